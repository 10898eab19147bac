"""The Dagster code location: every asset, check, sensor, schedule and resource, in one place."""

import dagster as dg

from bridge_assets.human import assets as human_assets
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.ingest import checks as ingest_checks
from bridge_assets.llm.resource import LLMResource
from bridge_assets.partitions import dataset_partitions
from bridge_assets.resources import DuckDBStore

ingest_job = dg.define_asset_job(
    "ingest_job", selection=dg.AssetSelection.groups("ingest"), partitions_def=dataset_partitions,
    description="Load every table of one dataset (its corpus, queries and original qrels).")

# What `make run` / `bridge run` materializes for one dataset: the whole pipeline except the
# assets that wait for people (human_labels is refreshed by its sensor once votes are in).
main_selection = dg.AssetSelection.all() - dg.AssetSelection.assets("human_labels")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([ingest_assets, human_assets]),
    asset_checks=dg.load_asset_checks_from_modules([ingest_checks]),
    jobs=[ingest_job, human_assets.human_labels_job],
    sensors=[human_assets.human_labels_sensor],
    resources={"store": DuckDBStore(), "llm": LLMResource()},
)
