"""LARA-style escalation: the LLM's P(yes) decides, except for the cases it is least sure of,
which go to humans; the humans' labels calibrate the LLM online.

As LARA does: repeatedly pick the case whose *calibrated* probability is closest to 0.5,
escalate it (its gold label stands in for the human's), and refit a logistic regression
from the LLM's logit P(yes) to the labels escalated so far; stop once the escalation budget
(a ratio of the cases) is spent. Every other case gets the calibrated prediction
(P >= 0.5 -> relevant). Until the escalated labels hold both classes the calibration is the
identity. Cases whose score failed are escalated first (humans must label them anyway).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from pydantic import Field

from bridge_assets.evaluation.scores import calibration_metrics, escalation_count
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.debate import PairLabel
from bridge_assets.labeling.labeler import Labeler, LabelerError, LabelerRun, LabelerSettings, LabelItem, outcome_label
from bridge_assets.labeling.pointwise import SCORE_TEMPLATE, score_triplets
from bridge_assets.labeling.prompts import Prompts

CLIP = 1e-6


def logit(p: float) -> float:
    p = min(max(p, CLIP), 1 - CLIP)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class Calibrator:
    """P(relevant) = sigmoid(slope * logit(p_yes) + intercept)."""

    slope: float = 1.0
    intercept: float = 0.0

    def __call__(self, p_yes: float) -> float:
        z = self.slope * logit(p_yes) + self.intercept
        return 1 / (1 + math.exp(-z))


IDENTITY = Calibrator()


def fit_calibrator(p_yes: Sequence[float], labels: Sequence[int], c: float = 1.0) -> Calibrator:
    """Logistic regression of the labels on logit(P(yes)) (L2, inverse strength `c`); the
    identity while the labels hold fewer than two classes."""
    from sklearn.linear_model import LogisticRegression

    if len(set(labels)) < 2:
        return IDENTITY
    features = np.array([[logit(p)] for p in p_yes])
    model = LogisticRegression(C=c).fit(features, np.array(labels))
    return Calibrator(float(model.coef_[0][0]), float(model.intercept_[0]))


@dataclass(frozen=True)
class LaraOutcome:
    labels: list[int | None]   # calibrated prediction; None where escalated
    escalated: list[bool]
    order: list[int]           # escalation order (case indices)
    calibrated: list[float | None]  # final calibrated P(relevant); None for failed scores
    calibrator: Calibrator


def lara(p_yes: Sequence[float | None], gold: Sequence[int], ratio: float, *,
         c: float = 1.0) -> LaraOutcome:
    """Escalate `ratio` of the cases with online calibration; see the module docstring."""
    n = len(p_yes)
    if len(gold) != n:
        raise ValueError(f"{n} scores but {len(gold)} gold labels")
    budget = escalation_count(n, ratio)
    scores = {i: p for i, p in enumerate(p_yes) if p is not None}
    order = [i for i in range(n) if i not in scores]  # failed scores: escalated regardless
    calibrator = IDENTITY
    while len(order) < budget:
        chosen = set(order)
        candidates = [i for i in scores if i not in chosen]
        pick = min(candidates, key=lambda i: (abs(calibrator(scores[i]) - 0.5), i))
        order.append(pick)
        scored = [i for i in order if i in scores]
        calibrator = fit_calibrator([scores[i] for i in scored], [gold[i] for i in scored], c)
    escalated = set(order)
    calibrated = [calibrator(p) if p is not None else None for p in p_yes]
    labels = [None if i in escalated else int(calibrator(scores[i]) >= 0.5) for i in range(n)]
    return LaraOutcome(labels, [i in escalated for i in range(n)], order, calibrated, calibrator)


class LaraSettings(LabelerSettings):
    escalation_ratio: float = Field(0.035, ge=0.0, le=1.0, description="Share of the pairs "
                                    "escalated to people, whose labels calibrate the rest.")


class LaraLabeler(Labeler):
    """LARA: a pointwise P(yes), calibrated online on the escalated pairs' known labels (people
    standing in), so it runs where labels are known: on a gold set."""

    Settings = LaraSettings
    needs_gold = True
    templates = (SCORE_TEMPLATE,)
    settings: LaraSettings

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        gold = [item.gold for item in items if item.gold is not None]
        if len(gold) < len(items):
            raise LabelerError("lara calibrates on the escalated pairs' known labels: it needs "
                               "a gold set (bridge label-eval), not unlabelled pairs")
        point = score_triplets(items, self.model, generate, prompts=prompts,
                               temperature=self.settings.temperature)
        p_yes = [s.p_yes for s in point]
        chosen = lara(p_yes, gold, self.settings.escalation_ratio)
        labels = [PairLabel(item.pair.query_id, item.pair.doc_id, item.pair.key, None, "escalated", 1,
                            flags=("lara",), p_yes=p)
                  if escalated else outcome_label(item.pair, label, p_yes=p)
                  for item, label, escalated, p in zip(items, chosen.labels, chosen.escalated,
                                                       chosen.calibrated, strict=True)]
        return LabelerRun(labels, scores=chosen.calibrated, details=[s.error for s in point],
                          extra={**calibration_metrics(gold, p_yes), "calibrator": asdict(chosen.calibrator)},
                          models=[self.model])
