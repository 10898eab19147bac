"""`bridge_qrels` as a plain function: original gold + every label the pipeline produced,
and the pairs still pending (escalated, awaiting people: never a label).

The merge itself is sql/bridge_qrels.sql (sources and their precedence are documented
there; imported sources are registered in the data lake, see bridge_assets.qrels.sources);
this module stands in empty tables for the labeling stages not run yet and for imports never
made, so the refined qrels of a dataset can be built at any point of the pipeline, and counts
what was found, what was corrected and what is still pending.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.paths import read_sql
from bridge_assets.qrels.sources import IMPORT_TABLES, SOURCES, UNVERIFIED_GUESSERS, VERIFIED_BUILTINS, registered
from bridge_assets.qrels.trust import DebateTrust, DroppedHoles, debate_trust, dropped_holes, trusted_by_rule

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# Built-in labels a person or a passed check stands behind (imported sources say so at import,
# in bridge_qrels.verified): a verified relevant label outside the original qrels is a found
# hole. (Pending pairs have no label; the filter only ever says irrelevant, unverified.)
VERIFIED_SOURCES = VERIFIED_BUILTINS
UNVERIFIED_SOURCES = UNVERIFIED_GUESSERS

BRIDGE_QRELS_SCHEMA: dict[str, PolarsDataType] = {
    "dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32,
    "source": pl.Utf8, "unverified_label": pl.Int32, "unverified_source": pl.Utf8,
    "pair_key": pl.Utf8, "config_hash": pl.Utf8, "call_keys": pl.List(pl.Utf8),
    "vote_ids": pl.List(pl.Int64), "original_relevance": pl.Int32, "verified": pl.Boolean,
    "precedence": pl.Float64, "import_file": pl.Utf8, "import_line": pl.Int32,
    "estimated_hole": pl.Boolean,
}
# Columns added after the table's first release: a data lake written before gets them (NULL
# on other datasets' rows until their bridge_qrels is built again).
ADDED_COLUMNS = {"original_relevance": "integer", "verified": "boolean", "precedence": "double",
                 "import_file": "varchar", "import_line": "integer", "estimated_hole": "boolean"}

# The columns sql/bridge_qrels.sql reads from each optional input, for empty stand-ins.
OPTIONAL_INPUTS = {
    "human_labels": "dataset varchar, query_id varchar, doc_id varchar, label integer, vote_ids bigint[]",
    "debate_labels": "dataset varchar, query_id varchar, doc_id varchar, pair_key varchar, "
                     "label integer, outcome varchar, config_hash varchar, "
                     "adjudicator_label integer, adjudicator_call_key varchar",
    "debate_turns": "dataset varchar, query_id varchar, doc_id varchar, round integer, "
                    "agent varchar, call_key varchar",
    "filtered_pool": "dataset varchar, query_id varchar, doc_id varchar, kept boolean",
    "filter_votes": "dataset varchar, query_id varchar, doc_id varchar, pair_key varchar, "
                    "model varchar, call_key varchar, p_yes double",
}


class MissingOriginalQrels(BridgeError, LookupError):
    """The refined qrels start from the original ones: ingest the dataset first."""


@dataclass(frozen=True)
class BridgeQrels:
    dataset: str
    qrels: pl.DataFrame          # rows of the bridge_qrels table (pending pairs included)
    missing_inputs: tuple[str, ...]  # labeling tables not materialized yet (read as empty)
    sources: pl.DataFrame        # the dataset's imported sources (qrels_sources rows)
    trust: DebateTrust           # which consensus classes counted as labels, and why
    dropped: DroppedHoles        # the audit's estimate of the holes among the drops

    @property
    def pending(self) -> pl.DataFrame:
        """The pairs awaiting people: query_id, doc_id, pair_key, unverified guess."""
        return pending_pairs(self.qrels)

    @property
    def corrections(self) -> pl.DataFrame:
        """The original judgments a correction source changed."""
        return corrections(self.qrels)

    def counts(self) -> dict[str, int]:
        """Pairs and relevant pairs per source, found holes, pending pairs, and the model
        guesses on pending pairs (apart: they are not labels)."""
        return qrels_counts(self.qrels)


def pending_pairs(qrels: pl.DataFrame) -> pl.DataFrame:
    return qrels.filter(pl.col("source") == "pending").select(
        "query_id", "doc_id", "pair_key", "unverified_label", "unverified_source")


def corrections(qrels: pl.DataFrame) -> pl.DataFrame:
    """query_id, doc_id, original_relevance, relevance, source, import_file, import_line of the
    pairs whose original judgment a correction source changed (only those may differ)."""
    if "original_relevance" not in qrels.columns:
        return pl.DataFrame(schema={c: BRIDGE_QRELS_SCHEMA[c] for c in (
            "query_id", "doc_id", "original_relevance", "relevance", "source", "import_file", "import_line")})
    return qrels.filter(pl.col("original_relevance").is_not_null() & (pl.col("source") != "original")).select(
        "query_id", "doc_id", "original_relevance", "relevance", "source", "import_file", "import_line")


def _new_relevant() -> pl.Expr:
    """A relevant label outside the original qrels."""
    return (pl.col("relevance") > 0) & pl.col("original_relevance").is_null()


def qrels_counts(qrels: pl.DataFrame) -> dict[str, int]:
    """Pairs and relevant pairs per source (built-in and imported), found holes (verified
    relevant labels outside the original qrels), corrections, pending pairs, and the labels
    nobody verified apart: model guesses on pending pairs, unverified imported labels."""
    counts = {f"pairs_{source}": 0 for source in SOURCES}
    counts.update({f"relevant_{source}": 0 for source in SOURCES if source != "pending"})
    for source, pairs, relevant in qrels.group_by("source").agg(
            pl.len(), (pl.col("relevance") > 0).sum()).sort("source").iter_rows():
        counts[f"pairs_{source}"] = pairs
        if source != "pending":
            counts[f"relevant_{source}"] = relevant
    counts["pairs"] = qrels.height
    counts["relevant"] = int((qrels["relevance"] > 0).sum())
    if "verified" in qrels.columns:
        imported = qrels.filter(pl.col("import_file").is_not_null())
        counts["holes_found"] = int(qrels.filter(_new_relevant() & pl.col("verified")).height)
        counts["corrections"] = corrections(qrels).height
        unverified = imported.filter(~pl.col("verified") & pl.col("original_relevance").is_null())
        counts["unverified_imported_relevant"] = int((unverified["relevance"] > 0).sum())
        counts["unverified_imported_irrelevant"] = int((unverified["relevance"] == 0).sum())
    else:  # rows written before imports existed: only people and passed checks were verified
        counts["holes_found"] = counts["relevant_human"] + counts["relevant_debate"]
    counts["pending"] = counts["pairs_pending"]
    # drops the upper bound counts as relevant (relevance.drops_in_bounds)
    counts["estimated_holes"] = int(qrels["estimated_hole"].fill_null(False).sum()) \
        if "estimated_hole" in qrels.columns else 0
    # pending pairs people are asked to label (those voted beyond the human budget are not, nor
    # the provisional consensus labels outside the calibration sample)
    counts["awaiting_people"] = int(qrels.filter((pl.col("source") == "pending")
                                                 & ~pl.col("unverified_source").is_in(["vote", "provisional"])
                                                 .fill_null(False)).height)
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


def add_missing_columns(con: duckdb.DuckDBPyConnection) -> None:
    """Give a bridge_qrels table written by an earlier version the columns added since."""
    if table_exists(con, "bridge_qrels"):
        for name, kind in ADDED_COLUMNS.items():
            con.execute(f"alter table bridge_qrels add column if not exists {name} {kind}")


def build_bridge_qrels(con: duckdb.DuckDBPyConnection, dataset: str, min_precision: float = 0.7,
                       drops_in_bounds: bool = False) -> BridgeQrels:
    """The refined qrels of `dataset` from whatever labels the data lake holds; the debate's
    consensus classes count as labels where bridge_assets.qrels.trust trusts them at the bar
    `min_precision` (the dataset's `relevance.min_precision`). `drops_in_bounds`: the filter's
    drops the audit estimates to be holes are marked `estimated_hole`, which the metrics' upper
    bound counts as relevant (sql/bridge_qrels.sql says which)."""
    if not table_exists(con, "original_qrels") or not one_row(
            con, "select count(*) from original_qrels where dataset = ?", [dataset])[0]:
        raise MissingOriginalQrels(f"bridge_qrels for dataset '{dataset}': no original_qrels rows; "
                                   "materialize the dataset's ingest assets first")
    # no import is not a missing stage: those stand-ins are not reported
    with stand_ins(con, OPTIONAL_INPUTS) as missing, stand_ins(con, IMPORT_TABLES):
        # filter votes written before the scorer's P(yes) was kept
        con.execute("alter table filter_votes add column if not exists p_yes double")
        # human labels written before they listed their votes (human_labels code version 1:
        # Dagster marks it changed, and a run builds it again before this)
        con.execute("alter table human_labels add column if not exists vote_ids bigint[]")
        trust = debate_trust(con, dataset, by_rule=trusted_by_rule(con, dataset), bar=min_precision)
        dropped = dropped_holes(con, dataset)
        qrels = con.execute(read_sql("bridge_qrels"), {
            "dataset": dataset, "trust_yes": trust.yes.trusted, "trust_no": trust.no.trusted,
            "drops_at_upper": dropped.at_upper if drops_in_bounds else 0}).pl()
    # polars types cast()'s mapping with an invariant key (column name | selector | dtype), which
    # refuses a dict[str, dtype] (its own SchemaDict); the call is as documented
    qrels = qrels.cast(BRIDGE_QRELS_SCHEMA)  # type: ignore[arg-type]
    return BridgeQrels(dataset, qrels.select(list(BRIDGE_QRELS_SCHEMA)), missing,
                       registered(con, dataset), trust, dropped)
