"""Telling a run whose worker died from one still computing.

Dagster's default launcher starts each run's worker as a local process but cannot say whether
that process still lives, so a run whose worker was killed stays STARTED forever (and would
hold its dataset's turn in the run queue). Every run worker, the daemon's and the command
line's in-process runs alike, reports its pid in the run's event log; `BridgeRunLauncher` is
the default launcher plus a health check on that pid, which Dagster's run monitoring (on in
the instance config: orchestration.INSTANCE_CONFIG) polls to mark such runs FAILURE.

It also does not start a run that automation, a sensor or a schedule queued when every asset it
would materialize became up to date while it waited for its dataset's turn (another door's run
computed them): the run ends SUCCESS at once, saying so, instead of computing them again.
"""

from __future__ import annotations

import logging

import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

from bridge_assets import processes

log = logging.getLogger(__name__)
# Runs no person asked for: when they find nothing to do, nobody expects them to compute.
AUTOMATIC_TAGS = ("dagster/from_automation_condition", "dagster/sensor_name", "dagster/schedule_name")


def worker_pid(inst: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid its worker reported for the run (the latest), or None before it did."""
    records = inst.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    for record in reversed(records):
        event = record.event_log_entry.dagster_event
        data = event.event_specific_data if event is not None else None
        pid = (getattr(data, "metadata", None) or {}).get("pid")
        if pid is not None:
            return int(pid.value)
    return None


def worker_died(inst: dg.DagsterInstance, run: dg.DagsterRun) -> int | None:
    """The pid of the run's worker when that process is gone; None while it lives or has not
    started yet."""
    pid = worker_pid(inst, run.run_id)
    return pid if pid is not None and not processes.alive(pid) else None


class BridgeRunLauncher(DefaultRunLauncher):
    """The default launcher, whose runs' worker health run monitoring can check."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if any(run.tags.get(tag) for tag in AUTOMATIC_TAGS) and self._nothing_left(run):
            self._instance.report_engine_event(
                "not started: every asset of this run is up to date (another run computed it while "
                "this one waited for its dataset's turn)", run)
            self._instance.report_dagster_event(
                DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name,
                             message="nothing left to do"), run_id=run.run_id)
            return
        super().launch_run(context)

    def _nothing_left(self, run: dg.DagsterRun) -> bool:
        from bridge_assets.orchestration.runs import left_to_do

        try:
            return left_to_do(self._instance, run) == []
        except Exception as exc:  # when in doubt, run it; the run's log says why it was checked in vain
            log.exception("could not tell whether run %s is up to date; starting it", run.run_id)
            self._instance.report_engine_event(
                f"could not tell whether this run is up to date ({type(exc).__name__}: {exc}); started it", run)
            return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        pid = worker_died(self._instance, run)
        if pid is not None:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's worker process (pid {pid}) is gone")
        return CheckRunHealthResult(WorkerStatus.RUNNING)
