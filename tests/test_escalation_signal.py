"""A score as an escalation signal (bridge_assets/student/escalation.py): what it escalates, and
the LARA row it stands beside."""

from __future__ import annotations

import json

import pytest

from bridge_assets.evaluation.lara import lara
from bridge_assets.student.escalation import (
    contradiction,
    decided_bacc,
    difference_interval,
    escalate_contradicted,
    escalate_most_contradicted,
    escalation_study,
)

GOLD = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0] * 3
# the labeler: right but for one "yes" on an irrelevant pair and one "no" on a relevant one
# per ten, and one case it escalated itself
LABELS = [1, 1, 1, 1, 0, 1, 0, 0, 0, None] * 3
P_YES = [0.9, 0.8, 0.7, 0.6, 0.55, 0.45, 0.4, 0.3, 0.2, 0.1] * 3


def test_a_signal_escalates_only_the_decided_labels_it_contradicts_with_confidence():
    assert contradiction(1, 0.2) == pytest.approx(0.8) and contradiction(0, 0.8) == 0.8
    labels, signal = [1, 0, 1, None, 0], [0.1, 0.95, 0.5, 0.0, None]
    assert escalate_contradicted(labels, signal, 0.9) == [None, None, 1, None, 0]  # no score: kept
    assert escalate_contradicted([1], [0.2], 0.8) == [None]  # 0.8 reaches 0.8 (no float slip)
    # only where eligible (e.g. the debate's consensus, not the filter's "no")
    assert escalate_contradicted(labels, signal, 0.9, [True, False, True, True, True]) == [None, 0, 1, None, 0]


def test_up_to_a_ratio_the_most_contradicted_labels_go_first_however_close_to_a_half():
    # a student whose calibrated scores crowd near 0.5: no confidence reaches them, its order does
    labels = [1, 1, 0, 0, None, 1, 0, 1, 0, 1]
    signal = [0.47, 0.495, 0.51, 0.499, 0.0, 0.5, 0.45, 0.8, 0.54, 0.48]
    assert escalate_contradicted(labels, signal, 0.6) == labels
    # 40% of 10 = 4 escalated in all: 1 already, then the 3 most contradicted (0.54, 0.53, 0.52)
    assert escalate_most_contradicted(labels, signal, 0.4) == [None, 1, 0, 0, None, 1, 0, 1, None, None]
    # only contradictions above one half (5 here: 0.5 on a "yes" is none), however large the budget
    assert escalate_most_contradicted(labels, signal, 1.0).count(None) == 1 + 5
    assert escalate_most_contradicted(labels, signal, 0.05) == labels  # already past the ratio


def test_a_perfect_signal_escalates_exactly_the_labelers_errors():
    rows = escalation_study(GOLD, LABELS, {"oracle": [float(g) for g in GOLD]}, P_YES, confidences=[0.9],
                            up_to=[0.2])
    alone, oracle, budget = rows
    assert (alone.signal, alone.rule, alone.escalated, alone.by_signal) == ("", "", 3, 0)
    assert (oracle.rule, budget.rule, budget.escalated, budget.by_signal) == ("P >= 0.9", "up to 20%", 6, 3)
    assert alone.bacc == pytest.approx(decided_bacc(GOLD, LABELS)) and alone.bacc < 1
    assert (oracle.escalated, oracle.by_signal, oracle.bacc) == (9, 6, 1.0)
    # beside LARA escalating as many cases, from the same P(yes)
    baseline = lara(P_YES, GOLD, 9 / 30)
    assert sum(baseline.escalated) == 9
    assert oracle.lara_bacc == pytest.approx(decided_bacc(GOLD, baseline.labels))
    assert oracle.difference == pytest.approx(oracle.bacc - oracle.lara_bacc)
    low, high = oracle.difference_ci
    assert low <= oracle.difference <= high


def test_the_difference_interval_is_paired_and_none_where_undefined():
    assert difference_interval(GOLD, LABELS, LABELS) == (0.0, 0.0)  # the same decisions: no spread
    assert difference_interval(GOLD, [None] * 30, LABELS) == (None, None)  # nothing decided


def test_the_script_reads_label_eval_items_and_refuses_missing_scores(tmp_path, monkeypatch, capsys):
    import runpy
    import sys

    def items(name, labels, scores, details=None):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"method": name, "id": f"t{i}", "domain": None, "gold": g, "label": label,
                                            "escalated": label is None, "resolved": None, "score": s,
                                            "detail": (details or {}).get(i)}) + "\n"
                                for i, (g, label, s) in enumerate(zip(GOLD, labels, scores, strict=True))))
        return path

    # the labeler's first "no" is the filter's: out of the consensus scope
    labeled = items("dream", LABELS, [None] * 30, {4: "filtered"})
    pyes = items("diras", [int(p >= 0.5) for p in P_YES], P_YES)
    oracle = items("oracle", GOLD, [float(g) for g in GOLD])
    argv = ["escalation_signal.py", "--labels", str(labeled), "--lara", str(pyes), "--signal", f"oracle={oracle}",
            "--confidences", "0.9", "--up-to", ""]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path("scripts/escalation_signal.py", run_name="__main__")
    table = capsys.readouterr().out
    assert "| (labeler alone) | - | 3 of 30, 10.0% (0) |" in table
    assert "| oracle | P >= 0.9 | 8 of 30, 26.7% (5) |" in table  # the filtered "no" stays
    assert "| oracle | 1.000 [1.000, 1.000] | +0.000 [+0.000, +0.000] |" in table  # AUROC; minus P(yes)'s
    assert "| P(yes) of --lara | 1.000 [1.000, 1.000] |" in table
    (tmp_path / "short.jsonl").write_text(oracle.read_text().splitlines()[0] + "\n")
    monkeypatch.setattr(sys, "argv", argv[:-6] + ["--signal", f"short={tmp_path / 'short.jsonl'}"])
    with pytest.raises(SystemExit):
        runpy.run_path("scripts/escalation_signal.py", run_name="__main__")
    assert "short: no score for 29 of the triplets studied" in capsys.readouterr().err
