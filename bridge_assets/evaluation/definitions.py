"""The labeler evaluation's Dagster definitions: the `labeler_eval` group, partitioned by gold
set (merged with the other stages' in bridge_assets/definitions.py, outside the main job)."""

import dagster as dg

from bridge_assets.evaluation import assets

GROUP = assets.GROUP

defs = dg.Definitions(assets=dg.load_assets_from_modules([assets]))
