"""The student stage's Dagster definitions: student_annotator, student_scores and
student_rerank_run, and the sensor that re-runs the last when the registry's evaluation-only
systems change (merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.student import assets

defs = dg.Definitions(assets=dg.load_assets_from_modules([assets]), jobs=[assets.student_rerank_job],
                      sensors=[assets.evaluation_systems_sensor])
