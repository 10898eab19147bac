"""Issue 59's target with every door open at once, on the scripted demo under a real daemon:
a run file dropped into the runs folder (the run-files sensor, then automation, capped at 2
LLM calls per run), an explicit `bridge run --dataset demo`, and votes on an escalated pair
(the votes sensor), all started together. The Dagster event log shows no partition computed
twice from the same inputs, each LLM call was sent once (distinct keys = ledger rows = calls
the server answered), and the new system and the votes reached the benchmark.

Slow (a real daemon, about five minutes): `pytest -m slow tests/test_concurrent_doors.py -s`
prints the runs each door launched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import dagster as dg
import duckdb
import pytest

from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote
from bridge_assets.lake import store
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.paths import PROJECT_ROOT
from fixtures.daemon import start_daemon, stop_daemon
from fixtures.event_log import computed, computed_twice, origin
from fixtures.paths import annotations, location
from fixtures.scripted_demo import script, write_registry
from fixtures.scripted_llm import ScriptedServer

pytestmark = pytest.mark.slow

CAP = 2
QUIET_S = 45  # longer than the daemon's automation tick (30 s) and the sensors' (5 s here)


@pytest.fixture
def doors(data_lake, tmp_path):
    home = tmp_path / "dagster_home"
    orchestration.ensure_instance_config(home)  # as `make ui` writes it
    with ScriptedServer(script) as server:
        registry = write_registry(tmp_path / "registry", server.url, automation={"llm_calls_per_run": CAP})
        (registry / "runs" / "demo").mkdir(parents=True)
        env = {**os.environ, "BRIDGE_REGISTRY_DIR": str(registry), "DAGSTER_HOME": str(home),
               "BRIDGE_EXECUTOR": "in_process", "BRIDGE_DATA_LAKE": str(data_lake),
               "BRIDGE_SENSOR_INTERVAL_S": "5"}
        for name in ("BRIDGE_RETRIEVER_PROFILE", "BRIDGE_RETRIEVERS"):
            env.pop(name, None)
        yield env, registry, home, server


def query(lake, sql: str) -> list[tuple]:
    with store.connect_read_only(location(lake)) as con:
        return con.execute(sql).fetchall()


def bridge_run(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bridge_assets.cli", "run", "--dataset", "demo"],
                            cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(what: str, check, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (duckdb.Error, FileNotFoundError, IndexError):  # not written yet, or being committed
            pass
        time.sleep(2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def test_automation_a_bridge_run_and_the_votes_sensor_together_compute_each_partition_once(doors, data_lake):
    env, registry, home, server = doors
    first = bridge_run(env)
    output = first.communicate(timeout=900)[0]
    assert first.returncode == 0, output[-3000:]
    escalated = query(data_lake, "select query_id, doc_id from debate_labels where dataset = 'demo' and "
                                 "outcome in ('escalated', 'failed') order by all limit 1")
    assert escalated, "the script escalates some pairs"
    instance = dg.DagsterInstance.from_config(str(home))
    before = {run.run_id for run in instance.get_runs()}
    hits_before = server.hits

    # an external system that ranks first what BM25 ranks fifth: new pairs for the pool
    fifth = query(data_lake, "select query_id, doc_id from retrieval_run where dataset = 'demo' and "
                             "retriever = 'bm25' and rank = 5 order by query_id")
    daemon = start_daemon(env)
    try:
        (registry / "runs" / "demo" / "ext.trec").write_text("".join(f"{q} Q0 {d} 1 9.5 ext\n" for q, d in fifth))
        wait_until("the run-files sensor registered ext", lambda: "ext:" in (registry / "retrievers.yaml").read_text())
        second = bridge_run(env)  # beside automation's runs of ext's partition and what follows
        with annotations(data_lake) as con:  # the votes sensor, beside both
            ensure_schema(con)
            for annotator in ("ann", "bob", "cid"):
                insert_vote(con, dataset="demo", query_id=escalated[0][0], doc_id=escalated[0][1],
                            annotator_id=annotator, label=1, comment=None, with_history=True,
                            is_attention_check=False, expected_label=None, status="accepted", source="test")
        output = second.communicate(timeout=900)[0]
        assert second.returncode == 0, output[-3000:]
        print("the second bridge run said (its last lines):\n" + "\n".join(output.splitlines()[-25:]))
        wait_until("ext is scored and the votes are in the qrels", lambda: (
            query(data_lake, "select count(*) from retrieval_metrics where dataset = 'demo' and retriever = 'ext'")[0][0]
            and query(data_lake, f"select source from bridge_qrels where dataset = 'demo' and query_id = "
                                 f"'{escalated[0][0]}' and doc_id = '{escalated[0][1]}'")[0][0] == "human"))
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S:  # until no door has anything left to do
            time.sleep(3)
            if instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, *orchestration.ACTIVE_RUNS])):
                quiet_since = time.monotonic()
    finally:
        stop_daemon(daemon)

    runs = [run for run in instance.get_runs() if run.run_id not in before]
    records = computed(instance, before)
    print(f"\n{len(runs)} runs since the doors opened; computed by door: "
          f"{dict(Counter(r.origin for r in records if not r.reused))}, reported again without computing: "
          f"{dict(Counter(r.origin for r in records if r.reused))}")
    for run in reversed(runs):
        assets = sorted({r.asset for r in records if r.run_id == run.run_id})
        print(f"  {run.run_id[:8]} {run.status.value:<8} {origin(run):<20} {', '.join(assets)}")
    assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs), [(r.run_id, r.status) for r in runs]
    twice = computed_twice(records)
    assert not twice, "computed twice from the same inputs:\n" + "\n".join(f"  {a}  then  {b}" for a, b in twice)

    rows, keys = query(data_lake, "select count(*), count(distinct key) from llm_calls")[0]
    assert rows == keys == server.hits, (rows, keys, server.hits)
    assert server.hits > hits_before  # ext's new pairs were labelled
