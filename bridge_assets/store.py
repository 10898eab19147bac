"""The DuckDB store every asset reads and writes.

DuckDB allows one writing process per file, and Dagster's multiprocess executor runs
partitions in parallel processes (dagster issues 16248/18746). So every access is a short
connection that retries while another process holds the lock, and every write of an asset
partition is one transaction: delete the partition's old rows, insert the new ones. A run
that fails never leaves half a partition behind, and parallel runs queue for the lock
instead of failing on it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl

from bridge_assets.paths import duckdb_path

LOCK_WAIT_SECONDS = 300.0
# Test-only: seconds write_partitions sleeps inside its transaction, before the commit, so a test
# can kill -9 the process mid-write (tests/test_faults_kill.py). Unset in normal use.
TEST_PAUSE_ENV = "BRIDGE_TEST_PAUSE_IN_WRITE"
T = TypeVar("T")


class StoreBusy(duckdb.IOException):
    """Another process held the file's lock for longer than the caller would wait."""


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
def connect(path: Path | None = None, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection; waits (with backoff) while another process holds the file."""
    path = Path(path or duckdb_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    con = _waiting(lambda: duckdb.connect(str(path)), path, wait_seconds)
    try:
        yield con
    finally:
        con.close()


def attach(con: duckdb.DuckDBPyConnection, path: Path, alias: str, *, read_only: bool = True,
           wait_seconds: float = LOCK_WAIT_SECONDS) -> None:
    """ATTACH the DuckDB file `path` to `con` as `alias` (read-only by default), waiting like
    connect() while another process writes it."""
    mode = " (read_only)" if read_only else ""
    _waiting(lambda: con.execute(f"attach '{_sql_string(path)}' as \"{alias}\"{mode}"), Path(path),
             wait_seconds)


def _sql_string(path: Path) -> str:
    return str(path).replace("'", "''")


def table_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute(
        "select count(*) from information_schema.tables where table_name = ?", [table]
    ).fetchone()[0])


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


def write_partitions(tables: Mapping[str, pl.DataFrame], keys: Mapping[str, Any],
                     path: Path | None = None) -> None:
    """Atomically replace one partition of several tables (all or nothing)."""
    with connect(path) as con:
        con.execute("begin transaction")
        try:
            for table, frame in tables.items():
                replace_partition(con, table, frame, keys)
            if pause := os.environ.get(TEST_PAUSE_ENV):
                print(f"{TEST_PAUSE_ENV}: paused before commit", file=sys.stderr, flush=True)
                time.sleep(float(pause))
            con.execute("commit")
        except BaseException:
            con.execute("rollback")
            raise


def read_frame(sql: str, params: list[Any] | None = None, path: Path | None = None) -> pl.DataFrame:
    with connect(path) as con:
        return con.execute(sql, params or []).pl()


def dataset_snapshot(path: Path, dataset: str, tables: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding `dataset`'s rows of those `tables` that exist in the data
    lake at `path`. Assets compute on it, so a long computation never holds the lake's
    single-writer lock (other materializations wait for that lock while it is held). The
    tables an asset passes here are the ones it declares as its Dagster deps (one tuple)."""
    memory = duckdb.connect()
    with connect(path) as con:
        for table in tables:
            if table_exists(con, table):
                frame = con.execute(f'select * from "{table}" where dataset = ?', [dataset]).to_arrow_table()
                memory.register("_snapshot", frame)
                memory.execute(f'create table "{table}" as select * from _snapshot')
                memory.unregister("_snapshot")
    return memory
