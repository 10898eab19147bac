"""The analysis stage's Dagster definitions: retrieval_metrics, ranking_shift, significance,
pool_saturation, partial_annotation_study, pending_impact (impact_asset.py) and the RAG assets
(merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.analysis import assets, impact_asset

defs = dg.Definitions(assets=dg.load_assets_from_modules([assets, impact_asset]))
