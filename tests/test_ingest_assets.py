"""Ingest assets end to end: tables in DuckDB, asset checks, atomic failure, parallel writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dagster as dg
import pytest

from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.ingest import checks as ingest_checks
from bridge_assets.lake import store
from fixtures.datasets import write_beir
from fixtures.paths import PROJECT_ROOT, lake_resources, location, shared_data

CHECKS = [ingest_checks.ingest_tables_are_valid]  # corpus_is_valid, queries_are_valid, original_qrels_are_valid


def materialize_demo(lake, selection=None):
    # checks read whole tables, so a checks-only run needs no partition
    return dg.materialize([ingest_assets.ingest_dataset, *CHECKS],
                          partition_key=None if selection else "demo",
                          resources=lake_resources(lake), selection=selection,
                          raise_on_error=False)


def check_results(result):
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def test_ingest_writes_tables_named_after_assets_and_checks_pass(data_lake):
    result = materialize_demo(data_lake)
    assert result.success
    assert check_results(result) == {"corpus_is_valid": True, "queries_are_valid": True,
                                     "original_qrels_are_valid": True}
    with store.connect(location(data_lake)) as con:
        queries = con.execute("select count(*) from queries where dataset = 'demo'").fetchone()[0]
        qrels = con.execute("select count(*) from original_qrels where dataset = 'demo'").fetchone()[0]
        docs = con.execute("select count(*) from corpus where dataset = 'demo'").fetchone()[0]
    assert queries == qrels and docs > 200
    # materializing again replaces the partition instead of appending to it
    assert materialize_demo(data_lake).success
    with store.connect(location(data_lake)) as con:
        assert con.execute("select count(*) from corpus").fetchone()[0] == docs


@pytest.mark.parametrize("corruption, failing_check", [
    ("insert into corpus select * from corpus limit 1", "corpus_is_valid"),
    ("update queries set answers = [] where query_id = (select min(query_id) from queries)",
     "queries_are_valid"),
    ("update original_qrels set doc_id = 'no-such-doc' where query_id = "
     "(select min(query_id) from original_qrels)", "original_qrels_are_valid"),
])
def test_asset_check_fails_on_a_corrupted_table(data_lake, corruption, failing_check):
    assert materialize_demo(data_lake).success
    with store.connect(location(data_lake)) as con:
        con.execute(corruption)
    result = materialize_demo(data_lake, selection=dg.AssetSelection.checks(*CHECKS))
    outcomes = check_results(result)
    assert outcomes[failing_check] is False
    assert all(passed for name, passed in outcomes.items() if name != failing_check)


def bridge_cli(*args, env_extra=None, timeout=300):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "bridge_assets.cli", *args], capture_output=True,
                          text=True, env=env, cwd=PROJECT_ROOT, timeout=timeout)


def test_bad_input_fails_the_run_naming_the_line_and_keeps_previous_tables(tmp_path, data_lake):
    folder = write_beir(tmp_path / "mine")
    registry = tmp_path / "datasets.yaml"
    registry.write_text(f"datasets:\n  mine:\n    kind: beir\n    path: {folder}\n")
    env = {"BRIDGE_DATASETS": str(registry), "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    first = bridge_cli("materialize", "--dataset", "mine", "corpus", env_extra=env)
    assert first.returncode == 0, first.stderr
    write_beir(folder, corpus=[{"_id": "d1", "text": "changed"}, '{"_id": "d2", "text": '])
    second = bridge_cli("materialize", "--dataset", "mine", "corpus", env_extra=env)
    assert second.returncode != 0
    assert "corpus.jsonl, line 2: malformed JSON" in second.stderr
    with store.connect(location(data_lake)) as con:
        assert con.execute("select text from corpus where doc_id = 'd1'").fetchone()[0] == \
            "Paris is the capital of France."
        assert con.execute("select count(*) from queries").fetchone()[0] == 2
    unknown = bridge_cli("materialize", "--dataset", "nope", env_extra=env)
    assert unknown.returncode == 2 and "unknown dataset 'nope'" in unknown.stderr


def test_parallel_partitions_with_the_multiprocess_executor_share_the_duckdb_file(tmp_path, data_lake):
    """Two dataset partitions materialized at once by two runs, each with the multiprocess
    executor (steps in child processes): the second writer waits for DuckDB's file lock
    instead of failing on it."""
    shared_data("nq_open_mini")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").touch()
    dg.DagsterInstance.from_config(str(home)).dispose()  # create its storage once, before the race
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    runs = [subprocess.Popen([sys.executable, "-m", "dagster", "job", "execute", "-m",
                              "bridge_assets.definitions", "-j", "ingest_job",
                              "--tags", json.dumps({"dagster/partition": partition})],
                             cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for partition in ("nq_open_mini", "demo")]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
        assert "multiprocess" in output and "RUN_SUCCESS" in output
    # what the runs did, from the instance's event log (a step process's last console lines can
    # be lost when it exits under load; its events are not)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        finished = instance.get_runs()
        assert sorted(r.tags["dagster/partition"] for r in finished) == ["demo", "nq_open_mini"]
        for finished_run in finished:
            assert finished_run.status == dg.DagsterRunStatus.SUCCESS

            def events(kind, run_id=finished_run.run_id):
                return instance.all_logs(run_id, of_type=kind)

            # a step is a process: the three checks share one (ingest/checks.py)
            assert {e.step_key for e in events(dg.DagsterEventType.STEP_START)} == \
                {"ingest_dataset", "ingest_tables_are_valid"}
            assert len({e.step_key for e in events(dg.DagsterEventType.STEP_WORKER_STARTED)}) == 2
            checks = events(dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            assert sorted(e.dagster_event.event_specific_data.check_name for e in checks) == \
                ["corpus_is_valid", "original_qrels_are_valid", "queries_are_valid"]
            assert all(e.dagster_event.event_specific_data.passed for e in checks)
    with store.connect(location(data_lake)) as con:
        counts = dict(con.execute("select dataset, count(*) from queries group by 1").fetchall())
    assert counts["nq_open_mini"] == 2655 and counts["demo"] >= 10


def test_datasets_list_shows_counts_once_ingested(tmp_path, data_lake):
    env = {"DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    assert materialize_demo(data_lake).success
    listing = bridge_cli("datasets", "list", env_extra=env)
    assert listing.returncode == 0, listing.stderr
    demo_line = next(line for line in listing.stdout.splitlines() if line.startswith("demo"))
    assert "beir" in demo_line and "resources/data/demo" in demo_line
