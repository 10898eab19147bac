"""The retrieval stage's LLM calls, estimated without running a system or calling a model
(`bridge run --dry-run`, bridge_assets/orchestration/costs.py): the LLM systems' rewrites and re-rankings,
replayed from the call ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb

from bridge_assets.lake import store
from bridge_assets.llm.budget import CHARS_PER_TOKEN
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.retrieval.llm_systems import RERANK_MAX_TOKENS, passage_requests, rerank_requests
from bridge_assets.retrieval.registry import RetrieverRegistry
from bridge_assets.retrieval.runs import document_texts


def llm_system_lines(registry: RetrieverRegistry, systems: Sequence[str]) -> list[str]:
    """A line per system (or upstream system) that calls an LLM, for when queries are unknown."""
    lines = []
    for name in with_upstream(registry, systems):
        spec = registry.system(name)
        if spec.llm is not None:
            params = spec.params()
            if spec.kind == "rewrite":
                per_query = f"{params.passages} call(s) per query"
            else:
                depth = params.depth or registry.defaults.rerank_depth
                per_query = f"a call per query and re-ranked document (top-{depth})"
            lines.append(f"{name} calls {spec.llm.profile_name()}: {per_query}")
    return lines


def with_upstream(registry: RetrieverRegistry, systems: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(name for system in systems for name in [*registry.upstream(system), system]))


def current_runs(con: duckdb.DuckDBPyConnection, dataset: str, registry: RetrieverRegistry,
                  systems: Sequence[str], k: int) -> dict[str, int]:
    """The systems whose stored run of `dataset` their current configuration made, with its
    depth (a run_file system without a file for this dataset has an empty run: current)."""
    stored = dict(con.execute("select retriever, any_value(config_hash) from retrieval_run "
                              "where dataset = ? group by retriever", [dataset]).fetchall()) \
        if store.table_exists(con, "retrieval_run") else {}
    current = {}
    for name in systems:
        depth = k or registry.system_k(name)
        no_file = registry.system(name).kind == "run_file" and not registry.run_file(name, dataset).exists()
        if no_file or stored.get(name) == registry.config_hash(name, depth):
            current[name] = depth
    return current


def estimate_retrieval_calls(con: duckdb.DuckDBPyConnection, dataset: str, registry: RetrieverRegistry,
                     systems: Sequence[str], current: Mapping[str, int],
                     replay: LedgerReplay) -> list[StageCalls]:
    """The LLM calls of the retrieval systems (every run re-runs them, the ledger answering
    what it holds). A rewrite's requests are known from the queries, a re-ranker's from its
    first stage's stored run when that is current and deep enough; otherwise they are bounded
    by queries x re-rank depth, each prompt estimated with the mean query and document."""
    queries = con.execute("select query_id, text from queries where dataset = ? order by query_id",
                          [dataset]).pl()
    stages = []
    for name in with_upstream(registry, systems):
        spec = registry.system(name)
        if spec.llm is None:
            continue
        profile, params = spec.llm.profile_name(), spec.params()
        rewrite = spec.kind == "rewrite"
        stage = replay.stage(f"retrieval {name}", profile, params.method if rewrite else "rerank")
        depth = 0 if rewrite else params.depth or registry.defaults.rerank_depth
        if rewrite:
            prompt = registry.prompt(params.method)
            requests = [r for text in queries["text"]
                        for r in passage_requests(replay.client(profile), prompt, text, params)]
        elif depth <= current.get(spec.required_first_stage(), 0):
            candidates = con.execute("select query_id, doc_id, rank from retrieval_run where dataset = ? "
                                     "and retriever = ? and rank <= ? order by query_id, rank",
                                     [dataset, spec.required_first_stage(), depth]).pl()
            corpus = con.execute("select doc_id, title, text from corpus where dataset = ?", [dataset]).pl()
            requests = rerank_requests(replay.client(profile), registry.prompt("rerank"), candidates,
                                       dict(zip(queries["query_id"], queries["text"])),
                                       dict(zip(corpus["doc_id"], document_texts(corpus))))
        else:
            query_chars, doc_chars = store.one_row(
                con, "select (select avg(length(text)) from queries), "
                "(select avg(length(coalesce(title, '') || ' ' || text)) from corpus)")
            prompt = (len(registry.prompt("rerank")) + query_chars + doc_chars) / CHARS_PER_TOKEN
            stage.add_bound(round(prompt), RERANK_MAX_TOKENS, queries.height * depth)
            requests = []
        for result in replay(profile, requests) if requests else ():
            stage.add(result.key, replay.requests[result.key], result.error != NOT_ANSWERED)
        stages.append(stage)
    return stages
