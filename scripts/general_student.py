"""Train the general student on the teacher's labels and measure it (issue "A first reader
learned from a strong teacher").

Trains a student cross-encoder on the DIRAS teacher data's *train* questions
(bridge_assets.student.teacher), calibrates it (Platt) on the *calibration* questions, saves it,
then scores and prints, each with percentile bootstrap 95% intervals (2,000 resamples, seed 0):
AUROC, bAcc, ECE and Brier on
- the teacher data's *test* questions (GPT-4's labels: agreement with the teacher);
- every gold set given with --gold (people's labels where the set has them);
and, where --reference names a `bridge label-eval --items` file of the same gold set (the
`diras` labeler's P(yes), one 1.5B call a pair), the same figures for that reference on the
same pairs and the paired AUROC difference. The student's bAcc is at the threshold that
maximises it on the calibration questions (its calibrated P rarely reaches 0.5: a quarter of the
teacher's pairs are relevant); the reference's at its own 0.5. Wall time of training and
scoring, and the process's peak memory.

    .venv/bin/python scripts/general_student.py --out data_lake/students/general-minilm \
        [--base-model all-minilm-l6-v2] [--epochs 1] [--max-length 128] [--batch-size 16] \
        [--teacher-weight 0] [--max-labels 5000] \
        [--gold resources/goldsets/diras_silver/goldset.jsonl=silver.items.jsonl] \
        [--gold resources/goldsets/nq_scifact_hard/goldset.jsonl] [--json out.json]

--gold FILE[=ITEMS]: a gold set, and optionally the items file of a reference labeler on it.
--teacher-pairs N: measure on the first N pairs (file order) of the calibration and of the test
questions only (default: all of them; a smoke test's size).
--load FOLDER: score a student saved before instead of training one.
--items DIR: write each gold set's per-pair student P, `<gold set folder>[-<file>].student.items.jsonl`
(the `bridge label-eval --items` shape: id, gold, score), for scripts/combiner_study.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import time
from pathlib import Path

import numpy as np

from bridge_assets.evaluation.goldsets import read_goldset
from bridge_assets.evaluation.runner import item_scores
from bridge_assets.evaluation.scores import (
    auroc,
    auroc_intervals,
    balanced_accuracies,
    brier_score,
    expected_calibration_error,
)
from bridge_assets.student.model import Student, StudentSettings, train_student, weights_hash
from bridge_assets.student.teacher import question_id, split_questions, teacher_examples

RESAMPLES = 2000


def bootstrap(gold: list[int], score: list[float], statistic) -> tuple[float, float, float]:
    """(value, low, high): `statistic(gold, score)` and its percentile bootstrap interval,
    cases resampled (seeded); resamples without both classes are skipped."""
    rng = np.random.default_rng(0)
    g, s = np.asarray(gold), np.asarray(score, dtype=float)
    values = []
    for _ in range(RESAMPLES):
        pick = rng.integers(0, len(g), len(g))
        if 0 < g[pick].sum() < len(pick):
            values.append(statistic(g[pick], s[pick]))
    return float(statistic(g, s)), float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def statistics(threshold: float) -> dict:
    return {
        "auroc": lambda g, s: auroc(list(g), list(s)),
        "bacc": lambda g, s: float(balanced_accuracies(g, (s >= threshold).astype(int))),
        "ece": lambda g, s: expected_calibration_error(list(g), list(s)),
        "brier": lambda g, s: brier_score(list(g), list(s)),
    }


def figures(gold: list[int], score: list[float], threshold: float = 0.5) -> dict:
    return {"n": len(gold), "relevant": int(sum(gold)), "threshold": threshold,
            **{name: bootstrap(gold, score, statistic) for name, statistic in statistics(threshold).items()}}


def best_threshold(gold: list[int], score: list[float]) -> float:
    """The score at or above which a pair is called relevant that maximises bAcc (ties: the
    lowest such score)."""
    g, s = np.asarray(gold), np.asarray(score, dtype=float)
    candidates = np.unique(s)
    accuracies = [float(balanced_accuracies(g, (s >= t).astype(int))) for t in candidates]
    return float(candidates[int(np.argmax(accuracies))])


def line(name: str, result: dict) -> str:
    cells = [f"{k} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for k, v in result.items() if isinstance(v, tuple)]
    cells[1] += f" (P >= {result['threshold']:.3f})"
    return f"  {name} (n {result['n']}, {result['relevant']} relevant): " + "; ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="Save the trained student here.")
    parser.add_argument("--load", type=Path, help="Score the student saved here (no training).")
    parser.add_argument("--base-model", default="all-minilm-l6-v2")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--teacher-weight", type=float, default=0.0)
    parser.add_argument("--max-labels", type=int, default=5000)
    parser.add_argument("--teacher-pairs", type=int, default=0,
                        help="Measure on the first N calibration and N test pairs only (0: all).")
    parser.add_argument("--gold", action="append", default=[], help="FILE[=ITEMS]")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--items", type=Path, help="Write per-pair scores of each gold set here.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    report: dict = {}
    started = time.perf_counter()
    if args.load:
        student = Student.load(args.load)
        print(f"loaded {args.load} (weights {weights_hash(args.load)})")
    else:
        settings = StudentSettings(base_model=args.base_model, epochs=args.epochs, max_length=args.max_length,
                                   batch_size=args.batch_size, learning_rate=args.learning_rate,
                                   teacher_weight=args.teacher_weight, max_labels=args.max_labels)
        examples = teacher_examples("train", "calibration")
        calibration = {question_id(q) for q in split_questions()["calibration"]}
        print(f"training on {sum(e.query_id not in calibration for e in examples)} teacher pairs, calibrating "
              f"on {sum(e.query_id in calibration for e in examples)}: {settings.model_dump()}", flush=True)
        student = train_student(examples, settings, calibration_queries=calibration)
        report["training"] = {"settings": settings.model_dump(), "trained_on": student.report.trained_on,
                              "calibrated_on": student.report.calibrated_on,
                              "calibration": student.report.calibration,
                              "held_out": student.report.held_out,
                              "seconds": round(time.perf_counter() - started, 1)}
        print(f"trained in {report['training']['seconds']:.0f} s on {student.report.trained_on} pairs; "
              f"calibration {student.report.calibration} on {student.report.calibrated_on}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            student.save(args.out)
            report["training"]["weights"] = weights_hash(args.out)
            print(f"saved to {args.out} (weights {report['training']['weights']})")

    limit = args.teacher_pairs or None
    calibration_pairs = teacher_examples("calibration")[:limit]
    threshold = best_threshold([int(e.target) for e in calibration_pairs],
                               student.score([(e.query, e.chunk) for e in calibration_pairs]))
    report["threshold"] = threshold
    print(f"bAcc threshold (best on the {len(calibration_pairs)} calibration pairs): P >= {threshold:.3f}")
    test = teacher_examples("test")[:limit]
    scoring = time.perf_counter()
    scores = student.score([(e.query, e.chunk) for e in test])
    seconds = time.perf_counter() - scoring
    report["teacher_test"] = figures([int(e.target) for e in test], scores, threshold)
    report["teacher_test"]["seconds"] = round(seconds, 1)
    print(f"teacher data, test questions ({len(test)} pairs scored in {seconds:.1f} s, "
          f"{len(test) / seconds:.0f} pairs/s), against GPT-4's labels:")
    print(line("student", report["teacher_test"]))

    for spec in args.gold:
        gold_path, _, items = spec.partition("=")
        triplets = read_goldset(Path(gold_path))
        gold = [int(t.label > 0) for t in triplets]
        student_scores = student.score([(t.query, t.chunk) for t in triplets])
        entry = {"student": figures(gold, student_scores, threshold)}
        if args.items:
            args.items.mkdir(parents=True, exist_ok=True)
            rows = [{"method": "student", "id": t.id, "gold": g, "score": s}
                    for t, g, s in zip(triplets, gold, student_scores)]
            stem = Path(gold_path).stem
            name = Path(gold_path).parent.name + ("" if stem == "goldset" else f"-{stem}")
            (args.items / f"{name}.student.items.jsonl").write_text(
                "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        print(f"{gold_path}:")
        print(line("student", entry["student"]))
        if items:
            reference = item_scores(Path(items))
            kept = [i for i, t in enumerate(triplets) if str(t.id) in reference]
            g = [gold[i] for i in kept]
            s = [student_scores[i] for i in kept]
            r = [reference[str(triplets[i].id)] for i in kept]
            entry["reference"] = figures(g, r)
            _, (low, high) = auroc_intervals(g, s, r)
            entry["auroc_difference"] = (auroc(g, s) - auroc(g, r), low, high)
            print(line(f"reference ({items})", entry["reference"]))
            print(f"  student - reference AUROC on the same {len(kept)} pairs: "
                  f"{entry['auroc_difference'][0]:+.3f} [{low:+.3f}, {high:+.3f}]")
        report[gold_path] = entry
    report["peak_memory_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(f"wall {report['wall_seconds']:.0f} s; peak memory {report['peak_memory_gib']:.2f} GiB")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
