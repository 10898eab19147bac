"""A real `kill -9` of `bridge materialize` in the middle of a partition write (issue 13, item 13).

The process pauses inside write_partitions' transaction (store.TEST_PAUSE_ENV, test-only), after
it deleted the partition's old rows and inserted the new ones, and is killed there with SIGKILL:
no rollback, no cleanup. The tables must stay as the last completed run left them (none at all
before the first), and the next run must complete.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from bridge_assets.ingest.assets import ingest_dataset
from bridge_assets.lake import store
from fixtures.datasets import write_beir
from fixtures.killed_runs import complete, dagster_home, kill_in_the_write
from fixtures.paths import lake_resources, location

TABLES = ("corpus", "queries", "original_qrels")
# Enough rows for DuckDB to write row groups to the file before the commit (optimistic writes).
BIG_CORPUS = 150_000


def snapshot(lake: Path) -> dict[str, list[tuple]]:
    """Every row of the ingest tables that exist."""
    with store.connect(location(lake)) as con:
        present = {r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()}
        return {t: con.execute(f"select * from {t} order by all").fetchall() for t in TABLES if t in present}


def test_kill_9_inside_a_partition_write_keeps_the_previous_tables_and_the_next_run_completes(
        tmp_path, data_lake):
    env = {"DAGSTER_HOME": str(dagster_home(tmp_path)), "BRIDGE_DATA_LAKE": str(data_lake)}

    def ingest_in_process() -> None:
        assert dg.materialize([ingest_dataset], partition_key="demo",
                              resources=lake_resources(data_lake)).success

    ingest_in_process()
    fresh = snapshot(data_lake)
    with store.connect(location(data_lake)) as con:  # a state no run would write
        con.execute("update corpus set text = 'left by the previous run' "
                    "where doc_id = (select min(doc_id) from corpus)")
        con.execute("delete from queries where query_id = (select min(query_id) from queries)")
    previous = snapshot(data_lake)
    assert previous != fresh

    kill_in_the_write("demo", env)
    assert snapshot(data_lake) == previous
    ingest_in_process()  # the next run: the file opens, its lock is free, the write commits
    assert snapshot(data_lake) == fresh


@pytest.mark.slow
def test_kill_9_in_a_first_write_and_in_a_big_replacement_through_the_cli(tmp_path, data_lake):
    folder = write_beir(tmp_path / "mine")
    registry = tmp_path / "datasets.yaml"
    registry.write_text(f"datasets:\n  mine:\n    kind: beir\n    path: {folder}\n")
    env = {"BRIDGE_DATASETS": str(registry), "DAGSTER_HOME": str(dagster_home(tmp_path)),
           "BRIDGE_DATA_LAKE": str(data_lake)}

    # the very first write, killed: no table appears; the rerun writes them
    kill_in_the_write("mine", env)
    assert snapshot(data_lake) == {}
    complete("mine", env)
    first = snapshot(data_lake)
    assert [len(first[t]) for t in TABLES] == [2, 2, 2]

    # replacing the partition by one big enough to reach the file before the commit, killed
    write_beir(folder, corpus=[{"_id": "d1", "text": "changed"}, {"_id": "d2", "text": "Berlin."}]
               + [{"_id": f"x{i}", "text": f"filler {i}"} for i in range(BIG_CORPUS)],
               queries=[{"_id": "q1", "text": "capital of france?", "answers": ["Paris"]}],
               qrels=["q1\td1\t1"])
    kill_in_the_write("mine", env)
    assert snapshot(data_lake) == first
    complete("mine", env)
    after = snapshot(data_lake)
    assert [len(after[t]) for t in TABLES] == [BIG_CORPUS + 2, 1, 1]
    with store.connect(location(data_lake)) as con:
        assert con.execute("select text from corpus where doc_id = 'd1'").fetchone() == ("changed",)
