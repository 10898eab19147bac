"""Run assets from the command line the way the UI does: on the Dagster instance in
$DAGSTER_HOME (default `<data lake>/dagster_home`), so runs, partitions and lineage show in
the UI afterwards."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from bridge_assets.llm.budget import BudgetExceeded
from bridge_assets.resources import DuckDBStore

LOG_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
# Failures the command line reports itself in one message (a budget stop is an expected end,
# not a crash): its console log leaves out their failure events, Dagster's stack traces included.
REPORTED_BY_CLI = frozenset({BudgetExceeded.__name__})


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


def instance() -> dg.DagsterInstance:
    if "DAGSTER_HOME" not in os.environ:
        home = DuckDBStore().lake.dagster_home
        home.mkdir(parents=True, exist_ok=True)
        config = home / "dagster.yaml"
        if not config.exists():
            config.write_text("telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


@dataclass
class Step:
    """Assets sharing one partitioning, run together for each of `partition_keys`."""

    keys: list[dg.AssetKey]
    partition_keys: list[str | None]


def _partition_keys(partitions_def, dataset: str | None, inst: dg.DagsterInstance) -> list[str | None]:
    if partitions_def is None:
        return [None]
    keys = partitions_def.get_partition_keys(dynamic_partitions_store=inst)
    if dataset is None:
        return list(keys)
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return [k for k in keys if k.keys_by_dimension.get("dataset") == dataset]
    if dataset not in keys:
        raise ValueError(f"unknown dataset '{dataset}' (known: {', '.join(keys)})")
    return [dataset]


def plan(defs: dg.Definitions, names: Iterable[str], dataset: str | None,
         inst: dg.DagsterInstance, with_missing_upstream: bool = True) -> list[Step]:
    """Steps to materialize `names` (all assets when empty) for `dataset` (all when None),
    adding upstream assets whose partitions were never materialized."""
    graph = defs.resolve_asset_graph()
    known = {key.to_user_string(): key for key in graph.get_all_asset_keys()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown asset(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    wanted = {known[n] for n in names} or set(known.values())
    # a multi-asset that cannot be subset (ingest writes three tables at once) runs whole
    wanted = set(dg.AssetSelection.assets(*wanted).required_multi_asset_neighbors().resolve(graph))
    if with_missing_upstream:
        upstream = dg.AssetSelection.assets(*wanted).upstream().resolve(graph) - wanted
        for parent in upstream:
            partitions_def = graph.get(parent).partitions_def
            needed = set(_partition_keys(partitions_def, dataset, inst))
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


def execute(defs: dg.Definitions, steps: list[Step], inst: dg.DagsterInstance,
            asset_config: dict[str, dict[str, Any]] | None = None,
            on_step: Callable[[Step, str | None], None] | None = None) -> list[dg.ExecuteInProcessResult]:
    job = defs.resolve_implicit_global_asset_job_def().with_logger_defs({"console": console_logger})
    results = []
    for step in steps:
        config = run_config(defs, step.keys, asset_config or {})
        for partition_key in step.partition_keys:
            if on_step:
                on_step(step, partition_key)
            result = job.execute_in_process(instance=inst, asset_selection=step.keys,
                                            partition_key=partition_key, run_config=config,
                                            raise_on_error=True)
            results.append(result)
    return results
