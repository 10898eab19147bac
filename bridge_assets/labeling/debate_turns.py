"""A debate turn: the agents, a reply's schema and bounds, the turn's request (its prompt) and
the reading of its reply."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bridge_assets.labeling.calls import Grade, YesNo, parse_reply
from bridge_assets.labeling.errors import LabelerError
from bridge_assets.labeling.evidence import evidence_status
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts, worked_examples
from bridge_assets.llm.scores import field_yes_probability
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.registry.datasets import GRADES, LabelScale

Stance = Literal["relevant", "irrelevant"]
StanceOrder = Literal["relevant_first", "irrelevant_first"]
# The debate prompts: the paper's (agents defend their stance, Tables 27-28 of the DREAM
# paper) and a softer one (a stance is a starting point to test).
DEBATE_TEMPLATES = {"paper": "debate_turn_paper", "soft_stance": "debate_turn"}
DEBATE_TEMPLATE = DEBATE_TEMPLATES["soft_stance"]
AGENT_NAMES = "ABCDEFGH"
DEFAULT_REASON_WORDS = 40
TOP_LOGPROBS = 5  # alternatives read at the yes/no token for an agent's confidence
MAX_QUOTES = 2
QUOTE_CHARS = 200       # a quoted sentence, cut at a word when longer
CHARS_PER_WORD = 7      # the reason's bound: its word limit at 7 characters a word
CHARS_PER_TOKEN = 2.5   # conservative: English runs at about 4
JSON_CHARS = 80         # keys, quotes and brackets of a turn
SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s|$)")


def reply_budget(max_tokens: int) -> int:
    """Characters of free text that surely fit in `max_tokens` next to the JSON syntax
    (~30 tokens), at a conservative 2.5 characters per token (the adjudicator's bound)."""
    return max(40, int((max_tokens - 30) * CHARS_PER_TOKEN))


def reason_bound(reason_words: int) -> int:
    return reason_words * CHARS_PER_WORD


def turn_schema(reason_words: int, scale: LabelScale = "binary", answer_first: bool = False) -> dict:
    """A turn's JSON schema. The reason and each quote are bounded so that a constrained
    decoder always closes the object (`turn_max_tokens`) and a small model that rambles or
    copies the whole chunk cannot spend minutes doing it on a CPU; a text that reaches its
    bound is cut back to a whole sentence or word when it is read (`bounded_text`). On the
    graded scale a "grade" 0-3 takes the place of the yes/no "response". `answer_first` puts the
    response before the quotes and the reason (a constrained decoder writes keys in the
    schema's order): the agent commits to its judgment before arguing for it."""
    if scale == "graded":
        if answer_first:
            raise LabelerError("answer_first applies to yes/no debates, not to graded ones")
        return graded_schema(turn_schema(reason_words))
    properties = {
        "reference": {"type": "array", "maxItems": MAX_QUOTES,
                      "items": {"type": "string", "maxLength": QUOTE_CHARS}},
        "reason": {"type": "string", "maxLength": reason_bound(reason_words)},
        "response": {"type": "string", "enum": ["yes", "no"]},
    }
    order = ["response", "reference", "reason"] if answer_first else ["reference", "reason", "response"]
    return {
        "type": "object",
        "properties": {key: properties[key] for key in order},
        "required": order,
        "additionalProperties": False,
    }


def graded_schema(schema: dict) -> dict:
    """`schema` (a reply with a yes/no "response", its last key) answering a grade instead."""
    properties = {k: v for k, v in schema["properties"].items() if k != "response"}
    required = [k for k in schema["required"] if k != "response"]
    return {**schema, "properties": {**properties, "grade": {"type": "integer", "enum": list(GRADES)}},
            "required": [*required, "grade"]}


def turn_max_tokens(reason_words: int) -> int:
    """Tokens that surely hold a turn at its bounds."""
    chars = MAX_QUOTES * QUOTE_CHARS + reason_bound(reason_words) + JSON_CHARS
    return math.ceil(chars / CHARS_PER_TOKEN)


def bounded_text(text: str, bound: int, *, sentences: bool) -> str:
    """`text` as written when it stayed under `bound`; when the decoder stopped it at the
    bound, cut back to the last whole sentence (a reason) or word (a quote, which stays a
    verbatim piece of the chunk), never mid-word."""
    if len(text) < bound:
        return text
    if sentences:
        ends = [m.end() for m in SENTENCE_END.finditer(text)]
        if ends:
            return text[:ends[-1]]
    cut = text.rfind(" ")
    return text[:cut].rstrip(" ,;:") + ("…" if sentences else "") if cut > 0 else text


class TurnReply(BaseModel):
    """One agent's answer in a round."""

    model_config = ConfigDict(extra="forbid")

    reference: list[str]
    reason: str
    response: YesNo


class GradedTurnReply(BaseModel):
    """One agent's answer in a round of a graded debate."""

    model_config = ConfigDict(extra="forbid")

    reference: list[str]
    reason: str
    grade: Grade


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
    response: str | None  # None when the call failed; on the graded scale the grade, "0".."3"
    call_key: str
    error: str | None
    evidence: str | None = None      # verified | unverified | none: are the quotes in the chunk?
    confidence: float | None = None  # P(its own response) from the yes/no token's log-probs

    @property
    def p_yes(self) -> float | None:
        if self.confidence is None or self.response is None:
            return None
        return self.confidence if self.response == "yes" else 1 - self.confidence


def debate_agents(models: Sequence[str], count: int = 2,
                  stance_order: StanceOrder = "relevant_first",
                  template: str = DEBATE_TEMPLATE) -> tuple[AgentConfig, ...]:
    """`count` agents named A, B, ..., stances alternating (half each), starting with the
    stance `stance_order` names. `models`: one profile for all, or one per agent."""
    if count < 2 or count % 2 or count > len(AGENT_NAMES):
        raise LabelerError(f"a debate needs an even number of agents between 2 and "
                         f"{len(AGENT_NAMES)}, got {count}")
    if len(models) not in (1, count):
        raise LabelerError(f"give one model profile for all agents or one per agent "
                         f"({count}), got {len(models)}: {list(models)}")
    stances: tuple[Stance, Stance] = ("relevant", "irrelevant") if stance_order == "relevant_first" \
        else ("irrelevant", "relevant")
    first, second = stances
    return tuple(AgentConfig(AGENT_NAMES[i], first if i % 2 == 0 else second,
                             models[0] if len(models) == 1 else models[i], template)
                 for i in range(count))


def fewshot_examples(fewshot: bool) -> list[dict]:
    """The worked examples the judge and debate prompts show, when asked."""
    return worked_examples() if fewshot else []


def turn_request(pair: Pair, agent: AgentConfig, agents: Sequence[AgentConfig],
                 history: list[list[Turn]], round_number: int, prompts: Prompts,
                 temperature: float, reason_words: int, examples: Sequence[Mapping] = (),
                 answer_first: bool = False) -> LLMRequest:
    extra = {"answer_first": True} if answer_first else {}  # absent: the prompts as they always were
    messages = prompts.messages(
        agent.template, **pair.prompt_context(),
        agent=agent.name, stance=agent.stance, agents=agents, history=history,
        round=round_number, reason_words=reason_words, examples=list(examples), **extra)
    return LLMRequest(messages=messages, json_schema=turn_schema(reason_words, pair.scale, answer_first),
                      max_tokens=turn_max_tokens(reason_words), temperature=temperature,
                      top_logprobs=TOP_LOGPROBS, purpose=turn_purpose(agent))


def turn_purpose(agent: AgentConfig) -> str:
    """What the call ledger records a turn as: the judge, or a debate turn of either prompt."""
    if agent.stance is None:
        return "judge"
    return "debate_paper" if agent.template == DEBATE_TEMPLATES["paper"] else "debate"


def read_turn(pair: Pair, agent: AgentConfig, round_number: int, result: LLMResult,
              reason_words: int, quote_ratio: float) -> Turn:
    """One agent's reply as a Turn: texts cut back to whole sentences or words where the
    schema's bound stopped them, quotes checked against the chunk, the answer's probability
    read from the log-probabilities (when the backend returned them)."""
    if pair.scale == "graded":
        return read_graded_turn(pair, agent, round_number, result, reason_words, quote_ratio)
    reply, error = parse_reply(result, TurnReply)
    if reply is None:
        return Turn(pair.query_id, pair.doc_id, pair.key, round_number, agent.name, agent.stance,
                    agent.model, (), None, None, result.key, error)
    quotes = tuple(bounded_text(q, QUOTE_CHARS, sentences=False) for q in reply.reference)
    reason = bounded_text(reply.reason, reason_bound(reason_words), sentences=True)
    p_yes = field_yes_probability(result.logprobs)
    confidence = None if p_yes is None else (p_yes if reply.response == "yes" else 1 - p_yes)
    return Turn(pair.query_id, pair.doc_id, pair.key, round_number, agent.name, agent.stance,
                agent.model, quotes, reason, reply.response, result.key, None,
                evidence_status(quotes, pair.chunk, quote_ratio), confidence)


def read_graded_turn(pair: Pair, agent: AgentConfig, round_number: int, result: LLMResult,
                     reason_words: int, quote_ratio: float) -> Turn:
    """read_turn on the graded scale: the grade is the turn's response; no confidence (the
    log-probabilities read are those of a yes/no token)."""
    reply, error = parse_reply(result, GradedTurnReply)
    if reply is None:
        return Turn(pair.query_id, pair.doc_id, pair.key, round_number, agent.name, agent.stance,
                    agent.model, (), None, None, result.key, error)
    quotes = tuple(bounded_text(q, QUOTE_CHARS, sentences=False) for q in reply.reference)
    return Turn(pair.query_id, pair.doc_id, pair.key, round_number, agent.name, agent.stance,
                agent.model, quotes, bounded_text(reply.reason, reason_bound(reason_words), sentences=True),
                str(reply.grade), result.key, None, evidence_status(quotes, pair.chunk, quote_ratio))
