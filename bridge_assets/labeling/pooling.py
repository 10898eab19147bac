"""The candidate pool: the union of every retrieval run's top-k per query (sql/candidate_pool.sql)."""

from __future__ import annotations

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.paths import read_sql


class NoRunsError(BridgeError, LookupError):
    """There is no retrieval run to pool for a dataset."""


def candidate_pool(con: duckdb.DuckDBPyConnection, dataset: str, depth: int = 10,
                   query_limit: int = 0) -> pl.DataFrame:
    """The pool of `dataset` from the `retrieval_run` and `original_qrels` tables:
    every system's top-`depth`, for all queries or a stable sample of `query_limit`."""
    if depth < 1:
        raise ValueError(f"pool depth must be at least 1, got {depth}")
    for table in ("retrieval_run", "original_qrels"):
        if not table_exists(con, table):
            raise NoRunsError(f"table {table} does not exist yet: materialize it for dataset "
                              f"'{dataset}' before candidate_pool")
    systems = one_row(con, "select count(distinct retriever) from retrieval_run where dataset = ?",
                      [dataset])[0]
    if not systems:
        raise NoRunsError(f"no retrieval_run rows for dataset '{dataset}': materialize at least "
                          "one retriever's run first")
    return con.execute(read_sql("candidate_pool"),
                       {"dataset": dataset, "depth": depth, "query_limit": query_limit}).pl()
