"""DREAM: agents with opposing opening stances debate each (query, answers, chunk) triplet.

Round 1 shows each agent only the opening stances; every later round shows all earlier turns.
After each round, pairs whose agents all give the same response get that response as their
label (consensus); after the last round the others are escalated with their full history. A
turn whose call failed, or whose reply is not the JSON the schema asks for, ends the pair as
`failed` (escalated too): a failure never becomes a label.

Agents within a round answer independently, so a round is one batch: the requests of all
pairs still debating go to the model in one `generate` call per model profile, which lets a
server see many requests at once and lets the call ledger store the round as it returns.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, field_validator

from bridge_assets.labeling.calls import Generate, generate_grouped, parse_reply
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMRequest

Stance = Literal["relevant", "irrelevant"]
StanceOrder = Literal["relevant_first", "irrelevant_first"]
Outcome = Literal["consensus", "escalated", "failed"]
DEBATE_TEMPLATE = "debate_turn"
AGENT_NAMES = "ABCDEFGH"


def reply_budget(max_tokens: int) -> int:
    """Characters of free text that surely fit in `max_tokens` next to the JSON syntax
    (~30 tokens), at a conservative 2.5 characters per token."""
    return max(40, int((max_tokens - 30) * 2.5))


def turn_schema(max_tokens: int) -> dict:
    """A turn's JSON schema. Quotes and reason are bounded so that a constrained decoder
    always closes the object within `max_tokens`: a small model that rambles cannot leave
    truncated (unparseable, hence failed) JSON behind."""
    budget = reply_budget(max_tokens)
    return {
        "type": "object",
        "properties": {
            "reference": {"type": "array", "maxItems": 2,
                          "items": {"type": "string", "maxLength": budget * 3 // 10}},
            "reason": {"type": "string", "maxLength": budget * 4 // 10},
            "response": {"type": "string", "enum": ["yes", "no"]},
        },
        "required": ["reference", "reason", "response"],
        "additionalProperties": False,
    }


class TurnReply(BaseModel):
    """One agent's answer in a round."""

    model_config = ConfigDict(extra="forbid")

    reference: list[str]
    reason: str
    response: Literal["yes", "no"]

    @field_validator("response", mode="before")
    @classmethod
    def _normalise(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


@dataclass(frozen=True)
class AgentConfig:
    """A debating agent: its name in the transcript, opening stance and model profile.

    `stance` None is a stance-less assessor (the LLMJudge); `template` names its prompt.
    """

    name: str
    stance: Stance | None
    model: str
    template: str = DEBATE_TEMPLATE


@dataclass(frozen=True)
class Turn:
    """One agent's turn on one pair (a row of the `debate_turns` table)."""

    query_id: str
    doc_id: str
    pair_key: str
    round: int
    agent: str
    stance: str | None
    model: str
    reference: tuple[str, ...]
    reason: str | None
    response: str | None  # None when the call failed
    call_key: str
    error: str | None


@dataclass(frozen=True)
class PairLabel:
    """A pair's outcome (a row of the `debate_labels` table, without dataset and config)."""

    query_id: str
    doc_id: str
    pair_key: str
    label: int | None  # 1 relevant, 0 not; only for outcome 'consensus'
    outcome: Outcome
    rounds_used: int
    adjudicator_label: int | None = None
    adjudicator_call_key: str | None = None
    adjudicator_error: str | None = None


@dataclass
class DebateOutcome:
    labels: list[PairLabel]
    turns: list[Turn]
    agents: tuple[AgentConfig, ...] = ()
    rounds: int = 0

    def consensus_by_round(self) -> dict[int, int]:
        """Pairs agreed by the end of each round (cumulative), for rounds 1..R."""
        agreed = [label.rounds_used for label in self.labels if label.outcome == "consensus"]
        return {r: sum(1 for used in agreed if used <= r) for r in range(1, self.rounds + 1)}

    def count(self, outcome: Outcome) -> int:
        return sum(1 for label in self.labels if label.outcome == outcome)

    def histories(self) -> dict[tuple[str, str], list[list[Turn]]]:
        """Each pair's turns, (query_id, doc_id) -> rounds in order -> turns in agent order."""
        grouped: dict[tuple[str, str], dict[int, list[Turn]]] = defaultdict(lambda: defaultdict(list))
        for turn in self.turns:
            grouped[(turn.query_id, turn.doc_id)][turn.round].append(turn)
        return {pair: [rounds[r] for r in sorted(rounds)] for pair, rounds in grouped.items()}


def debate_agents(models: Sequence[str], count: int = 2,
                  stance_order: StanceOrder = "relevant_first") -> tuple[AgentConfig, ...]:
    """`count` agents named A, B, ..., stances alternating (half each), starting with the
    stance `stance_order` names. `models`: one profile for all, or one per agent."""
    if count < 2 or count % 2 or count > len(AGENT_NAMES):
        raise ValueError(f"a debate needs an even number of agents between 2 and "
                         f"{len(AGENT_NAMES)}, got {count}")
    if len(models) not in (1, count):
        raise ValueError(f"give one model profile for all agents or one per agent "
                         f"({count}), got {len(models)}: {list(models)}")
    first, second = ("relevant", "irrelevant") if stance_order == "relevant_first" \
        else ("irrelevant", "relevant")
    return tuple(AgentConfig(AGENT_NAMES[i], first if i % 2 == 0 else second,
                             models[0] if len(models) == 1 else models[i])
                 for i in range(count))


def turn_request(pair: Pair, agent: AgentConfig, agents: Sequence[AgentConfig],
                 history: list[list[Turn]], round_number: int, prompts: Prompts,
                 temperature: float, max_tokens: int) -> LLMRequest:
    messages = prompts.messages(
        agent.template, query=pair.query, answers=pair.answers, chunk=pair.chunk,
        agent=agent.name, stance=agent.stance, agents=agents, history=history,
        round=round_number)
    return LLMRequest(messages=messages, json_schema=turn_schema(max_tokens), max_tokens=max_tokens,
                      temperature=temperature, purpose="debate" if agent.stance else "judge")


def run_debate(pairs: Sequence[Pair], agents: Sequence[AgentConfig], generate: Generate, *,
               rounds: int = 2, temperature: float = 0.0, max_tokens: int = 256,
               prompts: Prompts | None = None) -> DebateOutcome:
    """Debate every pair for at most `rounds` rounds; see the module docstring."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not agents:
        raise ValueError("a debate needs at least one agent")
    if len({agent.name for agent in agents}) != len(agents):
        raise ValueError(f"agent names must be distinct: {[a.name for a in agents]}")
    prompts = prompts or Prompts()
    agents = tuple(agents)
    histories: dict[int, list[list[Turn]]] = {i: [] for i in range(len(pairs))}
    labels: dict[int, PairLabel] = {}
    active = list(range(len(pairs)))
    for round_number in range(1, rounds + 1):
        if not active:
            break
        slots = [(i, agent) for i in active for agent in agents]
        requests = [(agent.model, turn_request(pairs[i], agent, agents, histories[i], round_number,
                                               prompts, temperature, max_tokens))
                    for i, agent in slots]
        results = generate_grouped(requests, generate)
        round_turns: dict[int, list[Turn]] = defaultdict(list)
        for (i, agent), result in zip(slots, results, strict=True):
            pair = pairs[i]
            reply, error = parse_reply(result, TurnReply)
            round_turns[i].append(Turn(
                pair.query_id, pair.doc_id, pair.key, round_number, agent.name, agent.stance,
                agent.model, tuple(reply.reference) if reply else (),
                reply.reason if reply else None, reply.response if reply else None,
                result.key, error))
        still_active = []
        for i in active:
            turns = round_turns[i]
            histories[i].append(turns)
            pair = pairs[i]
            responses = {turn.response for turn in turns}
            if None in responses:
                labels[i] = PairLabel(pair.query_id, pair.doc_id, pair.key, None, "failed", round_number)
            elif len(responses) == 1:
                labels[i] = PairLabel(pair.query_id, pair.doc_id, pair.key,
                                      int(responses.pop() == "yes"), "consensus", round_number)
            elif round_number == rounds:
                labels[i] = PairLabel(pair.query_id, pair.doc_id, pair.key, None, "escalated", round_number)
            else:
                still_active.append(i)
        active = still_active
    turns = [turn for i in range(len(pairs)) for round_turns in histories[i] for turn in round_turns]
    return DebateOutcome([labels[i] for i in range(len(pairs))], turns, agents, rounds)


def debate_config_hash(agents: Sequence[AgentConfig], *, rounds: int, temperature: float,
                       max_tokens: int, prompts: Prompts, model_ids: Mapping[str, str],
                       adjudicator: Mapping[str, object] | None = None) -> str:
    """A label's labeler configuration: agents, their models (profile and model id), rounds,
    sampling, the prompts' content hashes and the adjudicator's settings when one runs."""
    templates = sorted({agent.template for agent in agents})
    config = {
        "agents": [[a.name, a.stance, a.model, model_ids.get(a.model, "")] for a in agents],
        "rounds": rounds, "temperature": temperature, "max_tokens": max_tokens,
        "prompts": {name: prompts.hash(name) for name in templates},
        "schema": turn_schema(max_tokens), "adjudicator": adjudicator,
    }
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


LABEL_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "label": pl.Int32,
                "outcome": pl.Utf8, "rounds_used": pl.Int32, "adjudicator_label": pl.Int32,
                "adjudicator_call_key": pl.Utf8, "adjudicator_error": pl.Utf8}
TURN_COLUMNS = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "round": pl.Int32,
                "agent": pl.Utf8, "stance": pl.Utf8, "model": pl.Utf8,
                "reference": pl.List(pl.Utf8), "reason": pl.Utf8, "response": pl.Utf8,
                "call_key": pl.Utf8, "error": pl.Utf8}


def labels_frame(outcome: DebateOutcome, dataset: str, config_hash: str) -> pl.DataFrame:
    """The `debate_labels` rows of `dataset`."""
    frame = pl.DataFrame([asdict(label) for label in outcome.labels], schema=LABEL_SCHEMA)
    return frame.with_columns(pl.lit(dataset).alias("dataset"), pl.lit(config_hash).alias("config_hash"))


def turns_frame(outcome: DebateOutcome, dataset: str) -> pl.DataFrame:
    """The `debate_turns` rows of `dataset`."""
    rows = [{**asdict(turn), "reference": list(turn.reference)} for turn in outcome.turns]
    return pl.DataFrame(rows, schema=TURN_COLUMNS).with_columns(pl.lit(dataset).alias("dataset"))
