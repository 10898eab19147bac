"""Measure the student as a pre-filter: per threshold, the LLM filter calls it would save and
the relevant pairs it would lose, on a gold set and/or on a dataset's lake.

    # a gold set: out-of-fold student scores (2 query folds), relevant = the gold label
    .venv/bin/python scripts/student_prefilter.py --gold resources/goldsets/nq_scifact_hard/goldset.jsonl
    # a dataset after `bridge run`: the pairs the filter saw, scored by students trained on the
    # verified labels of the other queries; relevant = the dataset's known holes
    .venv/bin/python scripts/student_prefilter.py --dataset demo

Prints one table per source (markdown): threshold, pairs skipped (share), relevant pairs lost
with a 95% Wilson interval. --limit (the gold set's first N triplets), --epochs and --max-length
(the students' training epochs and tokens read) make a run small.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bridge_assets.labeling.labeler import LabelItem
from bridge_assets.labeling.pairs import Pair
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.qrels.known_holes import read_known_holes
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.student.labeler import StudentLabelerSettings, cross_fitted_scores
from bridge_assets.student.prefilter import THRESHOLDS, ThresholdRow, lake_study, threshold_table


def markdown(rows: list[ThresholdRow], calls_per_pair: int = 1) -> str:
    lines = ["| threshold | pairs | skipped (share) | filter calls saved | relevant | lost (share) [95% CI] |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lost = "-" if row.lost_share is None else (
            f"{row.relevant_lost} ({100 * row.lost_share:.1f}%) "
            f"[{100 * row.lost_ci[0]:.1f}, {100 * row.lost_ci[1]:.1f}]")
        lines.append(f"| {row.threshold:g} | {row.pairs} | {row.skipped} ({100 * row.skipped_share:.1f}%) | "
                     f"{row.skipped * calls_per_pair} | {row.relevant} | {lost} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", type=Path, help="a gold set (JSONL of the label-eval format)")
    parser.add_argument("--dataset", help="a dataset of the lake, after `bridge run`")
    parser.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    parser.add_argument("--limit", type=int, default=0, help="--gold: only its first N triplets (0: all)")
    parser.add_argument("--epochs", type=int, default=StudentLabelerSettings.model_fields["epochs"].default,
                        help="the students' training epochs")
    parser.add_argument("--max-length", type=int,
                        default=StudentLabelerSettings.model_fields["max_length"].default,
                        help="tokens of query + chunk a student reads")
    args = parser.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    settings = StudentLabelerSettings(labeler="student", epochs=args.epochs, max_length=args.max_length)
    if args.gold:
        rows = [json.loads(line) for line in args.gold.read_text().splitlines() if line.strip()]
        rows = rows[:args.limit] if args.limit else rows
        items = [LabelItem(row["id"], Pair(row["query"], row["id"], row["query"], tuple(row.get("answers", ())),
                                           row["chunk"]), int(row["label"])) for row in rows]
        scores, _ = cross_fitted_scores(items, items, settings)
        print(f"## {args.gold} (out-of-fold scores, relevant = gold label)\n")
        print(markdown(threshold_table(scores, [item.gold == 1 for item in items], thresholds)))
    if args.dataset:
        spec = get_dataset(args.dataset)
        if not spec.known_holes:
            parser.error(f"dataset {args.dataset} names no known_holes: nothing to count lost pairs against")
        holes = read_known_holes(spec.resolve(spec.known_holes, "known_holes"))
        tables = ("bridge_qrels", "debate_labels", "filtered_pool", "filter_votes", "queries", "corpus")
        with DuckDBStore().snapshot(args.dataset, tables) as con:
            study = lake_study(con, args.dataset, holes, settings, thresholds)
        print(f"\n## {args.dataset} (the pairs the filter saw; relevant = known holes; "
              f"{study.filter_models} filter model(s) per pair)\n")
        print(markdown(study.rows, study.filter_models))


if __name__ == "__main__":
    main()
