"""The short summary `bridge run` prints: what the pipeline found, and where the time went."""

from __future__ import annotations

import time

import duckdb

from bridge_assets.paths import data_lake_dir
from bridge_assets.store import table_exists


def _rows(con: duckdb.DuckDBPyConnection, table: str, sql: str, params: list) -> list[tuple]:
    return con.execute(sql, params).fetchall() if table_exists(con, table) else []


def run_summary(con: duckdb.DuckDBPyConnection, dataset: str, started: float) -> str:
    """Holes found, labels by source, escalation ratio, biggest rank changes, the report's path
    and the share of wall time spent in the model (from the call ledger) since `started`."""
    lines = [f"== {dataset} =="]
    counts = _rows(con, "corpus", """
        select (select count(*) from corpus where dataset = $1),
               (select count(*) from queries where dataset = $1),
               (select count(*) from original_qrels where dataset = $1)""", [dataset])
    if counts:
        lines.append("documents {}, queries {}, original judgments {}".format(*counts[0]))
    systems = _rows(con, "retrieval_run",
                    "select count(distinct retriever) from retrieval_run where dataset = ?", [dataset])
    pool = _rows(con, "candidate_pool", """
        select count(*), count(*) filter (where not in_original_qrels)
        from candidate_pool where dataset = ?""", [dataset])
    if systems and pool:
        lines.append(f"retrievers {systems[0][0]}; candidate pairs {pool[0][0]} "
                     f"({pool[0][1]} not judged before)")
    by_source = _rows(con, "bridge_qrels", """
        select source, count(*) filter (where relevance > 0), count(*) filter (where relevance = 0)
        from bridge_qrels where dataset = ? group by source order by source""", [dataset])
    if by_source:
        holes = sum(relevant for source, relevant, _ in by_source if source != "original")
        lines.append(f"holes found (new relevant pairs): {holes}")
        lines.append("labels by source: " + ", ".join(
            f"{source} {relevant} relevant / {irrelevant} not" for source, relevant, irrelevant in by_source))
    outcomes = _rows(con, "debate_labels", """
        select count(*), count(*) filter (where outcome <> 'consensus'),
               count(*) filter (where outcome <> 'consensus' and adjudicator_label is not null)
        from debate_labels where dataset = ?""", [dataset])
    if outcomes and outcomes[0][0]:
        total, escalated, adjudicated = outcomes[0]
        lines.append(f"debated pairs {total}; escalated {escalated} ({escalated / total:.1%}), "
                     f"{adjudicated} decided provisionally by the LLM adjudicator")
        if escalated:
            lines.append("  replace them with human votes: bridge annotate add-annotator NAME; "
                         f"bridge annotate serve --dataset {dataset}")
    shifts = _rows(con, "ranking_shift", """
        select retriever, rank_original, rank_refined, rank_change from ranking_shift
        where dataset = ? and measure = 'ndcg_cut_10' and rank_change <> 0
        order by abs(rank_change) desc, retriever limit 3""", [dataset])
    lines.append("biggest rank changes (nDCG@10): " + (", ".join(
        f"{name} {before}->{after}" for name, before, after, _ in shifts) or "none"))
    wall = time.time() - started
    calls = _rows(con, "llm_calls", """
        select count(*), coalesce(sum(latency_s), 0), coalesce(sum(tokens_out), 0) from llm_calls
        where epoch(created_at) >= ?""", [started - 1])
    if calls:
        count, model_seconds, tokens = calls[0]
        lines.append(f"time {wall:.0f}s: {count} LLM calls took {model_seconds:.0f}s in the model "
                     f"({model_seconds / max(wall, 1e-9):.0%}), {tokens} tokens out; "
                     f"everything else {max(wall - model_seconds, 0):.0f}s")
    report = data_lake_dir() / "reports" / dataset / "report.html"
    if report.exists():
        lines.append(f"report: {report}")
    return "\n".join(lines)
