"""One dataset's runs and qrels as temp views, the shape the metrics and analyses read.

    analysis_scope(query_id)                       the queries the analysis covers
    analysis_run(dataset, retriever, query_id, doc_id, rank, score)
    analysis_original_qrels(dataset, query_id, doc_id, relevance)
    analysis_refined_qrels(dataset, query_id, doc_id, relevance)   (bridge_qrels)

Scope "pooled" keeps the queries of the candidate pool: when the pool was built on a sample of
queries (candidate_pool's query_limit), only those got new labels, and comparing original and
refined qrels over every query would dilute the difference with queries nobody re-judged.
Without a candidate pool, "pooled" falls back to every query. Scope "all" keeps every query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb

from bridge_assets import store
from bridge_assets.store import table_exists

Scope = Literal["pooled", "all"]
VIEWS = ("analysis_run", "analysis_original_qrels", "analysis_refined_qrels")


class MissingInput(LookupError):
    """An analysis needs a table (or rows of it) that is not materialized."""


@dataclass(frozen=True)
class ScopeInfo:
    scope: str          # what was asked
    applied: str        # "pooled" or "all" (pooled falls back to all without a pool)
    queries: int
    retrievers: tuple[str, ...]


def require_rows(con: duckdb.DuckDBPyConnection, table: str, dataset: str, asset: str) -> None:
    """Fail naming `table` when it has no rows for `dataset`."""
    if not table_exists(con, table) or not con.execute(
            f"select count(*) from {table} where dataset = ?", [dataset]).fetchone()[0]:
        raise MissingInput(f"{asset} for dataset '{dataset}': no {table} rows; materialize "
                           f"{table} for '{dataset}' first")


@contextlib.contextmanager
def analysis_views(con: duckdb.DuckDBPyConnection, dataset: str, scope: Scope = "pooled", *,
                   asset: str, refined: bool = True) -> Iterator[ScopeInfo]:
    """Create the views above for `dataset` (dropped afterwards). `refined=False` skips
    bridge_qrels for analyses that do not read it."""
    require_rows(con, "retrieval_run", dataset, asset)
    require_rows(con, "original_qrels", dataset, asset)
    if refined:
        require_rows(con, "bridge_qrels", dataset, asset)
    pooled = scope == "pooled" and table_exists(con, "candidate_pool") and con.execute(
        "select count(*) from candidate_pool where dataset = ?", [dataset]).fetchone()[0] > 0
    source = "candidate_pool" if pooled else "queries"
    if not pooled and not table_exists(con, "queries"):
        source = "retrieval_run"
    literal = dataset.replace("'", "''")
    views = {
        "analysis_scope": f"select distinct query_id from {source} where dataset = '{literal}'",
        "analysis_run": f"""select dataset, retriever, query_id, doc_id, rank, score from retrieval_run
                            where dataset = '{literal}' and query_id in (select query_id from analysis_scope)""",
        "analysis_original_qrels": f"""select dataset, query_id, doc_id, relevance from original_qrels
                                       where dataset = '{literal}'
                                         and query_id in (select query_id from analysis_scope)""",
    }
    if refined:
        views["analysis_refined_qrels"] = f"""select dataset, query_id, doc_id, relevance from bridge_qrels
                                              where dataset = '{literal}'
                                                and query_id in (select query_id from analysis_scope)"""
    try:
        for name, select in views.items():
            con.execute(f"create or replace temp view {name} as {select}")
        queries = con.execute("select count(*) from analysis_scope").fetchone()[0]
        retrievers = tuple(r[0] for r in con.execute(
            "select distinct retriever from analysis_run order by 1").fetchall())
        yield ScopeInfo(scope, "pooled" if pooled else "all", queries, retrievers)
    finally:
        for name in reversed(list(views)):
            con.execute(f"drop view if exists {name}")


def dataset_snapshot(path: Path, dataset: str, tables: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding `dataset`'s rows of those `tables` that exist in the data
    lake at `path`. Analyses run on it, so a long computation never holds the lake's
    single-writer lock (other materializations wait for that lock while it is held)."""
    memory = duckdb.connect()
    with store.connect(path) as con:
        for table in tables:
            if table_exists(con, table):
                frame = con.execute(f'select * from "{table}" where dataset = ?', [dataset]).to_arrow_table()
                memory.register("_snapshot", frame)
                memory.execute(f'create table "{table}" as select * from _snapshot')
                memory.unregister("_snapshot")
    return memory
