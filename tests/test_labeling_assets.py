"""The labeling assets end to end through Dagster, the real LLM client and its call ledger.

The "models" answer from a real HTTP server started in the test (OpenAI wire format, the
path that talks to llama.cpp's server or vLLM in production) from a script, so outcomes are
known in advance and every call is counted; tests/test_labeling_real.py does the same with
the offline model. The retrieval runs are written by hand: they are this stage's input.
"""

from __future__ import annotations

import json
import re

import dagster as dg
import polars as pl
import pytest

from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.labeling import checks as labeling_checks
from bridge_assets.labeling.debate import labels_frame, run_debate, turns_frame
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.labeling.filter import run_filter
from bridge_assets.labeling.pairs import Pair
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import write_partitions
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.ledger import read_calls
from bridge_assets.llm.resource import LLMResource
from bridge_assets.llm.types import LLMResult
from fixtures.labeling import metadata, write_run
from fixtures.paths import lake_resources, location
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, http_profile, scripted_reply

CHECKS = [labeling_checks.candidate_pool_is_valid, labeling_checks.debate_labels_are_valid,
          labeling_checks.escalated_pairs_have_full_history]
LABELING = [labeling_assets.candidate_pool, labeling_assets.filter_pool, labeling_assets.debate]


@pytest.fixture
def demo_lake(data_lake):
    result = dg.materialize([ingest_assets.ingest_dataset], partition_key="demo",
                            resources=lake_resources(data_lake))
    assert result.success
    return data_lake


def materialize(lake, url: str, *, debate: dict | None = None, filter_models=("f1", "f2")):
    run_config = {"ops": {
        "candidate_pool": {"config": {"depth": 3}},
        "filter_pool": {"config": {"models": list(filter_models)}},
        "debate": {"config": {"reason_words": 20, **(debate or {})}},
    }}
    resources = lake_resources(lake, llm=ScriptedLLM(store=DuckDBStore(data_lake=str(lake)), url=url, debate="agent",
                                    adjudicator="adj"))
    result = dg.materialize([*LABELING, *CHECKS], partition_key="demo", resources=resources,
                            run_config=run_config, raise_on_error=False)
    assert result.success
    return result


def checks_passed(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def table(lake, sql: str) -> pl.DataFrame:
    with store.connect(location(lake)) as con:
        return con.execute(sql).pl()


BM25 = {"q01": ["pydoc-lambda-1", "pydoc-function-7", "pydoc-assert-1"],
        "q02": ["pydoc-types-21", "pydoc-return-1", "pydoc-with-1"],
        "q08": ["pydoc-typesmapping-4", "pydoc-sequence-types-4"]}


def test_pipeline_labels_pairs_then_reruns_from_the_ledger_and_labels_only_new_pairs(demo_lake):
    write_run(demo_lake, "bm25", BM25)
    with ScriptedServer(scripted_reply) as server:
        first = materialize(demo_lake, server.url)
        assert checks_passed(first) == {name: True for name in (
            "candidate_pool_is_valid", "debate_labels_are_valid", "escalated_pairs_have_full_history")}
        pool = metadata(first, "candidate_pool")
        assert (pool["pairs"], pool["new_pairs"], pool["judged_pairs"], pool["systems"]) == (8, 8, 3, 1)
        filtered = metadata(first, "filtered_pool")
        assert filtered["pairs"] == 5  # the three judged pairs are not relabelled
        assert filtered["calls"] == 10 and filtered["cache_hits"] == 0  # 2 models x 5 pairs
        votes = table(demo_lake, "select * from filter_votes")
        assert votes.height == 10 and set(votes["model"]) == {"f1", "f2"}
        kept = table(demo_lake, "select * from filtered_pool where kept")
        debated = metadata(first, "debate_labels")
        assert debated["pairs"] == kept.height == 3
        labels = table(demo_lake, "select * from debate_labels")
        assert set(labels["outcome"]) <= {"consensus", "escalated"}
        turns = table(demo_lake, "select * from debate_turns")
        assert debated["calls"] == turns.height == server.hits - 10
        assert (debated["consensus_after_round_1"], debated["consensus_after_round_2"],
                debated["escalated"], debated["failed"]) == (0, 2, 1, 0)
        assert debated["escalation_ratio"] == 0.3333 and debated["relevant"] == 2
        ledger_rows = read_calls(location(demo_lake)).height
        assert ledger_rows == server.hits

        hits = server.hits
        second = materialize(demo_lake, server.url)
        assert server.hits == hits  # nothing changed: not one model call
        assert metadata(second, "filtered_pool")["calls"] == 0
        assert metadata(second, "debate_labels")["calls"] == 0
        assert metadata(second, "debate_labels")["cache_hits"] == turns.height
        assert metadata(second, "debate_labels")["new_pairs"] == 0
        assert table(demo_lake, "select * from debate_labels").sort("query_id", "doc_id").equals(
            labels.sort("query_id", "doc_id"))

        # A new retriever surfaces one new pair (q08 x pydoc-customization-17, no answer string)
        # and one the pool already had: only the new pair costs calls.
        write_run(demo_lake, "dense", {"q08": ["pydoc-customization-17", "pydoc-sequence-types-4"]})
        third = materialize(demo_lake, server.url)
        assert metadata(third, "candidate_pool")["new_pairs"] == 1
        assert metadata(third, "filtered_pool")["new_pairs"] == 1
        assert metadata(third, "filtered_pool")["calls"] == 2  # one vote per filter model
        new_calls = server.bodies[hits:]
        assert len(new_calls) == 2 and all("KeyError" in body["messages"][1]["content"] for body in new_calls)
        assert read_calls(location(demo_lake)).height == hits + 2


def test_adjudicator_labels_escalated_pairs_apart_from_consensus(demo_lake):
    write_run(demo_lake, "bm25", BM25)
    with ScriptedServer(scripted_reply) as server:
        result = materialize(demo_lake, server.url, debate={"adjudicate": True, "rounds": 1})
        hits_without = server.hits
    meta = metadata(result, "debate_labels")
    labels = table(demo_lake, "select * from debate_labels")
    unresolved = labels.filter(pl.col("outcome") != "consensus")
    assert unresolved.height == meta["escalated"] > 0
    assert unresolved["label"].is_null().all() and (unresolved["adjudicator_label"] == 1).all()
    assert unresolved["adjudicator_call_key"].is_not_null().all()
    assert labels.filter(pl.col("outcome") == "consensus")["adjudicator_label"].is_null().all()
    assert meta["adjudicated"] == unresolved.height and hits_without > 0


def test_four_agents_and_swapped_stances_are_recorded_per_turn(demo_lake):
    write_run(demo_lake, "bm25", BM25)
    with ScriptedServer(scripted_reply) as server:
        materialize(demo_lake, server.url, debate={"agents": 4, "stance_order": "irrelevant_first"})
    turns = table(demo_lake, "select distinct agent, stance from debate_turns order by agent")
    assert turns.rows() == [("A", "irrelevant"), ("B", "relevant"), ("C", "irrelevant"), ("D", "relevant")]


def test_killed_mid_debate_the_rerun_repeats_no_answered_call(data_lake):
    pairs = [Pair(f"q{i}", f"d{i}", f"query {i}", ("answer",), f"chunk {i} with the answer")
             for i in range(3)]
    with ScriptedServer(scripted_reply) as server:
        client = LLMClient(http_profile(server.url), lake=location(data_lake))
        calls = []

        def dies_in_round_two(profile, requests):  # the fault: the process is killed
            calls.append(len(requests))
            if len(calls) == 2:
                raise KeyboardInterrupt
            return client.generate(requests)

        with pytest.raises(KeyboardInterrupt):
            run_debate(pairs, debate_agents(["m"]), dies_in_round_two, reason_words=20)
        assert server.hits == 6 and read_calls(location(data_lake)).height == 6

        fresh = LLMClient(http_profile(server.url), lake=location(data_lake))
        outcome = run_debate(pairs, debate_agents(["m"]), lambda p, r: fresh.generate(r), reason_words=20)
        assert server.hits == 6 + 6  # round 2 only: round 1 came from the ledger
        assert fresh.stats.cache_hits == 6
        assert {label.rounds_used for label in outcome.labels} == {2}


def test_a_failing_server_fails_pairs_and_votes_without_labels(data_lake):
    def broken(index, body):
        return 500, {"error": "overloaded"}, 0

    pairs = [Pair("q1", "d1", "query", ("answer",), "chunk")]
    with ScriptedServer(broken) as server:
        client = LLMClient(http_profile(server.url, retries=1), lake=location(data_lake))
        generate = lambda profile, requests: client.generate(requests)  # noqa: E731
        votes = run_filter(pairs, ["m"], generate)
        outcome = run_debate(pairs, debate_agents(["m"]), generate, reason_words=20)
    assert votes[0].is_supported is None and "500" in votes[0].error
    assert (outcome.labels[0].outcome, outcome.labels[0].label) == ("failed", None)
    assert all(turn.error for turn in outcome.turns)


def corrupt_and_check(lake, sql: str) -> dict[str, bool]:
    with store.connect(location(lake)) as con:
        con.execute(sql)
    result = dg.materialize([*LABELING, *CHECKS],  # checks read whole tables: no partition
                            resources=lake_resources(lake, llm=LLMResource()),
                            selection=dg.AssetSelection.checks(*CHECKS), raise_on_error=False)
    return checks_passed(result)


def scripted_tables(lake):
    """debate tables with one consensus and one escalated pair, written as the asset does."""
    script = {("A", 1): "yes", ("B", 1): "no", ("A", 2): "yes", ("B", 2): "no"}
    agreed = {("A", 1): "yes", ("B", 1): "yes"}

    def generate(profile, requests):
        results = []
        for n, request in enumerate(requests):
            user = request.messages[1][1]
            key = (re.search(r"agent (\w)", user).group(1), int(re.search(r"round (\d)", user).group(1)))
            answer = (agreed if "agree" in user else script)[key]
            reply = {"reference": [], "reason": "r", "response": answer}
            results.append(LLMResult(key=f"k{n}", text=json.dumps(reply), parsed=reply))
        return results

    pairs = [Pair("q1", "d1", "agree", ("a",), "c"), Pair("q2", "d2", "split", ("a",), "c")]
    outcome = run_debate(pairs, debate_agents(["m"]), generate)
    write_partitions({"debate_labels": labels_frame(outcome, "demo", "cfg"),
                      "debate_turns": turns_frame(outcome, "demo"),
                      "candidate_pool": pl.DataFrame({
                          "dataset": ["demo"], "query_id": ["q1"], "doc_id": ["d1"],
                          "systems": [["bm25"]], "ranks": [[1]], "best_rank": [1], "n_systems": [1],
                          "in_original_qrels": [False]})},
                     {"dataset": "demo"}, location(lake))


@pytest.mark.parametrize("corruption, failing", [
    ("update debate_labels set label = 2 where query_id = 'q1'", {"debate_labels_are_valid"}),
    ("update debate_labels set label = 1 where query_id = 'q2'", {"debate_labels_are_valid"}),
    ("delete from debate_turns where query_id = 'q2' and round = 2 and agent = 'B'",
     {"escalated_pairs_have_full_history"}),
    ("update debate_turns set response = null where query_id = 'q2' and round = 1",
     {"escalated_pairs_have_full_history"}),
    ("update candidate_pool set ranks = [1, 2]", {"candidate_pool_is_valid"}),
    ("update debate_labels set flags = [] where query_id = 'q2'", {"debate_labels_are_valid"}),
    # a pair voted beyond the human budget carries its (unverified) label
    ("update debate_labels set outcome = 'vote', label = 1 where query_id = 'q2'", set()),
    ("select 1", set()),
])
def test_checks_catch_corrupted_labels_and_histories(data_lake, corruption, failing):
    scripted_tables(data_lake)
    outcomes = corrupt_and_check(data_lake, corruption)
    assert {name for name, passed in outcomes.items() if not passed} == failing
