"""Retrieval metrics equal to trec_eval's, computed set-based in DuckDB (docs/metrics.md)."""

from bridge_assets.metrics.measure_names import (
                                                 FAMILIES,
                                                 PIPELINE_MEASURES,
                                                 MeasureError,
                                                 MeasureSelection,
                                                 resolve_measures,
)
from bridge_assets.metrics.measures import compute_measures, compute_retrieval_metrics
from bridge_assets.metrics.trec_files import evaluate_trec_files, trec_eval_lines
from bridge_assets.trec_io import TrecRun, read_trec_run

__all__ = ["FAMILIES", "PIPELINE_MEASURES", "MeasureError", "MeasureSelection", "TrecRun",
           "compute_measures", "compute_retrieval_metrics", "evaluate_trec_files",
           "read_trec_run", "resolve_measures", "trec_eval_lines"]
