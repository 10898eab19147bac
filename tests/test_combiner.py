"""The calibrated combiner: fitted on verified labels only, calibrated, robust to a missing signal,
measured out of sample (bridge_assets/student/combiner.py)."""

import random

import pytest

from bridge_assets.evaluation.scores import auroc, expected_calibration_error
from bridge_assets.student.combiner import CombinerError, cross_fitted, fit_combiner, fold_of


def pairs(n: int, seed: int = 0) -> tuple[list[dict], list[int]]:
    """A P(yes) that ranks well, a student that ranks a little, and labels drawn from them."""
    rng = random.Random(seed)
    rows, labels = [], []
    for _ in range(n):
        label = int(rng.random() < 0.4)
        rows.append({"pyes": min(1.0, max(0.0, rng.gauss(0.65 if label else 0.35, 0.15))),
                     "student": rng.gauss(0.55 if label else 0.45, 0.2)})
        labels.append(label)
    return rows, labels


def test_only_verified_labels_teach_it():
    rows, labels = pairs(200)
    verified = [i % 2 == 0 for i in range(len(rows))]
    fitted = fit_combiner(rows, labels, verified)
    # a model's guesses (unverified) that contradict every verified label change nothing
    flipped = [1 - y if not ok else y for y, ok in zip(labels, verified)]
    refitted = fit_combiner(rows, flipped, verified)
    assert fitted.fitted_on == refitted.fitted_on == 100
    assert fitted.probabilities(rows) == refitted.probabilities(rows)
    # while the same flip on verified rows turns the combiner around
    turned = fit_combiner(rows, [1 - y for y in labels], verified)
    assert auroc(labels, turned.probabilities(rows)) < 0.5 < auroc(labels, fitted.probabilities(rows))


def test_too_few_verified_labels_is_a_named_error():
    rows, labels = pairs(40)
    verified = [False] * 40
    verified[:3] = [True] * 3
    with pytest.raises(CombinerError, match="at least 5 verified labels of each class"):
        fit_combiner(rows, labels, verified)


def test_missing_signal_and_calibration():
    rows, labels = pairs(400, seed=1)
    for row in rows[::3]:
        row["student"] = None  # a pair the student did not score
    combiner = fit_combiner(rows, labels, [True] * len(rows))
    probabilities = combiner.probabilities(rows)
    assert all(0.0 < p < 1.0 for p in probabilities)
    assert expected_calibration_error(labels, probabilities) < 0.1
    assert auroc(labels, probabilities) >= auroc(labels, [r["pyes"] for r in rows]) - 0.02
    assert set(combiner.weights()) >= {"pyes", "student"}


def test_cross_fitted_keeps_a_query_out_of_its_own_fit():
    rows, labels = pairs(240, seed=3)
    groups = [f"q{i // 4}" for i in range(len(rows))]  # four pairs a query
    probabilities = cross_fitted(rows, labels, groups, folds=5)
    folds = {g: fold_of(g, 5) for g in groups}
    assert len(set(folds.values())) == 5
    for held_out in range(5):  # each fold's P is that of a fit on the other folds' queries only
        others = [folds[g] != held_out for g in groups]
        alone = fit_combiner(rows, labels, others).probabilities(rows)
        held = [i for i, g in enumerate(groups) if folds[g] == held_out]
        assert [probabilities[i] for i in held] == pytest.approx([alone[i] for i in held])
