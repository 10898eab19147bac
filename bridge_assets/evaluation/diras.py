"""DIRAS-style pointwise labeling: a yes/no guess plus a calibrated relevance score per
triplet (P(yes) from token log-probabilities), under the triplet's relevance definition (its
query's own, else its dataset's or gold set's: bridge_assets.registry.relevance); judged by the
guess's recalls and the score's calibration (ECE, Brier, AUROC).
"""

from __future__ import annotations

from collections.abc import Sequence

from bridge_assets.evaluation.scores import calibration_metrics
from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.labeler import Labeler, LabelerRun, LabelerSettings, LabelItem, outcome_label
from bridge_assets.labeling.pointwise import SCORE_TEMPLATE, score_triplets
from bridge_assets.labeling.prompts import Prompts


class DirasLabeler(Labeler):
    """The guess is the label (a `vote`; no escalation by design, only a failed score leaves a
    pair to people); P(yes) is its score, whose calibration is measured where labels are known."""

    Settings = LabelerSettings
    templates = (SCORE_TEMPLATE,)

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        scores = score_triplets(items, self.model, generate, prompts=prompts,
                                temperature=self.settings.temperature)
        p_yes = [s.p_yes for s in scores]
        gold = [item.gold for item in items if item.gold is not None]
        calibration = calibration_metrics(gold, p_yes) if len(gold) == len(items) else {}
        return LabelerRun([outcome_label(item.pair, s.guess, p_yes=s.p_yes)
                           for item, s in zip(items, scores, strict=True)],
                          scores=p_yes, details=[s.error for s in scores], extra=calibration,
                          models=[self.model])
