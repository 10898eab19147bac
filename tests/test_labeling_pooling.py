"""sql/candidate_pool.sql on small hand-made tables."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from bridge_assets.labeling.pairs import load_pairs
from bridge_assets.labeling.pooling import NoRunsError, candidate_pool


def run_rows(rows):
    return pl.DataFrame(rows, schema=["dataset", "retriever", "query_id", "doc_id", "rank"],
                        orient="row").with_columns(score=pl.lit(1.0), config_hash=pl.lit("h"))


@pytest.fixture
def con():
    con = duckdb.connect()
    runs = run_rows([
        ("demo", "bm25", "q1", "a", 1), ("demo", "bm25", "q1", "b", 2), ("demo", "bm25", "q1", "c", 11),
        ("demo", "dense", "q1", "b", 1), ("demo", "dense", "q1", "d", 2),
        ("demo", "dense", "q2", "a", 1),
        ("other", "bm25", "q1", "z", 1),
    ])
    con.register("runs_frame", runs.to_arrow())
    con.execute("create table retrieval_run as select * from runs_frame")
    con.execute("""create table original_qrels as select * from (values
        ('demo', 'q1', 'b', 1), ('demo', 'q2', 'x', 1), ('other', 'q1', 'a', 1))
        t(dataset, query_id, doc_id, relevance)""")
    yield con
    con.close()


def rows(pool):
    return {(r["query_id"], r["doc_id"]): r for r in pool.iter_rows(named=True)}


def test_pool_unions_each_systems_top_k_with_systems_and_ranks(con):
    pool = rows(candidate_pool(con, "demo"))
    assert set(pool) == {("q1", "a"), ("q1", "b"), ("q1", "d"), ("q2", "a")}  # c is rank 11
    b = pool[("q1", "b")]
    assert (b["systems"], b["ranks"], b["best_rank"], b["n_systems"]) == (["bm25", "dense"], [2, 1], 1, 2)
    assert b["in_original_qrels"] is True
    assert pool[("q1", "a")]["in_original_qrels"] is False  # judged in another dataset only
    assert pool[("q2", "a")]["systems"] == ["dense"]


def test_depth_is_configurable(con):
    assert set(rows(candidate_pool(con, "demo", depth=1))) == {("q1", "a"), ("q1", "b"), ("q2", "a")}
    assert ("q1", "c") in rows(candidate_pool(con, "demo", depth=20))


def test_query_sample_is_stable_when_a_retriever_is_added(con):
    sample = candidate_pool(con, "demo", query_limit=1)
    assert sample["query_id"].n_unique() == 1
    chosen = sample["query_id"][0]
    con.register("more", run_rows([("demo", "splade", "q1", "e", 1), ("demo", "splade", "q2", "e", 1)]).to_arrow())
    con.execute("insert into retrieval_run select * from more")
    again = candidate_pool(con, "demo", query_limit=1)
    assert set(again["query_id"]) == {chosen}
    assert (chosen, "e") in rows(again)


def test_a_dataset_without_runs_fails_naming_it(con):
    with pytest.raises(NoRunsError, match="'nothing'"):
        candidate_pool(con, "nothing")
    empty = duckdb.connect()
    with pytest.raises(NoRunsError, match="retrieval_run does not exist"):
        candidate_pool(empty, "demo")


def test_pairs_join_texts_and_fail_on_unknown_documents(con):
    con.execute("""create table queries as select * from (values
        ('demo', 'q1', 'what?', ['x', 'y'])) t(dataset, query_id, text, answers)""")
    con.execute("""create table corpus as select * from (values
        ('demo', 'a', 'Title A', 'text a'), ('demo', 'b', '', 'text b')) t(dataset, doc_id, title, text)""")
    pairs = load_pairs(con, "demo", "select * from (values ('q1', 'a'), ('q1', 'b')) t(query_id, doc_id)")
    assert [(p.doc_id, p.chunk, p.answers) for p in pairs] == [
        ("a", "Title A\ntext a", ("x", "y")), ("b", "text b", ("x", "y"))]
    assert pairs[0].key != pairs[1].key
    with pytest.raises(LookupError, match="missing from the queries/corpus"):
        load_pairs(con, "demo", "select 'q1' as query_id, 'zzz' as doc_id")
