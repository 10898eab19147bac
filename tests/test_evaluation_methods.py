"""Every labeling method of the evaluation on a small gold set, driven by a scripted model.

The scripted model (tests/fixtures/oracle_model.py) reads each request's prompt and answers the
way the test dictates (an oracle that sees the word RELEVANT in a chunk, with a stubborn
agent A in round 1 of a debate), so every figure the runner reports can be checked by hand.
"""

from __future__ import annotations

import json

import pytest

from bridge_assets.evaluation.goldsets import GoldTriplet, MethodSpec
from bridge_assets.evaluation.runner import (
    CostMeter,
    format_stability,
    format_table,
    result_frames,
    run_method,
    summary_json,
)
from bridge_assets.evaluation.utility import RankingReply, group_by_query, useful_from_reply
from bridge_assets.llm.types import LLMResult
from fixtures.oracle_model import OracleModel


def triplets() -> list[GoldTriplet]:
    """Two queries, each with a relevant chunk (marked RELEVANT) and an irrelevant one."""
    return [
        GoldTriplet("a1", "query a", ("answer a",), "RELEVANT chunk a1", 1, "x"),
        GoldTriplet("a2", "query a", ("answer a",), "other chunk a2", 0, "x"),
        GoldTriplet("b1", "query b", ("answer b",), "RELEVANT chunk b1", 1, "y"),
        GoldTriplet("b2", "query b", ("answer b",), "other chunk b2", 0, "y"),
    ]


def profiles_for(role: str) -> list[str]:
    return {"judge": ["judge-model"], "debate": ["debate-model"], "filter": ["filter-model"],
            "adjudicator": ["adjudicator-model"]}[role]


def run(method: str, model=None, **knobs):
    if method == "dream":  # these chunks hold no answer string: the pipeline's answer check is
        knobs.setdefault("answer_check", "off")  # tested with the debate (test_labeling_checks)
    spec = MethodSpec.parse(f"{method}-test", {"method": method, **knobs})
    return run_method(spec, triplets(), model or OracleModel(), profiles_for=profiles_for, model_id=str)


def test_judge_labels_every_pair_with_one_call_each_and_escalates_nothing():
    model = OracleModel()
    result = run("judge", model)
    m = result.metrics
    assert (m.bacc, m.recall_relevant, m.recall_irrelevant, m.escalation_ratio) == (1.0, 1.0, 1.0, 0.0)
    assert model.calls == [("judge-model", "judge")] * 4
    assert result.cost.calls == 4 and result.cost.tokens_in == 400 and result.cost.model_seconds == 4.0
    assert result.models == ["judge-model"] and result.stability == []


def test_a_failed_judge_call_is_escalated_and_resolved_by_gold():
    result = run("judge", OracleModel(fail={"other chunk a2"}), models=("m",))
    m = result.metrics
    assert (m.escalated, m.recall_irrelevant, m.bacc_resolved) == (1, 1.0, 1.0)
    item = next(i for i in result.items if i.id == "a2")
    assert (item.label, item.escalated, item.resolved, item.detail) == (None, True, 0, "failed@1")


def test_filter_method_uses_the_pipeline_filter_prompt():
    model = OracleModel()
    result = run("filter", model)
    assert result.metrics.bacc == 1.0 and model.calls == [("filter-model", "filter")] * 4


def test_dream_reaches_consensus_in_round_two_on_the_stubborn_pairs_and_tracks_stability():
    model = OracleModel()
    result = run("dream", model, rounds=2)
    m = result.metrics
    assert (m.bacc, m.escalation_ratio) == (1.0, 0.0)
    assert [i.detail for i in result.items] == ["consensus@1", "consensus@2", "consensus@1", "consensus@2"]
    # round 1: 4 pairs x 2 agents; round 2: the 2 irrelevant pairs x 2 agents
    assert len(model.calls) == 12 and result.cost.calls == 12
    assert result.extra["consensus_by_round"] == {1: 2, 2: 4}
    assert result.stability == [
        # round 1: B (irrelevant stance) says yes on the 2 relevant pairs
        {"round": 1, "debating": 4, "agreed": 2, "agreed_accuracy": 1.0, "consensus_share_cumulative": 0.5,
         "answer_changes": 0, "against_opening_stance": 2, "failed": 0},
        # round 2: A changes yes -> no on the 2 irrelevant pairs, against its opening stance
        {"round": 2, "debating": 2, "agreed": 2, "agreed_accuracy": 1.0, "consensus_share_cumulative": 1.0,
         "answer_changes": 2, "against_opening_stance": 2, "failed": 0}]
    assert "consensus" not in format_stability(result) and "round" in format_stability(result)


def test_dream_with_one_round_escalates_the_disagreements():
    result = run("dream", rounds=1)
    m = result.metrics
    assert (m.escalated, m.escalation_ratio, m.bacc, m.bacc_resolved) == (2, 0.5, None, 1.0)
    assert (m.recall_relevant, m.recall_irrelevant) == (1.0, None)


def test_a_prefilter_labels_what_it_drops_and_dream_debates_only_the_rest():
    # as the pipeline's filtered_pool: the oracle filter drops a2 (its "no" is the label); its
    # call on b2 fails, which keeps the pair (b2's debate fails too and is escalated)
    model = OracleModel(fail={"other chunk b2"})
    result = run("dream", model, rounds=1, prefilter=("filter-model",))
    assert [i.detail for i in result.items] == ["consensus@1", "filtered", "consensus@1", "failed@1"]
    assert [i.label for i in result.items] == [1, 0, 1, None]
    assert model.calls.count(("filter-model", "filter")) == 4
    assert len([c for c in model.calls if c[0] == "debate-model"]) == 6  # 3 kept pairs x 2 agents
    assert result.models == ["debate-model", "prefilter:filter-model"]
    assert result.extra["prefiltered"] == 1
    m = result.metrics
    assert (m.escalated, m.recall_irrelevant, m.recall_relevant, m.bacc) == (1, 1.0, 1.0, 1.0)
    # without it, the stubborn agent A makes both irrelevant pairs disagreements
    assert run("dream", rounds=1).metrics.escalated == 2


def test_a_filter_no_on_a_relevant_pair_counts_against_the_method():
    model = OracleModel(is_relevant=lambda chunk: chunk != "RELEVANT chunk b1" and "RELEVANT" in chunk)
    result = run("judge", model, prefilter=("filter-model",))
    b1 = next(i for i in result.items if i.id == "b1")
    assert (b1.label, b1.escalated, b1.detail) == (0, False, "filtered")
    assert result.metrics.recall_relevant == 0.5


def test_dream_escalations_can_go_to_the_adjudicator():
    model = OracleModel()
    result = run("dream", model, rounds=1, adjudicate=True)
    assert ("adjudicator-model", "adjudicator") in model.calls
    assert result.models == ["debate-model", "adjudicator:adjudicator-model"]
    assert result.metrics.bacc_resolved == 1.0 and result.metrics.unresolved == 0
    assert [i.resolved for i in result.items if i.escalated] == [0, 0]


def test_dream_knobs_reach_the_debate():
    model = OracleModel()
    result = run("dream", model, models=("m1", "m2", "m1", "m2"), agents=4, rounds=1,
                 stance_order="irrelevant_first")
    assert {profile for profile, _ in model.calls} == {"m1", "m2"} and len(model.calls) == 16
    assert model.stances == {("A", "irrelevant"), ("B", "relevant"), ("C", "irrelevant"), ("D", "relevant")}
    assert result.metrics.escalation_ratio == 0.5  # the stubborn "relevant" agents disagree on 2 pairs


def test_only_dream_escalations_go_to_the_adjudicator():
    with pytest.raises(ValueError, match=r"labeler 'judge': adjudicate: Extra inputs"):
        run("judge", adjudicate=True)


def test_lara_escalates_at_the_ratio_and_reports_the_raw_scores_calibration():
    # the model is over-confident on the irrelevant chunk of query b
    model = OracleModel(p_yes={"other chunk b2": 0.6})
    result = run("lara", model, escalation_ratio=0.25)
    m = result.metrics
    # budget 1: the score closest to .5 (.6, chunk b2) goes to humans; the rest is right
    assert (m.escalated, m.escalation_ratio, m.bacc, m.bacc_resolved) == (1, 0.25, 1.0, 1.0)
    assert [i.id for i in result.items if i.escalated] == ["b2"]
    assert result.extra["auroc"] == 1.0 and result.extra["scored"] == 4
    # raw scores .8, .3, .8, .6: ECE = (.2 + .3 + .2 + .6) / 4 over bins 3, 6, 8
    assert result.extra["ece"] == pytest.approx(0.325)
    assert model.calls == [("judge-model", "relevance_score")] * 4


def test_diras_labels_with_its_guess_and_reports_calibration():
    model = OracleModel(p_yes={"other chunk b2": 0.6})
    result = run("diras", model)
    m = result.metrics
    assert (m.recall_relevant, m.recall_irrelevant, m.escalation_ratio) == (1.0, 0.5, 0.0)
    assert result.extra["brier"] == pytest.approx((0.04 + 0.09 + 0.04 + 0.36) / 4)
    assert [i.score for i in result.items] == pytest.approx([0.8, 0.3, 0.8, 0.6])


def test_every_labeler_reads_the_per_query_definition_over_the_method_s():
    seen = []

    def model(profile, requests):
        seen.extend(user for request in requests for role, user in request.messages if role == "user")
        return OracleModel()(profile, requests)

    triplets = [GoldTriplet("a1", "q", (), "RELEVANT c", 1, definition="only exact dates count"),
                GoldTriplet("a2", "q2", (), "other c", 0)]
    for method in ("diras", "filter", "judge", "dream", "lara"):
        seen.clear()
        spec = MethodSpec.parse("d", {"method": method, "models": ["m"], "definition": "names count"})
        result = run_method(spec, triplets, model, profiles_for=profiles_for, model_id=str)
        own = [text for text in seen if "Query: q\n" in text]
        other = [text for text in seen if "Query: q2\n" in text]
        assert own and all("What counts as relevant: only exact dates count" in t for t in own), method
        assert other and all("What counts as relevant: names count" in t for t in other), method
        plain = run_method(MethodSpec.parse("d", {"method": method, "models": ["m"]}), triplets, model,
                           profiles_for=profiles_for, model_id=str)
        assert plain.config_hash != result.config_hash, method


def test_utilsel_and_utilrank_are_compared_with_the_relevance_labels():
    for method in ("utilsel", "utilrank"):
        result = run(method)
        assert result.extra["agreement"] == 1.0 and result.extra["kappa"] == 1.0, method
        assert result.cost.calls == 2  # one listwise call per query
    reversed_rank = run("utilrank", OracleModel(ranking_reversed=True))
    assert reversed_rank.extra["agreement"] == 0.0 and reversed_rank.extra["kappa"] == -1.0


def test_a_failed_utility_reply_leaves_the_query_unlabelled():
    result = run("utilsel", OracleModel(fail={"other chunk b2"}))
    assert [i.escalated for i in result.items] == [False, False, True, True]
    assert result.items[2].detail == "scripted failure"
    assert result.extra["compared"] == 2


def test_utility_candidates_are_grouped_by_query_in_a_content_hashed_order():
    groups = group_by_query(triplets())
    assert [g.query for g in groups] == ["query a", "query b"]
    assert {t.id for t in groups[0].triplets} == {"a1", "a2"}
    assert group_by_query(list(reversed(triplets())))[1].triplets == groups[0].triplets


def test_utilrank_takes_the_top_percent_and_at_least_one():
    assert useful_from_reply("utilrank", RankingReply(ranking=[3, 1, 2, 4, 5]), 5, 0.2) == ({3}, None)
    assert useful_from_reply("utilrank", RankingReply(ranking=[3, 1, 2, 4, 5]), 5, 0.5) == ({3, 1, 2}, None)
    assert useful_from_reply("utilrank", RankingReply(ranking=[2, 1]), 2, 0.01) == ({2}, None)
    useful, error = useful_from_reply("utilrank", RankingReply(ranking=[2, 2]), 2, 0.2)
    assert useful is None and "distinct" in error
    useful, error = useful_from_reply("utilrank", RankingReply(ranking=[1]), 2, 0.2)
    assert useful is None and "each of the 2 passages" in error


def test_the_cost_meter_counts_cached_calls_in_calls_but_not_in_new_calls():
    def cached(profile, requests):
        return [LLMResult(key="k1", text="{}", tokens_in=5, cached=True),
                LLMResult(key="k2", text="{}", tokens_in=7)]

    meter = CostMeter(cached)
    meter("m", ["r1", "r2"])
    meter("m", ["r1", "r2"])  # the same keys again: still two distinct calls
    cost = meter.cost(1.5)
    assert (cost.calls, cost.new_calls, cost.tokens_in, cost.wall_seconds) == (2, 1, 12, 1.5)


def test_result_tables_and_printed_figures():
    result = run("dream", rounds=2)
    frames = result_frames(result, "gs")
    assert frames["labeler_eval_results"].row(0, named=True)["goldset"] == "gs"
    assert frames["labeler_eval_items"].height == 4 and frames["consensus_stability"].height == 2
    judge_frames = result_frames(run("judge"), "gs")
    assert judge_frames["consensus_stability"].height == 0
    assert judge_frames["consensus_stability"].schema == frames["consensus_stability"].schema
    table = format_table([result.summary()])
    assert "dream-test" in table and "100.0" in table
    payload = json.loads(summary_json(result))
    assert list(payload)[:6] == ["bacc", "recall_relevant", "recall_irrelevant", "escalation_ratio", "n", "calls"]
    assert payload["config"]["rounds"] == 2 and len(payload["stability"]) == 2
