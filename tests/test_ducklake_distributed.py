"""Many writers, one DuckLake (issue 15, item 4).

- A dask LocalCluster of 2 worker processes runs a job's steps at once, each committing its own
  partition into the same DuckLake (fast: a tiny job, workers import only tests/dask_jobs.py).
- A `bridge materialize` killed with SIGKILL inside its DuckLake transaction leaves the previous
  partition as it was, and the next run completes.
- (slow) Two `dagster job execute` runs (multiprocess executor) and a dask run (LocalCluster, 2
  workers) materialize partitions of the demo concurrently into one DuckLake; the tables equal
  those of an in-process run into a plain DuckDB file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableJob

from bridge_assets.ingest.assets import ingest_dataset
from bridge_assets.lake import ducklake, store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline.executors import dask_cluster_config, executor_from_env
from fixtures.killed_runs import complete, dagster_home, kill_in_the_write
from fixtures.paths import PROJECT_ROOT, lake_resources, location

TESTS = Path(__file__).resolve().parent
INGEST_TABLES = ("corpus", "queries", "original_qrels")


def table_rows(tables, where: str = "") -> dict[str, list[tuple]]:
    with store.connect(location()) as con:
        return {t: con.execute(f"select * exclude (dataset) from {t} {where} order by all").fetchall()
                for t in tables if store.table_exists(con, t)}


def test_the_executor_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("BRIDGE_EXECUTOR", raising=False)
    default = executor_from_env()  # multiprocess, each step forked from a server that preloaded us
    assert default.name == "multiprocess"
    assert default.apply_config_mapping({}).value["config"]["start_method"] == \
        {"forkserver": {"preload_modules": ["bridge_assets.definitions"]}}
    monkeypatch.setenv("BRIDGE_EXECUTOR", "in_process")
    assert executor_from_env() is dg.in_process_executor
    monkeypatch.setenv("BRIDGE_EXECUTOR", "dask")
    monkeypatch.setenv("BRIDGE_DASK_WORKERS", "3")
    assert executor_from_env().name == "dask"
    assert dask_cluster_config()["local"]["n_workers"] == 3
    monkeypatch.setenv("BRIDGE_DASK_SCHEDULER", "tcp://10.0.0.5:8786")
    assert dask_cluster_config() == {"existing": {"address": "tcp://10.0.0.5:8786"}}
    monkeypatch.setenv("BRIDGE_EXECUTOR", "celery")
    with pytest.raises(ValueError, match="multiprocess, dask, in_process"):
        executor_from_env()


def test_a_dask_local_cluster_runs_steps_on_two_workers_into_one_ducklake(ducklake_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_DASK_WORKERS", "2")
    monkeypatch.delenv("BRIDGE_DASK_SCHEDULER", raising=False)
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        recon = ReconstructableJob.for_file(str(TESTS / "dask_jobs.py"), "dask_parts_job")
        with dg.execute_job(recon, instance=instance) as result:
            assert result.success
            run_id = result.run_id
    with store.connect(location()) as con:
        parts = con.execute("select dataset, count(*), min(pid) from parts group by all order by all").fetchall()
        written = [s for s in ducklake.snapshots(con) if s.get("info", {}).get("run_id") == run_id]
    assert [(p, n) for p, n, _ in parts] == [("p0", 3), ("p1", 3), ("p2", 3), ("p3", 3)]
    assert len({pid for *_, pid in parts}) == 2  # two worker processes wrote
    assert len(written) == 4  # one snapshot per step, each naming the run


def test_kill_9_inside_a_ducklake_transaction_keeps_the_previous_partition(ducklake_lake, tmp_path):
    env = {"DAGSTER_HOME": str(dagster_home(tmp_path)), "BRIDGE_DATA_LAKE": str(ducklake_lake),
           "BRIDGE_STORAGE": "ducklake"}
    assert dg.materialize([ingest_dataset], partition_key="demo",
                          resources=lake_resources(ducklake_lake)).success
    fresh = table_rows(INGEST_TABLES)
    with store.connect(location()) as con:  # a state no run would write
        con.execute("update corpus set text = 'left by the previous run' where doc_id = (select min(doc_id) from corpus)")
        con.execute("delete from queries where query_id = (select min(query_id) from queries)")
        before_kill = ducklake.current_snapshot(con)
    previous = table_rows(INGEST_TABLES)
    assert previous != fresh

    kill_in_the_write("demo", env)
    assert table_rows(INGEST_TABLES) == previous
    with store.connect(location()) as con:
        assert ducklake.current_snapshot(con) == before_kill  # the killed commit left no snapshot
    complete("demo", env)  # the next run commits
    assert table_rows(INGEST_TABLES) == fresh


RETRIEVERS = """\
profile: offline
systems:
  bm25:
    kind: bm25
    profiles: [offline]
    parameters: {k1: 0.9, b: 0.4}
  bm25_rm3:
    kind: bm25
    profiles: [offline]
    parameters: {k1: 0.9, b: 0.4, rm3: {fb_terms: 10, fb_docs: 10, original_query_weight: 0.5}}
"""


def _job_execute(job: str, partition: dict[str, str], env: dict[str, str]) -> subprocess.Popen:
    key = "|".join(partition[d] for d in sorted(partition))
    tags = {"dagster/partition": key, **{f"dagster/partition/{d}": v for d, v in partition.items()}}
    return subprocess.Popen([sys.executable, "-m", "dagster", "job", "execute", "-m", "bridge_assets.definitions",
                             "-j", job, "--tags", json.dumps(tags)], cwd=PROJECT_ROOT,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_job_runs_and_a_dask_run_fill_one_ducklake_as_an_in_process_run_would(ducklake_lake, tmp_path, monkeypatch):
    registry = tmp_path / "retrievers.yaml"
    registry.write_text(RETRIEVERS)
    monkeypatch.setenv("BRIDGE_RETRIEVERS", str(registry))
    home = dagster_home(tmp_path)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"DAGSTER_HOME": str(home), "BRIDGE_DATA_LAKE": str(ducklake_lake), "BRIDGE_STORAGE": "ducklake",
           "BRIDGE_RETRIEVERS": str(registry)}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("retriever", ["bm25", "bm25_rm3"])
    # the dataset's corpus first (retrieval reads it)
    ingest = _job_execute("ingest_job", {"dataset": "demo"}, env)
    assert ingest.wait(600) == 0, ingest.stdout.read()[-3000:]

    started = time.monotonic()
    runs = [_job_execute("retrieval_job", {"dataset": "demo", "retriever": "bm25"}, env),
            _job_execute("retrieval_job", {"dataset": "demo", "retriever": "bm25_rm3"}, env),
            # the dask run re-ingests the demo: its asset's step, then its checks' step, in the
            # cluster's worker processes (two steps one after the other: which worker takes each
            # is dask's choice; steps at once on both workers: the fast test above)
            _job_execute("ingest_job", {"dataset": "demo"},
                         {**env, "BRIDGE_EXECUTOR": "dask", "BRIDGE_DASK_WORKERS": "2"})]
    logs = [run.communicate(timeout=900)[0] for run in runs]
    for run, log in zip(runs, logs):
        assert run.returncode == 0, log[-4000:]
    print(f"\nthree concurrent runs into one DuckLake: {time.monotonic() - started:.0f} s")
    assert re.search(r" - distributed\.\w+ - ", logs[2])  # dask's own log lines: its cluster ran
    # "time - dagster - DEBUG - job - run id - pid - [step - ]EVENT - ...": the steps ran in
    # processes other than the run's own (an in-process run logs every step from its pid)
    fields = [line.split(" - ") for line in logs[2].splitlines()]
    run_pid = next(f[5] for f in fields if len(f) > 6 and f[6] == "RUN_START")
    step_pids = {f[5] for f in fields if len(f) > 7 and f[7] == "STEP_START"}
    assert step_pids and run_pid not in step_pids, (run_pid, step_pids)

    lake_tables = table_rows([*INGEST_TABLES, "retrieval_run"], "where dataset = 'demo'")
    with store.connect(location()) as con:
        runs_in_lake = {s["info"].get("run_id") for s in ducklake.snapshots(con) if "info" in s}
    assert len(runs_in_lake) == 4  # one ingest before, then three runs at once

    # the same partitions in-process, into a plain DuckDB lake
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(plain))
    from bridge_assets.llm.resource import LLMResource
    from bridge_assets.retrieval.assets import retrieval_run

    resources = lake_resources(plain, llm=LLMResource(store=DuckDBStore(data_lake=str(plain))))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("retriever", ["bm25", "bm25_rm3"])
        assert dg.materialize([ingest_dataset], partition_key="demo", resources=resources, instance=instance).success
        for system in ("bm25", "bm25_rm3"):
            key = dg.MultiPartitionKey({"dataset": "demo", "retriever": system})
            assert dg.materialize([retrieval_run], partition_key=key, resources=resources,
                                  instance=instance).success
    assert table_rows([*INGEST_TABLES, "retrieval_run"], "where dataset = 'demo'") == lake_tables
