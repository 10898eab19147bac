"""The labeling prompts: for pairs with reference answers on the binary scale (every dataset and
gold set so far) they render byte for byte as the templates of commit 395e55c did, so the
call ledger's answers and running evaluations stay valid; without answers, a TREC topic's
description and narrative are the relevance criterion; on the graded scale, the 0-3 grades.

tests/data/labeling_prompts_head.json holds the messages the templates of 395e55c rendered
for the cases of `renders()`, written once; a template change that alters them fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_assets.evaluation.goldsets import GoldTriplet
from bridge_assets.labeling.adjudicator import adjudicate, adjudicator_schema
from bridge_assets.labeling.debate import DebateOutcome, PairLabel
from bridge_assets.labeling.debate_turns import DEBATE_TEMPLATES, Turn, debate_agents, turn_request, turn_schema
from bridge_assets.labeling.filter import filter_request
from bridge_assets.labeling.judge import judge_agent
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.pointwise import score_request
from bridge_assets.labeling.prompts import Prompts, worked_examples
from bridge_assets.llm.types import LLMResult

BASELINE = Path(__file__).parent / "data" / "labeling_prompts_head.json"
PAIRS = {
    "answers": Pair("q1", "d1", "who wrote the iliad", ("Homer", "the poet Homer"),
                    "Iliad\nThe Iliad is an ancient Greek epic poem attributed to Homer."),
    # judged by answer_support without answers, as every such pair was before definitions
    # (the default is `useful` since: test_relevance_definition.py)
    "no_answers": Pair("q2", "d2", "0-dimensional biomaterials show inductive properties.", (),
                       "Title line\nA study of nanomaterials and bone induction.",
                       definition="answer_support"),
}
DESCRIPTION = "Find studies of whether zero-dimensional biomaterials induce bone formation."
NARRATIVE = "A relevant abstract reports such an induction; a review without results is not relevant."


def _history(pair: Pair, agents) -> list[list[Turn]]:
    graded = pair.scale == "graded"
    return [[Turn(pair.query_id, pair.doc_id, pair.key, 1, agent.name, agent.stance, agent.model,
                  ("The Iliad is an ancient Greek epic poem attributed to Homer.",) if i % 2 == 0 else (),
                  f"reason of {agent.name}",
                  ("3" if i % 2 == 0 else "0") if graded else ("yes" if i % 2 == 0 else "no"),
                  f"k{i}", None)
             for i, agent in enumerate(agents)]]


def _adjudicator_messages(pair: Pair, prompts: Prompts):
    agents = debate_agents(["m"], 2)
    history = _history(pair, agents)
    second = Turn(pair.query_id, pair.doc_id, pair.key, 2, "A", "relevant", "m", (), "second thoughts",
                  "1" if pair.scale == "graded" else "no", "k2", None)
    failed = Turn(pair.query_id, pair.doc_id, pair.key, 2, "B", "irrelevant", "m", (), None, None, "kf", "boom")
    outcome = DebateOutcome([PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", 2)],
                            [*history[0], second, failed], agents, 2)
    sent = []

    def capture(model, requests):
        sent.extend(requests)
        return [LLMResult(key="x", error="not asked") for _ in requests]

    adjudicate(outcome, [pair], "m", capture, prompts=prompts)
    return sent[0]


def renders(pairs: dict[str, Pair]) -> dict[str, list[list[str]]]:
    """Every labeling prompt for each pair, through the code that sends it."""
    prompts, examples = Prompts(), worked_examples()
    out = {}
    for name, pair in pairs.items():
        out[f"filter/{name}"] = filter_request(pair, prompts).messages
        judge = judge_agent("m")
        for fewshot in (False, True):
            out[f"judge/{name}/fewshot={fewshot}"] = turn_request(
                pair, judge, [judge], [], 1, prompts, 0.0, 40, examples if fewshot else ()).messages
        for prompt, template in DEBATE_TEMPLATES.items():
            for count, round_number, fewshot in ((2, 1, False), (2, 2, False), (2, 1, True), (4, 2, False)):
                agents = debate_agents(["m"], count, template=template)
                history = [] if round_number == 1 else _history(pair, agents)
                key = f"{template}/{name}/agents={count}/round={round_number}/fewshot={fewshot}"
                out[key] = turn_request(pair, agents[1], agents, history, round_number, prompts,
                                        0.0, 40 if prompt == "soft_stance" else 100,
                                        examples if fewshot else ()).messages
        out[f"adjudicator/{name}"] = _adjudicator_messages(pair, prompts).messages
        triplet = GoldTriplet(pair.query_id, pair.query, pair.answers, pair.chunk, 1)
        out[f"diras_score/{name}/definition=False"] = score_request(
            triplet.item(pair.definition).pair, prompts).messages
    return {key: [list(message) for message in messages] for key, messages in out.items()}


def test_binary_prompts_render_byte_for_byte_as_at_395e55c():
    expected = json.loads(BASELINE.read_text(encoding="utf-8"))["renders"]
    rendered = renders(PAIRS)
    assert rendered.keys() == expected.keys()
    for key, messages in expected.items():
        assert rendered[key] == messages, key


def test_a_topic_without_answers_is_judged_by_its_description_and_narrative():
    topic = {"topic": Pair("q3", "d3", "biomaterials bone induction", (), "A chunk.",
                           DESCRIPTION, NARRATIVE)}
    for key, (system, user) in renders(topic).items():
        if key.startswith("diras_score"):
            continue  # the DIRAS scorer reads gold triplets, which carry no topic
        assert f"Narrative (what counts as relevant): {NARRATIVE}" in user[1], key
        assert f"Description (what the searcher wants): {DESCRIPTION}" in user[1], key
        assert "Reference answers" not in user[1] and "reference answers" not in system[1], key
        assert "description and narrative" in system[1], key
        if not key.startswith("filter"):
            assert "1. The narrative decides." in system[1], key
    # the DIRAS template takes the topic too, when a caller passes it
    system, user = Prompts().messages("diras_score", query="q", answers=(), chunk="c",
                                      description=DESCRIPTION, narrative=NARRATIVE, definition=None)
    assert NARRATIVE in user[1] and "description and narrative" in system[1]


def test_answers_win_over_a_topic_and_a_lone_narrative_is_enough():
    with_both = Pair("q", "d", "who wrote the iliad", ("Homer",), "chunk", DESCRIPTION, NARRATIVE)
    messages = filter_request(with_both, Prompts()).messages
    assert NARRATIVE not in messages[1][1] and "Reference answers:\n- Homer" in messages[1][1]
    assert with_both.key == Pair("q", "d", "who wrote the iliad", ("Homer",), "chunk").key
    narrative_only = Pair("q", "d", "query", (), "chunk", None, NARRATIVE)
    user = filter_request(narrative_only, Prompts()).messages[1][1]
    assert NARRATIVE in user and "Description" not in user and "none are given" not in user


def test_graded_prompts_define_the_scale_and_ask_for_a_grade():
    graded = {name: Pair(p.query_id, p.doc_id, p.query, p.answers, p.chunk, scale="graded")
              for name, p in PAIRS.items()}
    graded["topic"] = Pair("q3", "d3", "q", (), "c", DESCRIPTION, NARRATIVE, "graded")
    for key, (system, user) in renders(graded).items():
        if key.startswith(("diras_score", "filter")) or "fewshot=True" in key:
            continue  # yes/no by design; worked examples are yes/no (refused on graded datasets)
        assert "0 = irrelevant: the chunk has nothing to do with the query." in system[1], key
        assert "3 = perfectly relevant: the chunk is dedicated to the query and contains the exact answer." \
            in system[1], key
        assert '"grade": the chunk\'s grade on the scale: 0, 1, 2 or 3.' in system[1], key
        assert '"response"' not in system[1], key
        if "round=2" in key:
            assert ("gave grade 3" in user[1]) or ("Grade 3." in user[1]), key
    filter_system = filter_request(graded["answers"], Prompts()).messages[0][1]
    assert "anything to do with what the query asks" in filter_system


def test_graded_schemas_ask_for_a_grade_where_binary_ones_ask_yes_or_no():
    binary, graded = turn_schema(40), turn_schema(40, "graded")
    assert list(graded["properties"]) == ["reference", "reason", "grade"]
    assert graded["properties"]["grade"] == {"type": "integer", "enum": [0, 1, 2, 3]}
    assert graded["required"] == ["reference", "reason", "grade"]
    assert {k: v for k, v in binary["properties"].items() if k != "response"} == \
        {k: v for k, v in graded["properties"].items() if k != "grade"}
    assert list(adjudicator_schema(256, "graded")["properties"]) == ["reason", "grade"]
    pair = Pair("q", "d", "q", (), "c", scale="graded")
    assert _adjudicator_messages(pair, Prompts()).json_schema == adjudicator_schema(256, "graded")


@pytest.mark.parametrize("template", ["filter", "judge", "debate_turn", "debate_turn_paper",
                                      "adjudicator", "diras_score"])
def test_callers_that_pass_no_topic_or_scale_render_the_binary_prompt(template):
    """The evaluation and other callers pass only query, answers and chunk: the optional
    variables default to no topic and the binary scale."""
    pair = PAIRS["answers"]
    context = dict(query=pair.query, answers=pair.answers, chunk=pair.chunk, agents=[], history=[],
                   agent="A", stance="relevant", round=1, reason_words=40, examples=[], definition=None)
    explicit = dict(context, description=None, narrative=None, scale="binary")
    assert Prompts().messages(template, **context) == Prompts().messages(template, **explicit)
