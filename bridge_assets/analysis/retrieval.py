"""`retrieval_metrics` as a plain function: every system of a dataset evaluated on the
original and on the refined qrels, per query and averaged, with the metrics core
(bridge_assets.metrics: trec_eval's conventions, docs/metrics.md).

Measures at cutoff k (default 10): Hit@k (success_k), Recall@k (recall_k), Precision@k (P_k),
MRR@k (recip_rank_cut_k), nDCG@k (ndcg_cut_k), MAP (map, over the run's depth), Judged@k
(judged_k), Hole@k (hole_k: share of the top-k that is relevant in the evaluated qrels but
was not judged in the original ones, so 0 on the original qrels), plus num_rel / num_rel_ret.
nDCG's gains are the relevance grades themselves; the other measures count a document as
relevant from `relevance_level` up (trec_eval -l), so on a graded dataset level 2 asks for
highly relevant documents.
"""

from __future__ import annotations

import duckdb
import polars as pl

from bridge_assets.analysis.views import Scope, ScopeInfo, analysis_views
from bridge_assets.metrics import compute_retrieval_metrics

QRELS_VERSIONS = ("original", "refined", "refined_upper")  # refined: lower bound over pending pairs
METRICS_SCHEMA = {"dataset": pl.Utf8, "retriever": pl.Utf8, "qrels_version": pl.Utf8,
                  "query_id": pl.Utf8, "measure": pl.Utf8, "value": pl.Float64}

# Display names of the measure families (trec_eval names -> the paper's).
FAMILY_LABELS = {"success": "Hit", "recall": "Recall", "P": "P", "recip_rank_cut": "MRR",
                 "ndcg_cut": "nDCG", "judged": "Judged", "hole": "Hole"}
PLAIN_LABELS = {"map": "MAP", "num_rel": "#rel", "num_rel_ret": "#rel retrieved",
                "recip_rank": "MRR"}


def measure_label(measure: str) -> str:
    """`ndcg_cut_10` -> `nDCG@10`, `map` -> `MAP`; unknown names are returned unchanged."""
    if measure in PLAIN_LABELS:
        return PLAIN_LABELS[measure]
    family, _, cutoff = measure.rpartition("_")
    return f"{FAMILY_LABELS[family]}@{cutoff}" if family in FAMILY_LABELS and cutoff.isdigit() else measure


def measures_at(k: int) -> dict[str, str]:
    """The names retrieval_metrics stores for cutoff k, by role."""
    return {"hit": f"success_{k}", "recall": f"recall_{k}", "precision": f"P_{k}",
            "mrr": f"recip_rank_cut_{k}", "ndcg": f"ndcg_cut_{k}", "map": "map",
            "judged": f"judged_{k}", "hole": f"hole_{k}"}


def compute_dataset_metrics(con: duckdb.DuckDBPyConnection, dataset: str, *, k: int = 10,
                            scope: Scope = "pooled", relevance_level: int = 1,
                            top_grade: int = 1) -> tuple[pl.DataFrame, ScopeInfo]:
    """Rows of the retrieval_metrics table for `dataset`: (dataset, retriever, qrels_version,
    query_id | 'all', measure, value), on the original and on the refined (bridge_qrels) qrels;
    `top_grade`: the scale's highest grade (3 on a graded dataset), which pending pairs take
    at the upper bound."""
    frames = []
    with analysis_views(con, dataset, scope, asset="retrieval_metrics", top_grade=top_grade,
                        evaluated=True) as info:
        for version in QRELS_VERSIONS:
            values = compute_retrieval_metrics(con, run="analysis_run", qrels=f"analysis_{version}_qrels",
                                               k=k, original_qrels="analysis_original_qrels",
                                               relevance_level=relevance_level)
            frames.append(values.with_columns(pl.lit(version).alias("qrels_version")))
    # polars' cast() types: see qrels/merge.py
    frame = pl.concat(frames).select(list(METRICS_SCHEMA)).cast(METRICS_SCHEMA)  # type: ignore[arg-type]
    return frame, info
