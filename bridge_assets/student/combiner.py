"""The calibrated combiner (issue "A first reader learned from a strong teacher", use (c)): one
probability of relevance from every signal a pair has (the student's score, the filter's and the
agents' P(yes), the answer check, the retrievers' votes), a logistic regression fitted on the
**verified** labels only, so that a model's own guesses never teach it.

    combiner = fit_combiner(signals, labels, verified)        # rows: {signal name: value or None}
    combiner.probabilities(signals)                            # its calibrated P(relevant)
    cross_fitted(signals, labels, groups, folds=5)             # out-of-fold P, to measure it

A signal a pair lacks (no debate, no student) is imputed by the training median and flagged, so
the regression can learn what a missing signal says. Logistic regression's output is its own
calibration (fitted by log loss); nothing else is tuned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bridge_assets.errors import BridgeError

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

Signals = Mapping[str, float | None]
MIN_PER_CLASS = 5  # fewer verified labels of a class than this and the fit says nothing


class CombinerError(BridgeError, ValueError):
    """The combiner cannot be fitted on these labels."""


def _matrix(rows: Sequence[Signals], names: Sequence[str]) -> np.ndarray:
    return np.array([[np.nan if (value := row.get(n)) is None else float(value) for n in names] for row in rows],
                    dtype=float).reshape(len(rows), len(names))


@dataclass(frozen=True)
class Combiner:
    signals: tuple[str, ...]
    model: Pipeline  # fitted
    fitted_on: int

    def probabilities(self, rows: Sequence[Signals]) -> list[float]:
        if not rows:
            return []
        return [float(p) for p in self.model.predict_proba(_matrix(rows, self.signals))[:, 1]]

    def weights(self) -> dict[str, float]:
        """The regression's coefficient of each (standardised) input, for the report."""
        model = self.model
        names = model[:-1].get_feature_names_out([*self.signals])
        return {str(n): round(float(w), 3) for n, w in zip(names, model[-1].coef_[0])}


def fit_combiner(rows: Sequence[Signals], labels: Sequence[int | None], verified: Sequence[bool],
                 signals: Sequence[str] | None = None, *, regularization: float = 1.0) -> Combiner:
    """Fit on the rows whose label is verified (and known); every other row is ignored."""
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if not len(rows) == len(labels) == len(verified):
        raise CombinerError("signals, labels and verified flags must have one entry per pair")
    known = {i: label for i, (label, ok) in enumerate(zip(labels, verified)) if ok and label is not None}
    kept = list(known)
    names = tuple(signals) if signals is not None else tuple(sorted({n for i in kept for n in rows[i]}))
    y = np.array([int(known[i] > 0) for i in kept], dtype=int)
    if min(int(y.sum()), int(len(y) - y.sum())) < MIN_PER_CLASS:
        raise CombinerError(f"the combiner needs at least {MIN_PER_CLASS} verified labels of each class; "
                            f"it has {int(y.sum())} relevant and {int(len(y) - y.sum())} not")
    x = _matrix([rows[i] for i in kept], names)
    present = ~np.all(np.isnan(x), axis=0)
    if not present.any():
        raise CombinerError("no verified pair has any of the signals " + ", ".join(names))
    names = tuple(n for n, ok in zip(names, present) if ok)
    model = make_pipeline(SimpleImputer(strategy="median", add_indicator=True), StandardScaler(),
                          LogisticRegression(C=regularization, max_iter=1000))
    model.fit(x[:, present], y)
    return Combiner(names, model, len(kept))


def fold_of(group: str, folds: int, seed: int = 0) -> int:
    """The fold of a group (a query): its seeded hash, so a group's pairs share one fold."""
    return int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest(), 16) % folds


def cross_fitted(rows: Sequence[Signals], labels: Sequence[int], groups: Sequence[str],
                 signals: Sequence[str] | None = None, *, folds: int = 5, seed: int = 0) -> list[float]:
    """Each pair's P from a combiner fitted on the other folds' pairs (folds keep a group, e.g. a
    query, whole), so no pair is scored by a fit that saw its query."""
    fold = [fold_of(g, folds, seed) for g in groups]
    result = [float("nan")] * len(rows)
    for held_out in range(folds):
        held = [i for i, f in enumerate(fold) if f == held_out]
        if not held:
            continue
        combiner = fit_combiner(rows, labels, [f != held_out for f in fold], signals)
        for i, p in zip(held, combiner.probabilities([rows[i] for i in held])):
            result[i] = p
    return result
