"""Every labeler metric on small cases computed by hand (in the comments)."""

from __future__ import annotations

import math

import pytest

from bridge_assets.evaluation.lara import IDENTITY, fit_calibrator, lara, logit
from bridge_assets.evaluation.scores import (
    NO_LABEL,
    agreement,
    auroc,
    auroc_intervals,
    aurocs,
    bacc_difference_interval,
    bacc_interval,
    balanced_accuracies,
    balanced_accuracy,
    brier_score,
    calibration_metrics,
    class_recalls,
    escalate_least_confident,
    escalation_count,
    expected_calibration_error,
    labeler_metrics,
    reliability_bins,
)


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_class_recalls_and_balanced_accuracy():
    gold = [1, 1, 1, 0, 0]
    predicted = [1, 0, 1, 0, 1]
    # relevant: 2 of 3 found; irrelevant: 1 of 2 found; bAcc = (2/3 + 1/2) / 2 = 7/12
    assert class_recalls(gold, predicted) == pytest.approx((2 / 3, 1 / 2))
    assert balanced_accuracy(gold, predicted) == pytest.approx(7 / 12)


def test_balanced_accuracy_is_undefined_without_both_classes():
    assert class_recalls([1, 1], [1, 0]) == (0.5, None)
    assert balanced_accuracy([1, 1], [1, 0]) is None
    with pytest.raises(ValueError, match="2 gold labels but 1"):
        class_recalls([1, 0], [1])


def test_the_batched_balanced_accuracy_is_the_case_by_case_one():
    import numpy as np

    rng = np.random.default_rng(3)
    gold, predicted = rng.integers(0, 2, (50, 12)), rng.integers(-1, 2, (50, 12))
    predicted[0, :] = NO_LABEL  # nothing labelled: undefined
    batched = balanced_accuracies(gold, predicted)
    for g, p, value in zip(gold, predicted, batched, strict=True):
        kept = p != NO_LABEL
        expected = balanced_accuracy(g[kept].tolist(), p[kept].tolist())
        assert math.isnan(value) if expected is None else value == pytest.approx(expected)


def test_the_bacc_interval_is_scipys_percentile_bootstrap_of_the_case_by_case_bacc():
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(4)
    gold = rng.integers(0, 2, 60)
    predicted = np.where(rng.random(60) < 0.8, gold, 1 - gold)
    expected = stats.bootstrap((gold, predicted), lambda g, p: balanced_accuracy(g.tolist(), p.tolist()),
                               paired=True, vectorized=False, n_resamples=2000, method="percentile",
                               rng=np.random.default_rng(0)).confidence_interval
    assert bacc_interval(gold.tolist(), predicted.tolist()) == pytest.approx(tuple(expected))
    assert bacc_interval([1, 1], [1, 0]) == (None, None)


def test_the_bacc_difference_resamples_the_cases_of_both_labelers_together():
    import numpy as np
    from scipy import stats

    # a case left to humans (NO_LABEL) counts in neither class of its labeler's bAcc:
    # predicted (1, 0, -, 0) on gold (1, 1, 0, 0), its 3rd case escalated: (1/2 + 1/1) / 2 = 3/4;
    # reference (1, 1, 1, 0): (2/2 + 1/2) / 2 = 3/4
    assert bacc_difference_interval([1, 1, 0, 0], [1, 0, NO_LABEL, 0], [1, 1, 1, 0])[0] == pytest.approx(0)
    assert bacc_difference_interval([1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0])[0] == pytest.approx(0.5)
    same = [1, 0, 1, 1, 0, 0, 1, 0] * 5  # the same labels: every draw differs by nothing
    assert bacc_difference_interval([1, 0] * 20, same, same) == (0.0, 0.0, 0.0)
    assert bacc_difference_interval([1, 1], [1, 0], [1, 1]) == (None, None, None)

    rng = np.random.default_rng(6)
    gold = rng.integers(0, 2, 80)
    reference = np.where(rng.random(80) < 0.8, gold, 1 - gold)
    predicted = np.where(rng.random(80) < 0.1, 1 - reference, reference)  # mostly the same labels
    predicted[:5] = NO_LABEL

    def difference(g, p, r):
        keep = p != NO_LABEL
        return balanced_accuracy(g[keep].tolist(), p[keep].tolist()) - balanced_accuracy(g.tolist(), r.tolist())

    expected = stats.bootstrap((gold, predicted, reference), difference, paired=True, vectorized=False,
                               n_resamples=2000, method="percentile", rng=np.random.default_rng(0))
    value, low, high = bacc_difference_interval(gold.tolist(), predicted.tolist(), reference.tolist())
    assert value == pytest.approx(difference(gold, predicted, reference))
    assert (low, high) == pytest.approx(tuple(expected.confidence_interval))
    # paired: narrower than one labeler's own interval, for labels this alike
    alone_low, alone_high = bacc_interval(gold.tolist(), reference.tolist())
    assert high - low < alone_high - alone_low


def test_the_batched_auroc_is_roc_auc_score_ties_included():
    import numpy as np

    rng = np.random.default_rng(5)
    gold, score = rng.integers(0, 2, (40, 15)), np.round(rng.random((40, 15)), 1)  # many ties
    gold[0, :] = 1  # one class only: undefined
    for g, s, value in zip(gold, score, aurocs(gold, score), strict=True):
        expected = auroc(g.tolist(), s.tolist())
        assert math.isnan(value) if expected is None else value == pytest.approx(expected)


def test_auroc_intervals_hold_the_value_and_a_score_against_itself_differs_by_nothing():
    import numpy as np

    rng = np.random.default_rng(6)
    gold = rng.integers(0, 2, 80)
    good, noise = gold + rng.normal(0, 0.7, 80), rng.random(80)
    (low, high), (diff_low, diff_high) = auroc_intervals(gold.tolist(), good.tolist(), noise.tolist())
    assert low <= auroc(gold.tolist(), good.tolist()) <= high
    assert 0 < diff_low < diff_high  # the informative score ranks better than noise, intervals apart
    assert auroc_intervals(gold.tolist(), good.tolist(), good.tolist())[1] == (0.0, 0.0)
    with pytest.raises(ValueError, match="both classes"):
        auroc_intervals([1, 1], [0.2, 0.3], [0.1, 0.5])


@pytest.mark.parametrize("n, ratio, expected", [
    (48, 0.035, 2),    # 1.68 cases -> 2 (the fewest reaching 3.5%)
    (100, 0.035, 4),   # 3.5 -> 4
    (200, 0.035, 7),   # exactly 7
    (48, 0.125, 6),    # exactly 6
    (10, 0.5, 5),
    (10, 0.0, 0),
    (3, 1.0, 3),
])
def test_escalation_count(n, ratio, expected):
    assert escalation_count(n, ratio) == expected


def test_escalation_ratio_outside_zero_one_is_rejected():
    with pytest.raises(ValueError, match="within"):
        escalation_count(10, 1.5)


def test_escalate_least_confident_picks_the_lowest_confidence_and_breaks_ties_by_order():
    assert escalate_least_confident([0.9, 0.1, 0.5, 0.1], 0.5) == [False, True, False, True]
    assert escalate_least_confident([0.2, 0.2, 0.2], 1 / 3) == [True, False, False]
    assert escalate_least_confident([0.2, 0.3], 0.0) == [False, False]


def test_labeler_metrics_with_an_escalated_case_resolved_by_gold():
    gold = [1, 1, 0, 0, 1, 0]
    labels = [1, 0, 0, None, 1, 1]
    escalated = [False, False, False, True, False, False]
    resolved = [None, None, None, 0, None, None]
    m = labeler_metrics(gold, labels, escalated, resolved)
    # decided cases 0,1,2,4,5: relevant 2/3 (0 and 4 of 0,1,4), irrelevant 1/2 (2 of 2,5)
    assert (m.n, m.escalated, m.escalation_ratio) == (6, 1, pytest.approx(1 / 6))
    assert (m.recall_relevant, m.recall_irrelevant) == (pytest.approx(2 / 3), pytest.approx(1 / 2))
    assert m.bacc == pytest.approx(7 / 12)
    # final labels [1,0,0,0,1,1]: relevant 2/3, irrelevant 2/3 (cases 2, 3 right, 5 wrong)
    assert m.bacc_resolved == pytest.approx(2 / 3) and m.unresolved == 0


def test_an_unresolved_escalation_counts_as_an_error():
    gold = [1, 1, 0, 0, 1, 0]
    m = labeler_metrics(gold, [1, 0, 0, None, 1, 1], [False, False, False, True, False, False],
                        [None] * 6)
    # case 3 gets no label: counted wrong -> irrelevant recall 1/3, bAcc (2/3 + 1/3) / 2
    assert m.bacc_resolved == pytest.approx(0.5) and m.unresolved == 1


def test_labeler_metrics_reject_a_case_neither_labelled_nor_escalated():
    with pytest.raises(ValueError, match="case 1 is neither labelled nor escalated"):
        labeler_metrics([1, 0], [1, None], [False, False], [None, None])


def test_expected_calibration_error_with_ten_equal_width_bins():
    # bins: 0.05 -> [0,.1) acc 0 conf .05; .15 -> [.1,.2) acc 1 conf .15; .85 -> [.8,.9)
    # acc 1 conf .85; .95 -> [.9,1] acc 1 conf .95 -> (.05 + .85 + .15 + .05) / 4
    assert expected_calibration_error([0, 1, 1, 1], [0.05, 0.15, 0.95, 0.85]) == pytest.approx(0.275)
    # 1.0 falls in the last bin with .95: acc 1/2, conf .975 -> .475
    assert expected_calibration_error([1, 0], [1.0, 0.95]) == pytest.approx(0.475)
    assert expected_calibration_error([1, 0], [1.0, 0.0]) == pytest.approx(0.0)


def test_reliability_bins_are_the_points_ece_sums_over():
    gold, probability = [0, 1, 1, 1, 0], [0.05, 0.15, 0.95, 1.0, 0.92]
    rows = reliability_bins(gold, probability)
    assert [(r["low"], r["cases"]) for r in rows] == [(0.0, 1), (0.1, 1), (0.9, 3)]  # empty bins left out
    assert rows[2]["predicted"] == pytest.approx((0.95 + 1.0 + 0.92) / 3) and rows[2]["observed"] == pytest.approx(2 / 3)
    assert expected_calibration_error(gold, probability) == pytest.approx(
        sum(r["cases"] / 5 * abs(r["observed"] - r["predicted"]) for r in rows))
    with pytest.raises(ValueError):
        reliability_bins([1], [0.5, 0.2])


def test_brier_score():
    # ((1 - .8)^2 + (0 - .3)^2) / 2
    assert brier_score([1, 0], [0.8, 0.3]) == pytest.approx(0.065)


def test_auroc_counts_correctly_ordered_pairs():
    # positive/negative pairs: (.35>.1) yes, (.35>.4) no, (.8>.1) yes, (.8>.4) yes -> 3/4
    assert auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auroc([1, 1], [0.2, 0.3]) is None


def test_calibration_metrics_skip_cases_without_a_score():
    figures = calibration_metrics([1, 0, 1], [0.8, None, 0.6])
    assert figures["scored"] == 2 and figures["auroc"] is None
    assert figures["brier"] == pytest.approx((0.04 + 0.16) / 2)
    assert calibration_metrics([1], [None]) == {"ece": None, "brier": None, "auroc": None, "scored": 0}


def test_agreement_and_cohens_kappa():
    # observed .75; expected .5 * .25 + .5 * .75 = .5; kappa = (.75 - .5) / (1 - .5)
    figures = agreement([1, 1, 0, 0], [1, 0, 0, 0])
    assert figures == {"agreement": 0.75, "kappa": pytest.approx(0.5), "compared": 4}
    assert agreement([1, 1], [1, 1])["kappa"] is None  # one label only: kappa undefined


def test_lara_calibration_step_fits_the_logistic_regression_by_hand():
    # logit(p) = 1 for four cases labelled 0,0,0,1 and = 3 for four labelled 1,1,1,0: the
    # (unregularised) maximum-likelihood fit is P = 1/4 at 1 and 3/4 at 3, i.e.
    # slope ln 3 and intercept -2 ln 3.
    p = [sigmoid(1.0)] * 4 + [sigmoid(3.0)] * 4
    calibrator = fit_calibrator(p, [0, 0, 0, 1, 1, 1, 1, 0], c=1e6)
    assert calibrator.slope == pytest.approx(math.log(3), rel=1e-3)
    assert calibrator.intercept == pytest.approx(-2 * math.log(3), rel=1e-3)
    assert calibrator(sigmoid(1.0)) == pytest.approx(0.25, abs=1e-3)
    assert calibrator(sigmoid(2.0)) == pytest.approx(0.5, abs=1e-3)
    assert logit(sigmoid(3.0)) == pytest.approx(3.0)


def test_lara_calibration_is_the_identity_until_both_classes_are_labelled():
    assert fit_calibrator([0.9, 0.8], [1, 1]) is IDENTITY
    assert IDENTITY(0.7) == pytest.approx(0.7)


def test_lara_escalates_the_least_confident_online_and_calibrates_the_rest():
    p = [0.9, 0.55, 0.1, 0.45, 0.8, 0.2]
    gold = [1, 0, 0, 1, 1, 0]
    outcome = lara(p, gold, 2 / 6, c=1e6)
    # first pick: closest to .5 under the identity, .55 (case 1, before .45 on the tie);
    # one class only -> still the identity; second pick .45 (case 3)
    assert outcome.order == [1, 3]
    assert outcome.escalated == [False, True, False, True, False, False]
    # the humans said .55 -> 0 and .45 -> 1: the fitted calibration inverts the scores
    assert outcome.calibrator.slope < 0
    assert outcome.labels == [0, None, 1, None, 0, 1]


def test_lara_escalates_failed_scores_first_and_keeps_them_in_the_budget():
    outcome = lara([None, 0.6, 0.9, 0.1], [1, 1, 1, 0], 0.5)
    assert outcome.order == [0, 1]
    assert outcome.labels == [None, None, 1, 0] and outcome.calibrated[0] is None
    assert lara([None, None, 0.9], [1, 0, 1], 0.0).escalated == [True, True, False]
