"""Re-benchmarking and analysis on the refined qrels: retrieval metrics (original vs refined,
Hole@k), ranking shift, significance and its concordance, pool saturation, pool coverage, the
D-MERIT partial-annotation study and RAG alignment. Plain functions here; Dagster wiring in assets.py."""

from bridge_assets.analysis.coverage import compute_pool_coverage
from bridge_assets.analysis.partial import compute_partial_annotation_study
from bridge_assets.analysis.rag import (
                                        alignment_statistics,
                                        compute_rag_alignment,
                                        generate_answers,
                                        judge_answers,
                                        rag_contexts,
)
from bridge_assets.analysis.retrieval import compute_dataset_metrics, measure_label
from bridge_assets.analysis.saturation import compute_pool_saturation
from bridge_assets.analysis.shift import compute_ranking_shift, kendall_tau_a, kendall_tau_b

__all__ = ["alignment_statistics", "compute_dataset_metrics", "compute_partial_annotation_study",
           "compute_pool_coverage", "compute_pool_saturation", "compute_rag_alignment", "compute_ranking_shift",
           "generate_answers", "judge_answers", "kendall_tau_a", "kendall_tau_b", "measure_label",
           "rag_contexts"]
