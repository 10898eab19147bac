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
annotate plan` prints the order. The *stopping point* is the number of pending pairs with an
impact: labelled (in impact order) they decide every system pair in doubt now, and the other
pending pairs cannot change the order of any of them. It is a reading of the current bounds:
votes change the bounds, and the table is recomputed with them (against brute force, which
knows every answer the first pairs may get, it is equal on 7 of 10 small random lakes, above on
2 and below on 1: tests/test_impact_robust.py).

The headline measure is nDCG@k (`ndcg_cut_k`), computed as retrieval_metrics does
(trec_eval's conventions), so the means and queries come from retrieval_metrics and the
effects from the runs and bridge_qrels.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
import polars as pl

from bridge_assets.analysis.retrieval import measure_label
from bridge_assets.analysis.views import require_rows
from bridge_assets.errors import BridgeError
from bridge_assets.paths import read_sql

HEADLINE = "ndcg_cut_10"
_NDCG = re.compile(r"^ndcg_cut_(\d+)$")
SCHEMA = {"dataset": pl.Utf8, "query_id": pl.Utf8, "doc_id": pl.Utf8, "measure": pl.Utf8,
          "impact": pl.Float64, "decides": pl.Int32,
          "system_pairs": pl.List(pl.Struct({"system_a": pl.Utf8, "system_b": pl.Utf8,
                                             "rank_a": pl.Int32, "rank_b": pl.Int32,
                                             "share": pl.Float64})),
          "pairs_in_doubt": pl.Int32, "impact_rank": pl.Int32, "reason": pl.Utf8}


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


def explain(system_pairs: list[dict[str, Any]], measure: str, pairs_in_doubt: int, shown: int = 2) -> str:
    """The reason in words: the system pairs the label decides (largest share first), with where
    each system ranks the chunk; or why it decides none."""
    label = measure_label(measure)
    k = cutoff_of(measure)
    if not system_pairs:
        if pairs_in_doubt == 0:
            return (f"changes no conclusion: every rank change on {label} is robust (the same way at both "
                    "bounds)")
        return (f"changes no conclusion: no system pair in doubt on {label} ranks this chunk in its "
                f"top {k}, or its label cannot move their gap")
    parts = []
    for pair in system_pairs[:shown]:
        a, b, rank_a, rank_b = pair["system_a"], pair["system_b"], pair["rank_a"], pair["rank_b"]
        where = (f"rank {rank_a} in both" if rank_a is not None and rank_a == rank_b
                 else f"{_where(rank_a, a, k)}, {_where(rank_b, b, k)}")
        parts.append(f"{a} vs {b} on {label}: {where} ({pair['share']:.0%} of the swing)")
    more = len(system_pairs) - shown
    return "decides " + "; ".join(parts) + (f"; and {more} more system pair(s)" if more > 0 else "")


def compute_pending_impact(con: duckdb.DuckDBPyConnection, dataset: str, *, measure: str = HEADLINE,
                           top_grade: int = 1) -> pl.DataFrame:
    """Rows of the pending_impact table for `dataset`: one per pending pair, in impact order
    (impact_rank 1 first); `top_grade`: the relevance of a pending pair at the upper bound."""
    k = cutoff_of(measure)
    require_rows(con, "retrieval_metrics", dataset, "pending_impact")
    require_rows(con, "bridge_qrels", dataset, "pending_impact")
    frame = con.execute(read_sql("pending_impact"), {"dataset": dataset, "measure": measure, "k": k,
                                                     "gain": top_grade}).pl()
    reasons = [explain(pairs, measure, doubt) for pairs, doubt in
               zip(frame["system_pairs"].to_list(), frame["pairs_in_doubt"].to_list(), strict=True)]
    return frame.with_columns(pl.Series("reason", reasons, dtype=pl.Utf8)).select(list(SCHEMA)).cast(SCHEMA)


def stopping_point(frame: pl.DataFrame) -> int:
    """Labels, in impact order, that decide every system pair in doubt: the pairs with an impact."""
    return frame.filter(pl.col("impact") > 0).height
