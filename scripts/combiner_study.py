"""Measure the calibrated combiner (bridge_assets/student/combiner.py) on a gold set, against one
of its signals alone, from per-pair score files (no model call).

    G=resources/goldsets/diras_silver/goldset.jsonl
    bridge label-eval --gold $G --method diras --profile qwen-1.5b --threads 1 --set definition=useful --items pyes.jsonl
    .venv/bin/python scripts/general_student.py --load STUDENT --gold $G --items scores/
    .venv/bin/python scripts/combiner_study.py --gold $G --signal pyes=pyes.jsonl \
        --signal student=scores/diras_silver.student.items.jsonl [--answer-check] [--folds 5] \
        [--fit resources/goldsets/diras_silver/calibration.jsonl] [--json out.json]

With --fit, the combiner is fitted on that gold set's pairs (other queries: the silver set's
calibration questions) and measured on --gold; without, every pair is scored by a combiner
fitted on the other folds' queries (cross-fitting: folds keep a query whole, seeded). Either
way the figures are out of sample. A --signal file may hold the scores of both sets. Prints a markdown table: each signal
alone and the combiner, with AUROC and its paired difference from the reference signal (the
first --signal) with percentile bootstrap 95% intervals, ECE and Brier where the score is a
probability. --answer-check adds the answer check (does the passage contain one of the query's
answer strings) as a signal. Only pairs every --signal file scores are used.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bridge_assets.evaluation.goldsets import read_goldset
from bridge_assets.evaluation.runner import item_scores
from bridge_assets.evaluation.scores import auroc, auroc_intervals, brier_score, expected_calibration_error
from bridge_assets.labeling.evidence import answer_in_chunk
from bridge_assets.student.combiner import cross_fitted, fit_combiner


def row(name: str, gold: list[int], score: list[float], reference: list[float], probability: bool) -> dict:
    (low, high), (dlow, dhigh) = auroc_intervals(gold, score, reference)
    value = auroc(gold, score)
    return {"signal": name, "auroc": (value, low, high), "difference": (value - auroc(gold, reference), dlow, dhigh),
            "ece": expected_calibration_error(gold, score) if probability else None,
            "brier": brier_score(gold, score) if probability else None}


def markdown(rows: list[dict], reference: str) -> str:
    lines = [f"| signal | AUROC [95% CI] | minus {reference} [95% CI] | ECE | Brier |", "|---|---|---|---|---|"]
    for r in rows:
        a, d = r["auroc"], r["difference"]
        ece = "-" if r["ece"] is None else f"{r['ece']:.3f}"
        brier = "-" if r["brier"] is None else f"{r['brier']:.3f}"
        lines.append(f"| {r['signal']} | {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}] | "
                     f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] | {ece} | {brier} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", type=Path, required=True)
    parser.add_argument("--signal", action="append", required=True, help="NAME=ITEMS (the first is the reference)")
    parser.add_argument("--answer-check", action="store_true")
    parser.add_argument("--fit", type=Path, help="Fit the combiner on this gold set's pairs.")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    scores = {name: item_scores(Path(path)) for name, _, path in (s.partition("=") for s in args.signal)}
    names = list(scores) + (["answer_check"] if args.answer_check else [])

    def pairs(path: Path) -> tuple[list, list[int], list[dict]]:
        triplets = [t for t in read_goldset(path) if all(str(t.id) in s for s in scores.values())]
        signals = [{n: scores[n][str(t.id)] for n in scores} for t in triplets]
        if args.answer_check:
            for s, t in zip(signals, triplets):
                s["answer_check"] = float(answer_in_chunk(t.answers, t.chunk))
        return triplets, [int(t.label > 0) for t in triplets], signals

    triplets, gold, signals = pairs(args.gold)
    groups = [t.query for t in triplets]
    reference = [s[names[0]] for s in signals]
    if args.fit:
        _, fit_gold, fit_signals = pairs(args.fit)

        def combined(used: list[str]) -> list[float]:
            return fit_combiner(fit_signals, fit_gold, [True] * len(fit_gold), used).probabilities(signals)
        how = f"fitted on {args.fit} ({len(fit_gold)} pairs, {sum(fit_gold)} relevant)"
    else:
        def combined(used: list[str]) -> list[float]:
            return cross_fitted(signals, gold, groups, used, folds=args.folds, seed=args.seed)
        fit_gold, fit_signals = gold, signals
        how = f"cross-fitted over {args.folds} query folds (seed {args.seed})"

    rows = [row(n, gold, [s[n] for s in signals], reference, probability=n != "answer_check") for n in names]
    for n in names:  # one signal through the regression: its own recalibration
        rows.append(row(f"{n}, recalibrated", gold, combined([n]), reference, True))
    rows.append(row("combiner (" + " + ".join(names) + ")", gold, combined(names), reference, True))
    weights = fit_combiner(fit_signals, fit_gold, [True] * len(fit_gold), names).weights()
    print(f"{args.gold}: {len(triplets)} pairs ({sum(gold)} relevant), {len(set(groups))} queries; combiner {how}")
    print(markdown(rows, names[0]))
    print(f"combiner's standardised weights: {weights}")
    if args.json:
        args.json.write_text(json.dumps({"gold": str(args.gold), "n": len(gold), "relevant": sum(gold), "fit": how,
                                         "rows": rows, "weights": weights}, indent=2))


if __name__ == "__main__":
    main()
