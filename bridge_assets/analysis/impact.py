"""`pending_impact`: which conclusions each pending pair's label can change.

Refined metrics are bounds over the pending pairs (every one irrelevant / every one relevant);
a system pair whose order on the headline measure differs between the two bounds, and one of
whose systems has a rank change that is not robust (its place moves from the original ranking
in different ways at the two bounds, as ranking_shift judges it), is *in doubt*: until none is,
some rank change depends on how people will decide, and none is exactly when every rank change
is robust. For each
pending pair (sql/pending_impact.sql): the system pairs in doubt whose rankings hold its chunk
in their top k, each with the share of its doubt the pair accounts for: how much the chunk's
gain, and its query's ideal DCG, move the gap between the two systems, over how much that gap
swings from one bound to the other, or, when larger, the part of that swing its query's
pending pairs carry together (settled only once all of them are labelled). The impact is the
sum of the shares, and the reason says it in words ("decides bm25 vs dense on nDCG@10: rank 2
in both").

The annotation queue serves pending pairs by impact (bridge_assets.human.queue); `bridge
annotate plan` prints the order. The *stopping point* is the number of pending pairs, in impact
order, up to the last that decides a system pair in doubt (without significance doubt: the
pairs with an impact): labelled, they decide every system pair in doubt now, and the other
pending pairs cannot change the order of any of them. It is a reading of the current bounds:
votes change the bounds, and the table is recomputed with them (against brute force, which
knows every answer the first pairs may get, it is equal on 7 of 10 small random lakes, above on
2 and below on 1: tests/test_impact_robust.py).

The headline measure is nDCG@k (`ndcg_cut_k`), computed as retrieval_metrics does
(trec_eval's conventions), so the means and queries come from retrieval_metrics and the
effects from the runs and bridge_qrels.

Significance (issue 26, item 1: "the significance outcomes it can flip";
sql/pending_impact_significance.sql): when the significance table holds the headline measure
at both bounds, a significance call (a system pair and a test: paired t-test or randomization)
is in doubt when its conclusion differs between them (significant at one bound only, or in
opposite directions); a pending pair may flip it when its chunk stands in the top k of either
system. `significance_pairs` lists those calls (with the Holm-corrected p-values at the two
bounds), `flips` counts their system pairs, `significance_in_doubt` the dataset's system pairs
with a call in doubt (NULL: no significance at both bounds to read). The impact adds
SIGNIFICANCE_WEIGHT per system pair it may flip, so a pair with no significance doubt keeps its
impact and its place relative to the others. The stopping point with significance
(stopping_point_with_significance) counts the labels, in impact order, until every pair that
decides a rank change or may flip a significance call is labelled: an upper figure for the
calls (one label may settle a call; every pair that may flip it is counted), read at the
current bounds like the stopping point itself (a pending pair outside both systems' top k still
moves its query's ideal DCG, which this reading leaves out).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import duckdb
import polars as pl

from bridge_assets.analysis.retrieval import measure_label
from bridge_assets.analysis.views import benchmark_runs, require_rows
from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import int_max, one_row, table_exists
from bridge_assets.paths import read_sql

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

HEADLINE = "ndcg_cut_10"
# impact added per system pair whose significance call a pending pair may flip: modest beside a
# rank change it decides alone (share 1)
SIGNIFICANCE_WEIGHT = 0.25
SIGNIFICANCE_CALL: dict[str, PolarsDataType] = {"system_a": pl.Utf8, "system_b": pl.Utf8, "test": pl.Utf8, "rank_a": pl.Int32,
                     "rank_b": pl.Int32, "p_low": pl.Float64, "p_high": pl.Float64,
                     "conclusion_low": pl.Utf8, "conclusion_high": pl.Utf8}
TEST_LABELS = {"paired_t": "paired t-test"}
_NDCG = re.compile(r"^ndcg_cut_(\d+)$")
SCHEMA: dict[str, PolarsDataType] = {"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "measure": pl.Utf8,
          "impact": pl.Float64, "decides": pl.Int32,
          "system_pairs": pl.List(pl.Struct({"system_a": pl.Utf8, "system_b": pl.Utf8,
                                             "rank_a": pl.Int32, "rank_b": pl.Int32,
                                             "share": pl.Float64})),
          "pairs_in_doubt": pl.Int32, "impact_rank": pl.Int32, "reason": pl.Utf8,
          "significance_pairs": pl.List(pl.Struct(SIGNIFICANCE_CALL)), "flips": pl.Int32,
          "significance_in_doubt": pl.Int32}


class UnsupportedMeasure(BridgeError, ValueError):
    """pending_impact computes nDCG@k effects only."""


def cutoff_of(measure: str) -> int:
    match = _NDCG.match(measure)
    if not match:
        raise UnsupportedMeasure(f"pending_impact: measure '{measure}' is not nDCG@k (ndcg_cut_<k>); "
                                 "the impact of a pending pair is computed for nDCG@k only")
    return int(match.group(1))


def _where(rank: int | None, system: str, k: int) -> str:
    return f"rank {rank} in {system}" if rank is not None else f"not in {system}'s top {k}"


def _p(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def explain_significance(calls: list[dict[str, Any]], measure: str, shown: int = 2) -> str:
    """The significance calls a pending pair may flip, in words ("may flip the significance of
    bm25 vs splade on nDCG@10 (paired t-test p 0.030 .. 0.210)": the Holm-corrected p-value at
    the lower bound, pending irrelevant, then at the upper one); "" for none."""
    if not calls:
        return ""
    by_pair: dict[tuple[str, str], list[str]] = {}
    for call in calls:
        by_pair.setdefault((call["system_a"], call["system_b"]), []).append(
            f"{TEST_LABELS.get(call['test'], call['test'])} p {_p(call['p_low'])} .. {_p(call['p_high'])}")
    label = measure_label(measure)
    parts = [f"{a} vs {b} on {label} ({', '.join(tests)})" for (a, b), tests in list(by_pair.items())[:shown]]
    more = len(by_pair) - shown
    return ("may flip the significance of " + "; ".join(parts)
            + (f"; and {more} more system pair(s)" if more > 0 else ""))


def explain(system_pairs: list[dict[str, Any]], measure: str, pairs_in_doubt: int, shown: int = 2,
            significance_pairs: list[dict[str, Any]] | None = None,
            significance_in_doubt: int | None = None) -> str:
    """The reason in words: the system pairs the label decides (largest share first), with where
    each system ranks the chunk, then the significance calls it may flip; or why it decides none."""
    label = measure_label(measure)
    k = cutoff_of(measure)
    flips = explain_significance(significance_pairs or [], measure, shown)
    if not system_pairs:
        if flips:
            return f"decides no rank change on {label}; {flips}"
        if pairs_in_doubt == 0:
            text = (f"changes no conclusion: every rank change on {label} is robust (the same way at both "
                    "bounds)")
        else:
            text = (f"changes no conclusion: no system pair in doubt on {label} ranks this chunk in its "
                    f"top {k}, or its label cannot move their gap")
        if significance_in_doubt:
            text += (f"; no system pair whose significance on {label} differs between the bounds ranks it "
                     f"in its top {k}")
        return text
    parts = []
    for pair in system_pairs[:shown]:
        a, b, rank_a, rank_b = pair["system_a"], pair["system_b"], pair["rank_a"], pair["rank_b"]
        where = (f"rank {rank_a} in both" if rank_a is not None and rank_a == rank_b
                 else f"{_where(rank_a, a, k)}, {_where(rank_b, b, k)}")
        parts.append(f"{a} vs {b} on {label}: {where} ({pair['share']:.0%} of the swing)")
    more = len(system_pairs) - shown
    return ("decides " + "; ".join(parts) + (f"; and {more} more system pair(s)" if more > 0 else "")
            + (f"; {flips}" if flips else ""))


def _significance(con: duckdb.DuckDBPyConnection, dataset: str, measure: str, k: int) -> pl.DataFrame | None:
    """Per pending pair, the significance calls its label may flip (sql/pending_impact_significance.sql);
    None when `con` holds no significance of `measure` at both bounds for `dataset`."""
    if not table_exists(con, "significance"):
        return None
    bounds = one_row(con, "select count(distinct qrels_version) from significance where dataset = ? and "
                     "measure = ? and qrels_version in ('refined', 'refined_upper')", [dataset, measure])[0]
    if bounds < 2:
        return None
    return con.execute(read_sql("pending_impact_significance"), {"dataset": dataset, "measure": measure,
                                                                 "k": k}).pl()


def compute_pending_impact(con: duckdb.DuckDBPyConnection, dataset: str, *, measure: str = HEADLINE,
                           top_grade: int = 1) -> pl.DataFrame:
    """Rows of the pending_impact table for `dataset`: one per pending pair, in impact order
    (impact_rank 1 first); `top_grade`: the relevance of a pending pair at the upper bound. With
    a significance table in `con` (the headline measure at both bounds), the significance calls
    each pair may flip too, SIGNIFICANCE_WEIGHT per system pair added to its impact."""
    k = cutoff_of(measure)
    require_rows(con, "retrieval_metrics", dataset, "pending_impact")
    require_rows(con, "bridge_qrels", dataset, "pending_impact")
    # every ranking retrieval_metrics evaluates (the evaluation-only systems' too): their top k,
    # read by both statements
    con.execute(f"create or replace temp view benchmark_run as {benchmark_runs(con)}")
    con.execute(read_sql("top_k_rankings"))
    frame = con.execute(read_sql("pending_impact"), {"dataset": dataset, "measure": measure, "k": k,
                                                     "gain": top_grade}).pl()
    flips = _significance(con, dataset, measure, k)
    if flips is None:
        frame = frame.with_columns(pl.lit([], SCHEMA["significance_pairs"]).alias("significance_pairs"),
                                   pl.lit(0, pl.Int32).alias("flips"),
                                   pl.lit(None, pl.Int32).alias("significance_in_doubt"))
    else:
        frame = frame.join(flips.cast({"significance_pairs": SCHEMA["significance_pairs"], "flips": pl.Int32,
                                       "significance_in_doubt": pl.Int32}),
                           on=["query_id", "doc_id"], how="left")
        in_doubt = column_max(flips["significance_in_doubt"]) if flips.height else 0
        frame = frame.with_columns(pl.col("significance_pairs").fill_null(pl.lit([], SCHEMA["significance_pairs"])),
                                   pl.col("flips").fill_null(0),
                                   pl.lit(in_doubt, pl.Int32).alias("significance_in_doubt"))
        # the bonus, then the former order (impact, moves, query, chunk) among equal impacts: a
        # pair that may flip no call keeps its impact and its order relative to the others
        frame = (frame.with_columns(pl.col("impact") + SIGNIFICANCE_WEIGHT * pl.col("flips"))
                 .sort(["impact", "impact_rank"], descending=[True, False])
                 .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).alias("impact_rank")))
    reasons = [explain(pairs, measure, doubt, significance_pairs=calls, significance_in_doubt=sig_doubt)
               for pairs, doubt, calls, sig_doubt in
               zip(frame["system_pairs"].to_list(), frame["pairs_in_doubt"].to_list(),
                   frame["significance_pairs"].to_list(), frame["significance_in_doubt"].to_list(), strict=True)]
    return (frame.with_columns(pl.Series("reason", reasons, dtype=pl.Utf8)).select(list(SCHEMA))
            .cast(SCHEMA))  # type: ignore[arg-type]  # polars' cast() types: see qrels/merge.py


def column_max(column: pl.Series) -> int:
    """The largest value of a count or rank column, 0 where it has none."""
    return int_max(column) or 0


def _labels_until(frame: pl.DataFrame, needed: pl.Expr) -> int:
    """Labels, in impact order, until every pair `needed` marks is labelled: the place of the last."""
    return column_max(frame.filter(needed)["impact_rank"])


def stopping_point(frame: pl.DataFrame) -> int:
    """Labels, in impact order, that decide every system pair in doubt (every rank change robust):
    up to the last pair that decides one (without significance doubt: the pairs with an impact)."""
    return _labels_until(frame, pl.col("decides") > 0)


def stopping_point_with_significance(frame: pl.DataFrame) -> int | None:
    """Labels, in impact order, that also settle every significance call in doubt: up to the last
    pair that decides a rank change or may flip a call (the pairs with an impact). An upper figure
    for the calls: every pair that may flip one is counted. None without significance to read."""
    if frame.is_empty() or frame["significance_in_doubt"].is_null().all():
        return None
    return _labels_until(frame, (pl.col("decides") > 0) | (pl.col("flips") > 0))
