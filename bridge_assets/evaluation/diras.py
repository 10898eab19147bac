"""DIRAS-style pointwise labeling: a yes/no guess plus a calibrated relevance score per
triplet (P(yes) from token log-probabilities), optionally with a per-query relevance
definition; judged by the guess's recalls and the score's calibration (ECE, Brier, AUROC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge_assets.evaluation.goldsets import GoldTriplet
from bridge_assets.evaluation.metrics import calibration_metrics
from bridge_assets.evaluation.pointwise import PointwiseScore, score_triplets
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.prompts import Prompts


@dataclass(frozen=True)
class DirasOutcome:
    scores: list[PointwiseScore]
    calibration: dict  # ece, brier, auroc, scored

    @property
    def labels(self) -> list[int | None]:
        return [s.guess for s in self.scores]

    @property
    def escalated(self) -> list[bool]:
        """No escalation by design; only a failed score leaves a case to humans."""
        return [s.guess is None for s in self.scores]


def diras(triplets: Sequence[GoldTriplet], model: str, generate: Generate, *,
          prompts: Prompts | None = None, use_definitions: bool = True,
          temperature: float = 0.0) -> DirasOutcome:
    scores = score_triplets(triplets, model, generate, prompts=prompts, definitions=use_definitions,
                            temperature=temperature)
    return DirasOutcome(scores, calibration_metrics([t.label for t in triplets],
                                                    [s.p_yes for s in scores]))
