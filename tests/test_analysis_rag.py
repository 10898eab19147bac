"""RAG alignment: the statistics on a toy case, the asset over hand-written judgments, the
judgment rules (no call for "no relevant information", failed calls stay NULL), and the real
offline model answering and judging through the LLM layer (two tiny prompts)."""

from __future__ import annotations

import math

import dagster as dg
import numpy as np
import polars as pl
import pytest
from scipy import stats

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.rag import (
    alignment_statistics,
    generate_answers,
    judge_answers,
    rag_contexts,
    says_no_information,
)
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.types import LLMResult
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources, location
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, scripted_server_reply

# per system, queries q1..q4: (hit@10, nDCG@10, judgment) on the original and the refined qrels
TOY = {
    ("a", "original"): ([1, 1, 0, 0], [1.0, 0.5, 0.0, 0.0], [1, 0, 0, 0]),
    ("a", "refined"): ([1, 1, 1, 0], [1.0, 0.6, 0.3, 0.0], [1, 0, 0, 0]),
    ("b", "original"): ([1, 0, 0, 0], [0.4, 0.0, 0.0, 0.0], [1, 1, 0, 0]),
    ("b", "refined"): ([1, 1, 0, 0], [0.7, 0.5, 0.0, 0.0], [1, 1, 0, 0]),
    ("c", "original"): ([1, 1, 1, 1], [1.0, 0.9, 0.8, 0.2], [1, 1, 1, 0]),
    ("c", "refined"): ([1, 1, 1, 0], [1.0, 0.9, 0.8, 0.0], [1, 1, 1, 0]),
}


def toy_frame() -> pl.DataFrame:
    rows = [{"retriever": r, "qrels_version": v, "query_id": f"q{i + 1}", "judgment": j[i], "hit": float(h[i]),
             "ndcg": n[i]} for (r, v), (h, n, j) in TOY.items() for i in range(4)]
    return pl.DataFrame(rows)


def value(frame: pl.DataFrame, retriever: str, version: str, name: str) -> dict:
    return frame.filter((pl.col("retriever") == retriever) & (pl.col("qrels_version") == version)
                        & (pl.col("statistic") == name)).row(0, named=True)


def test_alignment_statistics_on_a_toy_case():
    frame = alignment_statistics(toy_frame(), k=10)
    # RAGAlign@10: share of queries where Hit@10 and the judgment agree
    assert value(frame, "a", "original", "rag_align_10")["value"] == pytest.approx(3 / 4)
    assert value(frame, "a", "refined", "rag_align_10")["value"] == pytest.approx(2 / 4)
    assert value(frame, "b", "original", "rag_align_10")["value"] == pytest.approx(3 / 4)
    assert value(frame, "b", "refined", "rag_align_10")["value"] == pytest.approx(4 / 4)
    assert value(frame, "c", "original", "rag_align_10")["value"] == pytest.approx(3 / 4)
    assert value(frame, "c", "refined", "rag_align_10")["value"] == pytest.approx(4 / 4)
    assert value(frame, "all", "refined", "rag_align_10")["value"] == pytest.approx(10 / 12)
    assert value(frame, "all", "refined", "rag_align_10")["queries"] == 12
    # point-biserial of judgment vs nDCG@10 equals scipy's
    h, n, j = TOY[("c", "original")]
    expected = stats.pointbiserialr(j, n)
    got = value(frame, "c", "original", "point_biserial_ndcg_10")
    assert (got["value"], got["p_value"]) == pytest.approx((expected.statistic, expected.pvalue))
    assert value(frame, "a", "refined", "rag_accuracy")["value"] == 0.25
    # across systems: Pearson of mean Hit@10 and mean nDCG@10 with the share of correct answers
    accuracy = [0.25, 0.5, 0.75]
    for version in ("original", "refined"):
        hits = [np.mean(TOY[(s, version)][0]) for s in "abc"]
        ndcgs = [np.mean(TOY[(s, version)][1]) for s in "abc"]
        assert value(frame, "all", version, "pearson_hit_10")["value"] == pytest.approx(np.corrcoef(hits, accuracy)[0, 1])
        assert value(frame, "all", version, "pearson_ndcg_10")["value"] == pytest.approx(np.corrcoef(ndcgs, accuracy)[0, 1])
        assert value(frame, "all", version, "pearson_hit_10")["queries"] == 3


def test_undefined_correlations_stay_empty():
    constant = pl.DataFrame({"retriever": ["a"] * 3, "qrels_version": ["refined"] * 3, "query_id": ["1", "2", "3"],
                             "judgment": [1, 1, 1], "hit": [1.0, 0.0, 1.0], "ndcg": [0.5, 0.0, 0.7]})
    frame = alignment_statistics(constant)
    assert value(frame, "a", "refined", "point_biserial_ndcg_10")["value"] is None
    assert value(frame, "all", "refined", "pearson_hit_10")["value"] is None  # one system


def test_rag_alignment_asset_joins_judgments_with_both_qrels_versions(labeled_lake):
    judgments = pl.DataFrame({
        "dataset": DATASET, "retriever": ["bm25", "bm25", "dense", "dense", "splade", "splade"],
        "query_id": ["q3", "q4", "q3", "q4", "q3", "q4"], "judgment": [False, True, True, None, False, True],
        "decided_by": "llm", "model": "m", "prompt_hash": "h", "call_key": "k", "error": None})
    store.write_partitions({"rag_judgments": judgments}, {"dataset": DATASET}, location(labeled_lake))
    result = dg.materialize([qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics,
                             analysis_assets.rag_alignment], partition_key=DATASET,
                            resources=lake_resources(labeled_lake))
    assert result.success
    frame = read(labeled_lake, "select * from rag_alignment")
    # every system finds each original gold: Hit@10 = 1, so RAGAlign = share of True judgments
    assert value(frame, "bm25", "original", "rag_align_10")["value"] == pytest.approx(0.5)
    assert value(frame, "dense", "refined", "rag_align_10")["queries"] == 1  # the NULL judgment is left out
    # nDCG@10 differs between the versions: bm25 ranks d3 (q3) and d4 (q4) second; refined adds
    # d7 for q3 (unretrieved) and d8 for q4 (ranked first)
    second = 1 / math.log2(3)
    assert value(frame, "bm25", "original", "ndcg_10")["value"] == pytest.approx(second)
    assert value(frame, "bm25", "refined", "ndcg_10")["value"] == pytest.approx((second / (1 + second) + 1) / 2)
    assert set(frame["qrels_version"]) == {"original", "refined"}


def scripted(replies: dict[str, LLMResult]):
    """A generate() that answers from a table and records what it was asked (provokes faults)."""
    asked = []

    def generate(profile, requests):
        asked.extend(requests)
        return [replies[request.messages[-1][1].split("Proposed answer: ")[-1]] for request in requests]
    return generate, asked


def test_judgment_rules_no_information_needs_no_call_and_failures_stay_null():
    answers = pl.DataFrame({"retriever": ["a", "a", "a"], "query_id": ["q1", "q2", "q3"],
                            "answer": ["No relevant information.", "Paris", None],
                            "no_information": [True, False, None], "error": [None, None, "timeout"]})
    queries = pl.DataFrame({"query_id": ["q1", "q2", "q3"], "text": ["x?", "Capital of France?", "y?"],
                            "answers": [["a"], ["Paris"], ["b"]]})
    generate, asked = scripted({"Paris": LLMResult(key="k1", error="reply is not valid JSON")})
    judged = judge_answers(answers, queries, generate, "m", DATASET)
    rows = {r["query_id"]: r for r in judged.iter_rows(named=True)}
    assert len(asked) == 1 and asked[0].json_schema["required"] == ["correct"]
    assert rows["q1"]["judgment"] is False and rows["q1"]["decided_by"] == "no_information"
    assert rows["q1"]["call_key"] is None
    assert rows["q2"]["judgment"] is None and rows["q2"]["error"] == "reply is not valid JSON"
    assert rows["q3"]["judgment"] is None and "timeout" in rows["q3"]["error"]
    assert says_no_information("NO relevant-information!") and not says_no_information("Paris")


# --- the offline model ----------------------------------------------------------------------

def small_model_profile():
    from bridge_assets.llm import get_profile
    return get_profile("qwen-0.5b")


@pytest.fixture
def small_model(data_lake):
    pytest.importorskip("llama_cpp")
    from bridge_assets.llm import weights
    return weights.provision(small_model_profile())


# slow: the real model answers and judges in tests/test_automation_daemon.py's `bridge run`; the
# assets' calls: test_rag_assets_call_the_llm_once_per_answer_and_never_again
@pytest.mark.slow
def test_offline_model_answers_from_the_passages_and_judges_the_answer(small_model, data_lake):
    from bridge_assets.llm import LLMClient

    # one thread: on a CPU shared with other busy processes it answers faster (see models.yaml)
    client = LLMClient(small_model_profile().model_copy(update={"threads": 1}), lake=location(data_lake))

    def generate(profile, requests):
        assert profile == "qwen-0.5b"
        return client.generate(requests, context="rag-test")

    contexts = pl.DataFrame({"retriever": ["bm25"], "query_id": ["q1"], "query": ["What is the capital of France?"],
                             "answers": [["Paris"]], "doc_ids": [["d1", "d2"]],
                             "passages": [["Paris is the capital and largest city of France.",
                                           "The Loire is the longest river in France."]]})
    answers = generate_answers(contexts, generate, "qwen-0.5b", DATASET)
    answer = answers.row(0, named=True)
    assert answer["error"] is None and "paris" in answer["answer"].lower(), answer
    assert answer["no_information"] is False and answer["doc_ids"] == ["d1", "d2"]
    queries = pl.DataFrame({"query_id": ["q1"], "text": ["What is the capital of France?"], "answers": [["Paris"]]})
    judged = judge_answers(answers, queries, generate, "qwen-0.5b", DATASET).row(0, named=True)
    assert judged["error"] is None and judged["judgment"] is True and judged["decided_by"] == "llm"
    calls = client.stats.calls
    generate_answers(contexts, generate, "qwen-0.5b", DATASET)  # asked again: from the ledger
    assert client.stats.calls == calls and client.stats.cache_hits >= 1
    client.close()


def test_rag_assets_call_the_llm_once_per_answer_and_never_again(labeled_lake):
    config = {"ops": {"rag_answers": {"config": {"systems": ["bm25", "dense"], "query_limit": 0, "model": "m"}},
                      "rag_judgments": {"config": {"model": "m"}}}}
    with ScriptedServer(scripted_server_reply) as server:
        resources = lake_resources(labeled_lake, llm=ScriptedLLM(data_lake=str(labeled_lake), url=server.url))

        def run():
            result = dg.materialize([analysis_assets.rag_answers, analysis_assets.rag_judgments],
                                    partition_key=DATASET, resources=resources, run_config=config)
            assert result.success
            return {node: result.asset_materializations_for_node(node)[0].metadata
                    for node in ("rag_answers", "rag_judgments")}

        first = run()
        # 2 systems x 4 queries answered; the 2 "no relevant information" answers need no
        # judgment call, and both systems' "an answer" to one question is one judgment call
        assert server.hits == 8 + 3
        assert first["rag_answers"]["no_information"].value == 2 and first["rag_judgments"]["correct"].value == 6
        second = run()
        assert server.hits == 11 and second["rag_answers"]["cache_hits"].value == 8
    answers = read(labeled_lake, "select * from rag_answers order by retriever, query_id")
    assert answers.height == 8 and answers["doc_ids"][0].to_list() == ["d1", "d5", "d9", "d12", "d6"]
    judged = read(labeled_lake, "select retriever, query_id, judgment, decided_by from rag_judgments "
                                "where query_id = 'q2' order by retriever")
    assert judged.rows() == [("bm25", "q2", False, "no_information"), ("dense", "q2", False, "no_information")]
    prompt = server.bodies[0]["messages"][1]["content"]
    assert prompt.startswith("Passages:\n[1] ") and "Question:" in prompt


@pytest.mark.slow  # two model loads and a few calls: about a minute on two shared CPU cores
def test_rag_assets_run_through_dagster_with_the_offline_model(small_model, labeled_lake):
    from bridge_assets.llm.resource import LLMResource

    resources = lake_resources(labeled_lake, llm=LLMResource(store=DuckDBStore(data_lake=str(labeled_lake))))
    config = {"ops": {"rag_answers": {"config": {"systems": ["bm25"], "query_limit": 1, "model": "qwen-0.5b"}},
                      "rag_judgments": {"config": {"model": "qwen-0.5b"}}}}
    with store.connect(location(labeled_lake)) as con:
        contexts, _ = rag_contexts(con, DATASET, query_limit=1, systems=["bm25"])
    assert contexts.height == 1 and len(contexts["doc_ids"][0]) == 5

    def run():
        result = dg.materialize([analysis_assets.rag_answers, analysis_assets.rag_judgments], partition_key=DATASET,
                                resources=resources, run_config=config)
        assert result.success
        return {node: result.asset_materializations_for_node(node)[0].metadata
                for node in ("rag_answers", "rag_judgments")}

    first = run()
    assert first["rag_answers"]["dagster/row_count"].value == 1 and first["rag_answers"]["calls"].value == 1
    answers = read(labeled_lake, "select * from rag_answers")
    assert answers["retriever"].to_list() == ["bm25"] and answers["error"].to_list() == [None]
    judgments = read(labeled_lake, "select * from rag_judgments")
    assert judgments.height == 1 and judgments["decided_by"][0] in ("llm", "no_information")
    second = run()  # nothing changed: no model call
    assert second["rag_answers"]["calls"].value == 0 and second["rag_answers"]["cache_hits"].value == 1
    assert second["rag_judgments"]["calls"].value == 0
    calls = read(labeled_lake, "select purpose, context from llm_calls where purpose like 'rag%'")
    assert set(calls["purpose"]) <= {"rag_answer", "rag_judgment"} and "rag_answer" in set(calls["purpose"])
