"""Debate persistence (`bridge label-eval --method dream --persistence R`): debates that go on
after consensus, the survival of each round's consensus and the agents' flips, checked against
hand counts on scripted debates; the pipeline's debate still stops at consensus, under the
same config hash.

The debate below (2 agents, A opens "relevant", B "irrelevant"; the pipeline's rounds=2; R=4)
is scripted per query, agent and round; "x" is a failed call:

    pair  A: r1 r2 r3 r4   B: r1 r2 r3 r4   stopping debate           later
    p1       y  y  y  y       y  y  y  y    consensus yes @1          holds to 4
    p2       n  n  n  n       n  n  y  y    consensus no @1           splits at 3 (B no->yes)
    p3       y  n  n  n       y  n  n  n    consensus yes @1          reversed at 2 (both yes->no)
    p4       y  y  y  y       n  y  y  n    consensus yes @2          splits at 4 (B yes->no)
    p5       y  y  y  y       n  n  n  y    escalated @2              first agrees at 4
    p6       y  y  x  -       y  y  y  -    consensus yes @1          lost at 3 (A's call fails)
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from bridge_assets.cli.main import app
from bridge_assets.labeling.debate import run_debate
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.labeling.labeler import LabelerError, LabelItem, build_labeler
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.persistence import debate_persistence, format_persistence
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMResult
from fixtures.scripted_llm import ScriptedServer, completion

AGENT = re.compile(r"You are agent (\w+)")
ROUND = re.compile(r"This is round (\d+)")
QUERY = re.compile(r"^Query: (.*)$", re.M)

SCRIPT = {  # query -> agent -> answers of rounds 1..4
    "p1": {"A": "yyyy", "B": "yyyy"},
    "p2": {"A": "nnnn", "B": "nnyy"},
    "p3": {"A": "ynnn", "B": "ynnn"},
    "p4": {"A": "yyyy", "B": "nyyn"},
    "p5": {"A": "yyyy", "B": "nnny"},
    "p6": {"A": "yyx", "B": "yyy"},
}
R = 4


def pair(name: str) -> Pair:
    return Pair(f"q-{name}", f"d-{name}", name, (f"answer {name}",),
                f"The chunk for {name} states answer {name}.")


def reply(query: str, agent: str, round_number: int) -> dict | None:
    """The scripted turn, or None for a failed call."""
    answer = SCRIPT[query][agent][round_number - 1]
    if answer == "x":
        return None
    return {"reference": [], "reason": f"{agent} round {round_number}",
            "response": "yes" if answer == "y" else "no"}


class ScriptedLedger:
    """Answers each debate request from SCRIPT, keyed like the call ledger (by the request's
    messages): a request asked before is answered `cached`, as the ledger answers it."""

    def __init__(self):
        self.asked: list[tuple[str, str, int]] = []  # (query, agent, round) of every call made
        self.ledger: set[str] = set()

    def __call__(self, profile, requests):
        results = []
        for request in requests:
            user = request.messages[1][1]
            query, agent = QUERY.search(user).group(1), AGENT.search(user).group(1)
            round_number = int(ROUND.search(user).group(1))
            key = hashlib.sha256(json.dumps([profile, request.messages]).encode()).hexdigest()[:16]
            cached = key in self.ledger
            if not cached:
                self.ledger.add(key)
                self.asked.append((query, agent, round_number))
            body = reply(query, agent, round_number)
            results.append(LLMResult(key=key, error="scripted failure", cached=cached) if body is None
                           else LLMResult(key=key, text=json.dumps(body), parsed=body, cached=cached))
        return results


PAIRS = [pair(name) for name in SCRIPT]
SURVIVAL = [  # the module docstring's debate, counted by hand
    {"round": 1, "debating": 6, "failed": 0, "agreeing": 4, "reached": 4, "reached_relevant": 3,
     "held": {2: 3, 3: 1, 4: 1}, "reversed": 1, "split": 1, "lost": 1, "turns": 12,
     "survived": 1, "survival_rate": 0.25},
    {"round": 2, "debating": 6, "failed": 0, "agreeing": 5, "reached": 1, "reached_relevant": 1,
     "held": {3: 1, 4: 0}, "reversed": 0, "split": 1, "lost": 0, "turns": 12,
     "survived": 0, "survival_rate": 0.0},
    {"round": 3, "debating": 6, "failed": 1, "agreeing": 3, "reached": 0, "reached_relevant": 0,
     "held": {4: 0}, "reversed": 0, "split": 0, "lost": 0, "turns": 12,
     "survived": 0, "survival_rate": None},
    {"round": 4, "debating": 5, "failed": 0, "agreeing": 3, "reached": 1, "reached_relevant": 1,
     "held": {}, "reversed": 0, "split": 0, "lost": 0, "turns": 10,
     "survived": None, "survival_rate": None},
]
FLIPS = [  # (round, stance): turns, rel->irr, irr->rel, after consensus: turns, rel->irr, irr->rel
    (2, "relevant", 6, 1, 0, 4, 1, 0),     # p3's A
    (2, "irrelevant", 6, 1, 1, 4, 1, 0),   # p3's B; p4's B joins A
    (3, "relevant", 5, 0, 0, 4, 0, 0),     # p6's A failed
    (3, "irrelevant", 6, 0, 1, 5, 0, 1),   # p2's B breaks its consensus
    (4, "relevant", 5, 0, 0, 4, 0, 0),
    (4, "irrelevant", 5, 1, 1, 4, 1, 0),   # p4's B breaks its consensus; p5's B joins A
]
# the stopping debate's calls: round 1 of every pair, round 2 of p4 and p5
STOPPING_CALLS = 12 + 4


def flip_tuples(flips):
    return [(f["round"], f["stance"], f["turns"], f["to_irrelevant"], f["to_relevant"],
             f["after_consensus_turns"], f["after_consensus_to_irrelevant"],
             f["after_consensus_to_relevant"]) for f in flips]


def test_persistent_debates_count_survival_and_flips_as_by_hand():
    model = ScriptedLedger()
    outcome = run_debate(PAIRS, debate_agents(["m"]), model, rounds=2, persistence=R)
    table = debate_persistence(outcome.all_turns(), R).as_dict()
    assert table["rounds"] == R and table["pairs"] == 6
    assert [{k: v for k, v in row.items() if k != "from_ledger"} for row in table["survival"]] == SURVIVAL
    assert {row["from_ledger"] for row in table["survival"]} == {None}  # not known: none given
    assert flip_tuples(table["flips"]) == FLIPS
    # every pair went on to round 4 but p6, whose failed turn ended it at round 3
    assert len(outcome.all_turns()) == 12 + 12 + 12 + 10 == len(model.asked)


def test_persistence_keeps_the_stopping_debates_labels_and_turns_apart_from_the_rounds_after():
    stopping = run_debate(PAIRS, debate_agents(["m"]), ScriptedLedger(), rounds=2)
    persistent = run_debate(PAIRS, debate_agents(["m"]), ScriptedLedger(), rounds=2, persistence=R)
    assert persistent.labels == stopping.labels
    assert [(label.outcome, label.label, label.rounds_used) for label in stopping.labels] == [
        ("consensus", 1, 1), ("consensus", 0, 1), ("consensus", 1, 1), ("consensus", 1, 2),
        ("escalated", None, 2), ("consensus", 1, 1)]
    assert persistent.turns == stopping.turns and len(stopping.turns) == STOPPING_CALLS
    assert stopping.continued == [] and len(persistent.continued) == 46 - STOPPING_CALLS
    assert persistent.consensus_by_round() == stopping.consensus_by_round() == {1: 4, 2: 5}


def test_the_pipelines_debate_still_stops_at_consensus():
    model = ScriptedLedger()
    outcome = run_debate(PAIRS, debate_agents(["m"]), model, rounds=2)
    assert sorted(model.asked) == sorted(
        [(q, a, 1) for q in SCRIPT for a in "AB"] + [(q, a, 2) for q in ("p4", "p5") for a in "AB"])
    assert outcome.persistence == 0 and max(t.round for t in outcome.turns) == 2


def test_the_ledger_answers_the_rounds_a_stopping_debate_already_asked():
    """The persistent debate asks, round by round, exactly the requests the stopping one asked
    (so a run after the pipeline's, or after label-eval's, finds them in the ledger) and only
    the rounds after consensus are new calls."""
    model = ScriptedLedger()
    run_debate(PAIRS, debate_agents(["m"]), model, rounds=2)
    labeler = build_labeler({"models": ["m"]}, lambda role: ["m"])
    items = [LabelItem(p.query_id, p, 1) for p in PAIRS]
    run = labeler.label(items, model, persistence=R)
    table = run.extra["persistence"]
    assert [row.from_ledger for row in table.survival] == [12, 4, 0, 0]
    assert len(model.asked) == 46  # 16 asked by the stopping debate, 30 by the persistent one


def test_the_labeler_with_persistence_returns_the_stopping_debates_run_and_the_tables():
    labeler = build_labeler({"models": ["m"]}, lambda role: ["m"])
    items = [LabelItem(p.query_id, p, 1) for p in PAIRS]
    plain, persistent = labeler.label(items, ScriptedLedger()), labeler.label(items, ScriptedLedger(),
                                                                                 persistence=R)
    assert persistent.labels == plain.labels and persistent.turns == plain.turns
    assert persistent.stability == plain.stability and persistent.details == plain.details
    assert "persistence" not in plain.extra
    assert flip_tuples(persistent.extra["persistence"].as_dict()["flips"]) == FLIPS
    text = format_persistence(persistent.extra["persistence"])
    assert "held@4" in text and "1 (25%)" in text  # round 1: 1 of 4 consensuses survives to 4
    with pytest.raises(LabelerError, match="fewer rounds than the debate's"):
        build_labeler({"models": ["m"], "rounds": 3}, lambda role: ["m"]).label(items, ScriptedLedger(),
                                                                                  persistence=2)
    graded = [LabelItem("g", Pair("g", "g", "p1", (), "text", scale="graded"), 1)]
    with pytest.raises(LabelerError, match="graded"):
        labeler.label(graded, ScriptedLedger(), persistence=R)


def test_a_persistence_below_the_debates_rounds_is_refused():
    with pytest.raises(ValueError, match="at least the debate's rounds"):
        run_debate(PAIRS, debate_agents(["m"]), ScriptedLedger(), rounds=3, persistence=2)


def test_the_default_dream_labelers_config_hash_is_unchanged(tmp_path):
    """The key the pipeline's labels are stored under: pinned for the default DREAM settings
    (prompts of fixed content, a fixed model id), as it was before persistence existed."""
    (tmp_path / "debate_turn.j2").write_text("{% block system %}fixed system{% endblock %}\n"
                                             "{% block user %}fixed user{% endblock %}\n")
    labeler = build_labeler({}, lambda role: ["m"])
    assert labeler.config_hash(Prompts(tmp_path), model_id=lambda name: "id-" + name) == "280c74090629d68e"


# --- bridge label-eval --persistence ---------------------------------------------------------

def server_reply(index: int, body: dict):
    user = body["messages"][1]["content"]
    turn = reply(QUERY.search(user).group(1), AGENT.search(user).group(1),
                 int(ROUND.search(user).group(1)))
    if turn is None:  # a reply that is not the turn's JSON: the ledger keeps it as final
        return 200, completion("not a turn"), 0
    return 200, completion(json.dumps(turn)), 0


@pytest.fixture
def scripted_gold(data_lake, tmp_path, monkeypatch):
    """A gold set of the scripted pairs (p5 and p3 not relevant) and a `scripted` model profile
    served by the scripted server; the call ledger in a temporary lake."""
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": name, "query": name, "answers": [f"answer {name}"],
                                        "chunk": f"The chunk for {name} states answer {name}.",
                                        "label": int(name not in ("p3", "p5"))}) + "\n"
                            for name in SCRIPT))
    registry = tmp_path / "registry"
    registry.mkdir()
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(registry))
    with ScriptedServer(server_reply) as server:
        (registry / "models.yaml").write_text(yaml.safe_dump({"profiles": {"scripted": {
            "backend": "openai", "model": "scripted-model", "base_urls": [server.url],
            "timeout_s": 10, "retries": 0, "parse_retries": 0,
            "structured_output": "json_object_schema"}}}))
        yield gold, server


def label_eval(*args: str):
    result = CliRunner().invoke(app, ["label-eval", *args])
    assert "Traceback" not in result.output, result.output
    return result


def test_label_eval_prints_the_survival_and_flip_tables(scripted_gold):
    gold, server = scripted_gold
    common = ["--gold", str(gold), "--method", "dream", "--profile", "scripted"]
    stopping = label_eval(*common, "--json")
    assert stopping.exit_code == 0, stopping.output
    plain = json.loads(stopping.output)
    assert "persistence" not in plain and plain["calls"] == STOPPING_CALLS
    hits = server.hits

    persistent = label_eval(*common, "--persistence", "4", "--json")
    assert persistent.exit_code == 0, persistent.output
    figures = json.loads(persistent.output)
    # the labels, their figures and their key are the stopping debate's; the cost is not
    for key in ("bacc", "recall_relevant", "recall_irrelevant", "escalation_ratio", "n", "stability"):
        assert figures[key] == plain[key], key
    assert figures["config_hash"] == plain["config_hash"] and figures["config"] == plain["config"]
    assert figures["calls"] == 46
    table = figures["persistence"]
    assert table["rounds"] == 4 and table["pairs"] == 6
    as_json = [{**row, "held": {int(k): v for k, v in row["held"].items()}} for row in SURVIVAL]
    assert [{k: v for k, v in row.items() if k != "from_ledger"} for row in table["survival"]] == \
        json.loads(json.dumps(as_json))
    assert [row["from_ledger"] for row in table["survival"]] == [12, 4, 0, 0]  # the first run's calls
    assert flip_tuples(table["flips"]) == FLIPS
    assert server.hits - hits == 46 - STOPPING_CALLS

    text = label_eval(*common, "--persistence", "4")  # all from the ledger now
    assert text.exit_code == 0, text.output
    assert f"config hash {plain['config_hash']}" in text.output
    lines = text.output.splitlines()
    survival = lines.index(next(line for line in lines if line.startswith("consensus survival")))
    assert lines[survival + 1].split() == ["round", "debating", "agreeing", "reached", "(yes)", "held@2",
                                           "held@3", "held@4", "survived", "reversed", "split", "lost",
                                           "turns", "ledger"]
    assert lines[survival + 2].split() == ["1", "6", "4", "4", "3", "3", "1", "1", "1", "(25%)",
                                           "1", "1", "1", "12", "12"]
    assert lines[survival + 5].split() == ["4", "5", "3", "1", "1", "-", "-", "-", "-", "0", "0", "0",
                                           "10", "10"]
    flips = lines.index(next(line for line in lines if line.startswith("flips by opening stance")))
    assert lines[flips + 5].split() == ["3", "irrelevant", "6", "0", "1", "5", "0", "1"]
    assert server.hits - hits == 46 - STOPPING_CALLS  # nothing new


def test_label_eval_refuses_persistence_where_it_means_nothing(scripted_gold):
    gold, server = scripted_gold
    judge = label_eval("--gold", str(gold), "--method", "judge", "--profile", "scripted", "--persistence", "3")
    assert judge.exit_code != 0 and "persistence applies to a debate (dream)" in judge.output
    short = label_eval("--gold", str(gold), "--method", "dream", "--profile", "scripted",
                       "--set", "rounds=3", "--persistence", "2")
    assert short.exit_code != 0 and "give at least 3" in short.output
    assert label_eval("--gold", str(gold), "--persistence", "1").exit_code == 2  # at least 2
    assert server.hits == 0
