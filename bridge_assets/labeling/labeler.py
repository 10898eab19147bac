"""The one labeler interface: the pipeline's labeling stage and `bridge label-eval` both run a
labeler through it, so the labeler evaluated is the labeler the pipeline runs.

    labeler = build_labeler({"labeler": "dream", "rounds": 3}, profiles_for=role_profiles)
    run = labeler.label(items, generate)          # labels, escalations, confidence, turns
    labeler.config_hash(scale="binary")           # the key its labels are stored under

A labeler is a `Labeler` subclass with a `Settings` model (its knobs, one spelling, validated
once) and `label()`. Each item's outcome is a `PairLabel`: `consensus` (a label the labeler
verified: the DREAM agents agreed and the agreement passed its checks), `vote` (a label it did
not verify: a single judge, a calibrated score, a pooled vote; never a finding), `escalated`
(for people) or `failed`. Adding a labeler is one module and a line in `LABELERS`; a labeler
of your own is named by its import path, `labeler: my_package.my_module:MyLabeler`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import PairLabel
from bridge_assets.labeling.debate_turns import Turn
from bridge_assets.labeling.errors import LabelerError
from bridge_assets.labeling.pairs import Pair, load_pairs
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.registry.datasets import LabelScale

ProfilesFor = Callable[[str], list[str]]  # role -> profile names (models.yaml `defaults`)
ModelId = Callable[[str], str]  # profile -> the model id its calls are keyed by

# name -> "module:Class", imported on first use (the implementations live beside their code).
LABELERS = {
    "dream": "bridge_assets.labeling.dream:DreamLabeler",
    "judge": "bridge_assets.labeling.judge:JudgeLabeler",
    "filter": "bridge_assets.labeling.filter:FilterLabeler",
    "lara": "bridge_assets.evaluation.lara:LaraLabeler",
    "diras": "bridge_assets.evaluation.diras:DirasLabeler",
    "utilsel": "bridge_assets.evaluation.utility:UtilitySelectionLabeler",
    "utilrank": "bridge_assets.evaluation.utility:UtilityRankingLabeler",
    "student": "bridge_assets.student.labeler:StudentLabeler",
}
DEFAULT_LABELER = "dream"


@dataclass(frozen=True)
class LabelItem:
    """One (query, chunk) to label, with its label when one is known (a gold set's, or people's
    standing in; None in the pipeline, where no labeler may see one)."""

    id: str
    pair: Pair
    gold: int | None = None
    domain: str | None = None

    # The texts, as the scorers read them.
    @property
    def query(self) -> str:
        return self.pair.query

    @property
    def answers(self) -> tuple[str, ...]:
        return self.pair.answers

    @property
    def chunk(self) -> str:
        return self.pair.chunk

    @property
    def label(self) -> int | None:
        return self.gold

    def judged_by(self, definition: str | None) -> LabelItem:
        """The item under the relevance definition `definition` where its query states none of
        its own (None: unchanged)."""
        if definition is None:
            return self
        return dataclasses.replace(self, pair=dataclasses.replace(self.pair, definition=definition))


@dataclass
class LabelerRun:
    """What a labeler returns: one `PairLabel` per item, in the items' order."""

    labels: list[PairLabel]
    turns: list[Turn] = field(default_factory=list)       # the debate's (a debating labeler)
    scores: list[float | None] | None = None              # P(relevant) per item, where it has one
    details: list[str | None] | None = None               # per item: how it was decided, or an error
    extra: dict[str, Any] = field(default_factory=dict)   # figures of its own (calibration, flags)
    stability: list[dict[str, Any]] = field(default_factory=list)  # per round (a debate)
    models: list[str] = field(default_factory=list)       # every profile it called, for reports

    def count(self, outcome: str) -> int:
        return sum(1 for label in self.labels if label.outcome == outcome)


class LabelerSettings(BaseModel):
    """Knobs every labeler has; a labeler's `Settings` adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    labeler: str = Field(DEFAULT_LABELER, description="The labeler: a name in "
                         "bridge_assets.labeling.labeler.LABELERS, or module:Class of your own.")
    models: tuple[str, ...] = Field((), description="Model profiles (models.yaml); empty: the "
                                    "labeler's role in models.yaml `defaults`.")
    temperature: float = Field(0.0, ge=0.0)


class Labeler(ABC):
    """Base class: a labeler built from its settings and the models it resolved."""

    Settings: ClassVar[type[LabelerSettings]] = LabelerSettings
    role: ClassVar[str] = "judge"          # models.yaml role its models default to
    max_models: ClassVar[int | None] = 1   # profiles it takes (None: any number)
    needs_gold: ClassVar[bool] = False     # it learns from known labels (cannot run in the pipeline)
    # the prompt templates it renders (an instance whose settings change them sets its own)
    templates: tuple[str, ...] = ()

    def __init__(self, settings: LabelerSettings, profiles_for: ProfilesFor):
        self.settings = settings
        self.models = list(settings.models) or profiles_for(self.role)[:1]
        if self.max_models is not None and len(self.models) > self.max_models:
            raise LabelerError(f"labeler '{settings.labeler}' takes {self.max_models} model "
                               f"profile(s), got {self.models}")

    @property
    def model(self) -> str:
        return self.models[0]

    @abstractmethod
    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        """One `PairLabel` per item, in order (the labeler's one obligation)."""

    def describe(self, items: int = 0) -> dict[str, Any]:
        """What the pipeline's metadata shows of it, labelling `items` pairs."""
        return {"models": ", ".join(self.models)}

    def estimate(self, items: Sequence[LabelItem], unsure: set[tuple[str, str]],
                 replay: LedgerReplay) -> list[StageCalls]:
        """The calls `label` would make, replayed from the ledger (`bridge run --dry-run`). This
        default suits a labeler that asks about each pair apart from the others' replies: every
        request is known; those of `unsure` pairs (the filter may still drop them) are bounds."""
        stages: dict[str, StageCalls] = {}

        def replaying(surely: bool) -> Generate:
            def generate(profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
                results = replay(profile, requests)
                for request, result in zip(requests, results, strict=True):
                    stage = stages.setdefault(profile, replay.stage(
                        f"labeler {self.settings.labeler}", profile, request.purpose))
                    stage.add(result.key, request, result.error != NOT_ANSWERED, surely)
                return results
            return generate

        for surely in (True, False):
            chosen = [item for item in items
                      if ((item.pair.query_id, item.pair.doc_id) in unsure) != surely]
            if chosen:
                self.label(chosen, replaying(surely))
        return list(stages.values())

    def check(self, scale: LabelScale) -> None:
        """Raise LabelerError when this labeler cannot label a dataset of `scale`."""
        if scale == "graded":
            raise LabelerError(f"labeler '{self.settings.labeler}' answers yes/no; the dataset "
                               "is graded (use dream)")

    def config_hash(self, prompts: Prompts | None = None, scale: LabelScale = "binary",
                    items: int = 0, model_id: ModelId | None = None,
                    definition: str | None = None) -> str:
        """The key its labels are stored under: changes when anything they depend on does
        (`items`: how many are labelled together, for a labeler whose budget is a share;
        `model_id`: a profile's model id, default models.yaml's; `definition`: the relevance
        definition of the dataset or gold set, None: each query's default)."""
        prompts, model_id = prompts or Prompts(), model_id or profile_model_id
        config = {"settings": self.settings.model_dump(mode="json", exclude={"labeler"}),
                  "labeler": f"{type(self).__module__}:{type(self).__name__}",
                  "model_ids": {name: model_id(name) for name in self.models},
                  "prompts": {name: prompts.hash(name) for name in self.templates}, "scale": scale}
        if definition is not None:  # absent when unset, so the labels stored before keep their key
            config["definition"] = definition
        return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def profile_model_id(profile: str) -> str:
    from bridge_assets.llm.backends import model_id
    from bridge_assets.llm.profiles import get_profile

    return model_id(get_profile(profile))


def labeler_class(name: str) -> type[Labeler]:
    """The class a labeler name (or `module:Class`) names."""
    target = LABELERS.get(name, name)
    module_name, _, class_name = target.partition(":")
    if not class_name:
        raise LabelerError(f"unknown labeler '{name}' (labelers: {', '.join(LABELERS)}; or "
                           "module:Class of your own)")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise LabelerError(f"labeler '{name}': cannot import {target} ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, Labeler)):
        raise LabelerError(f"labeler '{name}': {target} is not a Labeler")
    return cls


def labeler_settings(values: dict[str, Any]) -> LabelerSettings:
    """The settings `values` describe, validated by their labeler's Settings (default: dream)."""
    values = {"labeler": DEFAULT_LABELER, **values}
    cls = labeler_class(values["labeler"])
    try:
        return cls.Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise LabelerError(f"labeler '{values['labeler']}': {problems}") from None


def build_labeler(settings: LabelerSettings | dict[str, Any], profiles_for: ProfilesFor) -> Labeler:
    if isinstance(settings, dict):
        settings = labeler_settings(settings)
    return labeler_class(settings.labeler)(settings, profiles_for)


def outcome_label(pair: Pair, label: int | None, *, verified: bool = False,
                  p_yes: float | None = None, flags: tuple[str, ...] = ()) -> PairLabel:
    """A one-shot labeler's `PairLabel`: its label as `vote` (`consensus` only when `verified`),
    or `failed` when it has none."""
    if label is None:
        return PairLabel(pair.query_id, pair.doc_id, pair.key, None, "failed", 1,
                         flags=flags or ("failed",), p_yes=p_yes)
    return PairLabel(pair.query_id, pair.doc_id, pair.key, label, "consensus" if verified else "vote",
                     1, agreed_label=label, flags=flags, p_yes=p_yes)


def pipeline_labeler(settings: LabelerSettings, profiles_for: ProfilesFor, scale: LabelScale) -> Labeler:
    """The labeler the pipeline's labeling stage runs on a dataset of `scale`: one that needs
    known labels cannot run there, where no label is known."""
    labeler = build_labeler(settings, profiles_for)
    if labeler.needs_gold:
        raise LabelerError(f"labeler '{settings.labeler}' learns from known labels: it runs on a "
                           "gold set (bridge label-eval), not in the pipeline")
    labeler.check(scale)
    return labeler


def pipeline_pairs(con: duckdb.DuckDBPyConnection, dataset: str, scale: LabelScale,
                   definition: str | None = None) -> list[Pair]:
    """The pairs the pipeline's labeler labels: every pair the filter kept (`definition`: the
    dataset's relevance definition)."""
    return load_pairs(con, dataset, "select query_id, doc_id from filtered_pool "
                                    "where dataset = $dataset and kept", scale, definition)


def pipeline_items(pairs: Sequence[Pair]) -> list[LabelItem]:
    """The pairs as items, no label known."""
    return [LabelItem(f"{pair.query_id}|{pair.doc_id}", pair) for pair in pairs]
