"""`bridge run` runs only what is out of date, and the benchmark keeps itself current under a
real Dagster daemon, with no command in between.

After the first run, a second `bridge run` launches no run at all and says nothing changed; a
changed retriever entry re-runs that system's partition and what depends on it, nothing else.
Then, under the daemon: a TREC run file dropped into the runs folder becomes a system (run-files sensor), its run is
materialized, and automation brings the dataset's pool, labels, qrels, metrics and report up to
date; its new pairs stay pending (the dataset's automation cap is 0 LLM calls per run). Then
votes arrive for one pending pair and the votes sensor puts them into the qrels and metrics
while the other pairs still wait. (That `bridge run` then labels what the cap deferred, and
that a cap above 0 holds over a run's steps: tests/test_main_job_costs.py, scripted model.)

One real daemon (`dagster-daemon run` on a temporary instance and lake), the real model
(qwen-0.5b) for the explicit first run only, tiny sizes. It prints its timeline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import dagster as dg
import duckdb
import pytest
import yaml

from bridge_assets.definitions import defs
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote
from bridge_assets.lake import store
from bridge_assets.llm import get_profile, weights
from bridge_assets.llm.budget import DEFERRED
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR
from fixtures.daemon import start_daemon, stop_daemon
from fixtures.paths import annotations, location

pytest.importorskip("llama_cpp")

MODEL = "qwen-0.5b"
DATASET = "tiny"
PIPELINE = {
    "candidate_pool": {"depth": 1, "query_limit": 3},
    "filtered_pool": {"models": [MODEL]},
    "debate_labels": {"models": [MODEL], "rounds": 1, "reason_words": 15},
    "rag_answers": {"model": MODEL, "query_limit": 1, "max_tokens": 16, "systems": ["bm25"]},
    "rag_judgments": {"model": MODEL},
    "significance": {"resamples": 200},
    "partial_annotation_study": {"samples": 20, "sweep_samples": 2},
    # the student retrains whenever verified labels change (four times here): one short epoch
    "student_annotator": {"epochs": 1, "max_length": 64},
}


@pytest.fixture
def tiny(tmp_path, data_lake):
    """Environment of a registry folder with dataset `tiny` (the demo's files, tiny settings,
    automation cap 0), a BM25-only retriever profile, sensors ticking every 5 s and a Dagster
    home whose daemon runs each step in its run's process."""
    weights.provision(get_profile(MODEL))
    registry = tmp_path / "registry"
    (registry / "runs" / DATASET).mkdir(parents=True)
    (registry / "datasets.yaml").write_text(yaml.safe_dump({"datasets": {DATASET: {
        "kind": "beir", "path": str(RESOURCES_DIR / "data" / "demo"), "split": "test",
        "pipeline": PIPELINE, "automation": {"llm_calls_per_run": 0}}}}))
    retrievers = yaml.safe_load((RESOURCES_DIR / "retrievers.yaml").read_text())
    retrievers.update(profile="tiny", systems={name: {**retrievers["systems"][name], "profiles": ["tiny"]}
                                               for name in ("bm25", "bm25_rm3")})
    (tmp_path / "retrievers.yaml").write_text(yaml.safe_dump(retrievers))
    home = tmp_path / "dagster_home"
    orchestration.ensure_instance_config(home)  # as `make ui` writes it: the run queue per dataset, run monitoring
    env = {**os.environ, "BRIDGE_REGISTRY_DIR": str(registry), "DAGSTER_HOME": str(home),
           "BRIDGE_RETRIEVERS": str(tmp_path / "retrievers.yaml"), "BRIDGE_EXECUTOR": "in_process",
           "BRIDGE_DATA_LAKE": str(data_lake),
           # the sensors tick every 5 s rather than every minute: the same ticks, less waiting
           "BRIDGE_SENSOR_INTERVAL_S": "5"}
    env.pop("BRIDGE_RETRIEVER_PROFILE", None)
    return env, registry, tmp_path / "retrievers.yaml", home


def bridge(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "bridge_assets.cli", *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def query(lake, sql: str) -> list[tuple]:
    with store.connect(location(lake)) as con:
        return con.execute(sql).fetchall()


def wait_until(what: str, check: Callable[[], bool], started: float, timeline: list[str],
               timeout_s: float = 420) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                timeline.append(f"{time.monotonic() - started:6.0f} s  {what}")
                return
        except (duckdb.Error, FileNotFoundError, IndexError):  # not written yet, or being committed
            pass
        time.sleep(3)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}\n" + "\n".join(timeline))


def materialized_since(instance: dg.DagsterInstance, runs_before: set[str]) -> set[tuple[str, str]]:
    """(asset, partition) materialized by the runs made since `runs_before`."""
    found = set()
    for run in instance.get_runs():
        if run.run_id in runs_before:
            continue
        for event in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            materialization = event.dagster_event.event_specific_data.materialization
            found.add((materialization.asset_key.to_user_string(), str(materialization.partition)))
    return found


def test_only_what_changed_runs_and_the_daemon_keeps_the_benchmark_current(tiny, data_lake, tmp_path):
    env, registry, retrievers_file, home = tiny
    timeline: list[str] = []
    test_started = time.monotonic()

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - test_started:6.0f} s  {what}")

    bridge(env, "run", "--dataset", DATASET)  # the explicit first run: real model calls
    mark("first bridge run (real model)")
    calls_before = query(data_lake, "select count(*) from llm_calls")[0][0]
    assert calls_before > 0
    instance = dg.DagsterInstance.from_config(str(home))

    # nothing changed: no run at all
    runs = {run.run_id for run in instance.get_runs()}
    assert "nothing changed" in bridge(env, "run", "--dataset", DATASET)
    assert {run.run_id for run in instance.get_runs()} == runs
    # the same from a copy of the lake folder (cp -a): its catalog follows it
    copy = tmp_path / "lake_copy"
    shutil.copytree(data_lake, copy, symlinks=True)
    assert "nothing changed" in bridge({**env, "BRIDGE_DATA_LAKE": str(copy)}, "run", "--dataset", DATASET)
    assert {run.run_id for run in instance.get_runs()} == runs
    mark("two runs: nothing changed")

    # bm25's entry changed: its partition and what depends on it run again, nothing else
    retrievers = yaml.safe_load(retrievers_file.read_text())
    retrievers["systems"]["bm25"]["parameters"]["k1"] = 1.2
    retrievers_file.write_text(yaml.safe_dump(retrievers))
    bridge(env, "run", "--dataset", DATASET)
    mark("bm25 changed: its partition and what depends on it")
    again = materialized_since(instance, runs)
    assert ("retrieval_run", f"{DATASET}|bm25") in again
    assert ("retrieval_run", f"{DATASET}|bm25_rm3") not in again
    graph = defs.resolve_asset_graph()
    downstream = {k.to_user_string() for k in
                  dg.AssetSelection.assets("retrieval_run").downstream(include_self=False).resolve(graph)}
    assert {asset for asset, _ in again} - {"retrieval_run"} <= downstream
    assert ("retrieval_metrics", DATASET) in again  # it reads every run: bm25's scores changed
    calls_before = query(data_lake, "select count(*) from llm_calls")[0][0]
    # an external system that ranks first what BM25 ranks fifth: new pairs in the pool
    fifth = query(data_lake, f"select query_id, doc_id from retrieval_run where dataset = '{DATASET}' "
                             "and retriever = 'bm25' and rank = 5 order by query_id")
    (registry / "runs" / DATASET / "ext.trec").write_text(
        "".join(f"{q} Q0 {d} 1 9.5 ext\n" for q, d in fifth))

    log = open(tmp_path / "daemon.log", "w")
    daemon = start_daemon(env, log)
    mark("daemon started")
    try:
        metrics_of_ext = f"select count(*) from retrieval_metrics where dataset = '{DATASET}' and retriever = 'ext'"
        wait_until("retrieval_run of ext", lambda: query(
            data_lake, "select count(*) from retrieval_run where retriever = 'ext'")[0][0] > 0, test_started, timeline)
        wait_until("candidate_pool holds ext's pairs", lambda: query(
            data_lake, "select count(*) from candidate_pool where list_contains(systems, 'ext')")[0][0] > 0,
            test_started, timeline)
        wait_until("retrieval_metrics, ranking_shift and the report hold ext", lambda: (
            query(data_lake, metrics_of_ext)[0][0] > 0
            and query(data_lake, "select count(*) from ranking_shift where retriever = 'ext'")[0][0] > 0
            and "ext" in (data_lake / "reports" / DATASET / "report.md").read_text()), test_started, timeline)

        # the new pairs wait for people: their calls were deferred (cap 0), none was made
        new_pairs = query(data_lake, f"""
            select c.query_id, c.doc_id from candidate_pool c where c.dataset = '{DATASET}'
              and c.systems = ['ext'] and not c.in_original_qrels""")
        assert new_pairs
        sources = dict(((q, d), s) for q, d, s in query(
            data_lake, f"select query_id, doc_id, source from bridge_qrels where dataset = '{DATASET}'"))
        assert all(sources[pair] == "pending" for pair in new_pairs)
        errors = {e for (e,) in query(data_lake, f"select distinct error from filter_votes where dataset = "
                                                 f"'{DATASET}' and error is not null")}
        assert errors == {DEFERRED}
        assert query(data_lake, "select count(*) from llm_calls")[0][0] == calls_before

        # three votes on one pending pair: in the qrels and the metrics, the others still pending
        voted = new_pairs[0]
        with annotations(data_lake) as con:
            ensure_schema(con)
            for annotator in ("ann", "bob", "cid"):
                insert_vote(con, dataset=DATASET, query_id=voted[0], doc_id=voted[1], annotator_id=annotator,
                            label=1, comment=None, with_history=True, is_attention_check=False,
                            expected_label=None, status="accepted", source="test")
        wait_until("the votes are in bridge_qrels (source human)", lambda: query(
            data_lake, f"select source from bridge_qrels where dataset = '{DATASET}' and query_id = "
                       f"'{voted[0]}' and doc_id = '{voted[1]}'")[0][0] == "human", test_started, timeline)
        wait_until("retrieval_metrics rebuilt after the votes", lambda: query(
            data_lake, f"select count(*) from retrieval_metrics where dataset = '{DATASET}' and retriever = "
                       "'ext' and qrels_version = 'refined' and measure = 'hole_10' and query_id = 'all' "
                       "and value > 0")[0][0] > 0, test_started, timeline)
    finally:
        stop_daemon(daemon)
        log.close()
        mark("daemon stopped")
        print("\n".join(["timeline (from the test's start):", *timeline]))

