"""Run assets from the command line the way the UI does: on the Dagster instance in
$DAGSTER_HOME (default `<data lake>/dagster_home`), so runs, partitions and lineage show in
the UI afterwards.

`materialize` is the command line's one way in (`bridge run`, `bridge materialize`, `bridge
runs import`, `bridge qrels import`): it plans the steps, runs them in process, and raises the
asset's own error when one fails. The settings each asset runs with are resolved inside the
run (bridge_assets.pipeline.asset_config), so the command line passes only what its user typed. With
`stale_only`, a partition runs only when it is missing, Dagster marks it stale (an upstream
data version or code version changed), its settings changed, or an input outside the lake
changed (the dataset's files or entry, a retriever's registry entry, the votes, imported
judgments)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from bridge_assets.errors import AssetError, DatasetError
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.budget import BudgetExceeded
from bridge_assets.pipeline import staleness

# Dagster's tags naming a run's partition: a dataset's, or the dataset dimension of a
# retriever x dataset partition.
DATASET_TAGS = ("dagster/partition", "dagster/partition/dataset")
LOG_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
# Failures the command line reports itself in one message (a budget stop is an expected end,
# not a crash; bad input names its file, line and field): its console log leaves out their
# failure events, Dagster's stack traces included.
REPORTED_BY_CLI = frozenset({BudgetExceeded.__name__, DatasetError.__name__})


class _ReportedByCli(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "dagster_meta", {}).get("dagster_event")
        error = getattr(getattr(event, "event_specific_data", None), "error", None)
        while error is not None:  # the asset's own error is a cause of Dagster's
            if error.cls_name in REPORTED_BY_CLI:
                return False
            error = error.cause
        return True


@dg.logger(dg.colored_console_logger.config_schema,
           description="Dagster's colored console log, less the failures the command line reports.")
def console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    logger = dg.colored_console_logger.logger_fn(init_context)
    logger.addFilter(_ReportedByCli())
    return logger


# What BRIDGE needs of the Dagster instance (`make ui`'s and the command line's): runs that
# compute the same dataset's partitions queue behind one another (the daemon's run queue, one
# run per value of Dagster's partition tags); a run whose worker process died is marked
# FAILURE by the daemon's run monitoring within RUN_MONITORING_SECONDS; no telemetry.
RUN_MONITORING_SECONDS = 30
INSTANCE_CONFIG: dict[str, Any] = {
    "telemetry": {"enabled": False},
    "run_launcher": {"module": "bridge_assets.orchestration.run_launcher", "class": "BridgeRunLauncher"},
    "run_monitoring": {"enabled": True, "poll_interval_seconds": RUN_MONITORING_SECONDS,
                       "max_resume_run_attempts": 0},
    "run_coordinator": {
        "module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
        "config": {"tag_concurrency_limits": [
            {"key": tag, "value": {"applyLimitPerUniqueValue": True}, "limit": 1} for tag in DATASET_TAGS]},
    },
}


# Sections an earlier BRIDGE wrote, replaced by today's: they were ours, not the user's (the run
# launcher's module moved into bridge_assets.orchestration).
SUPERSEDED: dict[str, list[dict[str, Any]]] = {
    "run_launcher": [{"module": "bridge_assets.run_launcher", "class": "BridgeRunLauncher"}],
}


def ensure_instance_config(home: str | os.PathLike) -> Path:
    """Write `home`/dagster.yaml with INSTANCE_CONFIG, or add the sections of it that an
    existing file lacks or holds as an earlier BRIDGE wrote them (SUPERSEDED); a section the
    user wrote is theirs: it is kept as it is."""
    import yaml

    config = Path(home) / "dagster.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    current = (yaml.safe_load(config.read_text()) or {}) if config.exists() else {}
    missing = {name: section for name, section in INSTANCE_CONFIG.items()
               if name not in current or current[name] in SUPERSEDED.get(name, [])}
    if missing or not config.exists():
        config.write_text(yaml.safe_dump({**current, **missing}, sort_keys=False))
    return config


def instance() -> dg.DagsterInstance:
    """The Dagster instance in $DAGSTER_HOME (set to the lake's dagster_home, with its config
    written, when unset). Opened under a file lock: two commands starting on a new home would
    otherwise both create its SQLite storages' tables, and one would fail."""
    from filelock import FileLock

    if "DAGSTER_HOME" not in os.environ:
        home = DuckDBStore().lake.dagster_home
        ensure_instance_config(home)
        os.environ["DAGSTER_HOME"] = str(home)
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(home / ".instance.lock"):
        return dg.DagsterInstance.get()


@dataclass(frozen=True)
class FailedSystem:
    """A system whose input failed validation: the run went on without it."""

    retriever: str
    dataset: str
    error: str   # names the file, line and field


@dataclass
class Step:
    """Assets sharing one partitioning, run together for each of `partition_keys`."""

    keys: list[dg.AssetKey]
    partition_keys: list[str | None]


def _partition_keys(partitions_def: dg.PartitionsDefinition | None, dataset: str | None,
                    inst: dg.DagsterInstance) -> list[str | None]:
    if partitions_def is None:
        return [None]
    keys = partitions_def.get_partition_keys(dynamic_partitions_store=inst)
    if dataset is None:
        return list(keys)
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return [k for k in keys if isinstance(k, dg.MultiPartitionKey) and k.keys_by_dimension.get("dataset") == dataset]
    if dataset not in keys:
        raise DatasetError(f"unknown dataset '{dataset}' (known: {', '.join(keys)})")
    return [dataset]


def plan(defs: dg.Definitions, names: Iterable[str], dataset: str | None,
         inst: dg.DagsterInstance, with_missing_upstream: bool = True) -> list[Step]:
    """Steps to materialize `names` (all assets when empty) for `dataset` (all when None),
    adding upstream assets whose partitions were never materialized."""
    graph = defs.resolve_asset_graph()
    known = {key.to_user_string(): key for key in graph.get_all_asset_keys()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise AssetError(f"unknown asset(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    wanted = {known[n] for n in names} or set(known.values())
    # a multi-asset that cannot be subset (ingest writes three tables at once) runs whole
    wanted = set(dg.AssetSelection.assets(*wanted).required_multi_asset_neighbors().resolve(graph))
    if with_missing_upstream:
        upstream = dg.AssetSelection.assets(*wanted).upstream().resolve(graph) - wanted
        for parent in upstream:
            partitions_def = graph.get(parent).partitions_def
            needed = set(_partition_keys(partitions_def, dataset, inst))
            done: set[str | None]
            if partitions_def is None:
                done = {None} if inst.get_latest_materialization_event(parent) else set()
            else:
                done = set(inst.get_materialized_partitions(parent))
            if needed - done:
                wanted.add(parent)
        # a missing parent made by a multi-asset that cannot be subset brings its siblings
        wanted = set(dg.AssetSelection.assets(*wanted).required_multi_asset_neighbors().resolve(graph))
    wanted = {key for key in wanted if graph.get(key).is_materializable}
    steps: list[Step] = []
    for level in graph.toposorted_asset_keys_by_level:
        # within a level, keep assets of one partitioning together so they share a run
        for key in sorted(set(level) & wanted,
                          key=lambda k: (str(graph.get(k).partitions_def), k.to_user_string())):
            partitions_def = graph.get(key).partitions_def
            keys = _partition_keys(partitions_def, dataset, inst)
            if steps and steps[-1].partition_keys == keys and \
                    graph.get(steps[-1].keys[0]).partitions_def == partitions_def:
                steps[-1].keys.append(key)
            else:
                steps.append(Step([key], keys))
    return steps


def run_config(defs: dg.Definitions, keys: Iterable[dg.AssetKey],
               asset_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Dagster run config giving each selected asset its entry of `asset_config` (keyed by
    asset name, e.g. {"candidate_pool": {"depth": 3}}); a multi-asset's entries are merged."""
    graph = defs.resolve_asset_graph()
    ops: dict[str, dict[str, Any]] = {}
    for key in keys:
        config = asset_config.get(key.to_user_string())
        if config:
            op_name = graph.get(key).assets_def.op.name
            ops.setdefault(op_name, {"config": {}})["config"].update(config)
    return {**LOG_CONFIG, "ops": ops} if ops else dict(LOG_CONFIG)


def root_cause(exc: BaseException) -> BaseException:
    """The asset's own error inside the errors Dagster wraps it in."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


# --- what is out of date: bridge_assets.pipeline.staleness ------------------------------------------

def asset_settings(asset: str, dataset: str,
                   asset_config: dict[str, dict[str, Any]] | None = None) -> Any:
    """What the asset `asset` runs with on `dataset` (its op's defaults < the dataset's entry <
    `asset_config`), read from the asset's own definition: the dry run and `bridge label-eval
    --dataset` see exactly the settings a run would."""
    from bridge_assets.definitions import defs

    resolved = staleness.resolved_settings(defs.get_assets_def(asset), dataset, asset_config)
    if resolved is None:
        raise AssetError(f"asset '{asset}' has no settings")
    return resolved.config


def _partition_of(run: dg.DagsterRun) -> str | dg.MultiPartitionKey | None:
    dimensions = {tag.removeprefix("dagster/partition/"): value for tag, value in run.tags.items()
                  if tag.startswith("dagster/partition/")}
    return dg.MultiPartitionKey(dimensions) if len(dimensions) > 1 else run.tags.get("dagster/partition")


def left_to_do(inst: dg.DagsterInstance, run: dg.DagsterRun) -> list[str] | None:
    """The assets of a queued `run` that are out of date now (another run may have computed the
    rest while it waited for its dataset's turn); None when that cannot be told (a run of
    several partitions, or of assets this code does not define)."""
    from bridge_assets.definitions import defs

    partition_key = _partition_of(run)
    if partition_key is None or run.tags.get("dagster/asset_partition_range_start"):
        return None
    keys = run.asset_selection or defs.resolve_job_def(run.job_name).asset_layer.selected_asset_keys
    graph = defs.resolve_asset_graph()
    if not keys or not all(graph.has(key) for key in keys):
        return None
    config = staleness.explicit_config(run.run_config)
    return [key.to_user_string() for key in keys
            if staleness.out_of_date(graph, inst, key, partition_key, config) is not None]


# --- one run per dataset at a time ---------------------------------------------------------------

# Run statuses of a run that is computing (a queued run waits for the coordinator: see
# instance_config's per-dataset limits).
ACTIVE_RUNS = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
WAIT_POLL_SECONDS = 1.0


def dataset_lock_file(lake_folder: Path, dataset: str) -> Path:
    return lake_folder / "locks" / f"dataset-{dataset}.lock"


@contextlib.contextmanager
def dataset_turn(lake_folder: Path, datasets: list[str], say: Callable[[str], None]) -> Iterator[None]:
    """Hold the turn of each dataset in `datasets` for the block: a second command on one of
    them waits here, says so, and then plans (it finds what the first built up to date). A file
    lock, so a killed command's turn ends with it."""
    from filelock import FileLock, Timeout

    locks = []
    try:
        for dataset in sorted(set(datasets)):  # one order: two commands never hold each other's
            path = dataset_lock_file(lake_folder, dataset)
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(path)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                say(f"another bridge command is running on dataset {dataset}: waiting for it to finish")
                lock.acquire()
            locks.append(lock)
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


QUEUE_HEARTBEAT_S = 60  # the daemon beats every 30 s


def queue_running(inst: dg.DagsterInstance) -> bool:
    """Whether a daemon is starting the instance's queued runs (its heartbeat is recent)."""
    beat = inst.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return beat is not None and time.time() - beat.timestamp < QUEUE_HEARTBEAT_S


def wait_for_other_runs(inst: dg.DagsterInstance, datasets: list[str], say: Callable[[str], None]) -> bool:
    """Return once no run of the instance (the daemon's automation or sensor runs, the UI's
    launches, another command's) is computing a partition of `datasets`. A run whose worker
    process is gone (killed) is marked FAILURE here, as the daemon's run monitoring would.
    True when it waited."""
    from bridge_assets.orchestration.run_launcher import worker_died

    told: set[str] = set()
    while True:
        active = []
        # queued runs too while the daemon runs its queue: the queue would start one beside this
        # command's run, and it would compute again what this command is about to compute
        statuses = ACTIVE_RUNS + ([dg.DagsterRunStatus.QUEUED] if queue_running(inst) else [])
        for run in inst.get_runs(dg.RunsFilter(statuses=statuses)):
            if not any(run.tags.get(tag, "") in datasets for tag in DATASET_TAGS):
                continue
            pid = worker_died(inst, run)
            if pid is not None:
                inst.report_run_failed(run, f"its worker process (pid {pid}) is gone")
                say(f"run {run.run_id[:8]} was marked failed: its worker process (pid {pid}) is gone")
                continue
            active.append(run)
        if not active:
            return bool(told)
        for run in active:
            if run.run_id not in told:
                told.add(run.run_id)
                origin = "automation" if run.tags.get("dagster/from_automation_condition") else \
                    run.tags.get("dagster/sensor_name") or "a launch"
                say(f"waiting for run {run.run_id[:8]} ({origin}) on dataset "
                    f"{next(run.tags[t] for t in DATASET_TAGS if run.tags.get(t) in datasets)} to finish")
        time.sleep(WAIT_POLL_SECONDS)


@dataclass(frozen=True)
class PartitionState:
    """Where one partition of an asset stands on the instance."""

    status: str          # "stored", "failed", "running" or "never run"
    rows: int | None = None  # the stored materialization's row count
    error: str = ""      # the failed run's error (a DatasetError names the file, line and field)


def _failure_message(inst: dg.DagsterInstance, run_id: str) -> str:
    """The asset's own error in the run's step failure (inside the errors Dagster wraps it in)."""
    for record in inst.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        event = record.dagster_event
        error = event.step_failure_data.error if event is not None else None
        if error is None:
            continue
        while error.cause is not None:
            error = error.cause
        return error.message.strip().removeprefix(f"{error.cls_name}: ").strip()
    return ""


def partition_states(asset: str, keys: list[dg.MultiPartitionKey]) -> dict[dg.MultiPartitionKey, PartitionState]:
    """The state of each of `keys` (partitions of `asset`) on the instance the UI uses, however
    they were run (a command, the daemon, the UI): a failed one carries its run's error."""
    from bridge_assets.definitions import defs

    inst = instance()
    asset_key = dg.AssetKey(asset)
    partitions_def = defs.resolve_assets_def(asset_key).partitions_def
    assert partitions_def is not None, f"{asset} is partitioned"  # callers pass retrieval_run
    known = set(partitions_def.get_partition_keys(dynamic_partitions_store=inst))
    statuses = inst.get_status_by_partition(asset_key, [k for k in keys if k in known], partitions_def) or {}
    states: dict[dg.MultiPartitionKey, PartitionState] = {}
    for key in keys:
        status = statuses.get(key)
        if status == dg.AssetPartitionStatus.FAILED:
            runs = inst.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], tags={
                f"dagster/partition/{dim}": value for dim, value in key.keys_by_dimension.items()}), limit=1)
            states[key] = PartitionState("failed", error=_failure_message(inst, runs[0].run_id) if runs else "")
        elif status == dg.AssetPartitionStatus.IN_PROGRESS:
            states[key] = PartitionState("running")
        elif status == dg.AssetPartitionStatus.MATERIALIZED:
            metadata = staleness.latest_metadata(inst, asset_key, key) or {}
            states[key] = PartitionState("stored", rows=metadata.get("dagster/row_count"))
        else:
            states[key] = PartitionState("never run")
    return states


def execute(defs: dg.Definitions, steps: list[Step], inst: dg.DagsterInstance,
            asset_config: dict[str, dict[str, Any]] | None = None,
            on_step: Callable[[Step, str | None], None] | None = None,
            stale_only: bool = False,
            on_step_end: Callable[[Step, str | None, str], None] | None = None,
            before_run: Callable[[], bool] | None = None,
            failed: list[FailedSystem] | None = None) -> list[dg.ExecuteInProcessResult]:
    """Run the steps in process. With `stale_only`, each step's assets are checked just before
    it runs (what ran before may have changed their inputs) and only those out of date run,
    with what follows them in the step and the members of a multi-asset that cannot be subset.
    `before_run` is called before each step's check (to wait for other runs; True when it
    waited). `on_step` is called as a step starts, `on_step_end` as it ends: "done", "up to
    date" (skipped with `stale_only`), or "failed: ..." (left out). With `failed`,
    a retriever x dataset partition whose input fails validation (a malformed run file: a
    DatasetError naming its file, line and field) is put there and the rest goes on without
    it; any other failure is raised."""
    job = defs.resolve_implicit_global_asset_job_def().with_logger_defs({"console": console_logger})
    graph = defs.resolve_asset_graph()
    results = []
    for step in steps:
        for partition_key in step.partition_keys:
            keys = step.keys
            if before_run:
                before_run()
            if stale_only:
                while True:
                    keys = [k for k in step.keys if staleness.out_of_date(graph, inst, k, partition_key, asset_config)]
                    # a run that another door started while this checked (seconds) is waited
                    # for, and then the check is made again
                    if not (keys and before_run and before_run()):
                        break
                if not keys:
                    if on_step_end:
                        on_step_end(Step(step.keys, [partition_key]), partition_key, "up to date")
                    continue
                # what follows them in this step runs too: it is judged before they ran (each of
                # them checks again as it is about to compute: staleness.reuse_when_current)
                keys = sorted(set(dg.AssetSelection.assets(*keys).downstream().required_multi_asset_neighbors()
                                  .resolve(graph)) & set(step.keys), key=lambda k: k.to_user_string())
            if on_step:
                on_step(Step(keys, [partition_key]), partition_key)
            try:
                result = job.execute_in_process(instance=inst, asset_selection=keys,
                                                partition_key=partition_key,
                                                run_config=run_config(defs, keys, asset_config or {}),
                                                tags={staleness.ONLY_WHAT_CHANGED_TAG: "true"} if stale_only else None,
                                                raise_on_error=True)
            except Exception as exc:
                cause = root_cause(exc)
                if failed is None or not isinstance(cause, DatasetError) or \
                        not isinstance(partition_key, dg.MultiPartitionKey):
                    raise
                failed.append(FailedSystem(partition_key.keys_by_dimension["retriever"],
                                           partition_key.keys_by_dimension["dataset"], str(cause)))
                if on_step_end:
                    on_step_end(Step(keys, [partition_key]), partition_key, f"failed: {cause}")
                continue
            if on_step_end:
                on_step_end(Step(keys, [partition_key]), partition_key, "done")
            results.append(result)
    return results


@dataclass
class Materialized:
    results: list[dg.ExecuteInProcessResult]
    planned: int  # partition steps planned
    added_retrievers: list[str]
    retired_retrievers: list[str]
    failed_systems: list[FailedSystem] = field(default_factory=list)

    def metadata(self, asset: str) -> dict[str, Any]:
        """The last materialization metadata of `asset` in these runs."""
        for result in reversed(self.results):
            events = [e for e in result.get_asset_materialization_events()
                      if e.asset_key is not None and e.asset_key.to_user_string() == asset]
            if events:
                return {n: v.value for n, v in events[-1].materialization.metadata.items()}
        raise LookupError(f"{asset} was not materialized")



def main_assets() -> list[str]:
    """The assets of the main job (every one but the labeler evaluation's), as `bridge run`
    materializes them; the CLIs ask here rather than import the definitions themselves."""
    from bridge_assets.definitions import defs, main_selection

    return [key.to_user_string() for key in main_selection.resolve(defs.resolve_asset_graph())]

def materialize(assets: Iterable[str], dataset: str | None, *,
                asset_config: dict[str, dict[str, Any]] | None = None,
                partition_key: dg.MultiPartitionKey | None = None,
                with_missing_upstream: bool = True, stale_only: bool = False,
                on_step: Callable[[Step, str | None], None] | None = None,
                on_step_end: Callable[[Step, str | None, str], None] | None = None,
                on_plan: Callable[[int], None] | None = None,
                on_wait: Callable[[str], None] = logging.getLogger(__name__).warning) -> Materialized:
    """Materialize `assets` (all when empty) for `dataset` (all when None) on the instance:
    the retriever partitions synced with the registry first (what its sensor does under the
    daemon), missing upstream partitions added, `asset_config` as the explicit run config
    (each asset's settings are resolved in the run: its defaults < the dataset's `pipeline:`
    entry < this). `partition_key`: only that retrieval_run partition. `on_plan` hears the
    number of partition steps planned, `on_step` and `on_step_end` each step (see execute). Raises the asset's own
    error (not Dagster's wrapper) when one fails; AssetError or DatasetError (BridgeErrors) for unknown
    assets or datasets.

    One command per dataset at a time (`dataset_turn`), and none beside the instance's other
    runs of the dataset (the daemon's): each step first waits for them (`on_wait` says so), so
    the doors take turns and the later one finds what the earlier built up to date."""
    from bridge_assets.definitions import defs
    from bridge_assets.lake import store as lake_store
    from bridge_assets.registry.datasets import load_registry
    from bridge_assets.retrieval.sensors import sync_partitions

    resource = DuckDBStore()
    lake_store.check(resource.lake)
    inst = instance()
    datasets = [dataset] if dataset is not None else list(load_registry())
    with dataset_turn(resource.lake.folder, datasets, on_wait):
        sync = sync_partitions(inst, resource)
        steps = plan(defs, list(assets), dataset, inst, with_missing_upstream=with_missing_upstream)
        if partition_key is not None:
            steps = [Step(step.keys, [partition_key]) if step.partition_keys and
                     isinstance(step.partition_keys[0], dg.MultiPartitionKey) else step for step in steps]
        planned = sum(len(step.partition_keys) for step in steps)
        if on_plan:
            on_plan(planned)
        try:
            failed: list[FailedSystem] = []
            results = execute(defs, steps, inst, asset_config, on_step=on_step, on_step_end=on_step_end,
                              stale_only=stale_only,
                              before_run=lambda: wait_for_other_runs(inst, datasets, on_wait),
                              failed=failed if partition_key is None else None)
        except Exception as exc:  # Dagster wraps the asset's own error
            raise root_cause(exc) from None
    return Materialized(results, planned, sync.add, sync.delete, failed)
