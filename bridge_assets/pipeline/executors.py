"""Which Dagster executor runs the asset jobs' steps: one machine, or a Dask cluster.

    BRIDGE_EXECUTOR=multiprocess   (the default) Dagster's multiprocess executor: a process per
                                   step on this machine (`dagster dev`, `dagster job execute`),
                                   forked from a server that imported the definitions once per
                                   run (`forkserver`, not Dagster's default `spawn`)
    BRIDGE_EXECUTOR=dask           dagster-dask: each step is a task on a Dask cluster;
        BRIDGE_DASK_SCHEDULER=tcp://host:8786   an existing cluster (`dask scheduler` +
                                                `dask worker tcp://host:8786` on each node)
        BRIDGE_DASK_WORKERS=N                   else a LocalCluster of N worker processes
                                                (default 2), one thread each
    BRIDGE_EXECUTOR=in_process     every step in the run's own process

Steps still write through the store: on the DuckLake (the default storage; a Postgres catalog and an
object-store data path when the workers are on other machines) they commit their partitions in
parallel. Measured on one 2-core machine (`scripts/bench_executors.py`, the demo's ingest and 11
retrieval partitions run one after the other, offline_fast profile): in-process 220 s, largest
process 1635 MiB; multiprocess 457 s, largest step process 1335 MiB; dask (2 workers) 464 s,
largest worker 1458 MiB; tables identical. A step process pays 20-25 s of start-up (it imports
the definitions again; that import is 2.2 s since scipy.stats, scikit-learn and matplotlib load
where they are used, 4.4 s before: docs/testing.md), so on one machine the separate processes only pay off where steps run
side by side or a step's models must not share memory with another's; on a cluster they are
the point. Hence `bridge run` / `bridge materialize` run in-process, one partition after the
other, and the UI, schedules and sensors run multiprocess unless BRIDGE_EXECUTOR says otherwise.
Their step processes are forked from a server process that has imported the definitions (and
with them Dagster, polars, DuckDB) once per run, instead of each importing them again:
`dagster job execute -j ingest_job` (2 steps) took 16-21 s forked against 21-26 s spawned
(docs/testing.md). Nothing else changes: each step still runs in its own process.
"""

from __future__ import annotations

import dagster as dg

from bridge_assets.errors import SettingsError
from bridge_assets.settings import env

EXECUTOR_ENV = "BRIDGE_EXECUTOR"
SCHEDULER_ENV = "BRIDGE_DASK_SCHEDULER"
WORKERS_ENV = "BRIDGE_DASK_WORKERS"
EXECUTORS = ("multiprocess", "dask", "in_process")
DEFAULT_EXECUTOR = "multiprocess"
# what the multiprocess executor's forkserver imports before it forks a step process
PRELOAD = ["bridge_assets.definitions"]
multiprocess_executor = dg.multiprocess_executor.configured(
    {"start_method": {"forkserver": {"preload_modules": PRELOAD}}}, name="multiprocess")


def dask_cluster_config() -> dict:
    """dagster-dask's `cluster` config from the environment: an existing scheduler, else a
    LocalCluster of worker processes."""
    if address := env.raw(SCHEDULER_ENV):
        return {"existing": {"address": address}}
    workers = env.dask_workers
    return {"local": {"n_workers": workers, "threads_per_worker": 1, "processes": True,
                      "dashboard_address": None}}


def executor_from_env() -> dg.ExecutorDefinition:
    """The executor $BRIDGE_EXECUTOR names (see the module's docstring); multiprocess when unset."""
    kind = env.executor or DEFAULT_EXECUTOR
    if kind not in EXECUTORS:
        raise SettingsError(f"{EXECUTOR_ENV}={kind!r}: expected one of {', '.join(EXECUTORS)}")
    if kind == "dask":
        from dagster_dask import dask_executor

        return dask_executor.configured({"cluster": dask_cluster_config()}, name="dask")
    if kind == "in_process":
        return dg.in_process_executor
    return multiprocess_executor
