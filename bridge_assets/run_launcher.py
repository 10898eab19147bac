"""Telling a run whose worker died from one still computing.

Dagster's default launcher starts each run's worker as a local process but cannot say whether
that process still lives, so a run whose worker was killed stays STARTED forever (and would
hold its dataset's turn in the run queue). Every run worker, the daemon's and the command
line's in-process runs alike, reports its pid in the run's event log; `BridgeRunLauncher` is
the default launcher plus a health check on that pid, which Dagster's run monitoring (on in
the instance config: orchestration.INSTANCE_CONFIG) polls to mark such runs FAILURE.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

from bridge_assets import processes


def worker_pid(inst: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid its worker reported for the run (the latest), or None before it did."""
    records = inst.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    for record in reversed(records):
        data = record.event_log_entry.dagster_event.event_specific_data
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

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        pid = worker_died(self._instance, run)
        if pid is not None:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's worker process (pid {pid}) is gone")
        return CheckRunHealthResult(WorkerStatus.RUNNING)
