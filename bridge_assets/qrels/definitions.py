"""The qrels stage's Dagster definitions: bridge_qrels and its checks (merged with the other
stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.qrels import assets

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    asset_checks=dg.load_asset_checks_from_modules([assets]),
)
