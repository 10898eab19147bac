"""`human_labels` as a plain function: the median vote per escalated pair (on 0/1 votes the
majority; on grades 0-3 the middle grade), agreement, coverage.

The set-based part (tallies and median per pair) is sql/human_labels.sql; this module adds
Fleiss' kappa over the votes (0/1 or grades), the quadratic-weighted kappa between every two
annotators, and the data version (a hash of exactly the votes and pairs the labels come from).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.human.agreement import PairKappa, category_counts, fleiss_kappa, weighted_kappas
from bridge_assets.human.tables import REQUIRED_VOTES, votes_version  # noqa: F401 (REQUIRED_VOTES named here too)
from bridge_assets.lake.store import table_exists
from bridge_assets.paths import read_sql
from bridge_assets.registry.datasets import GRADES

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

HUMAN_LABELS_SCHEMA: dict[str, PolarsDataType] = {
    "dataset": pl.String, "query_id": pl.String, "doc_id": pl.String, "review": pl.String,
    "label": pl.Int32, "votes": pl.Int32, "votes_relevant": pl.Int32, "agreement": pl.Float64,
    "vote_ids": pl.List(pl.Int64),
}
TALLY_SCHEMA: dict[str, PolarsDataType] = {**HUMAN_LABELS_SCHEMA, "decided": pl.Boolean}
# Stands in for the review sample where the lake has none yet (an older lake, or before the debate).
_NO_REVIEW_SAMPLE = ("(select null::varchar as dataset, null::varchar as query_id, "
                     "null::varchar as doc_id, null::varchar as kind where false)")


def tallies_sql(con: duckdb.DuckDBPyConnection) -> str:
    """sql/human_labels.sql for `con`: the pairs for people are the debate's escalations and
    the review sample (labeling/review.py), read as empty where `con` has no such table."""
    sql = read_sql("human_labels")
    return sql if table_exists(con, "review_sample") else sql.replace("from review_sample", f"from {_NO_REVIEW_SAMPLE}")


def for_people_sql(con: duckdb.DuckDBPyConnection, alias: str) -> str:
    """A condition: the pair `alias` (dataset, query_id, doc_id) was sent to people."""
    escalated = (f"exists (select 1 from debate_labels d where d.dataset = {alias}.dataset "
                 f"and d.query_id = {alias}.query_id and d.doc_id = {alias}.doc_id "
                 "and d.outcome in ('escalated', 'failed'))") if table_exists(con, "debate_labels") else "false"
    reviewed = (f"exists (select 1 from review_sample r where r.dataset = {alias}.dataset "
                f"and r.query_id = {alias}.query_id and r.doc_id = {alias}.doc_id)"
                if table_exists(con, "review_sample") else "false")
    return f"({escalated} or {reviewed})"


class MissingDebateLabels(BridgeError, LookupError):
    """human_labels needs the debate's outcomes to know which pairs were escalated."""


@dataclass(frozen=True)
class HumanLabels:
    dataset: str
    labels: pl.DataFrame            # rows of the human_labels table: the decided pairs
    escalated_pairs: int
    open_pairs: int                 # escalated pairs still short of votes (or tied)
    accepted_votes: int
    excluded_votes: int
    kappa: float | None             # Fleiss' kappa over the first REQUIRED_VOTES votes per pair
    kappa_with_history: float | None
    kappa_without_history: float | None
    kappa_pairs: int
    data_version: str               # the escalated pairs and their counted votes: the table's inputs
    votes_version: str              # the dataset's counted votes alone: what the votes sensor watches
    # quadratic-weighted Cohen's kappa of every two annotators over their common pairs
    annotator_kappas: tuple[PairKappa, ...] = ()
    # of the pairs for people, those the review sample drew (labeling/review.py): all, decided
    audit: tuple[int, int] = (0, 0)
    calibration: tuple[int, int] = (0, 0)

    @property
    def weighted_kappa(self) -> float | None:
        """The annotator pairs' weighted kappas averaged (None without a pair)."""
        kappas = [pair.kappa for pair in self.annotator_kappas]
        return sum(kappas) / len(kappas) if kappas else None

    @property
    def decided_pairs(self) -> int:
        return self.labels.height

    @property
    def coverage(self) -> float:
        return self.decided_pairs / self.escalated_pairs if self.escalated_pairs else 1.0


def pair_tallies(con: duckdb.DuckDBPyConnection, dataset: str | None = None) -> pl.DataFrame:
    """One row per escalated pair (of `dataset`, or all): votes, majority label, decided.
    Empty when the debate has not run yet. `con` sees human_votes (the votes store, or a
    snapshot's copy of it) and debate_labels."""
    if not table_exists(con, "debate_labels"):
        return pl.DataFrame(schema=TALLY_SCHEMA)
    frame = con.execute(tallies_sql(con),
                        {"dataset": dataset, "required_votes": REQUIRED_VOTES}).pl()
    if not frame.height:
        return pl.DataFrame(schema=TALLY_SCHEMA)
    return frame.cast(TALLY_SCHEMA)  # type: ignore[arg-type]  # polars' cast() types: see qrels/merge.py


def _votes_on_escalated_pairs(con: duckdb.DuckDBPyConnection, dataset: str) -> pl.DataFrame:
    return con.execute(f"""
        select v.vote_id, v.query_id, v.doc_id, v.annotator_id, v.label, v.with_history, v.status
        from human_votes v
        where v.dataset = ? and not v.is_attention_check and {for_people_sql(con, "v")}
        order by v.vote_id""", [dataset]).pl()


def _kappa(first_votes: pl.DataFrame) -> tuple[float | None, int]:
    groups = [g["label"].to_list() for _, g in first_votes.group_by(["query_id", "doc_id"])]
    # over the grades: a category nobody chose changes no kappa, so 0/1 votes count as before
    return fleiss_kappa(category_counts(groups, GRADES)), len(groups)


def compute_human_labels(con: duckdb.DuckDBPyConnection, dataset: str) -> HumanLabels:
    """The majority label of every decided escalated pair of `dataset`, with agreement (`con`
    as for pair_tallies)."""
    if not table_exists(con, "debate_labels"):
        raise MissingDebateLabels(f"human_labels for dataset '{dataset}': no debate_labels table "
                                  "yet; materialize debate_labels first")
    tallies = pair_tallies(con, dataset)
    votes = _votes_on_escalated_pairs(con, dataset)
    accepted = votes.filter(pl.col("status") == "accepted")
    # Fleiss' kappa needs the same number of raters per pair: the first REQUIRED_VOTES each.
    first_votes = (accepted.with_columns(pl.int_range(pl.len()).over(["query_id", "doc_id"]).alias("n"))
                   .filter(pl.col("n") < REQUIRED_VOTES)
                   .filter(pl.len().over(["query_id", "doc_id"]) == REQUIRED_VOTES))
    kappa, kappa_pairs = _kappa(first_votes)
    uniform = first_votes.with_columns(
        pl.col("with_history").all().over(["query_id", "doc_id"]).alias("all_with"),
        (~pl.col("with_history")).all().over(["query_id", "doc_id"]).alias("all_without"))
    kappa_with, _ = _kappa(uniform.filter(pl.col("all_with")))
    kappa_without, _ = _kappa(uniform.filter(pl.col("all_without")))
    by_annotator: dict[str, dict[tuple[str, str], int]] = {}
    for query_id, doc_id, annotator_id, label in accepted.select(
            "query_id", "doc_id", "annotator_id", "label").iter_rows():
        by_annotator.setdefault(annotator_id, {})[(query_id, doc_id)] = label

    digest = hashlib.sha256()
    for row in tallies.select("query_id", "doc_id").iter_rows():
        digest.update(repr(("pair", *row)).encode())
    for row in accepted.select("vote_id", "query_id", "doc_id", "annotator_id", "label").iter_rows():
        digest.update(repr(("vote", *row)).encode())

    return HumanLabels(
        dataset=dataset,
        labels=tallies.filter(pl.col("decided")).select(list(HUMAN_LABELS_SCHEMA)),
        escalated_pairs=tallies.height,
        open_pairs=tallies.filter(~pl.col("decided")).height,
        accepted_votes=accepted.height,
        excluded_votes=votes.height - accepted.height,
        kappa=kappa, kappa_with_history=kappa_with, kappa_without_history=kappa_without,
        kappa_pairs=kappa_pairs,
        data_version=digest.hexdigest()[:32],
        votes_version=votes_version(con, dataset),
        annotator_kappas=tuple(weighted_kappas(by_annotator)),
        audit=_drawn(tallies, "audit"), calibration=_drawn(tallies, "calibration"),
    )


def _drawn(tallies: pl.DataFrame, kind: str) -> tuple[int, int]:
    drawn = tallies.filter(pl.col("review") == kind)
    return drawn.height, drawn.filter(pl.col("decided")).height


def datasets_with_escalations(con: duckdb.DuckDBPyConnection) -> list[str]:
    if not table_exists(con, "debate_labels"):
        return []
    review = " union select dataset from review_sample" if table_exists(con, "review_sample") else ""
    return [r[0] for r in con.execute(
        "select distinct dataset from debate_labels where outcome in ('escalated', 'failed')"
        f"{review} order by 1").fetchall()]
