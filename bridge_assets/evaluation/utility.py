"""Utility labels (utility-focused LLM annotation): listwise judgments of which of a query's
candidate passages are *useful for answering it*, a label kind of its own, compared with
relevance labels rather than mixed into them.

- UtilSel: the model selects the useful passages from the query's candidate list.
- UtilRank: the model ranks the candidates by usefulness; the top `top_percent` (at least
  one) are useful.
Candidates are shown in a fixed pseudo-random order (hashed from the query and the chunk
ids), so the gold set's file order cannot leak into the labels. A reply that is not a valid
selection / complete ranking leaves the query's passages unlabelled (escalated).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from bridge_assets.evaluation.scores import agreement
from bridge_assets.labeling.calls import Generate, parse_reply
from bridge_assets.labeling.labeler import Labeler, LabelerRun, LabelerSettings, LabelItem, outcome_label
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.types import LLMRequest

UtilityKind = Literal["utilsel", "utilrank"]
TEMPLATES = {"utilsel": "util_select", "utilrank": "util_rank"}


def utility_schema(kind: UtilityKind, n: int) -> dict:
    key = "selected" if kind == "utilsel" else "ranking"
    items = {"type": "integer", "minimum": 1, "maximum": n}
    array = {"type": "array", "items": items, "maxItems": n}
    if kind == "utilrank":
        array["minItems"] = n
    return {"type": "object", "properties": {key: array}, "required": [key],
            "additionalProperties": False}


class SelectionReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    selected: list[int]


class RankingReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ranking: list[int]


@dataclass(frozen=True)
class QueryCandidates:
    """One query's candidate triplets, in the order the model sees them."""

    query: str
    answers: tuple[str, ...]
    triplets: tuple[LabelItem, ...]


def group_by_query(triplets: Sequence[LabelItem]) -> list[QueryCandidates]:
    """Triplets grouped by (query, answers), groups in order of first appearance, candidates
    shuffled by a content hash."""
    groups: dict[tuple[str, tuple[str, ...]], list[LabelItem]] = {}
    for triplet in triplets:
        groups.setdefault((triplet.query, triplet.answers), []).append(triplet)

    def position(query: str, triplet: LabelItem) -> str:
        return hashlib.sha256(f"{query}\0{triplet.id}".encode()).hexdigest()

    return [QueryCandidates(query, answers, tuple(sorted(members, key=lambda t: position(query, t))))
            for (query, answers), members in groups.items()]


@dataclass(frozen=True)
class UtilityOutcome:
    labels: dict[str, int | None]   # triplet id -> 1 useful / 0 not / None (reply failed)
    errors: dict[str, str]          # query -> why its reply was unusable
    call_keys: dict[str, str]       # query -> call key


def useful_from_reply(kind: UtilityKind, reply: SelectionReply | RankingReply, n: int,
                      top_percent: float) -> tuple[set[int] | None, str | None]:
    """The 1-based positions judged useful, or (None, why) for an invalid reply (a kind's
    reply: utilsel's a selection, utilrank's a ranking)."""
    numbers = reply.selected if isinstance(reply, SelectionReply) else reply.ranking
    if any(not 1 <= k <= n for k in numbers) or len(set(numbers)) != len(numbers):
        return None, f"passage numbers must be distinct and within 1..{n}, got {numbers}"
    if kind == "utilsel":
        return set(numbers), None
    if sorted(numbers) != list(range(1, n + 1)):
        return None, f"a ranking must list each of the {n} passages once, got {numbers}"
    return set(numbers[:max(1, math.ceil(top_percent * n - 1e-9))]), None


def utility_labels(triplets: Sequence[LabelItem], kind: UtilityKind, model: str,
                   generate: Generate, *, prompts: Prompts | None = None, top_percent: float = 0.2,
                   temperature: float = 0.0, max_tokens: int = 64) -> UtilityOutcome:
    """One call per query (batched); a utility label per triplet."""
    prompts = prompts or Prompts()
    groups = group_by_query(triplets)
    requests = [LLMRequest(
        messages=prompts.messages(TEMPLATES[kind], query=g.query, answers=g.answers,
                                  passages=[t.chunk for t in g.triplets]),
        json_schema=utility_schema(kind, len(g.triplets)), max_tokens=max_tokens,
        temperature=temperature, purpose=kind) for g in groups]
    reply_model: type[SelectionReply | RankingReply] = SelectionReply if kind == "utilsel" else RankingReply
    labels: dict[str, int | None] = {}
    errors, keys = {}, {}
    for group, result in zip(groups, generate(model, requests) if requests else [], strict=True):
        keys[group.query] = result.key
        reply, error = parse_reply(result, reply_model)
        useful = None
        if reply is not None:
            useful, error = useful_from_reply(kind, reply, len(group.triplets), top_percent)
        if error is not None:
            errors[group.query] = error
        for position, triplet in enumerate(group.triplets, start=1):
            labels[triplet.id] = None if useful is None else int(position in useful)
    return UtilityOutcome(labels, errors, keys)


class UtilitySettings(LabelerSettings):
    top_percent: float = Field(0.2, gt=0.0, le=1.0, description="utilrank: the top share of a "
                               "query's candidates counted useful.")


class UtilitySelectionLabeler(Labeler):
    """A query's candidates judged together; useful = 1 (a `vote`: a label kind of its own)."""

    Settings = UtilitySettings
    kind: ClassVar[UtilityKind] = "utilsel"
    templates = (TEMPLATES["utilsel"],)
    settings: UtilitySettings

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        out = utility_labels(items, self.kind, self.model, generate, prompts=prompts,
                             top_percent=self.settings.top_percent, temperature=self.settings.temperature)
        labels = [out.labels[item.id] for item in items]
        known = [(item.gold, label) for item, label in zip(items, labels, strict=True)
                 if label is not None and item.gold is not None]
        extra = agreement([gold for gold, _ in known], [label for _, label in known]) \
            if all(item.gold is not None for item in items) else {}
        return LabelerRun([outcome_label(item.pair, label) for item, label in zip(items, labels, strict=True)],
                          details=[out.errors.get(item.query) for item in items], extra=extra,
                          models=[self.model])


class UtilityRankingLabeler(UtilitySelectionLabeler):
    kind = "utilrank"
    templates = (TEMPLATES["utilrank"],)
