"""The registry sensor: keeps the `retriever` partitions equal to the active profile of
resources/retrievers.yaml.

A new system gets its partition and a run on every dataset; a system whose configuration
changed (its hash, kept in the cursor) is re-run on every dataset; a removed system's partition
is deleted and its rows leave `retrieval_run`, so nothing downstream pools a retired system.

The run-files sensor watches `<BRIDGE_REGISTRY_DIR>/runs/<dataset>/<name>.trec[.gz]`: a new
file becomes a run_file system (an entry in the registry folder's retrievers.yaml) and a new or
changed file gets its run on its dataset, so an external system is re-benchmarked like any other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import dagster as dg

from bridge_assets.lake import store as duckdb_store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline.partitions import RETRIEVER_PARTITIONS, dataset_partitions, retriever_partitions
from bridge_assets.registry import registry_files
from bridge_assets.retrieval.assets import retrieval_job
from bridge_assets.retrieval.errors import RegistryError
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.run_files import FoundRun, find_run_files, register_run_file, runs_dir
from bridge_assets.settings import env


@dataclass
class RegistrySync:
    add: list[str]          # systems without a partition yet
    delete: list[str]       # partitions whose system left the profile
    changed: list[str]      # existing partitions whose configuration hash changed
    hashes: dict[str, str]  # the profile's systems -> configuration hash (the next cursor)


def plan_sync(wanted: dict[str, str], existing: list[str], previous: dict[str, str]) -> RegistrySync:
    """What to do, from the profile's {system: config hash}, the current partitions and the
    hashes seen at the last evaluation."""
    add = [name for name in wanted if name not in existing]
    delete = [name for name in existing if name not in wanted]
    changed = [name for name in wanted
               if name in existing and name in previous and previous[name] != wanted[name]]
    return RegistrySync(add, delete, changed, wanted)


def retire_runs(store: DuckDBStore, retrievers: list[str]) -> int:
    """Delete the stored runs of retired retrievers; returns how many rows went."""
    with store.connect() as con:
        if not duckdb_store.table_exists(con, "retrieval_run"):
            return 0
        placeholders = ", ".join("?" for _ in retrievers)
        return duckdb_store.one_row(con, f"delete from retrieval_run where retriever in ({placeholders})",
                                    retrievers)[0]


def sync_partitions(instance: dg.DagsterInstance, store: DuckDBStore) -> RegistrySync:
    """Apply the registry to the instance directly (no daemon): add the profile's missing
    partitions, delete and retire the others. For `bridge materialize`, before planning."""
    registry = load_registry()
    wanted = {name: registry.config_hash(name) for name in registry.profile_systems()}
    sync = plan_sync(wanted, list(instance.get_dynamic_partitions(RETRIEVER_PARTITIONS)), {})
    if sync.add:
        instance.add_dynamic_partitions(RETRIEVER_PARTITIONS, sync.add)
    for name in sync.delete:
        instance.delete_dynamic_partition(RETRIEVER_PARTITIONS, name)
    if sync.delete:
        retire_runs(store, sync.delete)
    return sync


@dg.sensor(job=retrieval_job, minimum_interval_seconds=env.sensor_interval(60), default_status=dg.DefaultSensorStatus.RUNNING,
           description="Syncs the `retriever` partitions with the active profile of "
                       "resources/retrievers.yaml and requests the runs of new or changed systems.")
def retriever_registry_sensor(context: dg.SensorEvaluationContext, store: DuckDBStore) -> dg.SensorResult:
    registry = load_registry()
    wanted = {name: registry.config_hash(name) for name in registry.profile_systems()}
    existing = list(context.instance.get_dynamic_partitions(RETRIEVER_PARTITIONS))
    previous = json.loads(context.cursor) if context.cursor else {}
    sync = plan_sync(wanted, existing, previous)
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if sync.add:
        requests.append(retriever_partitions.build_add_request(sync.add))
    if sync.delete:
        requests.append(retriever_partitions.build_delete_request(sync.delete))
        retired = retire_runs(store, sync.delete)
        context.log.info(f"retired {sync.delete}: {retired} rows removed from retrieval_run")
    runs = [dg.RunRequest(run_key=f"{name}:{sync.hashes[name]}:{dataset}",
                          partition_key=dg.MultiPartitionKey({"dataset": dataset, "retriever": name}))
            for name in [*sync.add, *sync.changed] for dataset in dataset_partitions.get_partition_keys()]
    if sync.add or sync.changed or sync.delete:
        context.log.info(f"profile {registry.active_profile}: added {sync.add}, changed {sync.changed}, "
                         f"deleted {sync.delete}")
    return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=requests,
                           cursor=json.dumps(sync.hashes, sort_keys=True))


def _stamp(run: FoundRun) -> str:
    """Changes when the file does (size and modification time: no re-reading every minute)."""
    stat = run.path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


@dg.sensor(job=retrieval_job, minimum_interval_seconds=env.sensor_interval(60), default_status=dg.DefaultSensorStatus.RUNNING,
           description="Turns every new TREC run file in <BRIDGE_REGISTRY_DIR>/runs/<dataset>/<name>.trec[.gz] "
                       "into a run_file system and requests the run of each new or changed file.")
def run_files_sensor(context: dg.SensorEvaluationContext, store: DuckDBStore) -> dg.SensorResult | dg.SkipReason:
    if registry_files.registry_dir() is None:
        return dg.SkipReason(f"{registry_files.ENV_REGISTRY_DIR} is not set: there is no runs folder to watch")
    previous = json.loads(context.cursor) if context.cursor else {}
    stamps, runs, added = {}, [], []
    datasets = set(dataset_partitions.get_partition_keys())
    partitions = set(context.instance.get_dynamic_partitions(RETRIEVER_PARTITIONS))
    for found in find_run_files(runs_dir(store.lake)):
        stamp = _stamp(found)
        if previous.get(found.key) == stamp:
            stamps[found.key] = stamp
            continue
        # a file that cannot be taken is not stamped: it is retried (and reported) until fixed
        if found.dataset not in datasets:
            context.log.warning(f"{found.path}: no dataset '{found.dataset}' (known: {', '.join(sorted(datasets))})")
            continue
        try:
            registry, written = register_run_file(found.name, found.dataset, found.path)
        except RegistryError as exc:
            context.log.warning(f"{found.path} is not read: {exc}")
            continue
        stamps[found.key] = stamp
        if written:
            context.log.info(f"{found.path}: registered run_file system '{found.name}'")
        if found.name not in registry.profile_systems():
            context.log.info(f"{found.path}: '{found.name}' is not in profile {registry.active_profile}; not run")
            continue
        if found.name not in partitions and found.name not in added:
            added.append(found.name)
        runs.append(dg.RunRequest(run_key=f"run_file:{found.key}:{stamp}",
                                  partition_key=dg.MultiPartitionKey({"dataset": found.dataset,
                                                                      "retriever": found.name})))
    requests = [retriever_partitions.build_add_request(added)] if added else []
    return dg.SensorResult(run_requests=runs, dynamic_partitions_requests=requests,
                           cursor=json.dumps(stamps, sort_keys=True))
