"""DIRAS's threshold retrieval and the student's reliability, on the queries it held out.

A calibrated score lets a system retrieve every chunk above a probability instead of a fixed
top-k: a query with many relevant chunks gets many, one with none gets few. Measured on the
student's calibration queries only (held out whole from the encoder's training; the Platt map
was fitted on their labels, one monotone map for all queries, so the order within a query is
out of sample and the thresholds' calibration is in sample), against the refined qrels'
verified labels of the candidate pool:

- relevant: pool pairs whose verified relevance is >= 1; a pending pair counts as not relevant
  (the refined qrels' lower bound) and is never a relevant chunk found;
- recall@t: per query with a relevant pool pair, the share of them scored >= t; precision@t: per
  query that retrieves something, the share of what it retrieves that is relevant; both the
  mean over those queries (macro), with how many queries each mean is over;
- top-k rows: the same figures for the k best-scored pairs of every query, to compare at a
  similar mean number retrieved.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from bridge_assets.evaluation.scores import reliability_bins

THRESHOLDS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
TOP_K = (1, 3, 5, 10)
RETRIEVAL_SCHEMA = {"rule": pl.Utf8, "queries": pl.Int64, "retrieved_per_query": pl.Float64,
                    "recall": pl.Float64, "recall_queries": pl.Int64, "precision": pl.Float64,
                    "precision_queries": pl.Int64}


def held_out_pairs(scores: pl.DataFrame, qrels: pl.DataFrame, queries: Sequence[str]) -> pl.DataFrame:
    """query_id, doc_id, p_relevant and relevant (1 verified relevant, 0 otherwise, `judged`
    whether a verified label exists) of the scored pool pairs of the held-out `queries`."""
    verified = (qrels.filter(pl.col("verified") & pl.col("relevance").is_not_null())
                .select("query_id", "doc_id", (pl.col("relevance") > 0).cast(pl.Int64).alias("label")))
    return (scores.filter(pl.col("query_id").is_in(list(queries)))
            .select("query_id", "doc_id", "p_relevant")
            .join(verified, on=["query_id", "doc_id"], how="left")
            .with_columns(pl.col("label").is_not_null().alias("judged"),
                          pl.col("label").fill_null(0).alias("relevant"))
            .drop("label"))


def reliability(pairs: pl.DataFrame) -> list[dict]:
    """The reliability bins of the judged held-out pairs (unjudged ones have no answer)."""
    judged = pairs.filter(pl.col("judged"))
    if not judged.height:
        return []
    return reliability_bins(judged["relevant"].to_list(), judged["p_relevant"].to_list())


def _mean(column: pl.Series) -> float | None:
    """The mean of a numeric column; None when it has no value (polars types a mean as any
    Python value, whatever the column)."""
    mean = column.mean()
    return float(mean) if isinstance(mean, (int, float)) else None


def _figures(rule: str, retrieved: pl.DataFrame, pairs: pl.DataFrame) -> dict:
    """Recall/precision of `retrieved` (a subset of `pairs`, per query) as defined above."""
    per_query = (pairs.group_by("query_id").agg(pl.col("relevant").sum().alias("relevant_total"))
                 .join(retrieved.group_by("query_id").agg(pl.len().alias("retrieved"),
                                                          pl.col("relevant").sum().alias("hits")),
                       on="query_id", how="left")
                 .with_columns(pl.col("retrieved").fill_null(0), pl.col("hits").fill_null(0)))
    recall = per_query.filter(pl.col("relevant_total") > 0).select(pl.col("hits") / pl.col("relevant_total"))
    precision = per_query.filter(pl.col("retrieved") > 0).select(pl.col("hits") / pl.col("retrieved"))
    return {"rule": rule, "queries": per_query.height,
            "retrieved_per_query": _mean(per_query["retrieved"]),
            "recall": _mean(recall.to_series()),
            "recall_queries": recall.height,
            "precision": _mean(precision.to_series()),
            "precision_queries": precision.height}


def threshold_retrieval(pairs: pl.DataFrame, thresholds: Sequence[float] = THRESHOLDS,
                        top_k: Sequence[int] = TOP_K) -> pl.DataFrame:
    """One row per rule: every pair scored >= t, then the k best-scored of every query (ties
    broken by doc id, so the figures are reproducible)."""
    rows = [_figures(f"P >= {t:g}", pairs.filter(pl.col("p_relevant") >= t), pairs) for t in thresholds]
    ranked = pairs.sort(["query_id", "p_relevant", "doc_id"], descending=[False, True, False]) \
        .with_columns(pl.int_range(1, pl.len() + 1).over("query_id").alias("rank"))
    rows += [_figures(f"top-{k}", ranked.filter(pl.col("rank") <= k), pairs) for k in top_k]
    return pl.DataFrame(rows, schema=RETRIEVAL_SCHEMA)
