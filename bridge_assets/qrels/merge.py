"""`bridge_qrels` as a plain function: original gold + every label the pipeline produced,
and the pairs still pending (escalated, awaiting people: never a label).

The merge itself is sql/bridge_qrels.sql (sources and their precedence are documented
there); this module stands in empty tables for the labeling stages not run yet, so the
refined qrels of a dataset can be built at any point of the pipeline, and counts what was
found and what is still pending.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import polars as pl

from bridge_assets.paths import read_sql
from bridge_assets.store import table_exists

SOURCES = ("original", "human", "debate", "pending", "filter")
# Labels a person or a passed check stands behind: a relevant one outside the original qrels
# is a found hole. (Pending pairs have no label; the filter only ever says irrelevant.)
VERIFIED_SOURCES = ("original", "human", "debate", "filter")
UNVERIFIED_SOURCES = ("adjudicator", "vote")

BRIDGE_QRELS_SCHEMA = {
    "dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32,
    "source": pl.Utf8, "unverified_label": pl.Int32, "unverified_source": pl.Utf8,
    "pair_key": pl.Utf8, "config_hash": pl.Utf8, "call_keys": pl.List(pl.Utf8),
    "vote_ids": pl.List(pl.Int64),
}

# The columns sql/bridge_qrels.sql reads from each optional input, for empty stand-ins.
OPTIONAL_INPUTS = {
    "human_labels": "dataset varchar, query_id varchar, doc_id varchar, label integer",
    "human_votes": "vote_id bigint, dataset varchar, query_id varchar, doc_id varchar, "
                   "status varchar, is_attention_check boolean",
    "debate_labels": "dataset varchar, query_id varchar, doc_id varchar, pair_key varchar, "
                     "label integer, outcome varchar, config_hash varchar, "
                     "adjudicator_label integer, adjudicator_call_key varchar",
    "debate_turns": "dataset varchar, query_id varchar, doc_id varchar, round integer, "
                    "agent varchar, call_key varchar",
    "filtered_pool": "dataset varchar, query_id varchar, doc_id varchar, kept boolean",
    "filter_votes": "dataset varchar, query_id varchar, doc_id varchar, pair_key varchar, "
                    "model varchar, call_key varchar",
}


class MissingOriginalQrels(LookupError):
    """The refined qrels start from the original ones: ingest the dataset first."""


@dataclass(frozen=True)
class BridgeQrels:
    dataset: str
    qrels: pl.DataFrame          # rows of the bridge_qrels table (pending pairs included)
    missing_inputs: tuple[str, ...]  # labeling tables not materialized yet (read as empty)

    @property
    def pending(self) -> pl.DataFrame:
        """The pairs awaiting people: query_id, doc_id, pair_key, unverified guess."""
        return pending_pairs(self.qrels)

    def counts(self) -> dict[str, int]:
        """Pairs and relevant pairs per source, found holes, pending pairs, and the model
        guesses on pending pairs (apart: they are not labels)."""
        return qrels_counts(self.qrels)


def pending_pairs(qrels: pl.DataFrame) -> pl.DataFrame:
    return qrels.filter(pl.col("source") == "pending").select(
        "query_id", "doc_id", "pair_key", "unverified_label", "unverified_source")


def qrels_counts(qrels: pl.DataFrame) -> dict[str, int]:
    counts = {f"pairs_{source}": 0 for source in SOURCES}
    counts.update({f"relevant_{source}": 0 for source in SOURCES if source != "pending"})
    for source, pairs, relevant in qrels.group_by("source").agg(
            pl.len(), (pl.col("relevance") > 0).sum()).iter_rows():
        counts[f"pairs_{source}"] = pairs
        if source != "pending":
            counts[f"relevant_{source}"] = relevant
    counts["pairs"] = qrels.height
    counts["relevant"] = int((qrels["relevance"] > 0).sum())
    counts["holes_found"] = counts["relevant_human"] + counts["relevant_debate"]
    counts["pending"] = counts["pairs_pending"]
    for source in UNVERIFIED_SOURCES:
        guesses = qrels.filter(pl.col("unverified_source") == source)
        counts[f"unverified_{source}_relevant"] = int((guesses["unverified_label"] == 1).sum())
        counts[f"unverified_{source}_irrelevant"] = int((guesses["unverified_label"] == 0).sum())
    return counts


@contextlib.contextmanager
def stand_ins(con: duckdb.DuckDBPyConnection, tables: dict[str, str]) -> Iterator[tuple[str, ...]]:
    """Empty temp tables for those of `tables` (name -> column DDL) that do not exist; yields
    their names and drops them afterwards."""
    missing = tuple(name for name in tables if not table_exists(con, name))
    try:
        for name in missing:
            con.execute(f'create temp table "{name}" ({tables[name]})')
        yield missing
    finally:
        for name in missing:
            con.execute(f'drop table if exists temp."{name}"')


def build_bridge_qrels(con: duckdb.DuckDBPyConnection, dataset: str) -> BridgeQrels:
    """The refined qrels of `dataset` from whatever labels the data lake holds."""
    if not table_exists(con, "original_qrels") or not con.execute(
            "select count(*) from original_qrels where dataset = ?", [dataset]).fetchone()[0]:
        raise MissingOriginalQrels(f"bridge_qrels for dataset '{dataset}': no original_qrels rows; "
                                   "materialize the dataset's ingest assets first")
    with stand_ins(con, OPTIONAL_INPUTS) as missing:
        qrels = con.execute(read_sql("bridge_qrels"), {"dataset": dataset}).pl()
    return BridgeQrels(dataset, qrels.cast(BRIDGE_QRELS_SCHEMA).select(list(BRIDGE_QRELS_SCHEMA)), missing)
