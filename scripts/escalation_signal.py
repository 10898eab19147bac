"""Measure a score as an escalation signal for a labeler's decisions, beside LARA at the same
escalation, from `bridge label-eval --items` files (no model call).

    G=resources/goldsets/nq_scifact_hard/goldset.jsonl
    # the gold set's test half: the queries of student fold 1 (2 folds, seed 0)
    .venv/bin/python scripts/escalation_signal.py --write-test-half $G test_half.jsonl
    # the pipeline's labeler on it (the 1.5B filter, then DREAM), and the 1.5B's P(yes)
    bridge label-eval --gold test_half.jsonl --method dream --profile qwen-1.5b --threads 1 \
        --set reason_words=30 --prefilter qwen-1.5b --items dream.jsonl
    bridge label-eval --gold test_half.jsonl --method diras --profile qwen-1.5b --threads 1 --items pyes.jsonl
    # the students over the whole gold set: the test half is scored by students trained on fold 0
    bridge label-eval --gold $G --method student --items student.jsonl
    .venv/bin/python scripts/escalation_signal.py --labels dream.jsonl --lara pyes.jsonl \
        --signal student=student.jsonl --signal pyes=pyes.jsonl [--scope consensus|decided]

Prints two markdown tables: how well each signal ranks the triplets (AUROC, and its difference
from LARA's P(yes), with paired 95% intervals); then, with --labels, per signal and rule,
the escalation, the decided bAcc with its 95% interval, LARA's at the same escalation, and the
paired interval of the difference. Without --labels, only the first table, over the triplets of
the --lara file (e.g. the whole gold set).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bridge_assets.evaluation.goldsets import read_goldset
from bridge_assets.evaluation.runner import read_items
from bridge_assets.evaluation.scores import auroc, auroc_intervals
from bridge_assets.student.escalation import EscalationRow, escalation_study
from bridge_assets.student.labeler import query_folds

CONFIDENCES = (0.6, 0.7, 0.8, 0.9, 0.95)
UP_TO = (0.15, 0.2)
REFERENCE = "P(yes) of --lara"  # the scores LARA calibrates, the baseline of both tables


def write_test_half(gold: Path, out: Path, *, folds: int = 2, seed: int = 0, fold: int = 1) -> int:
    """The gold set's triplets of one student query fold (as `--method student` deals them)."""
    items = [t.item() for t in read_goldset(gold)]
    kept = {item.id for item, f in zip(items, query_folds(items, folds, seed), strict=True) if f == fold}
    lines = [line for line in gold.read_text(encoding="utf-8").splitlines()
             if line.strip() and json.loads(line)["id"] in kept]
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _interval(ci: tuple[float | None, float | None]) -> str:
    return "-" if ci[0] is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def markdown(rows: list[EscalationRow]) -> str:
    lines = ["| signal | rule | escalated (by signal) | decided bAcc [95% CI] | LARA at the same "
             "[95% CI] | difference [95% CI] |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.signal or '(labeler alone)'} | {row.rule or '-'} | "
                     f"{row.escalated} of {row.n}, {_percent(row.escalation_ratio)}% ({row.by_signal}) | "
                     f"{_percent(row.bacc)} {_interval(row.bacc_ci)} | {_percent(row.lara_bacc)} "
                     f"{_interval(row.lara_ci)} | {_percent(row.difference)} {_interval(row.difference_ci)} |")
    return "\n".join(lines)


def auroc_table(gold: list[int], scores: dict[str, list[float]], reference: str) -> str:
    lines = [f"| signal | AUROC [95% CI] | minus {reference}'s [95% CI] |", "|---|---|---|"]
    baseline = auroc(gold, scores[reference])
    for name, score in scores.items():
        (low, high), (diff_low, diff_high) = auroc_intervals(gold, score, scores[reference])
        value = auroc(gold, score)
        lines.append(f"| {name} | {value:.3f} [{low:.3f}, {high:.3f}] | "
                     f"{value - baseline:+.3f} [{diff_low:+.3f}, {diff_high:+.3f}] |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-test-half", nargs=2, type=Path, metavar=("GOLD", "OUT"),
                        help="write the gold set's test half (student query fold 1 of 2, seed 0) and stop")
    parser.add_argument("--labels", type=Path, help="label-eval --items of the labeler studied")
    parser.add_argument("--lara", type=Path, help="label-eval --items of a P(yes) scorer (diras): LARA's scores")
    parser.add_argument("--signal", action="append", default=[], metavar="NAME=FILE",
                        help="label-eval --items whose score is the signal (repeatable)")
    parser.add_argument("--confidences", default=",".join(map(str, CONFIDENCES)),
                        help="escalate every label the signal contradicts at this P or more")
    parser.add_argument("--up-to", default=",".join(map(str, UP_TO)),
                        help="escalate the most contradicted labels until this share is escalated in all")
    parser.add_argument("--scope", choices=("consensus", "decided"), default="consensus",
                        help="labels a signal may escalate: the debate's (not the filter's 'no'), or every decided one")
    args = parser.parse_args()
    if args.write_test_half:
        gold, out = args.write_test_half
        print(f"{write_test_half(gold, out)} triplets -> {out}")
        return
    if not (args.lara and args.signal):
        parser.error("give --lara and at least one --signal (and --labels for the escalation table), "
                     "or --write-test-half")
    scorers = {REFERENCE: read_items(args.lara)}
    for text in args.signal:
        name, _, path = text.partition("=")
        scorers[name] = read_items(Path(path))
    labeled = read_items(args.labels) if args.labels else scorers[REFERENCE]
    ids = list(labeled)
    for name, scored in scorers.items():
        if missing := [i for i in ids if i not in scored or scored[i]["score"] is None]:
            parser.error(f"{name}: no score for {len(missing)} of the triplets studied (e.g. {missing[0]})")
    gold = [labeled[i]["gold"] for i in ids]
    scores = {name: [scored[i]["score"] for i in ids] for name, scored in scorers.items()}
    print(f"{args.labels or args.lara}: {len(ids)} triplets\n")
    print(auroc_table(gold, scores, REFERENCE))
    if not args.labels:
        return
    labels = [labeled[i]["label"] for i in ids]
    eligible = [args.scope == "decided" or labeled[i]["detail"] != "filtered" for i in ids]
    rows = escalation_study(gold, labels, {name: score for name, score in scores.items() if name != REFERENCE},
                            scores[REFERENCE], confidences=[float(c) for c in args.confidences.split(",") if c],
                            up_to=[float(r) for r in args.up_to.split(",") if r], eligible=eligible)
    print(f"\nescalation, scope {args.scope}\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
