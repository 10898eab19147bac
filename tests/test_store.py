"""The store: on the DuckDB-file storage (BRIDGE_STORAGE=duckdb) a second process waits for the
file's lock instead of failing; on either storage a partition write is all or nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import duckdb
import polars as pl
import pytest

from bridge_assets.lake import store

HOLD_LOCK = textwrap.dedent("""
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    con.execute("create table if not exists t (x int)")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    con.close()
""")


def hold_lock(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_connect_waits_while_another_process_holds_the_file(tmp_path, duckdb_storage):
    path = tmp_path / "bridge.duckdb"
    holder = hold_lock(path, 2)
    started = time.monotonic()
    with store.connect(path) as con:
        assert con.execute("select count(*) from t").fetchone()[0] == 0
    assert time.monotonic() - started >= 1.0  # it really waited for the other writer
    holder.wait()


def test_connect_gives_up_after_its_deadline(tmp_path, duckdb_storage):
    path = tmp_path / "bridge.duckdb"
    holder = hold_lock(path, 5)
    with pytest.raises(duckdb.IOException, match="lock"):
        with store.connect(path, wait_seconds=0.5):
            pass
    holder.kill()


def test_write_partitions_is_all_or_nothing(tmp_path):
    path = tmp_path / "bridge.duckdb"
    good = pl.DataFrame({"dataset": ["a"], "x": [1]})
    store.write_partitions({"t1": good, "t2": good}, {"dataset": "a"}, path)
    with pytest.raises(ValueError, match="lacks partition columns"):
        store.write_partitions({"t1": pl.DataFrame({"dataset": ["a"], "x": [2]}),
                                "t2": pl.DataFrame({"x": [2]})}, {"dataset": "a"}, path)
    assert store.read_frame("select x from t1", where=path)["x"].to_list() == [1]
    # replacing a partition leaves the other partitions alone
    store.write_partitions({"t1": pl.DataFrame({"dataset": ["b"], "x": [5]})}, {"dataset": "b"}, path)
    store.write_partitions({"t1": pl.DataFrame({"dataset": ["b", "b"], "x": [6, 7]})}, {"dataset": "b"}, path)
    assert sorted(store.read_frame("select x from t1", where=path)["x"].to_list()) == [1, 6, 7]
