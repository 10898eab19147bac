"""Refined qrels (`bridge_qrels`): the original gold plus every label the pipeline produced,
each with its source, and their exports (TREC, BEIR, BRIDGE release, Hugging Face)."""

from bridge_assets.qrels.exports import ExportFormat, export_qrels
from bridge_assets.qrels.merge import SOURCES, BridgeQrels, build_bridge_qrels, pending_pairs

__all__ = ["SOURCES", "BridgeQrels", "ExportFormat", "build_bridge_qrels", "export_qrels", "pending_pairs"]
