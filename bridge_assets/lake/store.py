"""The store every asset reads and writes: one DuckDB file, or a DuckLake.

Which one is the lake location's (`paths.LakeLocation`; $BRIDGE_STORAGE: ducklake, the default,
or duckdb). Callers do not care: they pass the location (resolved once at the edge: the
DuckDBStore resource, a command's entry, a script's main) to `connect()`, and get a connection
on which the tables have their plain names. Every function here that opens the store takes a
LakeLocation and nothing else (a path is a TypeError: no environment fallback, no location
rebuilt from a file's name). Any other DuckDB file (the votes store) is opened as a plain file
with `connect_file` / `attach_file`.

DuckDB file: one writing process per file, and Dagster's multiprocess executor runs
partitions in parallel processes (dagster issues 16248/18746). So every access is a short
connection that retries while another process holds the lock, and every write of an asset
partition is one transaction: delete the partition's old rows, insert the new ones. A run
that fails never leaves half a partition behind, and parallel runs queue for the lock
instead of failing on it.

DuckLake (bridge_assets.lake.ducklake): nobody holds a lock; the same transaction is one snapshot,
committed whole or not at all. A commit that lost a race to another writer is retried with
backoff (`run_transaction`), then fails with StoreConflict. Each write records the Dagster run
and partition in its snapshot, and returns the snapshot's id (lineage, `--as-of` exports).
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl

from bridge_assets import settings
from bridge_assets.errors import BridgeError
from bridge_assets.lake import ducklake
from bridge_assets.paths import PIPELINE_FILE, LakeLocation

LOCK_WAIT_SECONDS = 300.0
# Test-only (tests/test_faults_kill.py kills the process mid-write): see settings.VARIABLES.
TEST_PAUSE_ENV = "BRIDGE_TEST_PAUSE_IN_WRITE"
STORAGE_ENV = "BRIDGE_STORAGE"  # named in messages
T = TypeVar("T")


class StoreBusy(BridgeError, duckdb.IOException):
    """Another process held the file's lock for longer than the caller would wait."""


class StoreConflict(StoreBusy):
    """A DuckLake commit kept losing races to other writers until the caller's deadline."""


class StoreMismatch(BridgeError, RuntimeError):
    """The lake folder holds the other storage than the one configured."""


class LakeMissing(BridgeError, FileNotFoundError):
    """No data lake where a read needs one (nothing materialized yet, or another lake folder)."""


def location(lake: object) -> LakeLocation:
    """`lake` itself, checked: the store is named by a LakeLocation only (a path or a string is
    a caller that skipped the edge that resolves the location)."""
    if not isinstance(lake, LakeLocation):
        raise TypeError(f"the store takes a LakeLocation (lake.location.lake_location(), resolved once at "
                        f"the edge), not {type(lake).__name__} {lake!r}")
    return lake


def exists(lake: LakeLocation) -> bool:
    """Whether the store at `lake` was ever written."""
    config = location(lake).ducklake
    return config.exists() if config is not None else lake.duckdb.exists()


def describe(lake: LakeLocation) -> str:
    """Where the store is, in words (for messages)."""
    config = location(lake).ducklake
    if config is None:
        return str(lake.duckdb)
    return f"DuckLake ducklake:{config.catalog} (data {config.data_path})"


def _check_storage(lake: LakeLocation) -> None:
    """Refuse to start an empty store beside a lake kept in the other storage."""
    path, config = location(lake).duckdb, lake.ducklake
    if config is None:
        if not path.exists() and (path.parent / ducklake.CATALOG_FILE).exists():
            raise StoreMismatch(f"{path.parent} holds a DuckLake ({ducklake.CATALOG_FILE}) and no "
                                f"{PIPELINE_FILE}, and {STORAGE_ENV}=duckdb: unset {STORAGE_ENV} "
                                f"(DuckLake is the default) to use it")
    elif not config.exists() and path.exists():
        raise StoreMismatch(f"{path} is a DuckDB-file lake (from an older BRIDGE, or {STORAGE_ENV}="
                            f"duckdb) and the storage in force is DuckLake: move it into the DuckLake "
                            f"with `bridge lake migrate`, or keep it with {STORAGE_ENV}=duckdb")


def check(lake: LakeLocation) -> None:
    """Raise StoreMismatch when the lake folder holds the other storage than the one in force
    (before a run starts, so it stops with what to do instead of failing in its first step)."""
    _check_storage(lake)


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    # (the last: the file is open elsewhere in this process, e.g. by a concurrent short connection)
    return ("lock" in text.lower() and ("Conflicting" in text or "Could not set lock" in text)) \
        or "Unique file handle conflict" in text


def _waiting(open_: Callable[[], T], path: Path, wait_seconds: float) -> T:
    """`open_()`, retried with backoff while another process holds `path`'s lock; StoreBusy
    once `wait_seconds` have passed."""
    deadline = time.monotonic() + wait_seconds
    # a short wait polls often: another process's lock comes and goes between its transactions
    longest = max(0.02, min(1.0, wait_seconds / 20))
    delay = min(0.05, longest)
    while True:
        try:
            return open_()
        except (duckdb.IOException, duckdb.ConnectionException, duckdb.BinderException) as exc:
            if not _is_lock_error(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise StoreBusy(f"{path} is locked by another process (waited {wait_seconds:g} s): "
                                f"{exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, longest)


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN ... COMMIT on `con`; any exception rolls back and propagates."""
    con.execute("begin transaction")
    try:
        yield con
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise


@contextlib.contextmanager
def connect(lake: LakeLocation, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the store; waits (with backoff) while another process holds
    the DuckDB file. On DuckLake a cursor of this process's lake instance, the lake in use."""
    _check_storage(lake)
    if (config := lake.ducklake) is not None:
        with ducklake.connect(config) as con:
            yield con
        return
    with connect_file(lake.duckdb, wait_seconds=wait_seconds) as con:
        yield con


@contextlib.contextmanager
def connect_file(path: Path, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short connection to the DuckDB file `path` itself, whatever the storage in force: the
    votes store, or the old bridge.duckdb `bridge lake migrate` reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = _waiting(lambda: duckdb.connect(str(path)), path, wait_seconds)
    try:
        yield con
    finally:
        con.close()


@contextlib.contextmanager
def connect_read_only(lake: LakeLocation, *, snapshot: int | None = None,
                      wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection that cannot change the store (`bridge sql`, exports); with `snapshot`, the
    DuckLake as it was at that snapshot (time travel; DuckLake only)."""
    _check_storage(lake)
    path, config = lake.duckdb, lake.ducklake
    if config is None:
        if snapshot is not None:
            raise StoreMismatch("time travel (--as-of) needs the DuckLake storage (BRIDGE_STORAGE=ducklake); "
                                f"{path} is a plain DuckDB file and keeps no history")
        if not path.exists():
            raise LakeMissing(f"no data lake at {path}")
        con = _waiting(lambda: duckdb.connect(str(path), read_only=True), path, wait_seconds)
    else:
        con = ducklake.new_instance(config, read_only=True, snapshot=snapshot)
    try:
        yield con
    finally:
        con.close()


def attach(con: duckdb.DuckDBPyConnection, lake: LakeLocation, alias: str, *, read_only: bool = True,
           wait_seconds: float = LOCK_WAIT_SECONDS) -> None:
    """ATTACH the store at `lake` to `con` as `alias` (read-only by default): the DuckLake (its
    extensions loaded into `con`), or the DuckDB file, waiting like connect() while another
    process writes it."""
    if (config := location(lake).ducklake) is not None:
        for name in ducklake.extensions_for(config):
            ducklake.load_extension(con, name)
        ducklake.attach(con, config, alias, read_only=read_only)
        return
    attach_file(con, lake.duckdb, alias, read_only=read_only, wait_seconds=wait_seconds)


def attach_file(con: duckdb.DuckDBPyConnection, path: Path, alias: str, *, read_only: bool = True,
                wait_seconds: float = LOCK_WAIT_SECONDS) -> None:
    """ATTACH the DuckDB file `path` itself (the votes store) to `con` as `alias`, waiting like
    connect_file() while another process writes it."""
    path = Path(path)
    mode = " (read_only)" if read_only else ""
    _waiting(lambda: con.execute(f"attach '{_sql_string(path)}' as \"{alias}\"{mode}"), path,
             wait_seconds)


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")


def int_max(column: pl.Series) -> int | None:
    """The largest value of a count or rank column, None where it has none (polars types a
    Series' max as any Python value)."""
    largest = column.max()
    return int(largest) if isinstance(largest, (int, float)) else None


def one_row(con: duckdb.DuckDBPyConnection, sql: str, parameters: object = None) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate without GROUP BY, a DELETE's
    count, a setting)."""
    row = con.execute(sql, parameters).fetchone()
    if row is None:
        raise RuntimeError(f"no row from a query that always returns one: {sql}")
    return row


def table_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(one_row(con, "select count(*) from information_schema.tables where table_name = ?",
                        [table])[0])


def replace_partition(con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame,
                      keys: Mapping[str, Any]) -> None:
    """Replace the rows of `table` matching `keys` (e.g. {"dataset": "scifact"}) by `frame`.

    Must run inside a transaction the caller opened, so several tables can change together.
    The table is created from the frame's schema on first write; a column the frame has and
    the table lacks (a newer schema) is added, NULL in the rows written before.
    """
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise ValueError(f"{table}: frame lacks partition columns {missing}")
    con.register("_incoming", frame.to_arrow())
    try:
        if not table_exists(con, table):
            con.execute(f'create table "{table}" as select * from _incoming limit 0')
        known = {row[0] for row in con.execute(f'describe "{table}"').fetchall()}
        for name, kind, *_ in con.execute("describe select * from _incoming").fetchall():
            if name not in known:
                con.execute(f'alter table "{table}" add column "{name}" {kind}')
        where = " and ".join(f'"{k}" = ?' for k in keys)
        con.execute(f'delete from "{table}" where {where}', list(keys.values()))
        con.execute(f'insert into "{table}" by name select * from _incoming')
    finally:
        con.unregister("_incoming")


def run_transaction(body: Callable[[duckdb.DuckDBPyConnection], T], lake: LakeLocation, *,
                    message: str = "", info: Mapping[str, Any] | None = None,
                    wait_seconds: float = LOCK_WAIT_SECONDS, test_pause: bool = False) -> tuple[T, int | None]:
    """`body(con)` in one transaction, committed or rolled back whole; returns its result and
    the DuckLake snapshot the commit made (None on a DuckDB file, or when nothing changed).
    On DuckLake a commit that lost a race to another writer is rolled back and the whole body
    run again, with growing random waits, until `wait_seconds` have passed: then StoreConflict.
    `message` and `info` label the snapshot (the Dagster run, the partition)."""
    config = location(lake).ducklake
    deadline = time.monotonic() + wait_seconds
    delay, attempt = 0.02, 0
    while True:
        attempt += 1
        with connect(lake, wait_seconds=wait_seconds) as con:
            con.execute("begin transaction")
            try:
                if config is not None and (message or info):
                    ducklake.set_commit_info(con, message, dict(info or {}))
                result = body(con)
                if test_pause and (pause := settings.env.raw(TEST_PAUSE_ENV)):
                    print(f"{TEST_PAUSE_ENV}: paused before commit", file=sys.stderr, flush=True)
                    time.sleep(float(pause))
                con.execute("commit")
            except BaseException as exc:
                with contextlib.suppress(duckdb.Error):
                    con.execute("rollback")
                if config is None or not isinstance(exc, duckdb.Error) or not ducklake.is_conflict(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise StoreConflict(
                        f"{describe(lake)}: the commit lost to other writers {attempt} times in "
                        f"{wait_seconds:g} s ({message or 'write'}); the previous state is kept, "
                        f"run it again: {exc}") from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            return result, (ducklake.last_committed_snapshot(con) if config is not None else None)


def write_partitions(tables: Mapping[str, pl.DataFrame], keys: Mapping[str, Any],
                     lake: LakeLocation, *, info: Mapping[str, Any] | None = None) -> int | None:
    """Atomically replace one partition of several tables (all or nothing). Returns the
    DuckLake snapshot it committed (None on a DuckDB file). `info` (the Dagster run id, ...)
    is recorded with the snapshot."""
    def body(con: duckdb.DuckDBPyConnection) -> None:
        for table, frame in tables.items():
            replace_partition(con, table, frame, keys)

    partition = "|".join(f"{k}={v}" for k, v in keys.items())
    _, snapshot = run_transaction(
        body, lake, message=f"write {', '.join(tables)} [{partition}]",
        info={"tables": list(tables), "partition": {k: str(v) for k, v in keys.items()}, **(info or {})},
        test_pause=True)
    return snapshot


def read_frame(sql: str, params: list[Any] | None, lake: LakeLocation) -> pl.DataFrame:
    with connect(lake) as con:
        return con.execute(sql, params or []).pl()


def dataset_snapshot(lake: LakeLocation, dataset: str, tables: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding `dataset`'s rows of those `tables` that exist in the data
    lake at `lake`. Assets compute on it, so a long computation never holds the lake's
    single-writer lock (other materializations wait for that lock while it is held). The
    tables an asset passes here are the ones it declares as its Dagster deps (one tuple)."""
    location(lake)
    memory = duckdb.connect()
    with connect(lake) as con:
        for table in tables:
            if table_exists(con, table):
                frame = con.execute(f'select * from "{table}" where dataset = ?', [dataset]).to_arrow_table()
                memory.register("_snapshot", frame)
                memory.execute(f'create table "{table}" as select * from _snapshot')
                memory.unregister("_snapshot")
    return memory
