"""The Dagster code location: every asset, check, sensor, schedule and resource, in one place."""

import dagster as dg

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.evaluation import assets as evaluation_assets
from bridge_assets.human import assets as human_assets
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.ingest import checks as ingest_checks
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.labeling import checks as labeling_checks
from bridge_assets.llm.resource import LLMResource
from bridge_assets.partitions import dataset_partitions
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports import assets as report_assets
from bridge_assets.resources import DuckDBStore
from bridge_assets.retrieval import assets as retrieval_assets
from bridge_assets.retrieval import sensors as retrieval_sensors

STAGES = [ingest_assets, retrieval_assets, labeling_assets, human_assets, qrels_assets,
          analysis_assets, report_assets, evaluation_assets]

ingest_job = dg.define_asset_job(
    "ingest_job", selection=dg.AssetSelection.groups("ingest"), partitions_def=dataset_partitions,
    description="Load every table of one dataset (its corpus, queries and original qrels).")

# What `make run` / `bridge run` materializes for one dataset: the whole pipeline. The labeler
# evaluation runs on gold sets, not datasets, so it is left out; human_labels runs with
# whatever votes exist (the sensor refreshes it, and everything after it, as votes arrive).
main_selection = dg.AssetSelection.all() - dg.AssetSelection.groups(evaluation_assets.GROUP)

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(STAGES),
    asset_checks=dg.load_asset_checks_from_modules([ingest_checks, retrieval_assets, labeling_checks,
                                                    qrels_assets]),
    jobs=[ingest_job, retrieval_assets.retrieval_job, human_assets.human_labels_job],
    sensors=[retrieval_sensors.retriever_registry_sensor, retrieval_sensors.run_files_sensor,
             human_assets.human_labels_sensor],
    schedules=[retrieval_assets.retrieval_rebenchmark_schedule],
    resources={"store": DuckDBStore(), "llm": LLMResource()},
)
