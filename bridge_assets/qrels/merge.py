"""`bridge_qrels` as a plain function: original gold + every label the pipeline produced.

The merge itself is sql/bridge_qrels.sql (sources and their precedence are documented
there); this module stands in empty tables for the labeling stages not run yet, so the
refined qrels of a dataset can be built at any point of the pipeline, and counts what is
still open.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import polars as pl

from bridge_assets.paths import read_sql
from bridge_assets.store import table_exists

SOURCES = ("original", "human", "debate", "adjudicator", "filter")

BRIDGE_QRELS_SCHEMA = {
    "dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32,
    "source": pl.Utf8, "provisional": pl.Boolean, "pair_key": pl.Utf8, "config_hash": pl.Utf8,
    "call_keys": pl.List(pl.Utf8), "vote_ids": pl.List(pl.Int64),
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
    qrels: pl.DataFrame          # rows of the bridge_qrels table
    open_pairs: pl.DataFrame     # escalated/failed pairs nobody decided: query_id, doc_id, pair_key, outcome
    missing_inputs: tuple[str, ...]  # labeling tables not materialized yet (read as empty)

    def counts(self) -> dict[str, int]:
        """Pairs per source, relevant pairs per source, and the totals."""
        counts = {f"pairs_{source}": 0 for source in SOURCES}
        counts.update({f"relevant_{source}": 0 for source in SOURCES})
        for source, pairs, relevant in self.qrels.group_by("source").agg(
                pl.len(), (pl.col("relevance") > 0).sum()).iter_rows():
            counts[f"pairs_{source}"] = pairs
            counts[f"relevant_{source}"] = relevant
        counts["pairs"] = self.qrels.height
        counts["relevant"] = int((self.qrels["relevance"] > 0).sum())
        counts["new_relevant"] = counts["relevant"] - counts["relevant_original"]
        counts["provisional"] = int(self.qrels["provisional"].sum())
        counts["open_pairs"] = self.open_pairs.height
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
    return BridgeQrels(dataset, qrels.cast(BRIDGE_QRELS_SCHEMA).select(list(BRIDGE_QRELS_SCHEMA)),
                       open_pairs(con, dataset), missing)


def open_pairs(con: duckdb.DuckDBPyConnection, dataset: str) -> pl.DataFrame:
    """Escalated or failed pairs of `dataset` with no decision yet (query_id, doc_id, pair_key,
    outcome); empty before the debate ran."""
    with stand_ins(con, {**OPTIONAL_INPUTS, "original_qrels": "dataset varchar, query_id varchar, "
                                                              "doc_id varchar"}):
        return con.execute(read_sql("bridge_qrels_open_pairs"), {"dataset": dataset}).pl()
