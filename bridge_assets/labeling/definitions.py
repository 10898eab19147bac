"""The labeling stage's Dagster definitions: candidate_pool, the filter and the debate, and their
checks (merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.labeling import assets, checks

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    asset_checks=dg.load_asset_checks_from_modules([checks]),
)
