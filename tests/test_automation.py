"""Declarative automation on the asset graph, evaluated with Dagster's own test entry point
(`dg.evaluate_automation_conditions`, the evaluation the daemon's sensor makes) on a real
instance whose materializations are recorded as Dagster records them."""

from __future__ import annotations

import dagster as dg

from bridge_assets.definitions import automated_selection, defs, main_selection
from bridge_assets.pipeline import automation

RETRIEVERS = ["bm25", "minilm"]
DATASETS = ["demo", "nq_open_mini"]


def partitions(key: dg.AssetKey, dataset: str) -> list:
    if key.to_user_string() == "retrieval_run":
        return [dg.MultiPartitionKey({"dataset": dataset, "retriever": r}) for r in RETRIEVERS]
    return [dataset]


def materialized(instance: dg.DagsterInstance, key: dg.AssetKey, partition) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=key, partition=partition))


def requested(result) -> set[tuple[str, str]]:
    graph = defs.resolve_asset_graph()
    return {(key.to_user_string(), str(partition)) for key in graph.get_all_asset_keys()
            for partition in result.get_requested_partitions(key)}


def test_every_asset_after_the_retrieval_runs_of_the_main_job_is_automated():
    graph = defs.resolve_asset_graph()
    automated = {key.to_user_string() for key in automated_selection.resolve(graph)}
    assert {"candidate_pool", "filtered_pool", "debate_labels", "human_labels", "bridge_qrels",
            "retrieval_metrics", "ranking_shift", "significance", "pool_saturation",
            "partial_annotation_study", "rag_answers", "rag_judgments", "rag_alignment", "report"} <= automated
    for key in graph.get_all_asset_keys():
        condition = graph.get(key).automation_condition
        assert (condition is not None) == (key.to_user_string() in automated), key
    # ingest and the retrieval runs are started by people and by the sensors, not by automation
    assert not automated & {"corpus", "queries", "original_qrels", "retrieval_run"}
    sensor = next(s for s in defs.sensors if s.name == automation.SENSOR_NAME)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_a_new_retriever_run_requests_exactly_its_datasets_downstream_partitions(tmp_path):
    graph = defs.resolve_asset_graph()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions("retriever", RETRIEVERS)
        for dataset in DATASETS:  # both datasets ran the whole main job
            for key in main_selection.resolve(graph):
                for partition in partitions(key, dataset):
                    materialized(instance, key, partition)
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0  # everything is current

        # minilm's run on the demo changed (a new system, a dropped run file, a changed entry)
        materialized(instance, dg.AssetKey("retrieval_run"),
                     dg.MultiPartitionKey({"dataset": "demo", "retriever": "minilm"}))
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        expected = {(key.to_user_string(), "demo") for key in automated_selection.resolve(graph)}
        assert requested(second) == expected  # the demo's pool, labels, qrels, metrics, report; nq none

        # nothing more until something changes again
        third = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=second.cursor)
        assert third.total_requested == 0


def test_new_votes_refresh_what_follows_human_labels_and_nothing_before_it(tmp_path):
    graph = defs.resolve_asset_graph()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions("retriever", RETRIEVERS)
        for key in main_selection.resolve(graph):
            for partition in partitions(key, "demo"):
                materialized(instance, key, partition)
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        materialized(instance, dg.AssetKey("human_labels"), "demo")  # the votes sensor's run
        second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        after = {key.to_user_string() for key in
                 dg.AssetSelection.assets("human_labels").downstream(include_self=False).resolve(graph)}
        assert requested(second) == {(name, "demo") for name in after}
        assert "bridge_qrels" in after and "candidate_pool" not in after


def sensor_intervals(env: dict[str, str]) -> dict[str, int]:
    """Each sensor's minimum interval in a fresh process (the definitions read it as they load,
    as the daemon's code server does)."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import json; from bridge_assets.definitions import defs; "
                           "print(json.dumps({s.name: s.minimum_interval_seconds for s in defs.sensors}))"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sensors_look_every_minute_and_automation_every_30_s_unless_the_setting_says_otherwise():
    default = sensor_intervals({"BRIDGE_SENSOR_INTERVAL_S": ""})
    assert default.pop(automation.SENSOR_NAME) == 30
    assert default and set(default.values()) == {60}, default
    assert set(sensor_intervals({"BRIDGE_SENSOR_INTERVAL_S": "7"}).values()) == {7}


def test_a_system_whose_run_failed_does_not_hold_its_dataset_back_and_one_never_run_does(tmp_path):
    """Issue 59: a malformed run file fails its retrieval_run partition; automation still
    refreshes the dataset when another system's run changes (without the failed one), while a
    system whose run has not happened yet still holds it back (its run is coming)."""
    graph = defs.resolve_asset_graph()
    partitions_def = graph.get(dg.AssetKey("retrieval_run")).partitions_def
    broken = dg.MultiPartitionKey({"dataset": "demo", "retriever": "broken"})

    @dg.asset(name="retrieval_run", partitions_def=partitions_def)
    def failing_run() -> None:  # what a malformed run file does to its system's partition
        raise ValueError("external.demo.trec, line 6, field \"score\": not a number")

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions("retriever", [*RETRIEVERS, "broken"])
        for key in main_selection.resolve(graph):
            for partition in partitions(key, "demo"):
                materialized(instance, key, partition)
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        minilm = dg.MultiPartitionKey({"dataset": "demo", "retriever": "minilm"})
        materialized(instance, dg.AssetKey("retrieval_run"), minilm)
        waiting = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        assert waiting.total_requested == 0  # broken's run has not happened: it holds the demo back

        failed = dg.materialize([failing_run], instance=instance, partition_key=broken, raise_on_error=False)
        assert not failed.success
        materialized(instance, dg.AssetKey("retrieval_run"), minilm)
        going_on = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=waiting.cursor)
        expected = {(key.to_user_string(), "demo") for key in automated_selection.resolve(graph)}
        assert requested(going_on) == expected
