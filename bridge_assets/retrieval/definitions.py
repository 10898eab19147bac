"""The retrieval stage's Dagster definitions: retrieval_run and its check, retrieval_job, the
re-benchmark schedule and the sensors that follow the retriever registry and the run-files
folder (merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.retrieval import assets, sensors

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    asset_checks=dg.load_asset_checks_from_modules([assets]),
    jobs=[assets.retrieval_job],
    sensors=[sensors.retriever_registry_sensor, sensors.run_files_sensor],
    schedules=[assets.retrieval_rebenchmark_schedule],
)
