"""The human stage's Dagster definitions: human_labels, human_labels_job and the sensor that runs
it as votes complete (merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.human import assets

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    jobs=[assets.human_labels_job],
    sensors=[assets.human_labels_sensor],
)
