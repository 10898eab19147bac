"""The optional LLM adjudicator: it reads an unresolved debate's whole history and decides.

For fully automatic runs (the paper's alternative to human annotators). Its decision is kept
in `adjudicator_label`, apart from the debate's own consensus `label`, and a pair's outcome
stays 'escalated' or 'failed': whoever builds qrels chooses whether to trust it. On a graded
dataset it decides a grade 0-3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pydantic import BaseModel, ConfigDict

from bridge_assets.labeling.calls import Generate, Grade, YesNo, parse_reply
from bridge_assets.labeling.debate import DebateOutcome
from bridge_assets.labeling.debate_turns import AgentConfig, graded_schema, reply_budget
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.registry.datasets import LabelScale

ADJUDICATOR_TEMPLATE = "adjudicator"


def adjudicator_schema(max_tokens: int, scale: LabelScale = "binary") -> dict:
    """The decision's JSON schema, its reason bounded to fit in `max_tokens` (see turn_schema);
    a grade 0-3 in place of yes/no on the graded scale."""
    if scale == "graded":
        return graded_schema(adjudicator_schema(max_tokens))
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": reply_budget(max_tokens)},
            "response": {"type": "string", "enum": ["yes", "no"]},
        },
        "required": ["reason", "response"],
        "additionalProperties": False,
    }


class AdjudicatorReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    response: YesNo


class GradedAdjudicatorReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    grade: Grade


def adjudicate(outcome: DebateOutcome, pairs: Sequence[Pair], model: str, generate: Generate, *,
               prompts: Prompts | None = None, temperature: float = 0.0,
               max_tokens: int = 256) -> DebateOutcome:
    """Ask `model` to decide every escalated or failed pair of `outcome`, in one batch.

    Returns the outcome with `adjudicator_label` / `adjudicator_call_key` (and
    `adjudicator_error` when its call failed) set on those pairs.
    """
    prompts = prompts or Prompts()
    by_id = {(pair.query_id, pair.doc_id): pair for pair in pairs}
    histories = outcome.histories()
    agents: tuple[AgentConfig, ...] = outcome.agents
    unresolved = [i for i, label in enumerate(outcome.labels) if label.outcome != "consensus"]
    requests = []
    for i in unresolved:
        label = outcome.labels[i]
        pair = by_id[(label.query_id, label.doc_id)]
        requests.append(LLMRequest(
            messages=prompts.messages(ADJUDICATOR_TEMPLATE, **pair.prompt_context(), agents=agents,
                                      history=histories.get((pair.query_id, pair.doc_id), [])),
            json_schema=adjudicator_schema(max_tokens, pair.scale), max_tokens=max_tokens,
            temperature=temperature, purpose="adjudicator"))
    labels = list(outcome.labels)
    for i, result in zip(unresolved, generate(model, requests) if requests else [], strict=True):
        labels[i] = replace(labels[i], **_decision(result, by_id[(labels[i].query_id, labels[i].doc_id)]))
    return replace(outcome, labels=labels)


def _decision(result: LLMResult, pair: Pair) -> dict:
    """The adjudicator_* fields of a pair from its call: the label (the grade, on the graded
    scale), the call key and the error when the reply was unusable."""
    label: int | None
    if pair.scale == "graded":
        graded, error = parse_reply(result, GradedAdjudicatorReply)
        label = graded.grade if graded else None
    else:
        reply, error = parse_reply(result, AdjudicatorReply)
        label = int(reply.response == "yes") if reply else None
    return {"adjudicator_label": label, "adjudicator_call_key": result.key, "adjudicator_error": error}
