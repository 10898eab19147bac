"""One dataset's runs and qrels as temp tables, the shape the metrics and analyses read.

    analysis_scope(query_id)                       the queries the analysis covers
    analysis_run(dataset, retriever, query_id, doc_id, rank, score)  (with `evaluated`, the
                                                   evaluation-only systems' runs too)
    analysis_original_qrels(dataset, query_id, doc_id, relevance)
    analysis_refined_qrels(dataset, query_id, doc_id, relevance)        (bridge_qrels, lower bound)
    analysis_refined_upper_qrels(dataset, query_id, doc_id, relevance)  (bridge_qrels, upper bound)

Pending pairs (escalated, awaiting people) are not labels, so the refined qrels come as two
bounds: every pending pair irrelevant (`refined`, what the verified labels alone give) and
every pending pair relevant at the scale's top grade (`refined_upper`: 1, or 3 on a graded
dataset, so that it bounds nDCG's gains and every relevance level). A finding that holds at
both ends does not depend on how people will decide. Where the dataset asks for it
(`relevance.drops_in_bounds`), the upper bound also counts as relevant the filter's drops the
audit estimates to be holes (bridge_qrels.estimated_hole).

Scope "pooled" keeps the queries of the candidate pool: when the pool was built on a sample of
queries (candidate_pool's query_limit), only those got new labels, and comparing original and
refined qrels over every query would dilute the difference with queries nobody re-judged.
Without a candidate pool, "pooled" falls back to every query. Scope "all" keeps every query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import duckdb

from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import dataset_snapshot, one_row, table_exists

Scope = Literal["pooled", "all"]
# The runs of the evaluation-only systems (the student stage's student_rerank_run): evaluated
# beside retrieval_run's, never pooled.
EVALUATION_RUNS = "student_rerank_run"
# qrels version -> whether a pending pair is relevant in it (at the scale's top grade)
REFINED_BOUNDS = {"refined": False, "refined_upper": True}


class MissingInput(BridgeError, LookupError):
    """An analysis needs a table (or rows of it) that is not materialized."""


@dataclass(frozen=True)
class ScopeInfo:
    scope: str          # what was asked
    applied: str        # "pooled" or "all" (pooled falls back to all without a pool)
    queries: int
    retrievers: tuple[str, ...]


def require_rows(con: duckdb.DuckDBPyConnection, table: str, dataset: str, asset: str) -> None:
    """Fail naming `table` when it has no rows for `dataset`."""
    if not table_exists(con, table) or not one_row(
            con, f'select count(*) from "{table}" where dataset = ?', [dataset])[0]:
        raise MissingInput(f"{asset} for dataset '{dataset}': no {table} rows; materialize "
                           f"{table} for '{dataset}' first")


def benchmark_runs(con: duckdb.DuckDBPyConnection) -> str:
    """A query over every run the benchmark evaluates: retrieval_run's and, where the table is
    in `con`, the evaluation-only systems' (dataset, retriever, query_id, doc_id, rank, score)."""
    columns = "dataset, retriever, query_id, doc_id, rank, score"
    tables = ["retrieval_run"] + ([EVALUATION_RUNS] if table_exists(con, EVALUATION_RUNS) else [])
    return " union all ".join(f"select {columns} from {table}" for table in tables)


@contextlib.contextmanager
def analysis_views(con: duckdb.DuckDBPyConnection, dataset: str, scope: Scope = "pooled", *,
                   asset: str, refined: bool = True, top_grade: int = 1,
                   evaluated: bool = False) -> Iterator[ScopeInfo]:
    """Create the tables above for `dataset` (dropped afterwards; values are bound as
    parameters). `refined=False` skips bridge_qrels for analyses that do not read it;
    `top_grade`: the relevance of a pending pair at the upper bound; `evaluated`: the run holds
    the evaluation-only systems too (retrieval_metrics), not only the pooled ones."""
    require_rows(con, "retrieval_run", dataset, asset)
    require_rows(con, "original_qrels", dataset, asset)
    if refined:
        require_rows(con, "bridge_qrels", dataset, asset)
    pooled = scope == "pooled" and table_exists(con, "candidate_pool") and one_row(
        con, "select count(*) from candidate_pool where dataset = ?", [dataset])[0] > 0
    source = "candidate_pool" if pooled else "queries"
    if not pooled and not table_exists(con, "queries"):
        source = "retrieval_run"
    in_scope = "dataset = $dataset and query_id in (select query_id from analysis_scope)"
    runs = f"({benchmark_runs(con)})" if evaluated else "retrieval_run"
    tables = {
        "analysis_scope": f"select distinct query_id from {source} where dataset = $dataset",
        "analysis_run": f"""select dataset, retriever, query_id, doc_id, rank, score
                            from {runs} where {in_scope}""",
        "analysis_original_qrels": f"""select dataset, query_id, doc_id, relevance from original_qrels
                                       where {in_scope}""",
    }
    if refined:
        # a table written before estimated_hole existed: no drop counted at the upper bound
        estimated = "coalesce(estimated_hole, false)" if "estimated_hole" in {
            c for (c,) in con.execute("select column_name from information_schema.columns "
                                      "where table_name = 'bridge_qrels'").fetchall()} else "false"
        for name, upper in REFINED_BOUNDS.items():
            relevance = f"case when {estimated} then {top_grade} else coalesce(relevance, {top_grade}) end" \
                if upper else "coalesce(relevance, 0)"
            tables[f"analysis_{name}_qrels"] = f"""
                select dataset, query_id, doc_id, ({relevance})::integer as relevance
                from bridge_qrels where {in_scope}"""
    try:
        for name, select in tables.items():
            con.execute(f"create or replace temp table {name} as {select}",
                        {"dataset": dataset} if "$dataset" in select else {})
        queries = one_row(con, "select count(*) from analysis_scope")[0]
        retrievers = tuple(r[0] for r in con.execute(
            "select distinct retriever from analysis_run order by 1").fetchall())
        yield ScopeInfo(scope, "pooled" if pooled else "all", queries, retrievers)
    finally:
        for name in reversed(list(tables)):
            con.execute(f"drop table if exists temp.{name}")


__all__ = ["EVALUATION_RUNS", "REFINED_BOUNDS", "MissingInput", "ScopeInfo", "analysis_views", "benchmark_runs", "dataset_snapshot", "require_rows"]
