"""Dagster wiring: the `human_labels` asset, its job and the sensor that runs it (and what
follows it) whenever a dataset's votes change."""

# No `from __future__ import annotations` here: Dagster resolves the Config annotation at import.

from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from bridge_assets.human.labels import REQUIRED_VOTES, HumanLabels, compute_human_labels, datasets_with_escalations
from bridge_assets.human.votes_resource import VotesStore
from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline import asset_config
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import external_input, reuse_when_current
from bridge_assets.settings import env

# The pipeline tables human_labels reads (its deps): which pairs went to people, escalated by
# the debate or drawn into the review sample; the votes come from the votes store.
READS = ("debate_labels", "review_sample")


class HumanLabelsConfig(dg.Config):
    # True by default: pending pairs are never labels and the metrics bound them, so the
    # benchmark follows the votes as they arrive instead of waiting for the last one.
    allow_partial: bool = Field(
        True, description="Materialize even though some escalated pairs still lack votes (only "
                          "the complete pairs get a label; the metadata says how many are open); "
                          "false: fail until every escalated pair has its votes.")


def _metadata(result: HumanLabels) -> dict:
    metadata = {
        "dagster/row_count": result.decided_pairs,
        "escalated_pairs": result.escalated_pairs,
        "open_pairs": result.open_pairs,
        "coverage": dg.MetadataValue.float(result.coverage),
        "accepted_votes": result.accepted_votes,
        "excluded_votes": result.excluded_votes,
        "required_votes": REQUIRED_VOTES,
        "fleiss_kappa_pairs": result.kappa_pairs,
        "votes_version": result.votes_version,
    }
    for key, value in (("fleiss_kappa", result.kappa),
                       ("fleiss_kappa_with_history", result.kappa_with_history),
                       ("fleiss_kappa_without_history", result.kappa_without_history),
                       ("weighted_kappa", result.weighted_kappa)):
        if value is not None:  # undefined with no complete pair or a single category
            metadata[key] = dg.MetadataValue.float(value)
    if result.annotator_kappas:
        metadata["weighted_kappa_by_annotator_pair"] = dg.MetadataValue.md("\n".join(
            ["| annotators | common pairs | quadratic-weighted kappa |", "| --- | --- | --- |"]
            + [f"| {p.first}, {p.second} | {p.items} | {p.kappa:.3f} |" for p in result.annotator_kappas]))
    return metadata


@dg.asset(
    partitions_def=dataset_partitions,
    deps=list(READS),
    group_name="human",
    code_version="2",  # 2: the vote_ids column
    description=f"Median of {REQUIRED_VOTES} accepted human votes per escalated pair (the "
                "majority of 0/1 votes, the middle grade of grades 0-3; from the annotation app's "
                "append-only human_votes table in the votes store), with Fleiss' kappa, the annotators' "
                "quadratic-weighted kappa and coverage; each label lists the votes it counted "
                "(vote_ids), which bridge_qrels cites. Its data version is a hash of the votes "
                "it was built from.",
)
@reuse_when_current
def human_labels(context: dg.AssetExecutionContext, config: HumanLabelsConfig,
                 store: DuckDBStore, votes: VotesStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    settings = asset_config.for_run(context, config)
    config = settings.config
    with snapshots.inputs(store, dataset, READS, votes=votes) as con:
        result = compute_human_labels(con, dataset)
    metadata = {**settings.metadata(), **_metadata(result)}
    if result.open_pairs and not config.allow_partial:
        raise dg.Failure(
            description=f"human_labels for dataset '{dataset}': {result.open_pairs} of "
                        f"{result.escalated_pairs} escalated pairs still need votes; annotate them "
                        "(bridge annotate serve) or run with config allow_partial=true",
            metadata=metadata)
    if result.open_pairs:
        context.log.warning(f"{dataset}: partial human_labels, {result.open_pairs} of "
                            f"{result.escalated_pairs} escalated pairs still open")
    store.write_partitions({"human_labels": result.labels}, dataset=dataset)
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(result.data_version))


human_labels_job = dg.define_asset_job(
    "human_labels_job", selection=dg.AssetSelection.assets(human_labels).downstream(),
    description="human_labels of one dataset and everything downstream of it.")


@dg.sensor(job=human_labels_job, minimum_interval_seconds=env.sensor_interval(60),
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Runs human_labels_job (human_labels and everything after it) for a dataset "
                       "whenever its votes changed: one run per state of the votes, however many "
                       "arrived since the last tick; pairs still waiting for votes stay pending "
                       "and the metrics bound them.")
def human_labels_sensor(context: dg.SensorEvaluationContext,
                        votes: VotesStore) -> dg.SensorResult | dg.SkipReason:
    known = set(dataset_partitions.get_partition_keys())
    requests = []
    with votes.store.connect() as con:
        datasets = [d for d in datasets_with_escalations(con) if d in known]
    for dataset in datasets:
        version = votes.version(dataset)
        built = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=human_labels.key, asset_partitions=[dataset]), limit=1).records
        materialization = built[0].asset_materialization if built else None
        if materialization and materialization.metadata.get("votes_version") == dg.MetadataValue.text(version):
            continue  # human_labels already holds these votes
        # the key repeats until a vote changes, so Dagster launches one run per state
        requests.append(dg.RunRequest(partition_key=dataset, run_key=f"human_labels:{dataset}:{version}"))
    if requests:
        return dg.SensorResult(run_requests=requests)
    return dg.SkipReason("the votes of every dataset are in human_labels" if datasets
                         else "no escalated pairs yet")


@external_input("human_labels")
def _votes_changed(dataset: str, metadata: dict[str, Any],
                   resources: Mapping[str, Any]) -> str | None:
    return "the votes changed" if metadata.get("votes_version") != resources["votes"].version(dataset) else None
