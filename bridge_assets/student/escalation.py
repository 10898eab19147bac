"""A score as an escalation signal: send to people the labels it contradicts with confidence.

    rows = escalation_study(gold, labels, {"student": scores}, p_yes, confidences=(0.7, 0.9),
                            up_to=(0.15, 0.2))

`labels` are one labeler's decisions on a gold set (None where it escalated already, e.g. the
pipeline's filter then DREAM); a signal is a P(relevant) per triplet (the student's, scored out
of fold; the LLM's P(yes)). Its contradiction of a decided label is its P of the other class.
Two rules escalate a decided label as well (only where `eligible`, e.g. the debate's consensus
but not the filter's "no"): at confidence c, every label contradicted at c or more; up to a
ratio r, the most contradicted labels (contradiction above one half) until r of the cases are
escalated in all (for a signal whose calibrated scores crowd near one half, which no confidence
reaches, the budget still uses its ranking). Each row stands beside LARA at the same
escalation (LARA's online-calibrated P(yes), `bridge_assets.evaluation.lara`), with the paired
bootstrap interval of the difference in decided bAcc (cases resampled, both labelers' decisions
held fixed). A study, not a default: the pipeline escalates by its own checks only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bridge_assets.evaluation.lara import lara
from bridge_assets.evaluation.scores import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE_LEVEL,
    NO_LABEL,
    bacc_interval,
    balanced_accuracies,
    balanced_accuracy,
    escalation_count,
)


@dataclass(frozen=True)
class EscalationRow:
    signal: str                  # "" for the labeler alone
    rule: str                    # what the signal escalated: "P >= 0.7", "up to 20%" ("" alone)
    n: int
    escalated: int               # the labeler's own escalations plus the signal's
    by_signal: int               # of those, escalated by the signal
    bacc: float | None           # over the decided cases
    bacc_ci: tuple[float | None, float | None]
    lara_bacc: float | None      # LARA at the same escalation count
    lara_ci: tuple[float | None, float | None]
    difference: float | None     # bacc - lara_bacc
    difference_ci: tuple[float | None, float | None]

    @property
    def escalation_ratio(self) -> float:
        return self.escalated / self.n


def contradiction(label: int, p_relevant: float) -> float:
    """How strongly a signal of P(relevant) `p_relevant` contradicts `label`: its P of the other class."""
    return 1 - p_relevant if label == 1 else p_relevant


def _contradicted(labels: Sequence[int | None], signal: Sequence[float | None],
                  eligible: Sequence[bool] | None) -> dict[int, float]:
    """Each eligible decided case with a score (a failed call has none: it keeps its label),
    with its contradiction."""
    eligible = eligible if eligible is not None else [True] * len(labels)
    return {i: contradiction(label, p) for i, (label, p, ok) in enumerate(zip(labels, signal, eligible, strict=True))
            if label is not None and ok and p is not None}


def escalate_contradicted(labels: Sequence[int | None], signal: Sequence[float | None], confidence: float,
                          eligible: Sequence[bool] | None = None) -> list[int | None]:
    """`labels` with every eligible decided label the signal contradicts at `confidence` or more escalated."""
    chosen = {i for i, strength in _contradicted(labels, signal, eligible).items() if strength >= confidence}
    return [None if i in chosen else label for i, label in enumerate(labels)]


def escalate_most_contradicted(labels: Sequence[int | None], signal: Sequence[float | None], ratio: float,
                               eligible: Sequence[bool] | None = None) -> list[int | None]:
    """`labels` with the eligible decided labels the signal contradicts most (above one half; ties:
    the earlier case) escalated until `ratio` of the cases are escalated in all (`escalation_count`)."""
    room = escalation_count(len(labels), ratio) - sum(label is None for label in labels)
    ranked = sorted(((-strength, i) for i, strength in _contradicted(labels, signal, eligible).items()
                     if strength > 0.5))
    chosen = {i for _, i in ranked[:max(room, 0)]}
    return [None if i in chosen else label for i, label in enumerate(labels)]


def _decided(gold: Sequence[int], labels: Sequence[int | None]) -> tuple[list[int], list[int]]:
    """The gold and labels of the decided cases."""
    kept = [i for i, label in enumerate(labels) if label is not None]
    return [gold[i] for i in kept], [label for label in labels if label is not None]


def decided_bacc(gold: Sequence[int], labels: Sequence[int | None]) -> float | None:
    return balanced_accuracy(*_decided(gold, labels))


def _decided_interval(gold: Sequence[int], labels: Sequence[int | None]) -> tuple[float | None, float | None]:
    return bacc_interval(*_decided(gold, labels))


def difference_interval(gold: Sequence[int], first: Sequence[int | None], second: Sequence[int | None], *,
                        seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of decided bAcc(first) - decided bAcc(second), the cases
    resampled in triples (scipy's `bootstrap`, seeded); (None, None) where undefined."""
    from scipy import stats

    def encode(labels: Sequence[int | None]) -> np.ndarray:
        return np.array([NO_LABEL if label is None else label for label in labels])

    def statistic(g: np.ndarray, a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return balanced_accuracies(g, a, axis) - balanced_accuracies(g, b, axis)

    data = (np.asarray(gold), encode(first), encode(second))
    if np.isnan(statistic(*data)):
        return None, None
    with warnings.catch_warnings():  # the same decisions: a valid, degenerate interval
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(data, statistic, paired=True, vectorized=True,
                                 n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                 confidence_level=CONFIDENCE_LEVEL, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return (None, None) if math.isnan(low) or math.isnan(high) else (float(low), float(high))


def _row(signal: str, rule: str, gold: Sequence[int], labels: Sequence[int | None],
         before: Sequence[int | None], p_yes: Sequence[float | None]) -> EscalationRow:
    n = len(gold)
    escalated = sum(label is None for label in labels)
    by_signal = escalated - sum(label is None for label in before)
    baseline = lara(p_yes, gold, escalated / n).labels
    bacc, lara_bacc = decided_bacc(gold, labels), decided_bacc(gold, baseline)
    return EscalationRow(signal, rule, n, escalated, by_signal, bacc, _decided_interval(gold, labels),
                         lara_bacc, _decided_interval(gold, baseline),
                         None if bacc is None or lara_bacc is None else bacc - lara_bacc,
                         difference_interval(gold, labels, baseline))


def escalation_study(gold: Sequence[int], labels: Sequence[int | None],
                     signals: Mapping[str, Sequence[float | None]], p_yes: Sequence[float | None], *,
                     confidences: Sequence[float] = (), up_to: Sequence[float] = (),
                     eligible: Sequence[bool] | None = None) -> list[EscalationRow]:
    """The labeler alone, then each signal under each rule, each beside LARA at its escalation."""
    rows = [_row("", "", gold, labels, labels, p_yes)]
    for name, signal in signals.items():
        if len(signal) != len(labels):
            raise ValueError(f"signal {name!r}: {len(signal)} scores for {len(labels)} labels")
        for confidence in confidences:
            rows.append(_row(name, f"P >= {confidence:g}", gold,
                             escalate_contradicted(labels, signal, confidence, eligible), labels, p_yes))
        for ratio in up_to:
            rows.append(_row(name, f"up to {100 * ratio:g}%", gold,
                             escalate_most_contradicted(labels, signal, ratio, eligible), labels, p_yes))
    return rows
