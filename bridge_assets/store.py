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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bridge_assets.paths import duckdb_path

LOCK_WAIT_SECONDS = 300.0
# Test-only: seconds write_partitions sleeps inside its transaction, before the commit, so a test
# can kill -9 the process mid-write (tests/test_faults_kill.py). Unset in normal use.
TEST_PAUSE_ENV = "BRIDGE_TEST_PAUSE_IN_WRITE"


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    return "lock" in text.lower() and ("Conflicting" in text or "Could not set lock" in text)


@contextlib.contextmanager
def connect(path: Path | None = None, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection; waits (with backoff) while another process holds the file."""
    path = Path(path or duckdb_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    delay = 0.05
    while True:
        try:
            con = duckdb.connect(str(path))
            break
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            if not _is_lock_error(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    try:
        yield con
    finally:
        con.close()


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
