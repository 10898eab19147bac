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
from fixtures.paths import location

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
    lake = location(tmp_path)
    holder = hold_lock(lake.duckdb, 2)
    started = time.monotonic()
    with store.connect(lake) as con:
        assert con.execute("select count(*) from t").fetchone()[0] == 0
    assert time.monotonic() - started >= 1.0  # it really waited for the other writer
    holder.wait()


def test_connect_gives_up_after_its_deadline(tmp_path, duckdb_storage):
    lake = location(tmp_path)
    holder = hold_lock(lake.duckdb, 5)
    with pytest.raises(duckdb.IOException, match="lock"):
        with store.connect(lake, wait_seconds=0.5):
            pass
    holder.kill()


def test_write_partitions_is_all_or_nothing(tmp_path):
    path = location(tmp_path)
    good = pl.DataFrame({"dataset": ["a"], "x": [1]})
    store.write_partitions({"t1": good, "t2": good}, {"dataset": "a"}, path)
    with pytest.raises(ValueError, match="lacks partition columns"):
        store.write_partitions({"t1": pl.DataFrame({"dataset": ["a"], "x": [2]}),
                                "t2": pl.DataFrame({"x": [2]})}, {"dataset": "a"}, path)
    assert store.read_frame("select x from t1", None, path)["x"].to_list() == [1]
    # replacing a partition leaves the other partitions alone
    store.write_partitions({"t1": pl.DataFrame({"dataset": ["b"], "x": [5]})}, {"dataset": "b"}, path)
    store.write_partitions({"t1": pl.DataFrame({"dataset": ["b", "b"], "x": [6, 7]})}, {"dataset": "b"}, path)
    assert sorted(store.read_frame("select x from t1", None, path)["x"].to_list()) == [1, 6, 7]


@pytest.mark.parametrize("bare", ["path", "str"])
def test_the_store_takes_a_lake_location_and_refuses_a_bare_path(tmp_path, bare):
    """No environment fallback and no location rebuilt from a file named bridge.duckdb: a path
    is a caller that skipped the edge resolving the location (a TypeError, before any file)."""
    path = location(tmp_path).duckdb
    where = path if bare == "path" else str(path)
    frame = pl.DataFrame({"dataset": ["a"], "x": [1]})
    calls = {
        "exists": lambda: store.exists(where),
        "describe": lambda: store.describe(where),
        "check": lambda: store.check(where),
        "connect": lambda: store.connect(where).__enter__(),
        "connect_read_only": lambda: store.connect_read_only(where).__enter__(),
        "attach": lambda: store.attach(duckdb.connect(), where, "lake"),
        "run_transaction": lambda: store.run_transaction(lambda con: None, where),
        "write_partitions": lambda: store.write_partitions({"t": frame}, {"dataset": "a"}, where),
        "read_frame": lambda: store.read_frame("select 1", None, where),
        "dataset_snapshot": lambda: store.dataset_snapshot(where, "a", ["t"]),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="LakeLocation"):
            call()
        assert not path.exists(), f"store.{name} opened {path}"
    with pytest.raises(TypeError):
        store.connect().__enter__()  # no environment fallback either
