"""Metrics of a labeler against gold labels: class recalls, balanced accuracy, escalation,
and the calibration of a relevance score (ECE, Brier, AUROC).

Conventions (the DREAM paper's): label 1 = relevant, 0 = not relevant. A labeler may leave a
case to humans (escalated; a failed call is escalated too). bAcc is the mean of the two class
recalls; "bAcc" alone is over the cases the labeler decided, "resolved bAcc" over every case
once the escalated ones got the resolver's label (gold labels standing in for humans, or an
LLM adjudicator). A case that still has no label after resolution counts as an error.
A figure that is undefined on the data (a recall with no case of its class, AUROC with one
class) is None, never a made-up number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bridge_assets.labeling.debate import escalation_count

ECE_BINS = 10  # equal-width bins over [0, 1], the last one closed
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE_LEVEL = 0.95


def class_recalls(gold: Sequence[int], predicted: Sequence[int]) -> tuple[float | None, float | None]:
    """(recall of the relevant class, recall of the irrelevant class); None for a class with
    no gold case."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels but {len(predicted)} predictions")

    def recall(cls: int) -> float | None:
        hits = [p == cls for g, p in zip(gold, predicted) if g == cls]
        return sum(hits) / len(hits) if hits else None

    return recall(1), recall(0)


def balanced_accuracy(gold: Sequence[int], predicted: Sequence[int]) -> float | None:
    """Mean of the two class recalls; None unless both classes occur in `gold`."""
    relevant, irrelevant = class_recalls(gold, predicted)
    if relevant is None or irrelevant is None:
        return None
    return (relevant + irrelevant) / 2


NO_LABEL = -1  # in arrays: a case without a label (escalated), left out of its bAcc


def balanced_accuracies(gold: np.ndarray, predicted: np.ndarray, axis: int = -1) -> np.ndarray:
    """`balanced_accuracy` along `axis`, for many resamples at once (scipy's vectorized
    `bootstrap`): cases predicted NO_LABEL are left out; NaN where a class has no case."""
    labelled = predicted != NO_LABEL
    relevant, irrelevant = labelled & (gold == 1), labelled & (gold == 0)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0: a class without a case
        return ((relevant & (predicted == 1)).sum(axis) / relevant.sum(axis)
                + (irrelevant & (predicted == 0)).sum(axis) / irrelevant.sum(axis)) / 2


def bacc_interval(gold: Sequence[int], predicted: Sequence[int], *, seed: int = 0,
                  confidence_level: float = CONFIDENCE_LEVEL) -> tuple[float | None, float | None]:
    """A percentile bootstrap confidence interval of the balanced accuracy (scipy's
    `bootstrap`, cases resampled in pairs, BOOTSTRAP_RESAMPLES draws, seeded). (None, None)
    when undefined: a class missing, or a resample without both classes."""
    from scipy import stats

    if balanced_accuracy(gold, predicted) is None:
        return None, None
    with warnings.catch_warnings():  # every resample scoring the same is a valid, degenerate interval
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap((np.asarray(gold), np.asarray(predicted)), balanced_accuracies, paired=True,
                                 vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                 confidence_level=confidence_level, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    if math.isnan(low) or math.isnan(high):
        return None, None
    return float(low), float(high)


def bacc_difference_interval(gold: Sequence[int], predicted: Sequence[int], reference: Sequence[int], *,
                             seed: int = 0, confidence_level: float = CONFIDENCE_LEVEL
                             ) -> tuple[float | None, float | None, float | None]:
    """(difference, low, high): bAcc of `predicted` minus bAcc of `reference` on the same cases,
    with its percentile bootstrap interval (scipy's `bootstrap`, the cases resampled together
    so each draw compares the two labelers on one sample). NO_LABEL marks a case a labeler
    left to humans, left out of that labeler's bAcc only. None where undefined."""
    from scipy import stats

    gold_array, predicted_array, reference_array = (np.asarray(values) for values in (gold, predicted, reference))
    difference = float(balanced_accuracies(gold_array, predicted_array)
                       - balanced_accuracies(gold_array, reference_array))
    if math.isnan(difference):
        return None, None, None

    def differences(g: np.ndarray, p: np.ndarray, r: np.ndarray, axis: int = -1) -> np.ndarray:
        return balanced_accuracies(g, p, axis) - balanced_accuracies(g, r, axis)

    with warnings.catch_warnings():  # the same labels in both: a valid, degenerate interval
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap((gold_array, predicted_array, reference_array), differences, paired=True, vectorized=True,
                                 n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                 confidence_level=confidence_level, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    if math.isnan(low) or math.isnan(high):
        return difference, None, None
    return difference, float(low), float(high)


def escalate_least_confident(confidence: Sequence[float], ratio: float) -> list[bool]:
    """Mark the `escalation_count` least confident cases (ties: the earlier case first)."""
    order = sorted(range(len(confidence)), key=lambda i: (confidence[i], i))
    chosen = set(order[:escalation_count(len(confidence), ratio)])
    return [i in chosen for i in range(len(confidence))]


@dataclass(frozen=True)
class LabelerMetrics:
    """One labeler's figures on one gold set (the columns of the paper's Table 1)."""

    n: int
    escalated: int
    escalation_ratio: float
    recall_relevant: float | None    # on the cases the labeler decided
    recall_irrelevant: float | None
    bacc: float | None
    bacc_resolved: float | None      # every case, escalations resolved
    unresolved: int                  # escalated cases the resolver gave no label
    bacc_ci: tuple[float | None, float | None] = (None, None)           # 95% bootstrap interval
    bacc_resolved_ci: tuple[float | None, float | None] = (None, None)

    def as_dict(self) -> dict:
        values = asdict(self)
        for name in ("bacc_ci", "bacc_resolved_ci"):
            low, high = values.pop(name)
            values[f"{name}_low"], values[f"{name}_high"] = low, high
        return values


def final_labels(gold: Sequence[int], labels: Sequence[int | None], escalated: Sequence[bool],
                 resolved: Sequence[int | None]) -> list[int]:
    """Each case's label once escalations are resolved: the labeler's, else the resolver's; an
    escalated case the resolver gave no label counts as an error (the wrong label)."""
    def final(i: int) -> int:
        if escalated[i]:
            label = resolved[i]
            return 1 - gold[i] if label is None else label
        label = labels[i]
        if label is None:
            raise ValueError(f"case {i} is neither labelled nor escalated")
        return label

    return [final(i) for i in range(len(gold))]


def labeler_metrics(gold: Sequence[int], labels: Sequence[int | None], escalated: Sequence[bool],
                    resolved: Sequence[int | None]) -> LabelerMetrics:
    """`labels[i]`: the labeler's label (ignored where escalated); `resolved[i]`: the label an
    escalated case finally got (None: unresolved, counted as an error)."""
    n = len(gold)
    if not len(labels) == len(escalated) == len(resolved) == n:
        raise ValueError("gold, labels, escalated and resolved must have the same length")
    for i in range(n):
        if not escalated[i] and labels[i] is None:
            raise ValueError(f"case {i} is neither labelled nor escalated")
    decided = [i for i in range(n) if not escalated[i]]
    final = final_labels(gold, labels, escalated, resolved)
    decided_gold, decided_labels = [gold[i] for i in decided], [final[i] for i in decided]  # the labeler's own
    recall_relevant, recall_irrelevant = class_recalls(decided_gold, decided_labels)
    n_escalated = sum(bool(e) for e in escalated)
    return LabelerMetrics(
        n=n, escalated=n_escalated, escalation_ratio=n_escalated / n if n else 0.0,
        recall_relevant=recall_relevant, recall_irrelevant=recall_irrelevant,
        bacc=balanced_accuracy(decided_gold, decided_labels),
        bacc_resolved=balanced_accuracy(gold, final),
        unresolved=sum(1 for i in range(n) if escalated[i] and resolved[i] is None),
        bacc_ci=bacc_interval(decided_gold, decided_labels), bacc_resolved_ci=bacc_interval(gold, final))


def reliability_bins(gold: Sequence[int], probability: Sequence[float], bins: int = ECE_BINS) -> list[dict]:
    """The reliability diagram's points, the bins ECE sums over: per non-empty equal-width bin
    (bin b holds probabilities in [b/bins, (b+1)/bins), the last bin also 1.0) its bounds, its
    cases, their mean predicted probability and the share of them that is relevant."""
    if len(gold) != len(probability) or not gold:
        raise ValueError("calibration needs as many probabilities as gold labels, and at least one")
    p = np.asarray(probability, dtype=float)
    y = np.asarray(gold, dtype=float)
    index = np.minimum((p * bins).astype(int), bins - 1)
    return [{"low": b / bins, "high": (b + 1) / bins, "cases": int(members.sum()),
             "predicted": float(p[members].mean()), "observed": float(y[members].mean())}
            for b in range(bins) if (members := index == b).any()]


def expected_calibration_error(gold: Sequence[int], probability: Sequence[float],
                               bins: int = ECE_BINS) -> float:
    """ECE of P(relevant): sum over the reliability bins of (share of cases in the bin) x
    |share of relevant cases in it - mean predicted probability in it|."""
    rows = reliability_bins(gold, probability, bins)
    return float(sum(r["cases"] / len(gold) * abs(r["observed"] - r["predicted"]) for r in rows))


def brier_score(gold: Sequence[int], probability: Sequence[float]) -> float:
    """Mean squared difference between P(relevant) and the 0/1 gold label."""
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(list(gold), list(probability), pos_label=1))


def auroc(gold: Sequence[int], score: Sequence[float]) -> float | None:
    """Area under the ROC curve of the score; None when `gold` has only one class."""
    from sklearn.metrics import roc_auc_score

    if len(set(gold)) < 2:
        return None
    return float(roc_auc_score(list(gold), list(score)))


def aurocs(gold: np.ndarray, score: np.ndarray, axis: int = -1) -> np.ndarray:
    """`auroc` along `axis`, for many resamples at once (scipy's vectorized `bootstrap`): the
    Mann-Whitney U over average ranks (a tie counts one half, as in roc_auc_score), divided by
    the pairs of one relevant and one irrelevant case; NaN where a class has no case."""
    from scipy.stats import rankdata

    relevant = gold == 1
    positives, negatives = relevant.sum(axis), (gold == 0).sum(axis)
    u = np.where(relevant, rankdata(score, axis=axis), 0).sum(axis) - positives * (positives + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return u / (positives * negatives)


def auroc_intervals(gold: Sequence[int], score: Sequence[float], reference: Sequence[float], *,
                    seed: int = 0) -> tuple[tuple[float, float], tuple[float, float]]:
    """Percentile bootstrap intervals (cases resampled together, scipy's `bootstrap`, seeded) of
    the AUROC of `score` and of its difference from `reference`'s AUROC on the same cases."""
    from scipy import stats

    data = (np.asarray(gold), np.asarray(score, dtype=float), np.asarray(reference, dtype=float))
    if auroc(gold, score) is None:
        raise ValueError("AUROC needs cases of both classes")

    def both(g: np.ndarray, s: np.ndarray, r: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
        value = aurocs(g, s, axis)
        return value, value - aurocs(g, r, axis)

    with warnings.catch_warnings():  # a score against itself: a valid, degenerate difference
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(data, both, paired=True, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES,
                                 method="percentile", confidence_level=CONFIDENCE_LEVEL,
                                 rng=np.random.default_rng(seed))
    (low, low_difference), (high, high_difference) = result.confidence_interval
    return (float(low), float(high)), (float(low_difference), float(high_difference))


def calibration_metrics(gold: Sequence[int], probability: Sequence[float | None]) -> dict:
    """ECE (10 equal-width bins), Brier and AUROC over the cases that have a probability."""
    scored = [(g, p) for g, p in zip(gold, probability) if p is not None]
    if not scored:
        return {"ece": None, "brier": None, "auroc": None, "scored": 0}
    ys, ps = [g for g, _ in scored], [p for _, p in scored]
    return {"ece": expected_calibration_error(ys, ps), "brier": brier_score(ys, ps),
            "auroc": auroc(ys, ps), "scored": len(scored)}


def agreement(a: Sequence[int], b: Sequence[int]) -> dict:
    """How two binary labelings of the same cases agree: raw share and Cohen's kappa
    (None when kappa is undefined, i.e. both labelings use one single label)."""
    from sklearn.metrics import cohen_kappa_score

    if len(a) != len(b):
        raise ValueError(f"{len(a)} labels against {len(b)}")
    if not a:
        return {"agreement": None, "kappa": None, "compared": 0}
    share = sum(x == y for x, y in zip(a, b)) / len(a)
    kappa = None if len(set(a) | set(b)) < 2 else float(cohen_kappa_score(list(a), list(b)))
    if kappa is not None and math.isnan(kappa):
        kappa = None
    return {"agreement": share, "kappa": kappa, "compared": len(a)}
