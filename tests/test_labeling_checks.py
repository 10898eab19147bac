"""The checks an agreement must pass before it is a label (evidence, answer presence,
confidence), the human budget, reply texts cut back to whole sentences, the paper-faithful
debate prompt and its worked examples.

Evidence and answer presence run on real chunks of the embedded demo corpus. The debates are
driven by scripted replies (a fake model that lives only in these tests) carrying log-probabilities
at the answer token, so each check is provoked on purpose.
"""

from __future__ import annotations

import json
import math

import pytest

from bridge_assets.labeling.debate import (
    FLAG_ANSWER,
    FLAG_CONFIDENCE,
    FLAG_DISAGREEMENT,
    FLAG_EVIDENCE,
    DebateChecks,
    PairLabel,
    apply_budget,
    labels_frame,
    run_debate,
)
from bridge_assets.labeling.debate_turns import DEBATE_TEMPLATES, bounded_text, debate_agents, fewshot_examples
from bridge_assets.labeling.evidence import (
    answer_in_chunk,
    answers_are_short,
    evidence_status,
    normalize_answer,
    quote_in_chunk,
)
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts, worked_examples
from bridge_assets.llm.scores import field_yes_probability
from bridge_assets.llm.types import LLMResult, TokenLogprob
from fixtures.paths import PROJECT_ROOT

DEMO = PROJECT_ROOT / "resources" / "data" / "demo"
GOLD = PROJECT_ROOT / "resources" / "goldsets" / "nq_scifact_hard"


def demo_chunk(doc_id: str) -> str:
    for line in (DEMO / "corpus.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["_id"] == doc_id:
            return f"{record['title']}\n{record['text']}"
    raise KeyError(doc_id)


# --- evidence and answer presence --------------------------------------------------------------

def test_quotes_are_found_exactly_across_whitespace_and_case_but_not_paraphrased_or_invented():
    chunk = demo_chunk("pydoc-function-7")  # the q01 hole: anonymous functions and lambda
    sentence = next(s for s in chunk.split(". ") if "lambda" in s.lower())
    assert quote_in_chunk(sentence, chunk)                                   # exact
    assert quote_in_chunk("  " + sentence.upper().replace(" ", "\n  "), chunk)  # case, line breaks
    assert quote_in_chunk(sentence.replace(",", "", 1) if "," in sentence else sentence[:-1], chunk)  # a small edit
    assert not quote_in_chunk("Anonymous functions are written inline with the lambda keyword.", chunk)  # paraphrase
    assert not quote_in_chunk("lambda expression", demo_chunk("pydoc-break-1"))  # not there at all
    assert evidence_status([sentence, "an invented sentence"], chunk) == "verified"
    assert evidence_status(["an invented sentence about nothing"], chunk) == "unverified"
    assert evidence_status([" "], chunk) == "none" and evidence_status([], chunk) == "none"


def test_answer_presence_normalises_like_the_nq_evaluation():
    assert normalize_answer("The  U.S. Army!") == "us army"
    # the demo's q05 hole contains its answer; the false holes the issue reported do not
    assert answer_in_chunk(["nonlocal"], demo_chunk("pydoc-execmodel-7"))
    assert not answer_in_chunk(["nonlocal"], demo_chunk("pydoc-break-1"))
    assert answer_in_chunk(["__enter__"], demo_chunk("pydoc-with-1"))
    assert answer_in_chunk(["Bianca Ryan"], "The first season was won by singer bianca ryan.")
    assert not answer_in_chunk(["Ryan"], "Bryan Adams sang.")  # whole words only
    assert not answer_in_chunk(["the"], "anything")  # an answer that normalises to nothing
    assert answers_are_short([["Bianca Ryan"], ["1939", "2 September 1945"]])
    assert not answers_are_short([["These mice have hypoglycemia during fasting secondary to impaired "
                                   "fasting-induced increases in glucagon."]])
    assert not answers_are_short([[]])


def test_bounded_texts_end_at_a_sentence_or_a_word_never_mid_word():
    reason = "The chunk states it directly. It also names the essential content of the f"
    assert bounded_text(reason, len(reason), sentences=True) == "The chunk states it directly."
    assert bounded_text("no sentence end here at all", 27, sentences=True) == "no sentence end here at…"
    assert bounded_text("The pulmonary arteries carry blood. Ar", 38, sentences=False) == \
        "The pulmonary arteries carry blood."
    assert bounded_text("short and whole", 40, sentences=True) == "short and whole"  # under the bound


# --- scripted debates with log-probabilities ----------------------------------------------------

def reply_logprobs(reply: dict, p_yes: float) -> list[TokenLogprob]:
    """Tokens of a JSON reply as a backend returns them, with P(yes) at the answer token."""
    head = json.dumps(reply)[: json.dumps(reply).rindex('"response": "') + len('"response": "')]
    answer = reply["response"]
    return [TokenLogprob(token=head, logprob=-0.1),
            TokenLogprob(token=answer, logprob=math.log(p_yes if answer == "yes" else 1 - p_yes),
                         top={"yes": math.log(p_yes), "no": math.log(1 - p_yes)}),
            TokenLogprob(token='"}', logprob=-0.01)]


class Agents:
    """Replies per (query, agent): (response, quotes, P(yes)) for every round."""

    def __init__(self, script):
        self.script = script

    def __call__(self, profile, requests):
        results = []
        for n, request in enumerate(requests):
            user = request.messages[1][1]
            query = user.split("\n", 1)[0].removeprefix("Query: ")
            agent = "A" if "You are agent A" in user or "You are Agent A" in user else "B"
            response, quotes, p_yes = self.script[query][agent]
            reply = {"reference": quotes, "reason": "Because the chunk says so.", "response": response}
            results.append(LLMResult(key=f"{query}-{agent}-{n}", text=json.dumps(reply), parsed=reply,
                                     logprobs=reply_logprobs(reply, p_yes)))
        return results


def demo_pair(query_id: str, doc_id: str, query: str, answers: tuple[str, ...]) -> Pair:
    return Pair(query_id, doc_id, query, answers, demo_chunk(doc_id))


NONLOCAL = ("How can a nested function assign to a variable of its enclosing function?", ("nonlocal",))


def test_checks_escalate_an_agreement_that_rests_on_nothing_the_chunk_says():
    hole = demo_pair("q05", "pydoc-execmodel-7", *NONLOCAL)
    false_hole = demo_pair("q05", "pydoc-break-1", *NONLOCAL)
    unsure = demo_pair("q05", "pydoc-assignment-4", *NONLOCAL)
    quote = next(s for s in hole.chunk.split(". ") if "nonlocal" in s)
    model = Agents({
        hole.query: {"A": ("yes", [quote], 0.97), "B": ("yes", [quote], 0.9)},
    })
    # one query, three chunks: route by chunk through a per-pair script
    scripts = {hole.doc_id: {"A": ("yes", [quote], 0.97), "B": ("yes", [quote], 0.9)},
               false_hole.doc_id: {"A": ("yes", ["the nonlocal statement is used here"], 0.95),
                                   "B": ("yes", [], 0.8)},
               unsure.doc_id: {"A": ("no", [], 0.45), "B": ("no", [], 0.2)}}

    def generate(profile, requests):
        out = []
        for request in requests:
            doc = next(d for d in scripts if demo_chunk(d) in request.messages[1][1])
            model.script = {hole.query: scripts[doc]}
            out += model(profile, [request])
        return out

    checks = DebateChecks(evidence=True, answer_presence="short", min_confidence=0.6)
    outcome = run_debate([hole, false_hole, unsure], debate_agents(["m"]), generate, checks=checks)
    labels = {label.doc_id: label for label in outcome.labels}
    assert (labels[hole.doc_id].outcome, labels[hole.doc_id].label) == ("consensus", 1)
    assert labels[hole.doc_id].confidence == pytest.approx(0.9) and labels[hole.doc_id].answer_present
    # both agents said yes, quoting nothing the chunk holds, on a chunk without the answer
    false = labels[false_hole.doc_id]
    assert (false.outcome, false.label, false.agreed_label) == ("escalated", None, 1)
    assert false.flags == (FLAG_EVIDENCE, FLAG_ANSWER) and false.answer_present is False
    # agreeing on "no" needs no quote, but a weak agent (P(no) = 0.55 < 0.6) escalates it
    weak = labels[unsure.doc_id]
    assert (weak.outcome, weak.flags, weak.confidence) == ("escalated", (FLAG_CONFIDENCE,), pytest.approx(0.55))
    turns = {(t.doc_id, t.agent): t for t in outcome.turns}
    assert turns[(hole.doc_id, "A")].evidence == "verified"
    assert turns[(false_hole.doc_id, "A")].evidence == "unverified" and turns[(false_hole.doc_id, "B")].evidence == "none"
    assert turns[(hole.doc_id, "B")].confidence == pytest.approx(0.9)
    assert outcome.flag_counts() == {FLAG_ANSWER: 1, FLAG_CONFIDENCE: 1, FLAG_EVIDENCE: 1}
    frame = labels_frame(outcome, "demo", "cfg")
    assert frame.filter(frame["doc_id"] == false_hole.doc_id)["flags"].to_list() == [[FLAG_EVIDENCE, FLAG_ANSWER]]
    # without checks (the paper's DREAM) the same replies are three labels
    plain = run_debate([hole, false_hole, unsure], debate_agents(["m"]), generate)
    assert [label.outcome for label in plain.labels] == ["consensus"] * 3


def label(i: int, outcome: str, p_yes: float | None, agreed: int | None = None) -> PairLabel:
    flags = {"escalated": (FLAG_DISAGREEMENT,), "failed": ("failed",)}.get(outcome, ())
    return PairLabel(f"q{i}", f"d{i}", f"k{i}", 1 if outcome == "consensus" else None, outcome, 2,
                     agreed_label=agreed, flags=flags, p_yes=p_yes)


def test_the_human_budget_escalates_the_least_confident_pairs_and_votes_the_rest():
    labels = [label(0, "consensus", 0.99), label(1, "escalated", 0.9), label(2, "escalated", 0.52),
              label(3, "failed", None), label(4, "escalated", 0.2), label(5, "escalated", 0.45),
              label(6, "escalated", None, agreed=1), label(7, "escalated", None)]
    budgeted = apply_budget(labels, budget=3)
    outcomes = {l.query_id: (l.outcome, l.label) for l in budgeted}
    # failed first (nobody answered it), then the two closest to 0.5 among those that have a
    # P(yes); a pair without one counts as least sure
    assert outcomes["q3"] == ("failed", None)
    escalated = {q for q, (o, _) in outcomes.items() if o == "escalated"}
    assert escalated == {"q6", "q7"}
    # the others get the pooled vote, P(yes) >= 0.5
    assert outcomes["q1"] == ("vote", 1) and outcomes["q2"] == ("vote", 1)
    assert outcomes["q4"] == ("vote", 0) and outcomes["q5"] == ("vote", 0)
    assert outcomes["q0"] == ("consensus", 1)
    # under the budget nothing changes; a budget below the failures still escalates them all
    assert apply_budget(labels, budget=8) == labels
    tight = apply_budget(labels, budget=0)
    assert {l.query_id for l in tight if l.outcome in ("escalated", "failed")} == {"q3", "q7"}
    assert next(l for l in tight if l.query_id == "q6").label == 1  # the agents' agreement, no P(yes)


def test_answer_probability_is_read_at_the_response_field_not_in_the_reason():
    reply = {"reference": [], "reason": "no, it does not say that", "response": "yes"}
    tokens = [TokenLogprob(token='{"reference": [], "reason": "', logprob=0.0),
              TokenLogprob(token="no", logprob=-0.1, top={"no": -0.1, "yes": -2.4}),
              TokenLogprob(token=', it does not say that", "response": "', logprob=0.0),
              TokenLogprob(token="yes", logprob=math.log(0.8), top={"yes": math.log(0.8), "No": math.log(0.2)})]
    assert "".join(t.token for t in tokens) + '"}' == json.dumps(reply)
    assert field_yes_probability(tokens) == pytest.approx(0.8)
    assert field_yes_probability(tokens[:3]) is None and field_yes_probability(None) is None


# --- the paper's prompt and the worked examples ---------------------------------------------------

def test_the_paper_prompt_states_the_opening_stances_as_answers_and_names_the_other_agent():
    agents = debate_agents(["m"], template=DEBATE_TEMPLATES["paper"])
    prompts = Prompts()
    system, user = (text for _, text in prompts.messages(
        "debate_turn_paper", query="q?", answers=("a",), chunk="c", agent="B", stance="irrelevant",
        agents=agents, history=[], round=1, reason_words=100, examples=fewshot_examples(False)))
    assert "Round 1:\n- Agent A: Yes. The chunk contains complete information to construct at least one " \
           "answer to the target query.\n- Agent B: No." in user
    assert "You are Agent B; there is also another agent, Agent A, assigned the same task." in user
    assert "in at most 100 words" in system
    for rule in ("Same scope", "Key content", "Said directly", "Same concept", "Completeness",
                 "No surface matching", "Do not judge whether an answer is correct", "each answer on its own"):
        assert rule in system
    assert "Worked examples" not in system
    with_examples = prompts.messages("debate_turn_paper", query="q?", answers=("a",), chunk="c", agent="A",
                                     stance="relevant", agents=agents, history=[], round=1,
                                     reason_words=100, examples=fewshot_examples(True))[0][1]
    assert with_examples.count("Correct reply: {\"reference\"") == len(worked_examples())


def test_worked_examples_come_from_the_few_shot_split_never_from_the_evaluated_triplets():
    fewshot = {json.loads(line)["id"]: json.loads(line) for line in (GOLD / "fewshot.jsonl").read_text().splitlines()}
    evaluated = {json.loads(line)["id"] for line in (GOLD / "goldset.jsonl").read_text().splitlines()}
    import yaml
    examples = yaml.safe_load((PROJECT_ROOT / "resources" / "prompts" / "examples.yaml").read_text())["examples"]
    assert examples and not {e["source"] for e in examples} & evaluated
    evaluated_queries = {json.loads(line)["query"] for line in (GOLD / "goldset.jsonl").read_text().splitlines()}
    for example in examples:
        source = fewshot[example["source"]]
        assert example["query"] == source["query"] and example["query"] not in evaluated_queries
        assert " ".join(example["chunk"].split()) in " ".join(source["chunk"].split())  # cut, not rewritten
        assert example["reply"]["response"] == ("yes" if source["label"] else "no")
        for quote in example["reply"]["reference"]:
            assert quote_in_chunk(quote, source["chunk"])


def test_answer_first_turns_give_their_judgment_before_arguing_for_it():
    from bridge_assets.labeling.debate_turns import turn_request, turn_schema
    assert list(turn_schema(30, answer_first=True)["properties"]) == ["response", "reference", "reason"]
    assert list(turn_schema(30)["properties"]) == ["reference", "reason", "response"]
    hole = demo_pair("q05", "pydoc-execmodel-7", *NONLOCAL)
    for template in DEBATE_TEMPLATES.values():
        agents = debate_agents(["m"], template=template)
        first = turn_request(hole, agents[0], agents, [], 1, Prompts(), 0.0, 30, (), answer_first=True)
        system = first.messages[0][1]
        assert system.index('"response"') < system.index('"reference"') < system.index('"reason"')
        plain = turn_request(hole, agents[0], agents, [], 1, Prompts(), 0.0, 30)
        assert plain.messages[0][1].index('"reference"') < plain.messages[0][1].index('"response"')
    # the answer's probability is read at the response field wherever it comes
    reply = {"response": "no", "reference": [], "reason": "It says nothing about yes."}
    tokens = [TokenLogprob(token='{"response": "', logprob=0.0),
              TokenLogprob(token="no", logprob=math.log(0.7), top={"no": math.log(0.7), "yes": math.log(0.3)}),
              TokenLogprob(token=json.dumps(reply)[len('{"response": "no'):], logprob=0.0)]
    assert field_yes_probability(tokens) == pytest.approx(0.3)
