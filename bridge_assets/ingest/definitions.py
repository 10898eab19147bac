"""The ingest stage's Dagster definitions: corpus, queries and original_qrels, their checks and
`ingest_job` (merged with the other stages' in bridge_assets/definitions.py)."""

import dagster as dg

from bridge_assets.ingest import assets, checks

GROUP = "ingest"

ingest_job = dg.define_asset_job(
    "ingest_job", selection=dg.AssetSelection.groups(GROUP),
    description="Load every table of one dataset (its corpus, queries and original qrels).")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([assets]),
    asset_checks=dg.load_asset_checks_from_modules([checks]),
    jobs=[ingest_job],
)
