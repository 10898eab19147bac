"""The pointwise relevance scorer shared by the DIRAS-style and LARA methods and by the filter
under a relevance definition: one short call per pair, whose yes/no guess is read together with
its token log-probabilities.

The score is P(yes) normalised over the yes-like and no-like alternatives at the answer token
(bridge_assets.llm.scores). A call that fails, or whose reply carries no yes/no token with
log-probabilities, gives a score with `error` set: the methods escalate it, never guess it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from bridge_assets.labeling.calls import Generate, YesNo, parse_reply
from bridge_assets.labeling.labeler import LabelItem
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.scores import yes_probability
from bridge_assets.llm.types import LLMRequest, LLMResult

SCORE_TEMPLATE = "diras_score"
SCORE_SCHEMA = {
    "type": "object",
    "properties": {"response": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["response"],
    "additionalProperties": False,
}
SCORE_MAX_TOKENS = 10   # {"response": "yes"} is six tokens
TOP_LOGPROBS = 10


class ScoreReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    response: YesNo


@dataclass(frozen=True)
class PointwiseScore:
    guess: int | None      # 1 = the model answered yes
    p_yes: float | None    # P(yes) over yes/no at the answer token
    call_key: str
    error: str | None


def score_request(pair: Pair, prompts: Prompts, *, temperature: float = 0.0,
                  purpose: str = "relevance_score") -> LLMRequest:
    """The scorer's call on one pair, under its relevance definition (`purpose` is recorded in
    the ledger, not part of the call's key: the filter and DIRAS share their calls)."""
    messages = prompts.messages(SCORE_TEMPLATE, **pair.prompt_context())
    return LLMRequest(messages=messages, json_schema=SCORE_SCHEMA, max_tokens=SCORE_MAX_TOKENS,
                      temperature=temperature, top_logprobs=TOP_LOGPROBS, purpose=purpose)


def read_score(result: LLMResult) -> PointwiseScore:
    """The guess and P(yes) of one scorer reply; an error where it has no usable yes/no token."""
    reply, error = parse_reply(result, ScoreReply)
    p_yes = yes_probability(result.logprobs) if reply else None
    if reply and p_yes is None:
        error = "the reply's log-probabilities hold no yes/no token"
    return PointwiseScore(int(reply.response == "yes") if reply and p_yes is not None else None,
                          p_yes, result.key, error)


def score_triplets(triplets: Sequence[LabelItem], model: str, generate: Generate, *,
                   prompts: Prompts | None = None, temperature: float = 0.0) -> list[PointwiseScore]:
    """One batched call to `model`; a score per triplet, in order."""
    prompts = prompts or Prompts()
    requests = [score_request(t.pair, prompts, temperature=temperature) for t in triplets]
    return [read_score(result) for result in (generate(model, requests) if requests else [])]
