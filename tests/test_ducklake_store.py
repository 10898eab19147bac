"""DuckLake as the store (issue 15, item 1): the same guarantees as the DuckDB file.

A partition's tables are replaced in one snapshot; a failed write leaves the previous state;
a commit that lost a race is retried, then fails with a clear error; parallel processes write
partitions of one table at once; the LLM ledger's small appends stay inlined in the catalog
(no Parquet file per chunk) and cost little per call; `bridge sql` prints TSV and refuses to
write; `bridge lake migrate` moves a DuckDB lake (the ledger included) table for table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from bridge_assets.lake import ducklake, store
from bridge_assets.lake.location import lake_location
from bridge_assets.llm import ledger
from bridge_assets.llm.types import LLMRequest, LLMResult
from fixtures.paths import PROJECT_ROOT, location


def frame(dataset: str, values: list[int], **extra) -> pl.DataFrame:
    return pl.DataFrame({"dataset": [dataset] * len(values), "value": values, **extra})


def rows(sql: str) -> list[tuple]:
    with store.connect(location()) as con:
        return con.execute(sql).fetchall()


def data_files(lake: Path, table: str) -> list[Path]:
    return sorted((lake / ducklake.DATA_FOLDER).rglob(f"main/{table}/*.parquet"))


def test_the_lake_location_means_the_ducklake_and_a_bare_path_is_refused(ducklake_lake):
    lake = lake_location()
    config = lake.ducklake
    assert config is not None and config.catalog == f"sqlite:{ducklake_lake / ducklake.CATALOG_FILE}"
    assert config.data_path == f"{ducklake_lake / ducklake.DATA_FOLDER}/"
    assert not store.exists(lake)
    store.write_partitions({"t": frame("a", [1])}, {"dataset": "a"}, lake)
    assert store.exists(lake) and not lake.duckdb.exists()
    for path in (lake.duckdb, str(lake.duckdb), lake.votes_db):  # no location rebuilt from a file's name
        with pytest.raises(TypeError, match="LakeLocation"):
            store.exists(path)


def test_a_partition_is_replaced_in_one_snapshot_and_a_failed_write_keeps_the_previous_state(ducklake_lake):
    first = store.write_partitions({"t": frame("a", [1, 2]), "u": frame("a", [10])}, {"dataset": "a"}, location())
    store.write_partitions({"t": frame("b", [7])}, {"dataset": "b"}, location())
    # a newer schema: the column is added, NULL in the rows written before
    third = store.write_partitions({"t": frame("a", [3], note=["new"]), "u": frame("a", [30])}, {"dataset": "a"}, location())
    assert first < third
    assert rows("select dataset, value, note from t order by all") == [("a", 3, "new"), ("b", 7, None)]
    with store.connect(location()) as con:
        snapshot = next(s for s in ducklake.snapshots(con) if s["snapshot"] == third)
    assert snapshot["info"]["tables"] == ["t", "u"] and snapshot["info"]["partition"] == {"dataset": "a"}

    class Boom(Exception):
        pass

    bad = frame("a", [99])
    with pytest.raises(Exception):  # the second table's frame lacks the partition column
        store.write_partitions({"t": bad, "u": pl.DataFrame({"value": [1]})}, {"dataset": "a"}, location())
    def fails_midway(con):
        con.execute("delete from t")
        raise Boom()

    with pytest.raises(Boom):
        store.run_transaction(fails_midway, location())
    assert rows("select dataset, value from t order by all") == [("a", 3), ("b", 7)]
    assert rows("select value from u") == [(30,)]
    # time travel: the lake as the first write left it
    with store.connect_read_only(location(), snapshot=first) as con:
        assert con.execute("select value from t order by all").fetchall() == [(1,), (2,)]


def test_a_commit_that_lost_a_race_is_retried_and_then_fails_clearly(ducklake_lake):
    store.write_partitions({"t": frame("a", [1])}, {"dataset": "a"}, location())
    attempts = []

    def body(con):  # another writer commits while this transaction is open, once
        attempts.append(1)
        con.execute("delete from t where dataset = 'a'")
        con.execute("insert into t values ('a', 2)")
        if len(attempts) == 1:
            thread = threading.Thread(target=store.write_partitions,
                                      args=({"t": frame("b", [5])}, {"dataset": "b"}, location()))
            thread.start()
            thread.join()

    _, snapshot = store.run_transaction(body, location())
    assert len(attempts) == 2 and snapshot is not None
    assert rows("select * from t order by all") == [("a", 2), ("b", 5)]

    def always_loses(con):
        con.execute("insert into t values ('c', 1)")
        thread = threading.Thread(target=store.write_partitions,
                                  args=({"t": frame("b", [len(attempts)])}, {"dataset": "b"}, location()))
        thread.start()
        thread.join()
        attempts.append(1)

    with pytest.raises(store.StoreConflict, match="lost to other writers .* previous state is kept"):
        store.run_transaction(always_loses, location(), message="write t [dataset=c]", wait_seconds=0.5)
    assert rows("select count(*) from t where dataset = 'c'") == [(0,)]


WRITER = textwrap.dedent("""
    import sys, polars as pl
    from bridge_assets.lake import store
    from bridge_assets.lake.location import lake_location
    worker, partitions = sys.argv[1], int(sys.argv[2])
    for i in range(partitions):
        key = f"{worker}-{i}"
        store.write_partitions({"t": pl.DataFrame({"dataset": [key] * 3, "value": [i, i + 1, i + 2]}),
                                "u": pl.DataFrame({"dataset": [key], "worker": [worker]})}, {"dataset": key},
                               lake_location())
    print("done", flush=True)
""")


def test_parallel_processes_write_partitions_of_the_same_tables_at_once(ducklake_lake):
    store.write_partitions({"t": frame("seed", [0]), "u": pl.DataFrame({"dataset": ["seed"], "worker": ["-"]})},
                           {"dataset": "seed"}, location())
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), "8"], cwd=PROJECT_ROOT,
                              env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    assert rows("select count(distinct dataset), count(*) from t") == [(25, 73)]
    assert rows("select count(*) from u") == [(25,)]
    assert rows("select count(*) from (select dataset from t except select dataset from u)") == [(0,)]


def call_records(n: int, offset: int) -> list[ledger.CallRecord]:
    out = []
    for i in range(offset, offset + n):
        request = LLMRequest(messages=[("user", f"is document {i} relevant? " + "x" * 400)], purpose="filter")
        key = ledger.call_key("openai", "fake", request)
        out.append(ledger.CallRecord(request, LLMResult(key=key, text='{"is_supported": true}',
                                                        parsed={"is_supported": True}, tokens_in=120,
                                                        tokens_out=8), 1))
    return out


def test_ledger_chunks_stay_inlined_and_cost_little_per_call(ducklake_lake, monkeypatch):
    chunks, size = 40, 64
    started = time.perf_counter()
    for chunk in range(chunks):
        ledger.append(call_records(size, chunk * size), profile="fake", backend="openai", model="fake",
                      context="test", lake=location())
    append_s = (time.perf_counter() - started) / (chunks * size)
    started = time.perf_counter()
    found = ledger.lookup([r.result.key for r in call_records(size, 0)], location())
    lookup_s = (time.perf_counter() - started) / size
    assert len(found) == size
    assert rows("select count(*) from llm_calls") == [(chunks * size,)]
    assert data_files(ducklake_lake, "llm_calls") == []  # 40 snapshots, rows in the catalog, no Parquet file
    print(f"\nledger on DuckLake: append {append_s * 1e3:.3f} ms/call, lookup {lookup_s * 1e3:.3f} ms/call "
          f"(chunks of {size})")
    assert append_s < 0.02  # far below a model call; measured ~0.5 ms here

    # past FLUSH_ROWS the rows go out as one Parquet file
    monkeypatch.setattr(ledger, "FLUSH_ROWS", size * 2)
    ledger.append(call_records(size, 10_000), profile="fake", backend="openai", model="fake", context="t", lake=location())
    ledger.append(call_records(size, 20_000), profile="fake", backend="openai", model="fake", context="t", lake=location())
    assert len(data_files(ducklake_lake, "llm_calls")) == 1
    assert rows("select count(*) from llm_calls") == [((chunks + 2) * size,)]

    with store.connect(location()) as con:
        counts = ducklake.compact(con)
    assert counts["after"]["llm_calls"] == {"files": 1, "delete_files": 0}


def test_partition_rewrites_are_compacted(ducklake_lake):
    big = list(range(2000))  # past the inlining limit: a Parquet file per write
    for i in range(6):
        store.write_partitions({"t": frame("a", big, round=[i] * len(big))}, {"dataset": "a"}, location())
        store.write_partitions({"t": frame("b", big, round=[i] * len(big))}, {"dataset": "b"}, location())
    before = len(data_files(ducklake_lake, "t"))
    with store.connect(location()) as con:
        counts = ducklake.compact(con)
    assert counts["before"]["t"]["files"] == 2 and counts["after"]["t"]["files"] == 1
    assert rows("select dataset, count(*), max(round) from t group by all order by all") == \
        [("a", 2000, 5), ("b", 2000, 5)]
    assert before >= 2


def test_bridge_sql_prints_tsv_on_both_storages_and_never_writes(data_lake, monkeypatch):
    from bridge_assets.cli.main import app

    runner = CliRunner()
    for storage in ("duckdb", "ducklake"):
        monkeypatch.setenv("BRIDGE_STORAGE", storage)
        store.write_partitions({"t": pl.DataFrame({"dataset": ["a", "a"], "value": [1, None],
                                                   "text": ["tab\there", "line\nbreak"]})}, {"dataset": "a"}, location())
        result = runner.invoke(app, ["sql", "select value, text, [1, 2] as l from t order by value nulls last"])
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == ["value\ttext\tl", "1\ttab\\there\t[1, 2]", "\tline\\nbreak\t[1, 2]"]
        refused = runner.invoke(app, ["sql", "delete from t"])
        assert refused.exit_code == 2 and "read-only" in refused.output
        assert rows("select count(*) from t") == [(2,)]
        (data_lake / "bridge.duckdb").rename(data_lake / "old.duckdb") if storage == "duckdb" else None
    ducklake.forget_instances()


def test_bridge_sql_refuses_every_statement_that_is_not_one_read(data_lake, tmp_path):
    from bridge_assets.cli.main import app

    store.write_partitions({"t": pl.DataFrame({"dataset": ["a"] * 5, "value": range(5)})}, {"dataset": "a"}, location())
    catalog, data = data_lake / "ducklake.sqlite", data_lake / "ducklake"
    out = tmp_path / "x.csv"
    runner = CliRunner()
    refused = {
        # a second, writable ATTACH of the same catalog, then a DELETE through it
        f"ATTACH 'ducklake:sqlite:{catalog}' AS w (DATA_PATH '{data}/'); DELETE FROM w.t": "exactly one statement",
        f"ATTACH 'ducklake:sqlite:{catalog}' AS w (DATA_PATH '{data}/')": "ATTACH statement",
        f"COPY (select 1 as a) TO '{out}'": "COPY statement",
        "SET threads = 1": "SET statement", "INSTALL httpfs": "LOAD statement", "LOAD httpfs": "LOAD statement",
        "EXPLAIN ANALYZE DELETE FROM t": "DELETE statement", "CHECKPOINT": "CALL statement",
        "select 1; select 2": "exactly one statement",
    }
    for query, why in refused.items():
        result = runner.invoke(app, ["sql", query])
        assert result.exit_code == 2 and why in result.output, (query, result.output)
    assert not out.exists()
    assert rows("select count(*) from t") == [(5,)]
    # a table past the inlining limit is read from its Parquet files, inside the lake
    store.write_partitions({"big": pl.DataFrame({"dataset": ["a"] * 2000, "value": range(2000)})}, {"dataset": "a"}, location())
    assert data_files(data_lake, "big")
    result = runner.invoke(app, ["sql", "select sum(value) as s from big"])
    assert result.exit_code == 0 and result.stdout.splitlines() == ["s", str(sum(range(2000)))], result.output
    # a read cannot reach files outside the lake either
    outside = tmp_path / "outside.csv"
    outside.write_text("a\n1\n")
    result = runner.invoke(app, ["sql", f"select * from read_csv('{outside}')"])
    assert result.exit_code == 2 and "disabled" in result.output
    # every read of the README still works
    for query, first in (("select count(*) as n from t", "n"), ("describe t", "column_name"),
                         ("show tables", "name"), ("summarize t", "column_name"),
                         ("pragma table_info('t')", "cid"), ("explain select * from t", "explain_key"),
                         ("from t select max(value) as m", "m"), ("with x as (select 1 as one) select * from x", "one")):
        result = runner.invoke(app, ["sql", query])
        assert result.exit_code == 0 and result.stdout.splitlines()[0].split("\t")[0] == first, (query, result.output)


def test_a_copied_or_moved_lake_folder_answers_from_its_new_place(data_lake, tmp_path, monkeypatch):
    import shutil

    from bridge_assets.cli.main import app

    store.write_partitions({"t": pl.DataFrame({"dataset": ["a"] * 3, "value": [1, 2, 3]})}, {"dataset": "a"}, location())
    ducklake.forget_instances()
    copy = tmp_path / "lake_copy"
    shutil.copytree(data_lake, copy, symlinks=True)  # cp -a
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(copy))
    runner = CliRunner()
    info = runner.invoke(app, ["lake", "info"])
    assert info.exit_code == 0 and info.exception is None, info.output
    assert f"ducklake data path\t{copy}/ducklake/" in info.stdout
    result = runner.invoke(app, ["sql", "select sum(value) as s from t"])
    assert result.exit_code == 0 and result.stdout.splitlines() == ["s", "6"], result.output
    config = ducklake.DuckLakeConfig.for_folder(copy)
    assert ducklake.stored_data_path(config) == f"{copy}/ducklake/"
    # the original still names its own data
    assert ducklake.stored_data_path(ducklake.DuckLakeConfig.for_folder(data_lake)) == f"{data_lake}/ducklake/"
    ducklake.forget_instances()

    # data moved to a place of the user's choosing: refused with what to do, then re-pointed
    moved = tmp_path / "parquet_elsewhere"
    (copy / "ducklake").rename(moved)
    monkeypatch.setenv("BRIDGE_LAKE_DATA_PATH", str(moved))
    refused = runner.invoke(app, ["sql", "select sum(value) from t"])
    assert refused.exit_code == 2 and "bridge lake repoint" in refused.output
    repointed = runner.invoke(app, ["lake", "repoint"])
    assert repointed.exit_code == 0 and f"-> {moved}/" in repointed.output, repointed.output
    result = runner.invoke(app, ["sql", "select sum(value) as s from t"])
    assert result.exit_code == 0 and result.stdout.splitlines() == ["s", "6"], result.output
    ducklake.forget_instances()


def test_migrate_moves_every_table_and_the_ledger(data_lake, monkeypatch):
    from bridge_assets.cli.main import app

    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")
    store.write_partitions({"corpus": pl.DataFrame({"dataset": ["a"], "doc_id": ["d1"], "text": ["x"]}),
                            "queries": pl.DataFrame({"dataset": ["a"], "query_id": ["q1"],
                                                     "answers": [["one", "two"]]})}, {"dataset": "a"}, location())
    ledger.append(call_records(100, 0), profile="fake", backend="openai", model="fake", context="run-1", lake=location())
    with store.connect(location()) as con:
        before = {t: con.execute(f"select * from {t} order by all").fetchall()
                  for t in ("corpus", "queries", "llm_calls")}

    result = CliRunner().invoke(app, ["lake", "migrate"])
    assert result.exit_code == 0, result.output
    assert "llm_calls\t100 rows" in result.stdout
    assert not (data_lake / "bridge.duckdb").exists()
    assert list(data_lake.glob("bridge.duckdb.migrated-*"))
    # the old storage now refuses the folder instead of starting an empty file
    with pytest.raises(store.StoreMismatch, match="unset BRIDGE_STORAGE"):
        with store.connect(location()):
            pass

    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    with store.connect(location()) as con:
        after = {t: con.execute(f"select * from {t} order by all").fetchall() for t in before}
    assert after == before
    assert ledger.lookup([r.result.key for r in call_records(3, 0)], location()).keys() == \
        {r.result.key for r in call_records(3, 0)}
    again = CliRunner().invoke(app, ["lake", "migrate", "--from", str(next(data_lake.glob("bridge.duckdb.migrated-*")))])
    assert again.exit_code == 2 and "already holds tables" in again.output
    ducklake.forget_instances()


def test_ducklake_refuses_an_unmigrated_duckdb_lake(data_lake, monkeypatch):
    duckdb.connect(str(data_lake / "bridge.duckdb")).close()
    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    with pytest.raises(store.StoreMismatch, match="bridge lake migrate"):
        with store.connect(location()):
            pass
