"""The student as a labeler (`bridge label-eval --method student`): measured on a gold set
like every other labeler, never on a pair it learned from.

The gold set's queries are split into `folds` (seeded); each fold is labelled by a student
trained (and calibrated) on the other folds' known labels, so every pair gets an out-of-fold
P(relevant) and no student sees a query it is scored on. Its labels are votes (a calibrated
score is not a verified label): relevant where P >= `threshold`.

With `teacher_weight` > 0 it distils a teacher (DIRAS): the model profile given (default: the
judge role's) scores every pair with its pointwise P(yes) (the `diras` labeler's call, so the
ledger answers a pair `diras` already scored), and each training pair learns
(1 - w) * gold + w * P(yes). A fold's student reads only its training folds' P(yes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from bridge_assets.evaluation.scores import calibration_metrics
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.labeler import (
    Labeler,
    LabelerError,
    LabelerRun,
    LabelerSettings,
    LabelItem,
    ProfilesFor,
    outcome_label,
)
from bridge_assets.labeling.pointwise import SCORE_TEMPLATE, score_triplets
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.student.model import Example, StudentSettings, train_student


class StudentLabelerSettings(LabelerSettings):
    folds: int = Field(2, ge=2, description="Query folds: each is labelled by a student trained "
                       "on the others.")
    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="Calibrated P(relevant) at or "
                             "above which a pair is labelled relevant.")
    base_model: str = StudentSettings.model_fields["base_model"].default
    epochs: int = Field(StudentSettings.model_fields["epochs"].default, ge=1)
    learning_rate: float = Field(StudentSettings.model_fields["learning_rate"].default, gt=0)
    batch_size: int = Field(StudentSettings.model_fields["batch_size"].default, ge=1)
    max_length: int = Field(StudentSettings.model_fields["max_length"].default, ge=16)
    calibration_share: float = Field(StudentSettings.model_fields["calibration_share"].default,
                                     ge=0.0, lt=1.0)
    max_labels: int = Field(StudentSettings.model_fields["max_labels"].default, ge=2)
    teacher_weight: float = Field(StudentSettings.model_fields["teacher_weight"].default, ge=0.0,
                                  le=1.0, description=StudentSettings.model_fields["teacher_weight"].description)
    low_memory: bool = Field(StudentSettings.model_fields["low_memory"].default,
                             description=StudentSettings.model_fields["low_memory"].description)
    seed: int = 0
    precision: str = Field(StudentSettings.model_fields["precision"].default,
                           description=StudentSettings.model_fields["precision"].description)

    def student(self) -> StudentSettings:
        """The training settings (the fields both spell the same)."""
        return StudentSettings(**self.model_dump(include=set(StudentSettings.model_fields)))


def query_folds(items: Sequence[LabelItem], folds: int, seed: int) -> list[int]:
    """The fold of each item: its query's, queries dealt round-robin after a seeded shuffle."""
    queries = sorted({item.query for item in items})
    random.Random(seed).shuffle(queries)
    fold_of = {query: n % folds for n, query in enumerate(queries)}
    return [fold_of[item.query] for item in items]


class StudentLabeler(Labeler):
    """DIRAS's student: a cross-encoder trained on known labels, cross-fitted by query."""

    Settings = StudentLabelerSettings
    needs_gold = True
    settings: StudentLabelerSettings

    def __init__(self, settings: StudentLabelerSettings, profiles_for: ProfilesFor):
        if settings.teacher_weight:
            super().__init__(settings, profiles_for)   # one profile: the teacher
            self.templates = (SCORE_TEMPLATE,)
        elif settings.models:
            raise LabelerError("the student calls no LLM without a teacher: a model profile is "
                               "its teacher, used with --set teacher_weight=W (0 < W <= 1)")
        else:
            self.settings, self.models = settings, []

    def describe(self, items: int = 0) -> dict[str, Any]:
        teacher = f", distilling {self.model} at {self.settings.teacher_weight}" if self.models else ""
        return {"models": f"student ({self.settings.base_model}{teacher})"}

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        if any(item.gold is None for item in items):
            raise LabelerError("the student learns from known labels: it needs a gold set "
                               "(bridge label-eval), not unlabelled pairs")
        teacher = None
        if self.models:
            teacher = [s.p_yes for s in score_triplets(items, self.model, generate, prompts=prompts,
                                                       temperature=self.settings.temperature)]
        scores, reports = cross_fitted_scores(items, items, self.settings, teacher)
        labels = [outcome_label(item.pair, int(p >= self.settings.threshold), p_yes=p)
                  for item, p in zip(items, scores, strict=True)]
        gold = [known_label(item) for item in items]
        extra = {**calibration_metrics(gold, scores), "folds": reports}
        if teacher is not None:
            extra["teacher_scored"] = sum(p is not None for p in teacher)
        return LabelerRun(labels, scores=list(scores), models=list(self.models), extra=extra)


def known_label(item: LabelItem) -> int:
    """The known label a student learns from (the gold set's)."""
    if item.gold is None:
        raise LabelerError(f"{item.pair}: no known label to learn from")
    return item.gold


def cross_fitted_scores(known: Sequence[LabelItem], to_score: Sequence[LabelItem],
                        settings: StudentLabelerSettings,
                        teacher: Sequence[float | None] | None = None) -> tuple[list[float], list[dict[str, Any]]]:
    """P(relevant) of each of `to_score`, each from a student trained on the `known` labels of
    the other query folds only (folds dealt over the queries of both); `teacher`: a P(yes) per
    known item (None where the teacher gave none), distilled at settings.teacher_weight."""
    teacher = teacher or [None] * len(known)
    folds = query_folds([*known, *to_score], settings.folds, settings.seed)
    known_folds, score_folds = folds[:len(known)], folds[len(known):]
    scores: list[float] = [math.nan] * len(to_score)
    reports = []
    for fold in range(settings.folds):
        scored = [i for i, f in enumerate(score_folds) if f == fold]
        if not scored:
            continue
        train = [Example(item.query, item.query, item.chunk, float(known_label(item)), "gold", p)
                 for item, f, p in zip(known, known_folds, teacher, strict=True) if f != fold]
        student = train_student(train, settings.student())
        for i, p in zip(scored, student.score([(to_score[i].query, to_score[i].chunk) for i in scored]),
                        strict=True):
            scores[i] = p
        reports.append({"fold": fold, "trained_on": student.report.trained_on,
                        "calibrated_on": student.report.calibrated_on,
                        "calibration": student.report.calibration,
                        "train_seconds": student.report.seconds})
    return scores, reports
