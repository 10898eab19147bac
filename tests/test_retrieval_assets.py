"""Dagster wiring: the retrieval_run asset and its check, the registry sensor, the schedule."""

from __future__ import annotations

import datetime as dt
import shutil

import dagster as dg
import polars as pl
import pytest

from bridge_assets.ingest.assets import ingest_dataset
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.resource import LLMResource
from bridge_assets.paths import RESOURCES_DIR
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.retrieval.assets import retrieval_rebenchmark_schedule, retrieval_run, retrieval_run_is_valid
from bridge_assets.retrieval.registry import append_system, load_registry
from bridge_assets.retrieval.runs import export_trec_run, read_trec
from bridge_assets.retrieval.sensors import plan_sync, retriever_registry_sensor, sync_partitions
from fixtures.paths import lake_resources, location

DATASETS = dataset_partitions.get_partition_keys()


@pytest.fixture
def registry_file(tmp_path, monkeypatch):
    path = tmp_path / "retrievers.yaml"
    shutil.copy(RESOURCES_DIR / "retrievers.yaml", path)
    monkeypatch.setenv("BRIDGE_RETRIEVERS", str(path))
    monkeypatch.setenv("BRIDGE_RETRIEVER_PROFILE", "offline_fast")
    return path


def _evaluate(instance, lake, cursor=None) -> dg.SensorResult:
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"store": DuckDBStore(data_lake=str(lake))})
    result = retriever_registry_sensor(context)
    for request in result.dynamic_partitions_requests:  # what the daemon does with them
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    return result


def _requested(result: dg.SensorResult) -> list[tuple[str, str]]:
    return sorted((r.partition_key.keys_by_dimension["dataset"], r.partition_key.keys_by_dimension["retriever"])
                  for r in result.run_requests)


def _added(result: dg.SensorResult) -> list[str]:
    return [key for r in result.dynamic_partitions_requests
            if isinstance(r, dg.AddDynamicPartitionsRequest) for key in r.partition_keys]


def _deleted(result: dg.SensorResult) -> list[str]:
    return [key for r in result.dynamic_partitions_requests
            if isinstance(r, dg.DeleteDynamicPartitionsRequest) for key in r.partition_keys]


def test_sensor_syncs_partitions_with_the_registry(registry_file, data_lake):
    profile = load_registry(registry_file).profile_systems()
    with dg.instance_for_test() as instance:
        first = _evaluate(instance, data_lake)
        assert sorted(_added(first)) == sorted(profile) and _deleted(first) == []
        assert _requested(first) == sorted((d, r) for d in DATASETS for r in profile)
        assert sorted(instance.get_dynamic_partitions("retriever")) == sorted(profile)

        quiet = _evaluate(instance, data_lake, first.cursor)
        assert _added(quiet) == [] and _deleted(quiet) == [] and quiet.run_requests == []

        append_system("minilm_hnsw", {"kind": "dense", "model": "all-minilm-l6-v2",
                                      "profiles": ["offline_fast"], "parameters": {"index": "hnsw"}}, registry_file)
        grown = _evaluate(instance, data_lake, quiet.cursor)
        assert _added(grown) == ["minilm_hnsw"] and _deleted(grown) == []  # exactly one new partition
        assert _requested(grown) == [(d, "minilm_hnsw") for d in sorted(DATASETS)]

        # a changed configuration re-runs that system and those built on it, adds nothing
        registry_file.write_text(registry_file.read_text().replace(
            "parameters: {k1: 0.9, b: 0.4}\n  bm25_rm3", "parameters: {k1: 1.1, b: 0.4}\n  bm25_rm3"))
        changed = _evaluate(instance, data_lake, grown.cursor)
        assert _added(changed) == [] and _deleted(changed) == []
        assert {r for _, r in _requested(changed)} == {"bm25", "rrf_bm25_e5", "minilm_rerank_bm25"}

        # removing an entry retires its partition and its stored rows
        store.write_partitions({"retrieval_run": pl.DataFrame({
            "dataset": ["demo"] * 2, "retriever": ["minilm_hnsw", "bm25"], "query_id": ["q01"] * 2,
            "doc_id": ["d"] * 2, "rank": [1, 1], "score": [1.0, 1.0], "config_hash": ["h"] * 2})},
            {"dataset": "demo"}, location())
        registry_file.write_text(registry_file.read_text().split("  minilm_hnsw:\n")[0])
        shrunk = _evaluate(instance, data_lake, changed.cursor)
        assert _deleted(shrunk) == ["minilm_hnsw"] and _added(shrunk) == [] and shrunk.run_requests == []
        assert "minilm_hnsw" not in instance.get_dynamic_partitions("retriever")
        left = store.read_frame("select retriever from retrieval_run", None, location())["retriever"].to_list()
        assert left == ["bm25"]


def test_plan_sync_without_previous_hashes_does_not_rerun_existing_partitions():
    plan = plan_sync({"a": "1", "b": "2"}, existing=["a", "old"], previous={})
    assert (plan.add, plan.delete, plan.changed) == (["b"], ["old"], [])


def test_sync_partitions_applies_the_profile_without_a_daemon(registry_file, data_lake):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("retriever", ["retired_system", "bm25"])
        sync = sync_partitions(instance, DuckDBStore(data_lake=str(data_lake)))
        assert sync.delete == ["retired_system"] and "bm25" not in sync.add
        assert sorted(instance.get_dynamic_partitions("retriever")) == sorted(load_registry().profile_systems())


def test_retrieval_run_asset_writes_the_partition_and_passes_its_check(data_lake, tmp_path):
    resources = lake_resources(data_lake, llm=LLMResource(store=DuckDBStore(data_lake=str(data_lake))))
    with dg.instance_for_test() as instance:
        dg.materialize([ingest_dataset], partition_key="demo", instance=instance, resources=resources)
        instance.add_dynamic_partitions("retriever", ["bm25"])
        key = dg.MultiPartitionKey({"dataset": "demo", "retriever": "bm25"})
        result = dg.materialize([retrieval_run, retrieval_run_is_valid], partition_key=key,
                                instance=instance, resources=resources)
        assert result.success
        checks = result.get_asset_check_evaluations()
        assert [c.passed for c in checks] == [True]
        materialization = result.asset_materializations_for_node("retrieval_run")[0]
        assert materialization.metadata["dagster/row_count"].value == 120
        assert materialization.metadata["config_hash"].value == load_registry().config_hash("bm25", 10)

    run = store.read_frame("select * from retrieval_run", None, location())
    assert set(run.columns) == {"dataset", "retriever", "query_id", "doc_id", "rank", "score", "config_hash",
                                "inputs_hash"}
    assert run.group_by("query_id").agg(pl.col("rank").sort())["rank"].to_list() == [list(range(1, 11))] * 12
    path, rows = export_trec_run("demo", "bm25", tmp_path / "demo.bm25.trec", location())
    assert rows == 120 and read_trec(path).height == 120
    assert path.read_text().split("\n")[0].endswith(" bm25")

    # a run with a repeated rank and an unknown document fails the check
    with store.connect(location()) as con:
        con.execute("insert into retrieval_run values ('demo', 'bm25', 'q01', 'no-such-doc', 1, 0.5, 'x', 'y')")
    outcome = retrieval_run_is_valid(store=DuckDBStore(data_lake=str(data_lake)))
    assert outcome.passed is False
    failed = " ".join(outcome.metadata)
    assert "doc_known" in failed and "rank" in failed


def test_a_reranker_partition_reads_its_first_stage_from_the_lake_when_current(registry_file, data_lake):
    """minilm_rerank_bm25 at depth 10 (= bm25's stored k): the bm25 partition's rows are reused,
    so the re-ranker's process needs no JVM; a changed query set makes it run bm25 again."""
    registry_file.write_text(registry_file.read_text().replace(
        "first_stage: bm25\n    model: all-minilm-l6-v2\n",
        "first_stage: bm25\n    model: all-minilm-l6-v2\n    parameters: {depth: 10}\n"))
    resources = lake_resources(data_lake, llm=LLMResource(store=DuckDBStore(data_lake=str(data_lake))))

    def materialize(instance, retriever):
        key = dg.MultiPartitionKey({"dataset": "demo", "retriever": retriever})
        result = dg.materialize([retrieval_run], partition_key=key, instance=instance, resources=resources)
        return result.asset_materializations_for_node("retrieval_run")[0].metadata["details"].value

    with dg.instance_for_test() as instance:
        dg.materialize([ingest_dataset], partition_key="demo", instance=instance, resources=resources)
        instance.add_dynamic_partitions("retriever", ["bm25", "minilm_rerank_bm25"])
        assert materialize(instance, "minilm_rerank_bm25")["first_stage"]["bm25"]["stored_run_reused"] is False
        materialize(instance, "bm25")
        details = materialize(instance, "minilm_rerank_bm25")
        assert details["first_stage"] == {"bm25": {"depth": 10, "stored_run_reused": True}}
        assert "indexes" not in details or "bm25-lucene" not in details["indexes"]  # no Lucene opened

        with store.connect(location()) as con:  # the queries changed since bm25 ran: its run is not current
            con.execute("update queries set text = text || ' ?' where query_id = 'q01'")
        assert materialize(instance, "minilm_rerank_bm25")["first_stage"]["bm25"]["stored_run_reused"] is False


def test_rebenchmark_schedule_requests_every_partition(registry_file):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("retriever", ["bm25", "minilm"])
        # closed: it enters an instance of its own (see conftest.no_dagster_instance_left_entered)
        with dg.build_schedule_context(instance=instance,
                                       scheduled_execution_time=dt.datetime(2026, 1, 4, 3, tzinfo=dt.UTC)) as context:
            requests = retrieval_rebenchmark_schedule(context)
    assert len(requests) == 2 * len(DATASETS)
    assert retrieval_rebenchmark_schedule.cron_schedule == load_registry().rebenchmark.cron
