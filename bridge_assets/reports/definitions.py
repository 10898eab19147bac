"""The reports stage's Dagster definitions: the per-dataset `report` (merged with the other
stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.reports import assets

defs = dg.Definitions(assets=dg.load_assets_from_modules([assets]))
