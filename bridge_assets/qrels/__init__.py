"""Refined qrels (`bridge_qrels`): the original gold plus every label the pipeline produced and
every judgment imported from elsewhere, each with its source, and their exports (TREC, BEIR,
BRIDGE release, Hugging Face)."""

from bridge_assets.qrels.exports import ExportFormat, export_qrels
from bridge_assets.qrels.imports import ImportFormat, import_qrels
from bridge_assets.qrels.merge import BridgeQrels, build_bridge_qrels, pending_pairs
from bridge_assets.qrels.sources import SOURCES

__all__ = ["SOURCES", "BridgeQrels", "ExportFormat", "ImportFormat", "build_bridge_qrels", "export_qrels",
           "import_qrels", "pending_pairs"]
