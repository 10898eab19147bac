"""Which lake snapshot each materialization wrote (time travel for lineage).

An asset writes its partition through `DuckDBStore.write_partitions`; on DuckLake the commit is
one snapshot. This module links the two sides: the snapshot records the Dagster run (run id,
asset, partition; `current_run_info`), and the materialization's metadata records the snapshot
(`lake_snapshot`; "n/a" on a plain DuckDB file, which keeps no history; `record_snapshot`).
`bridge audit` shows both per asset (`snapshot_of`), and `bridge qrels export --as-of RUN_ID`
finds the snapshot a run committed (`ducklake.snapshot_of_run`).

The read side of lineage lives here too: an asset reads the tables it declares (its READS,
which are also its Dagster deps) through `inputs`, and says what it wrote with `frame_version`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl

from bridge_assets.errors import BridgeError

if TYPE_CHECKING:
    import duckdb

    from bridge_assets.lake.resource import DuckDBStore, VotesSource
    from bridge_assets.paths import LakeLocation

METADATA_KEY = "lake_snapshot"
NOT_AVAILABLE = "n/a"


@contextlib.contextmanager
def inputs(store: DuckDBStore, dataset: str, tables: Sequence[str], *,
           votes: VotesSource | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """`with inputs(store, dataset, READS) as con:` an in-memory copy of `dataset`'s rows of
    `tables` (DuckDBStore.snapshot; with `votes`, the votes store's human_votes too), closed on
    leaving the block. `tables` is what the asset declares: its deps come from the same tuple
    (tests/test_lineage.py checks it reads no more)."""
    con = store.snapshot(dataset, tables, votes=votes)
    try:
        yield con
    finally:
        con.close()


def frame_version(frame: pl.DataFrame) -> dg.DataVersion:
    """A data version of `frame`'s rows (in any order; its dataset column aside): it changes
    only when they do, so Dagster marks what reads the table stale only then."""
    rows = frame.drop("dataset", strict=False)
    rows = rows.select(sorted(rows.columns))
    # nested columns cannot be sort keys; the others order the rows
    keys = [name for name, kind in rows.schema.items() if not kind.is_nested()]
    if keys:
        rows = rows.sort(keys, nulls_last=True)
    return dg.DataVersion(hashlib.sha256(rows.write_ipc(None).getvalue()).hexdigest()[:16])


def _context() -> dg.AssetExecutionContext | None:
    try:
        return dg.AssetExecutionContext.get()
    except dg.DagsterError:  # outside an asset (CLI, tests, a check): nothing to record
        return None


def current_run_info() -> dict[str, Any]:
    """The Dagster run, assets and partition of the asset being materialized now ({} outside one)."""
    context = _context()
    if context is None:
        return {}
    info: dict[str, Any] = {"run_id": context.run_id}
    # An op without assets or partitions (a check, a plain op) has neither: the info says less.
    with contextlib.suppress(dg.DagsterError):
        info["assets"] = sorted(key.to_user_string() for key in context.selected_asset_keys)
    with contextlib.suppress(dg.DagsterError):
        if context.has_partition_key:
            info["partition_key"] = str(context.partition_key)
    return info


def record_snapshot(snapshot: int | None, tables: Iterable[str]) -> None:
    """Put `snapshot` into the metadata of the asset being materialized now: every selected
    output whose asset is one of `tables` (a multi-asset writing several), else its only one."""
    context = _context()
    if context is None:
        return
    value = snapshot if snapshot is not None else NOT_AVAILABLE
    op = context.op_execution_context
    try:
        keys = list(context.selected_asset_keys)
        names = {key.to_user_string(): context.assets_def.get_output_name_for_asset_key(key) for key in keys}
    except dg.DagsterError:  # not an asset op: the metadata goes on its only output
        names = {}
    written = [names[t] for t in tables if t in names]
    try:
        if written:
            for output in written:
                op.add_output_metadata({METADATA_KEY: value}, output_name=output)
        elif len(names) == 1:
            op.add_output_metadata({METADATA_KEY: value}, output_name=next(iter(names.values())))
        elif not names:
            op.add_output_metadata({METADATA_KEY: value})
    except Exception as exc:  # metadata is lineage, never a reason to fail the write
        context.log.warning(f"could not record {METADATA_KEY}={value}: {exc}")


def snapshot_of(record: Any) -> int | str | None:
    """The `lake_snapshot` of a materialization event record (instance.fetch_materializations),
    or None when it predates this metadata."""
    try:
        value = record.asset_materialization.metadata.get(METADATA_KEY)
    except AttributeError:
        return None
    if value is None:
        return None
    value = getattr(value, "value", value)
    return value


class AsOfError(BridgeError, ValueError):
    """An `--as-of` that names no snapshot of this lake."""


def resolve_as_of(value: str, lake: LakeLocation) -> int:
    """A DuckLake snapshot from `--as-of`: a snapshot id of this lake, else a Dagster run id (or a
    unique prefix of one): the last snapshot that run committed. A run id's first characters
    can all be digits (97828695-...), so digits that name no snapshot are tried as a run id
    prefix; a number that is both names the snapshot (more of the run id, dash included, names
    the run). AsOfError when neither."""
    from bridge_assets.lake import ducklake, store

    if store.location(lake).ducklake is None:
        raise AsOfError("--as-of needs the DuckLake storage (BRIDGE_STORAGE=ducklake): a DuckDB "
                         "file keeps no earlier states")
    value = value.strip()
    with store.connect(lake) as con:
        if value.isdigit():
            known = {s["snapshot"] for s in ducklake.snapshots(con)}
            if int(value) in known:
                return int(value)
        try:
            snapshot = ducklake.snapshot_of_run(con, value)
        except ducklake.LakeError as exc:
            raise AsOfError(str(exc)) from exc
    if snapshot is None and value.isdigit():
        raise AsOfError(f"no snapshot {value} in the lake (it has {min(known)}..{max(known)}), and no "
                        f"run id starting with '{value}' wrote one")
    if snapshot is None:
        raise AsOfError(f"no lake snapshot was written by a run '{value}' (bridge lake snapshots lists "
                         "them; runs from before DuckLake have none)")
    return snapshot
