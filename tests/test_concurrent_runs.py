"""Runs of one dataset take turns (issue 59): the instance queues the daemon's runs per
dataset, a bridge command waits for another bridge command on the same dataset and for the
instance's runs of it, and says so. Real processes and a real Dagster instance."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import dagster as dg
import pytest
import yaml

from bridge_assets.orchestration import runs as orchestration
from bridge_assets.paths import PROJECT_ROOT
from fixtures import concurrent_calls
from fixtures.daemon import start_daemon, stop_daemon

SPAWN = multiprocessing.get_context("spawn")


def test_the_instance_queues_runs_of_one_dataset_behind_one_another(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: true\nretention: {}\n")  # the user's own
    orchestration.ensure_instance_config(home)
    written = yaml.safe_load((home / "dagster.yaml").read_text())
    assert written["telemetry"] == {"enabled": True} and written["retention"] == {}  # kept as written
    with dg.DagsterInstance.from_config(str(home)) as inst:  # as `make ui` and `bridge` load it
        coordinator = inst.run_coordinator
        assert type(coordinator).__name__ == "QueuedRunCoordinator"
        limits = coordinator.get_run_queue_config().tag_concurrency_limits
        assert {(limit["key"], limit["limit"]) for limit in limits} == {
            ("dagster/partition", 1), ("dagster/partition/dataset", 1)}
        assert all(limit["value"] == {"applyLimitPerUniqueValue": True} for limit in limits)


def test_a_second_command_on_a_dataset_waits_for_the_first_and_goes_on_when_it_dies(tmp_path):
    ready, said = SPAWN.Event(), SPAWN.Queue()
    first = SPAWN.Process(target=concurrent_calls.take_turn, args=(str(tmp_path), "demo", ready, said))
    first.start()
    assert ready.wait(60)
    told: list[str] = []
    got_turn = threading.Event()

    def second() -> None:
        with orchestration.dataset_turn(tmp_path, ["demo"], told.append):
            got_turn.set()

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(1.0)
    assert not got_turn.is_set()   # the first holds the dataset's turn
    assert told == ["another bridge command is running on dataset demo: waiting for it to finish"]
    with orchestration.dataset_turn(tmp_path, ["scifact"], told.append):
        pass                       # another dataset's turn is free
    os.kill(first.pid, signal.SIGKILL)  # its turn ends with it
    first.join()
    waiter.join(timeout=30)
    assert got_turn.is_set() and len(told) == 1


def test_a_command_waits_for_the_instances_run_of_its_dataset(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        other = inst.create_run_for_job(
            dg.GraphDefinition(name="g").to_job(), run_id="a1b2c3d4-0000-4000-8000-000000000000",
            tags={"dagster/partition": "demo", "dagster/from_automation_condition": "true"},
            status=dg.DagsterRunStatus.STARTED)
        inst.create_run_for_job(dg.GraphDefinition(name="h").to_job(), tags={"dagster/partition": "scifact"},
                                status=dg.DagsterRunStatus.STARTED)  # another dataset's: not waited for
        told: queue.Queue = queue.Queue()
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (orchestration.wait_for_other_runs(inst, ["demo"], told.put),
                                                  done.set()))
        waiter.start()
        assert told.get(timeout=30) == "waiting for run a1b2c3d4 (automation) on dataset demo to finish"
        time.sleep(0.5)
        assert not done.is_set()
        inst.report_run_failed(other)   # it ended (a killed worker marked FAILURE by the monitor)
        waiter.join(timeout=30)
        assert done.is_set() and told.empty()


def test_a_command_waits_for_a_queued_run_of_its_dataset_while_a_daemon_runs_the_queue(tmp_path):
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._daemon.types import DaemonHeartbeat

    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        # a run the daemon queued: queued runs name where their code lives
        origin = RemoteJobOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name="bridge_assets.definitions")), "__repository__"), "g")
        queued = inst.create_run_for_job(dg.GraphDefinition(name="g").to_job(), remote_job_origin=origin, tags={
            "dagster/partition": "demo", "dagster/sensor_name": "human_labels_sensor"},
            status=dg.DagsterRunStatus.QUEUED)
        told: list[str] = []
        orchestration.wait_for_other_runs(inst, ["demo"], told.append)  # no daemon: it would never start
        assert told == []
        inst.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "QUEUED_RUN_COORDINATOR", "d", None))
        heard: queue.Queue = queue.Queue()
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (orchestration.wait_for_other_runs(inst, ["demo"], heard.put),
                                                  done.set()))
        waiter.start()
        assert heard.get(timeout=30) == f"waiting for run {queued.run_id[:8]} (human_labels_sensor) on dataset demo to finish"
        time.sleep(0.5)
        assert not done.is_set()
        inst.report_run_failed(queued)
        waiter.join(timeout=30)
        assert done.is_set()


def test_a_queued_automatic_run_whose_assets_another_run_computed_ends_without_computing(data_lake, tmp_path,
                                                                                          monkeypatch):
    """While an automation run waits for its dataset's turn, another door computes its assets:
    the launcher does not start it; it ends SUCCESS, saying why. One with work left starts."""
    from dagster._core.launcher import LaunchRunContext

    from bridge_assets.definitions import defs
    from bridge_assets.orchestration.run_launcher import BridgeRunLauncher

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    orchestration.materialize(["corpus"], "demo")
    inst = orchestration.instance()
    keys = {dg.AssetKey("corpus"), dg.AssetKey("queries"), dg.AssetKey("original_qrels")}  # one multi-asset
    tags = {"dagster/partition": "demo", "dagster/from_automation_condition": "true"}
    job = defs.resolve_implicit_global_asset_job_def()
    waited = inst.create_run_for_job(job, tags=tags, asset_selection=frozenset(keys))
    assert orchestration.left_to_do(inst, waited) == []
    more = inst.create_run_for_job(job, tags=tags, asset_selection=frozenset(keys | {dg.AssetKey("candidate_pool")}))
    assert orchestration.left_to_do(inst, more) == ["candidate_pool"]

    launcher = BridgeRunLauncher()
    launcher.register_instance(inst)
    before = inst.fetch_materializations(dg.AssetKey("corpus"), limit=10).records
    launcher.launch_run(LaunchRunContext(dagster_run=waited, workspace=None))
    assert inst.get_run_by_id(waited.run_id).status == dg.DagsterRunStatus.SUCCESS
    assert inst.fetch_materializations(dg.AssetKey("corpus"), limit=10).records == before
    said = [e.message for e in inst.all_logs(waited.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)]
    assert any("every asset of this run is up to date" in message for message in said)


def test_inside_a_run_no_person_forced_a_current_asset_is_reported_again_not_computed(data_lake, tmp_path,
                                                                                     monkeypatch):
    """staleness.reuse_when_current: in `bridge run`'s runs (and automation's, sensors'), an
    asset whose partition is current reports its last materialization again, marked
    reused_from_run; a run a person forced (the UI, `bridge materialize`) computes it."""
    from bridge_assets.definitions import defs
    from bridge_assets.pipeline.staleness import ONLY_WHAT_CHANGED_TAG, REUSED_KEY

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    first = orchestration.materialize(["corpus"], "demo")
    computed_in = first.results[-1].run_id
    inst = orchestration.instance()
    job = defs.resolve_implicit_global_asset_job_def()
    keys = [dg.AssetKey("corpus"), dg.AssetKey("queries"), dg.AssetKey("original_qrels")]

    def metadata(result: dg.ExecuteInProcessResult) -> dict:
        [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey("corpus")]
        return {name: value.value for name, value in event.materialization.metadata.items()}

    again = job.execute_in_process(instance=inst, asset_selection=keys, partition_key="demo",
                                   tags={ONLY_WHAT_CHANGED_TAG: "true"})
    assert metadata(again)[REUSED_KEY] == computed_in
    forced = job.execute_in_process(instance=inst, asset_selection=keys, partition_key="demo")
    assert REUSED_KEY not in metadata(forced)


def test_a_run_whose_worker_was_killed_is_failed_not_waited_for(tmp_path):
    from dagster._core.events import EngineEventData

    from bridge_assets.orchestration.run_launcher import BridgeRunLauncher, WorkerStatus

    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        worker = SPAWN.Process(target=time.sleep, args=(600,))
        worker.start()
        run = inst.create_run_for_job(dg.GraphDefinition(name="g").to_job(), tags={"dagster/partition": "demo"},
                                      status=dg.DagsterRunStatus.STARTED)
        # what a run worker reports first (dagster's `api execute_run`, or the in-process executor)
        inst.report_engine_event(f"Started process for run (pid: {worker.pid}).", run,
                                 EngineEventData.in_process(worker.pid))
        launcher = BridgeRunLauncher()
        launcher.register_instance(inst)
        assert launcher.supports_check_run_worker_health
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        health = launcher.check_run_worker_health(run)   # what run monitoring polls
        assert health.status == WorkerStatus.FAILED and str(worker.pid) in health.msg
        told: list[str] = []
        orchestration.wait_for_other_runs(inst, ["demo"], told.append)  # returns: nothing alive
        assert inst.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        assert told == [f"run {run.run_id[:8]} was marked failed: its worker process (pid {worker.pid}) is gone"]


@pytest.mark.slow
def test_the_daemon_marks_a_killed_command_line_run_failed_within_a_minute(tmp_path):
    """A real daemon on the generated instance config: a `bridge materialize` killed -9 while its
    run writes (paused before the commit by the test hook) is FAILURE within the monitoring
    poll (30 s), not STARTED forever (~45 s here)."""
    lake = tmp_path / "lake"
    env = {**os.environ, "BRIDGE_DATA_LAKE": str(lake), "BRIDGE_TEST_PAUSE_IN_WRITE": "120"}
    env.pop("DAGSTER_HOME", None)
    subprocess.run([sys.executable, "-c", "from bridge_assets.orchestration import runs; runs.instance()"],
                   cwd=PROJECT_ROOT, env=env, check=True)  # the lake's home, its config written
    env["DAGSTER_HOME"] = str(lake / "dagster_home")
    daemon = start_daemon(env)
    try:
        command = subprocess.Popen([sys.executable, "-m", "bridge_assets.cli", "materialize", "-d", "demo", "corpus"],
                                   cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as inst:
            deadline = time.monotonic() + 120
            while not (started := inst.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))):
                assert time.monotonic() < deadline and command.poll() is None
                time.sleep(0.5)
            time.sleep(3)
            command.kill()
            command.wait()
            killed = time.monotonic()
            while inst.get_run_by_id(started[0].run_id).status == dg.DagsterRunStatus.STARTED:
                assert time.monotonic() - killed < 90, "still STARTED"
                time.sleep(1)
            assert inst.get_run_by_id(started[0].run_id).status == dg.DagsterRunStatus.FAILURE
            assert time.monotonic() - killed < orchestration.RUN_MONITORING_SECONDS + 30
    finally:
        stop_daemon(daemon)
