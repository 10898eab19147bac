"""The analysis stage's Dagster definitions: retrieval_metrics, ranking_shift, significance,
pool_saturation, partial_annotation_study and the RAG assets (merged with the other stages' in
bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.analysis import assets

defs = dg.Definitions(assets=dg.load_assets_from_modules([assets]))
