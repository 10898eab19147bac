"""The LLM filter: votes per model, the drop-only-when-all-say-false rule, failed votes kept."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from bridge_assets.labeling.debate_turns import debate_agents, turn_request
from bridge_assets.labeling.filter import filter_request, filtered_pool, run_filter, votes_frame
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import PROMPTS_DIR, PromptError, Prompts
from bridge_assets.llm.types import LLMResult
from fixtures.oracle_model import score_logprobs


def pair(name: str, answers=("an answer",)) -> Pair:
    return Pair(f"q-{name}", f"d-{name}", f"query {name}", answers, f"chunk {name}")


def voting(votes: dict[str, dict[str, object]]):
    """A scripted filter model (tests only): votes[profile][query] is True/False, raw text,
    or an Exception (a failed call)."""
    calls = []

    def generate(profile, requests):
        calls.append((profile, len(requests)))
        results = []
        for request in requests:
            user = request.messages[1][1]
            query = user.split("\n", 1)[0].removeprefix("Query: ")
            vote = votes[profile][query]
            key = f"{profile}/{query}"
            if isinstance(vote, Exception):
                results.append(LLMResult(key=key, error=str(vote)))
            elif isinstance(vote, str):
                results.append(LLMResult(key=key, text=vote))
            else:
                results.append(LLMResult(key=key, text=json.dumps({"is_supported": vote}),
                                         parsed={"is_supported": vote}))
        return results

    return generate, calls


def scoring(p_yes: dict[str, float | None]):
    """A scripted scorer: P(yes) per query (None: a reply without a yes/no token)."""
    def generate(profile, requests):
        results = []
        for request in requests:
            query = request.messages[1][1].split("\n", 1)[0].removeprefix("Query: ")
            p = p_yes[query]
            logprobs = score_logprobs(p) if p is not None else []
            word = "yes" if p is not None and p >= 0.5 else "no"
            results.append(LLMResult(key=f"{profile}/{query}", text=json.dumps({"response": word}),
                                     parsed={"response": word}, logprobs=logprobs))
        return results
    return generate


def test_under_a_definition_a_pair_is_dropped_only_when_its_p_yes_is_low():
    pairs = [pair(name, ()) for name in ("low", "edge", "high", "broken")]
    generate = scoring({"query low": 0.1, "query edge": 0.25, "query high": 0.9, "query broken": None})
    strict = {v.query_id: v.is_supported for v in run_filter(pairs, ["m"], generate, keep_p_yes=0.3)}
    assert strict == {"q-low": False, "q-edge": False, "q-high": True, "q-broken": None}
    lenient = {v.query_id: (v.is_supported, round(v.p_yes, 2) if v.p_yes else None)
               for v in run_filter(pairs, ["m"], generate, keep_p_yes=0.2)}
    assert lenient == {"q-low": (False, 0.1), "q-edge": (True, 0.25), "q-high": (True, 0.9), "q-broken": (None, None)}
    pool = filtered_pool(votes_frame(run_filter(pairs, ["m"], generate), "demo"))  # the default, 0.2
    assert kept(pool) == {"q-low": False, "q-edge": True, "q-high": True, "q-broken": True}  # a failed score keeps it


def kept(pool) -> dict[str, bool]:
    return dict(zip(pool["query_id"], pool["kept"]))


def test_a_pair_is_dropped_only_when_every_model_says_false():
    generate, calls = voting({
        "m1": {"query all-no": False, "query one-yes": False, "query all-yes": True},
        "m2": {"query all-no": False, "query one-yes": False, "query all-yes": True},
        "m3": {"query all-no": False, "query one-yes": True, "query all-yes": True},
    })
    pairs = [pair("all-no"), pair("one-yes"), pair("all-yes")]
    votes = votes_frame(run_filter(pairs, ["m1", "m2", "m3"], generate), "demo")
    assert calls == [("m1", 3), ("m2", 3), ("m3", 3)]  # one batched call per model
    assert votes.height == 9 and set(votes["dataset"]) == {"demo"}
    pool = filtered_pool(votes)
    assert kept(pool) == {"q-all-no": False, "q-one-yes": True, "q-all-yes": True}
    row = pool.filter(pool["query_id"] == "q-one-yes").row(0, named=True)
    assert (row["votes_supported"], row["votes_total"], row["votes_failed"]) == (1, 3, 0)


@pytest.mark.parametrize("failure", [RuntimeError("HTTP 500"), "yes it is", '{"is_supported": "maybe"}'])
def test_a_failed_vote_is_recorded_and_keeps_the_pair(failure):
    generate, _ = voting({"m1": {"query p": False}, "m2": {"query p": failure}})
    votes = votes_frame(run_filter([pair("p")], ["m1", "m2"], generate), "demo")
    failed = votes.filter(votes["model"] == "m2").row(0, named=True)
    assert failed["is_supported"] is None and failed["error"] and failed["call_key"] == "m2/query p"
    row = filtered_pool(votes).row(0, named=True)
    assert (row["kept"], row["votes_supported"], row["votes_total"], row["votes_failed"]) == (True, 0, 2, 1)


def test_the_filter_needs_a_model():
    with pytest.raises(ValueError, match="at least one model"):
        run_filter([pair("p")], [], voting({})[0])


def test_no_pairs_give_empty_tables_with_the_contract_columns():
    votes = votes_frame(run_filter([], ["m1"], voting({"m1": {}})[0]), "demo")
    pool = filtered_pool(votes)
    assert votes.height == 0 and pool.height == 0
    assert {"dataset", "query_id", "doc_id", "model", "is_supported", "call_key", "error"} <= set(votes.columns)
    assert {"dataset", "query_id", "doc_id", "kept", "votes_supported", "votes_total"} <= set(pool.columns)


def test_prompts_carry_the_guidelines_answers_and_chunk():
    system, user = (text for _, text in filter_request(pair("p", ("lambda", "def")), Prompts()).messages)
    assert '"is_supported"' in system
    assert "- lambda\n- def" in user and "chunk p" in user
    # without answers the default definition is `useful`: the filter asks the scorer's question
    # (P(yes) from log-probabilities); answer_support asks for a complete answer, as every such
    # pair was asked before definitions existed
    scorer = filter_request(pair("p", ()), Prompts())
    assert scorer.top_logprobs and scorer.purpose == "filter"
    assert "directly answers the question or a part of it" in scorer.messages[1][1]
    assert '{"response": "yes"}' in scorer.messages[0][1] and "none are given" not in scorer.messages[1][1]
    strict = replace(pair("p", ()), definition="answer_support")
    assert "none are given" in filter_request(strict, Prompts()).messages[1][1]
    agents = debate_agents(["m"])
    debate_system = turn_request(pair("p"), agents[0], agents, [], 1, Prompts(), 0.0, 256).messages[0][1]
    for guideline in ("Same scope", "Said directly", "Same concept, same intent", "No surface matching",
                      "Do not judge whether an answer is correct", "Take each answer on its own"):
        assert guideline in debate_system


def test_editing_a_prompt_changes_exactly_the_requests_that_use_it(tmp_path):
    edited = tmp_path / "prompts"
    shutil.copytree(PROMPTS_DIR, edited)
    (edited / "filter.j2").write_text((edited / "filter.j2").read_text().replace(
        "You screen search results.", "You screen retrieved passages."))
    agents = debate_agents(["m"])
    original, changed = Prompts(), Prompts(edited)
    assert filter_request(pair("p"), original) != filter_request(pair("p"), changed)
    assert turn_request(pair("p"), agents[0], agents, [], 1, original, 0.0, 256) == \
        turn_request(pair("p"), agents[0], agents, [], 1, changed, 0.0, 256)
    assert original.hash("filter") != changed.hash("filter")
    assert original.hash("debate_turn") == changed.hash("debate_turn")


def test_a_missing_or_broken_template_is_named(tmp_path):
    with pytest.raises(PromptError, match="nope"):
        Prompts().messages("nope")
    (tmp_path / "half.j2").write_text("{% block user %}hi{% endblock %}")
    with pytest.raises(PromptError, match=r"half\.j2 lacks block\(s\) \['system'\]"):
        Prompts(tmp_path).messages("half")
    (tmp_path / "undefined.j2").write_text("{% block system %}{{ who }}{% endblock %}{% block user %}x{% endblock %}")
    with pytest.raises(PromptError, match="who"):
        Prompts(tmp_path).messages("undefined")
