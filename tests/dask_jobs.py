"""A tiny Dagster job for the dask executor test (tests/test_ducklake_distributed.py): four
independent steps, each writing its own partition of one table through the store, so that a
LocalCluster runs them on several worker processes at once. Workers import this file only,
not the whole code location."""

from __future__ import annotations

import os
import time

import dagster as dg
import polars as pl

from bridge_assets.lake import location, store

PARTS = ("p0", "p1", "p2", "p3")


def _writer(part: str) -> dg.OpDefinition:
    @dg.op(name=f"write_{part}")
    def write(context) -> None:
        time.sleep(1.0)  # long enough for the scheduler to spread the steps over the workers
        snapshot = store.write_partitions(
            {"parts": pl.DataFrame({"dataset": [part] * 3, "value": [1, 2, 3], "pid": [os.getpid()] * 3})},
            {"dataset": part}, location.lake_location(), info={"run_id": context.run_id})
        context.log.info(f"{part} written by pid {os.getpid()} as snapshot {snapshot}")

    return write


@dg.job(executor_def=dg.multiprocess_executor)
def parts_job():
    for part in PARTS:
        _writer(part)()


def dask_parts_job() -> dg.JobDefinition:
    from dagster_dask import dask_executor

    from bridge_assets.pipeline.executors import dask_cluster_config

    return parts_job.with_executor_def(dask_executor.configured({"cluster": dask_cluster_config()}))
