"""The DREAM debate state machine, LLMJudge and the adjudicator, driven by scripted replies.

The scripted model below lives only in these tests: it answers each (agent, round, query)
the way a test dictates, so every path (consensus in round 1 or 2, escalation, failure) is
provoked on purpose and checked turn by turn.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest

from bridge_assets.labeling.adjudicator import adjudicate
from bridge_assets.labeling.calls import MeteredGenerate
from bridge_assets.labeling.debate import DebateChecks, debate_config_hash, labels_frame, run_debate, turns_frame
from bridge_assets.labeling.debate_turns import AgentConfig, debate_agents, turn_max_tokens, turn_schema
from bridge_assets.labeling.judge import run_judge
from bridge_assets.labeling.pairs import Pair, pair_key
from bridge_assets.labeling.prompts import PROMPTS_DIR, Prompts
from bridge_assets.llm.budget import DEFERRED
from bridge_assets.llm.types import LLMResult

AGENT = re.compile(r"You are agent (\w+)")
ROUND = re.compile(r"This is round (\d+)")
QUERY = re.compile(r"^Query: (.*)$", re.M)


def pair(name: str) -> Pair:
    return Pair(f"q-{name}", f"d-{name}", name, (f"answer {name}",), f"chunk text for {name}")


def turn(response: str, reason: str = "because") -> dict:
    return {"reference": ["a quoted sentence"], "reason": reason, "response": response}


class ScriptedModel:
    """Answers debate turns from `script[query][(agent, round)]`: a dict (the JSON reply),
    a string (raw text), or an Exception instance (a failed call)."""

    def __init__(self, script):
        self.script = script
        self.batches: list[tuple[str, int]] = []  # (profile, requests) per generate call
        self.prompts: list[tuple[str, str, int, str]] = []  # (query, agent, round, user message)

    def __call__(self, profile, requests):
        self.batches.append((profile, len(requests)))
        results = []
        for n, request in enumerate(requests):
            system, user = (text for _, text in request.messages)
            query = QUERY.search(user).group(1)
            agent_match, round_match = AGENT.search(user), ROUND.search(user)
            agent = agent_match.group(1) if agent_match else "judge"
            round_number = int(round_match.group(1)) if round_match else 1
            self.prompts.append((query, agent, round_number, user))
            reply = self.script[query][(agent, round_number)]
            key = f"{profile}-{query}-{agent}-{round_number}-{n}"
            if isinstance(reply, Exception):
                results.append(LLMResult(key=key, error=str(reply)))
            elif isinstance(reply, str):
                results.append(LLMResult(key=key, text=reply))
            else:
                results.append(LLMResult(key=key, text=json.dumps(reply), parsed=reply))
        return results


def by_pair(outcome):
    return {label.query_id: label for label in outcome.labels}


def test_consensus_in_round_one_ends_the_debate_with_that_label():
    model = ScriptedModel({
        "p1": {("A", 1): turn("yes"), ("B", 1): turn("yes")},
        "p2": {("A", 1): turn("no"), ("B", 1): turn("No ")},  # case and spaces do not matter
    })
    outcome = run_debate([pair("p1"), pair("p2")], debate_agents(["m"]), model)
    labels = by_pair(outcome)
    assert (labels["q-p1"].outcome, labels["q-p1"].label, labels["q-p1"].rounds_used) == ("consensus", 1, 1)
    assert (labels["q-p2"].outcome, labels["q-p2"].label, labels["q-p2"].rounds_used) == ("consensus", 0, 1)
    assert model.batches == [("m", 4)]  # one call for the whole round, both agents, both pairs
    assert outcome.consensus_by_round() == {1: 2, 2: 2}
    assert len(outcome.turns) == 4


def test_round_one_shows_only_the_opening_stances_and_round_two_shows_both_previous_turns():
    model = ScriptedModel({"p1": {
        ("A", 1): turn("yes", "A says it is stated"), ("B", 1): turn("no", "B says it is not"),
        ("A", 2): turn("yes"), ("B", 2): turn("yes", "B was convinced"),
    }})
    outcome = run_debate([pair("p1")], debate_agents(["m"]), model, rounds=2)
    label = outcome.labels[0]
    assert (label.outcome, label.label, label.rounds_used) == ("consensus", 1, 2)
    assert outcome.consensus_by_round() == {1: 0, 2: 1}
    round1 = [user for _, _, r, user in model.prompts if r == 1]
    round2 = [user for _, _, r, user in model.prompts if r == 2]
    for user in round1:
        assert "Agent A: the chunk is relevant." in user and "Agent B: the chunk is irrelevant." in user
        assert "Round 1:" not in user and "A says it is stated" not in user
    for user in round2:
        assert "Round 1:" in user and "A says it is stated" in user and "B says it is not" in user
    assert [(t.round, t.agent, t.stance, t.response) for t in outcome.turns] == [
        (1, "A", "relevant", "yes"), (1, "B", "irrelevant", "no"),
        (2, "A", "relevant", "yes"), (2, "B", "irrelevant", "yes")]


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_disagreement_after_the_last_round_escalates_with_the_full_history(rounds):
    model = ScriptedModel({"p1": {(agent, r): turn("yes" if agent == "A" else "no")
                                  for agent in "AB" for r in range(1, 4)}})
    outcome = run_debate([pair("p1")], debate_agents(["m"]), model, rounds=rounds)
    label = outcome.labels[0]
    assert (label.outcome, label.label, label.rounds_used) == ("escalated", None, rounds)
    assert [(t.round, t.agent) for t in outcome.turns] == [(r, a) for r in range(1, rounds + 1) for a in "AB"]
    assert len(model.batches) == rounds


def test_a_round_batches_every_pair_still_debating_and_only_those():
    script = {f"p{i}": {("A", 1): turn("yes"), ("B", 1): turn("yes" if i < 3 else "no"),
                        ("A", 2): turn("no"), ("B", 2): turn("no")} for i in range(5)}
    model = ScriptedModel(script)
    outcome = run_debate([pair(f"p{i}") for i in range(5)], debate_agents(["m"]), model)
    assert model.batches == [("m", 10), ("m", 4)]  # round 2: the two pairs that disagreed
    assert [label.rounds_used for label in outcome.labels] == [1, 1, 1, 2, 2]
    assert [label.label for label in outcome.labels] == [1, 1, 1, 0, 0]


def test_pair_major_debates_one_pair_at_a_time_to_the_same_labels_and_turns():
    script = {f"p{i}": {("A", 1): turn("yes"), ("B", 1): turn("yes" if i < 3 else "no"),
                        ("A", 2): turn("no"), ("B", 2): turn("no")} for i in range(5)}
    pairs = [pair(f"p{i}") for i in range(5)]
    by_round, by_pair_order = ScriptedModel(script), ScriptedModel(script)
    outcome = run_debate(pairs, debate_agents(["m"]), by_round)
    pair_major = run_debate(pairs, debate_agents(["m"]), by_pair_order, pair_major=True)
    # one batch per pair and round: p3's round 2 follows its own round 1, not p4's round 1
    assert by_pair_order.batches == [("m", 2)] * 3 + [("m", 2), ("m", 2)] * 2
    assert [(q, a, r) for q, a, r, _ in by_pair_order.prompts][6:10] == [
        ("p3", "A", 1), ("p3", "B", 1), ("p3", "A", 2), ("p3", "B", 2)]
    assert pair_major.labels == outcome.labels
    # the same turns (the scripted call keys number a request within its batch, so they differ)
    assert [replace(t, call_key="") for t in pair_major.turns] == [replace(t, call_key="") for t in outcome.turns]
    # the prompts are the same texts, only their order differs
    assert sorted(p for *_, p in by_pair_order.prompts) == sorted(p for *_, p in by_round.prompts)


@pytest.mark.parametrize("failure", [RuntimeError("HTTP 500 after 3 retries"), "not json at all",
                                     json.dumps({"reference": [], "reason": "r", "response": "maybe"})])
def test_a_failed_turn_marks_the_pair_failed_without_a_label_and_stops_its_debate(failure):
    model = ScriptedModel({
        "p1": {("A", 1): turn("yes"), ("B", 1): failure},
        "p2": {("A", 1): turn("yes"), ("B", 1): turn("no"), ("A", 2): turn("yes"), ("B", 2): turn("yes")},
    })
    outcome = run_debate([pair("p1"), pair("p2")], debate_agents(["m"]), model)
    labels = by_pair(outcome)
    assert (labels["q-p1"].outcome, labels["q-p1"].label, labels["q-p1"].rounds_used) == ("failed", None, 1)
    assert labels["q-p2"].outcome == "consensus"
    failed = [t for t in outcome.turns if t.query_id == "q-p1"]
    assert [(t.round, t.agent, t.response) for t in failed] == [(1, "A", "yes"), (1, "B", None)]
    assert failed[1].error and failed[1].call_key
    assert model.batches == [("m", 4), ("m", 2)]  # the failed pair is not debated further


def test_a_failure_in_round_two_keeps_round_one_in_the_history():
    model = ScriptedModel({"p1": {("A", 1): turn("yes"), ("B", 1): turn("no"),
                                  ("A", 2): RuntimeError("timeout"), ("B", 2): turn("no")}})
    outcome = run_debate([pair("p1")], debate_agents(["m"]), model)
    assert (outcome.labels[0].outcome, outcome.labels[0].rounds_used) == ("failed", 2)
    assert len(outcome.turns) == 4


def test_four_agents_need_unanimity_and_alternate_stances():
    agreeing = {(a, r): turn("no") for a in "ABCD" for r in (1, 2)}
    split = {**agreeing, ("C", 1): turn("yes"), ("C", 2): turn("yes")}
    model = ScriptedModel({"p1": agreeing, "p2": split})
    agents = debate_agents(["m"], count=4)
    assert [(a.name, a.stance) for a in agents] == [
        ("A", "relevant"), ("B", "irrelevant"), ("C", "relevant"), ("D", "irrelevant")]
    outcome = run_debate([pair("p1"), pair("p2")], agents, model)
    labels = by_pair(outcome)
    assert (labels["q-p1"].outcome, labels["q-p1"].label) == ("consensus", 0)
    assert (labels["q-p2"].outcome, labels["q-p2"].rounds_used) == ("escalated", 2)
    assert model.batches == [("m", 8), ("m", 4)]
    assert sum(1 for t in outcome.turns if t.query_id == "q-p2") == 8


def test_stance_order_gives_agent_a_the_irrelevant_stance_and_lists_it_first():
    model = ScriptedModel({"p1": {("A", 1): turn("no"), ("B", 1): turn("no")}})
    agents = debate_agents(["m"], stance_order="irrelevant_first")
    assert [(a.name, a.stance) for a in agents] == [("A", "irrelevant"), ("B", "relevant")]
    outcome = run_debate([pair("p1")], agents, model)
    user_of_a = next(user for _, agent, _, user in model.prompts if agent == "A")
    assert user_of_a.index("Agent A: the chunk is irrelevant.") < user_of_a.index("Agent B: the chunk is relevant.")
    assert "your opening stance was that the chunk is irrelevant" in user_of_a
    assert outcome.turns[0].stance == "irrelevant"


def test_a_model_per_agent_sends_one_call_per_model_and_round():
    model = ScriptedModel({"p1": {("A", 1): turn("yes"), ("B", 1): turn("no"),
                                  ("A", 2): turn("yes"), ("B", 2): turn("no")}})
    outcome = run_debate([pair("p1")], debate_agents(["big", "small"]), model)
    assert model.batches == [("big", 1), ("small", 1), ("big", 1), ("small", 1)]
    assert [t.model for t in outcome.turns] == ["big", "small", "big", "small"]


def test_agent_configuration_errors_name_the_problem():
    with pytest.raises(ValueError, match="even number"):
        debate_agents(["m"], count=3)
    with pytest.raises(ValueError, match="one per agent"):
        debate_agents(["a", "b", "c"], count=2)
    with pytest.raises(ValueError, match="distinct"):
        run_debate([pair("p")], [AgentConfig("A", "relevant", "m"), AgentConfig("A", "irrelevant", "m")],
                   ScriptedModel({}))


def test_llm_judge_is_one_call_per_pair_and_never_escalates():
    model = ScriptedModel({"p1": {("judge", 1): turn("yes")}, "p2": {("judge", 1): turn("no")},
                           "p3": {("judge", 1): RuntimeError("server down")}})
    outcome = run_judge([pair("p1"), pair("p2"), pair("p3")], "m", model)
    labels = by_pair(outcome)
    assert [(labels[q].outcome, labels[q].label) for q in ("q-p1", "q-p2", "q-p3")] == [
        ("consensus", 1), ("consensus", 0), ("failed", None)]
    assert model.batches == [("m", 3)]
    assert all(t.stance is None and t.agent == "judge" for t in outcome.turns)
    assert "Debate so far" not in model.prompts[0][3]


def test_adjudicator_decides_unresolved_pairs_from_their_history_apart_from_consensus():
    debate_model = ScriptedModel({
        "agree": {("A", 1): turn("yes"), ("B", 1): turn("yes")},
        "split": {("A", 1): turn("yes", "A: the chunk says so"), ("B", 1): turn("no"),
                  ("A", 2): turn("yes"), ("B", 2): turn("no", "B: only implied")},
        "broken": {("A", 1): turn("yes"), ("B", 1): RuntimeError("timeout")},
    })
    pairs = [pair("agree"), pair("split"), pair("broken")]
    outcome = run_debate(pairs, debate_agents(["m"]), debate_model)
    seen = []

    def adjudicator_model(profile, requests):
        seen.extend(text for request in requests for _, text in request.messages)
        return [LLMResult(key=f"adj-{i}", text='{"reason": "r", "response": "no"}',
                          parsed={"reason": "r", "response": "no"}) for i, _ in enumerate(requests)]

    decided = by_pair(adjudicate(outcome, pairs, "judge-model", adjudicator_model))
    assert decided["q-agree"].adjudicator_label is None and decided["q-agree"].label == 1
    assert (decided["q-split"].outcome, decided["q-split"].label, decided["q-split"].adjudicator_label) == \
        ("escalated", None, 0)
    assert decided["q-split"].adjudicator_call_key == "adj-0"
    assert (decided["q-broken"].outcome, decided["q-broken"].adjudicator_label) == ("failed", 0)
    users = [text for text in seen if text.startswith("Query:")]
    assert len(users) == 2
    assert "A: the chunk says so" in users[0] and "B: only implied" in users[0] and "Round 2:" in users[0]
    assert "gave no usable answer" in users[1]


def test_a_failed_adjudicator_call_leaves_no_adjudicator_label():
    model = ScriptedModel({"split": {("A", 1): turn("yes"), ("B", 1): turn("no")}})
    outcome = run_debate([pair("split")], debate_agents(["m"]), model, rounds=1)
    decided = adjudicate(outcome, [pair("split")], "j",
                         lambda profile, requests: [LLMResult(key="k", error="HTTP 500")])
    assert decided.labels[0].adjudicator_label is None
    assert decided.labels[0].adjudicator_error == "HTTP 500"


def test_frames_follow_the_table_contracts():
    model = ScriptedModel({"p1": {("A", 1): turn("yes"), ("B", 1): turn("no"),
                                  ("A", 2): turn("yes"), ("B", 2): RuntimeError("boom")}})
    outcome = run_debate([pair("p1")], debate_agents(["m"]), model)
    labels = labels_frame(outcome, "demo", "cfg")
    turns = turns_frame(outcome, "demo")
    assert {"dataset", "query_id", "doc_id", "pair_key", "label", "outcome", "rounds_used",
            "config_hash", "adjudicator_label", "adjudicator_call_key"} <= set(labels.columns)
    assert {"dataset", "query_id", "doc_id", "pair_key", "round", "agent", "stance", "model",
            "reference", "reason", "response", "call_key", "error"} <= set(turns.columns)
    assert labels.row(0, named=True)["outcome"] == "failed"
    assert turns["response"].to_list() == ["yes", "no", "yes", None]
    assert turns["reference"].to_list()[0] == ["a quoted sentence"]


def test_metered_generate_counts_calls_cache_hits_and_tokens():
    def generate(profile, requests):
        return [LLMResult(key="same", text="{}", tokens_in=10, tokens_out=5),
                LLMResult(key="same", text="{}", tokens_in=10, tokens_out=5),  # duplicate request
                LLMResult(key="old", text="{}", tokens_in=10, tokens_out=5, cached=True),
                LLMResult(key="bad", error="timeout")][:len(requests)]

    metered = MeteredGenerate(generate)
    metered("m", [object()] * 4)
    stats = metered.stats
    assert (stats.requests, stats.calls, stats.cache_hits, stats.failures) == (4, 2, 1, 1)
    assert (stats.tokens_in, stats.tokens_out) == (10, 5)


def test_metered_generate_counts_deferred_results_as_neither_calls_nor_failures():
    # past an automation run's cap the client returns results it never sent
    def generate(profile, requests):
        return [LLMResult(key=f"k{i}", error=DEFERRED) for i in range(len(requests))]

    metered = MeteredGenerate(generate)
    metered("m", [object()] * 3)
    stats = metered.stats
    assert (stats.requests, stats.calls, stats.failures) == (3, 0, 0)
    assert stats.as_metadata()["call_failures"] == 0 and stats.by_profile == {"m": 0}


def test_replies_are_bounded_and_their_token_budget_holds_them():
    for words in (10, 40, 100):
        schema = turn_schema(words)
        props = schema["properties"]
        free_text = props["reference"]["maxItems"] * props["reference"]["items"]["maxLength"] \
            + props["reason"]["maxLength"]
        assert props["reason"]["maxLength"] == 7 * words
        assert free_text / 2.5 + 30 <= turn_max_tokens(words)


def test_config_hash_follows_prompts_rounds_and_models(tmp_path):
    agents = debate_agents(["m"])
    common = dict(temperature=0.0, reason_words=40, model_ids={"m": "model-1"})
    base = debate_config_hash(agents, rounds=2, prompts=Prompts(), **common)
    assert base == debate_config_hash(agents, rounds=2, prompts=Prompts(), **common)
    assert base != debate_config_hash(agents, rounds=3, prompts=Prompts(), **common)
    assert base != debate_config_hash(agents, rounds=2, prompts=Prompts(),
                                      **{**common, "model_ids": {"m": "model-2"}})
    edited = tmp_path / "prompts"
    shutil.copytree(PROMPTS_DIR, edited)
    (edited / "filter.j2").write_text((edited / "filter.j2").read_text() + "\n{# edited #}\n")
    assert base == debate_config_hash(agents, rounds=2, prompts=Prompts(edited), **common)
    guidelines = edited / "guidelines.j2"  # included by the debate prompt: changes its hash
    guidelines.write_text(guidelines.read_text().replace("Same scope", "Equal scope"))
    assert base != debate_config_hash(agents, rounds=2, prompts=Prompts(edited), **common)


# --- the graded scale ---------------------------------------------------------------------------

def graded_pair(name: str, answers: tuple[str, ...] = ()) -> Pair:
    return Pair(f"q-{name}", f"d-{name}", name, answers, f"chunk text for {name}. A quoted sentence.",
                "what the searcher wants", "what counts as relevant", "graded")


def grade(value, reason: str = "because", reference=("A quoted sentence.",)) -> dict:
    return {"reference": list(reference), "reason": reason, "grade": value}


GRADED_SCRIPT = {
    "same": {("A", 1): grade(2), ("B", 1): grade("2")},          # a grade written as a string
    "near": {("A", 1): grade(3), ("B", 1): grade(2), ("A", 2): grade(3), ("B", 2): grade(2)},
    "far": {("A", 1): grade(3), ("B", 1): grade(0), ("A", 2): grade(3), ("B", 2): grade(1)},
    "moved": {("A", 1): grade(3), ("B", 1): grade(0), ("A", 2): grade(1), ("B", 2): grade(1)},
    "bad": {("A", 1): grade(2), ("B", 1): grade(4)},             # off the scale: a failed turn
}


@pytest.mark.parametrize("rule, near", [("exact", None), ("within_one", 2)])
def test_graded_agents_agree_under_the_consensus_rule_keeping_the_lower_grade(rule, near):
    model = ScriptedModel(GRADED_SCRIPT)
    pairs = [graded_pair(name) for name in GRADED_SCRIPT]
    outcome = run_debate(pairs, debate_agents(["m"]), model, grade_consensus=rule)
    labels = by_pair(outcome)
    assert (labels["q-same"].outcome, labels["q-same"].label, labels["q-same"].rounds_used) == ("consensus", 2, 1)
    assert labels["q-near"].label == near
    assert labels["q-near"].outcome == ("consensus" if near is not None else "escalated")
    assert labels["q-far"].outcome == "escalated" and labels["q-far"].flags == ("disagreement",)
    assert (labels["q-moved"].outcome, labels["q-moved"].label, labels["q-moved"].rounds_used) == \
        ("consensus", 1, 2)
    assert (labels["q-bad"].outcome, labels["q-bad"].flags) == ("failed", ("failed",))
    turns = {(t.query_id, t.agent, t.round): t for t in outcome.turns}
    assert turns[("q-same", "B", 1)].response == "2" and turns[("q-same", "B", 1)].confidence is None
    assert turns[("q-bad", "B", 1)].response is None and "grade" in turns[("q-bad", "B", 1)].error
    # round 2 shows the grades of round 1 and asks again for a grade, with the narrative
    user = next(u for q, a, r, u in model.prompts if (q, a, r) == ("far", "A", 2))
    assert "gave grade 3" in user and "gave grade 0" in user and "what counts as relevant" in user
    frame = labels_frame(outcome, "ds", "h")
    assert set(frame.drop_nulls("label")["label"].to_list()) <= {0, 1, 2, 3}


def test_graded_checks_need_evidence_from_grade_one_and_an_answer_from_grade_two():
    checks = DebateChecks(evidence=True, answer_presence="all")
    unquoted = {("A", 1): grade(1, reference=()), ("B", 1): grade(1, reference=())}
    model = ScriptedModel({
        "related": unquoted,
        "answers": {("A", 1): grade(2), ("B", 1): grade(2)},   # the answer is not in the chunk
        "nothing": {("A", 1): grade(0, reference=()), ("B", 1): grade(0, reference=())},
        "related-with-answer": {("A", 1): grade(1), ("B", 1): grade(1)},
    })
    pairs = [graded_pair("related"), graded_pair("answers", ("Paris",)), graded_pair("nothing"),
             graded_pair("related-with-answer", ("Paris",))]
    labels = by_pair(run_debate(pairs, debate_agents(["m"]), model, checks=checks))
    assert (labels["q-related"].outcome, labels["q-related"].flags) == ("escalated", ("unverified_evidence",))
    assert (labels["q-answers"].outcome, labels["q-answers"].flags) == ("escalated", ("answer_absent",))
    assert labels["q-answers"].agreed_label == 2
    assert (labels["q-nothing"].outcome, labels["q-nothing"].label) == ("consensus", 0)
    # a grade of 1 says the chunk does not answer: no answer needed
    assert (labels["q-related-with-answer"].outcome, labels["q-related-with-answer"].label) == ("consensus", 1)


def test_graded_adjudicator_decides_a_grade():
    model = ScriptedModel({"far": GRADED_SCRIPT["far"]})
    outcome = run_debate([graded_pair("far")], debate_agents(["m"]), model)
    sent = []

    def adjudicator_model(profile, requests):
        sent.extend(requests)
        return [LLMResult(key="adj", text='{"reason": "r", "grade": 2}', parsed={"reason": "r", "grade": 2})]

    decided = adjudicate(outcome, [graded_pair("far")], "j", adjudicator_model)
    assert (decided.labels[0].outcome, decided.labels[0].label, decided.labels[0].adjudicator_label) == \
        ("escalated", None, 2)
    assert sent[0].json_schema["properties"]["grade"]["enum"] == [0, 1, 2, 3]
    assert "Decide: how relevant is the chunk?" in sent[0].messages[1][1]


def test_the_graded_scale_and_its_rule_enter_the_config_hash_and_the_binary_hash_stays():
    agents = debate_agents(["m"])
    common = dict(rounds=2, temperature=0.0, reason_words=40, prompts=Prompts(), model_ids={"m": "x"})
    binary = debate_config_hash(agents, **common)
    assert binary == debate_config_hash(agents, **common, grade_consensus="within_one")
    exact = debate_config_hash(agents, **common, scale="graded")
    assert len({binary, exact, debate_config_hash(agents, **common, scale="graded",
                                                  grade_consensus="within_one")}) == 3


def test_the_key_of_a_graded_or_topic_pair_differs_and_a_binary_pair_keeps_its_key():
    plain = Pair("q", "d", "query", ("a",), "chunk")
    assert plain.key == pair_key("query", ("a",), "chunk")
    assert len({plain.key, Pair("q", "d", "query", ("a",), "chunk", scale="graded").key,
                Pair("q", "d", "query", (), "chunk", "desc", "narr").key,
                Pair("q", "d", "query", (), "chunk").key}) == 4
