"""The registry sensor: keeps the `retriever` partitions equal to the active profile of
resources/retrievers.yaml.

A new system gets its partition and a run on every dataset; a system whose configuration
changed (its hash, kept in the cursor) is re-run on every dataset; a removed system's partition
is deleted and its rows leave `retrieval_run`, so nothing downstream pools a retired system.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import dagster as dg

from bridge_assets import store as duckdb_store
from bridge_assets.partitions import dataset_partitions, retriever_partitions
from bridge_assets.resources import DuckDBStore
from bridge_assets.retrieval.assets import retrieval_job
from bridge_assets.retrieval.registry import load_registry


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
        return con.execute(f"delete from retrieval_run where retriever in ({placeholders})",
                           retrievers).fetchone()[0]


def sync_partitions(instance: dg.DagsterInstance, store: DuckDBStore) -> RegistrySync:
    """Apply the registry to the instance directly (no daemon): add the profile's missing
    partitions, delete and retire the others. For `bridge materialize`, before planning."""
    registry = load_registry()
    wanted = {name: registry.config_hash(name) for name in registry.profile_systems()}
    sync = plan_sync(wanted, list(instance.get_dynamic_partitions(retriever_partitions.name)), {})
    if sync.add:
        instance.add_dynamic_partitions(retriever_partitions.name, sync.add)
    for name in sync.delete:
        instance.delete_dynamic_partition(retriever_partitions.name, name)
    if sync.delete:
        retire_runs(store, sync.delete)
    return sync


@dg.sensor(job=retrieval_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Syncs the `retriever` partitions with the active profile of "
                       "resources/retrievers.yaml and requests the runs of new or changed systems.")
def retriever_registry_sensor(context: dg.SensorEvaluationContext, store: DuckDBStore) -> dg.SensorResult:
    registry = load_registry()
    wanted = {name: registry.config_hash(name) for name in registry.profile_systems()}
    existing = list(context.instance.get_dynamic_partitions(retriever_partitions.name))
    previous = json.loads(context.cursor) if context.cursor else {}
    sync = plan_sync(wanted, existing, previous)
    requests = []
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
