"""The LLM-based systems with the real local LLM (qwen-0.5b on llama.cpp), on two demo queries."""

from __future__ import annotations

import polars as pl
import pytest

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.profiles import get_profile
from bridge_assets.llm.weights import status
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.retrieval.llm_systems import rewrite_queries
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.runs import rank_problems
from bridge_assets.retrieval.systems import run_retriever
from fixtures.paths import location


@pytest.fixture(scope="module")
def registry():
    registry = load_registry()
    profile = get_profile(registry.system("llm_rerank_bm25").llm.profile_name())
    if status(profile) == "missing":
        pytest.skip(f"weights of LLM profile {profile.name} are not installed")
    return registry


@pytest.fixture
def demo_queries():
    tables = load_dataset(get_dataset("demo"))
    return tables.corpus, tables.queries


def _with_params(registry, name, parameters):
    spec = registry.system(name).model_copy(update={"parameters": parameters})
    return registry.model_copy(update={"systems": {**registry.systems, name: spec}})


@pytest.mark.slow  # 8 pointwise calls with log-probabilities: ~2 min on two shared CPU cores
def test_llm_reranker_reorders_bm25_by_p_yes_and_caches_its_calls(registry, demo_queries, data_lake):
    corpus, queries = demo_queries
    queries = queries.head(2)
    local = _with_params(registry, "llm_rerank_bm25", {"depth": 4})
    clients: dict[str, LLMClient] = {}

    def client(profile: str) -> LLMClient:
        return clients.setdefault(profile, LLMClient(profile, lake=location(data_lake)))

    first = run_retriever("demo", "bm25", corpus, queries, k=4, registry=local, lake=data_lake).run
    result = run_retriever("demo", "llm_rerank_bm25", corpus, queries, k=4, registry=local, lake=data_lake,
                           llm_client=client)
    assert rank_problems(result.run, 4) == []
    for qid in queries["query_id"]:
        assert set(result.run.filter(pl.col("query_id") == qid)["doc_id"]) == \
            set(first.filter(pl.col("query_id") == qid)["doc_id"])
    scored = result.run.filter(pl.col("score") >= 0)["score"]
    assert scored.len() == 8 - result.metadata["unscored_pairs"] and scored.is_between(0, 1).all()
    assert result.metadata["pairs"] == 8
    calls = sum(c.stats.calls for c in clients.values())
    again = run_retriever("demo", "llm_rerank_bm25", corpus, queries, k=4, registry=local, lake=data_lake,
                          llm_client=client)
    assert again.run.equals(result.run)
    assert sum(c.stats.calls for c in clients.values()) == calls  # every call answered by the ledger


# slow: HyDE through `bridge materialize` and the ledger is tests/test_main_job_costs.py::test_the_dry_run_counts_the_calls_the_run_makes
@pytest.mark.slow
def test_hyde_searches_bm25_with_a_generated_passage(registry, demo_queries, data_lake):
    corpus, queries = demo_queries
    queries = queries.head(1)
    local = _with_params(registry, "hyde", {"method": "hyde", "passages": 1, "max_tokens": 32})
    client = LLMClient(local.system("hyde").llm.profile_name(), lake=location(data_lake))
    rewritten, counts = rewrite_queries(client, local.prompt("hyde"), queries, local.system("hyde").params())
    assert counts["queries_not_rewritten"] == 0
    assert all(new != old and len(new.split()) > 5
               for new, old in zip(rewritten["text"], queries["text"]))
    result = run_retriever("demo", "hyde", corpus, queries, registry=local, lake=data_lake,
                           llm_client=lambda profile: client)
    assert rank_problems(result.run, 10) == [] and result.run["query_id"].n_unique() == 1
    assert result.metadata["llm_requests"] == 1 and client.stats.calls == 1  # the run reused the ledger
