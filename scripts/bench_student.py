"""Benchmark: the student annotator's training and scoring time and memory on this machine.

Trains a student (the pipeline's default settings) on the labelled triplets of a gold set
(default the hard one, 224 labels), then scores N (query, chunk) pairs made from the gold
set's queries and chunks (every query against chunks drawn at random, seeded), and prints
the seconds of each and the process's peak resident memory. The issue's targets: training
under 10 minutes, 10,000 pairs scored under 2 minutes, under 3 GiB, on 2 cores.

With --dataset it trains on a lake's verified labels of that dataset instead, as the
pipeline's student_annotator does (max_labels sample included; nothing is written to the
lake), and scores the dataset's candidate pool, printing the scores by the pool pairs'
source in the refined qrels.

    .venv/bin/python scripts/bench_student.py [--gold resources/goldsets/nq_scifact_hard/goldset.jsonl]
        [--pairs 10000] [--epochs 4] [--base-model all-minilm-l6-v2] [--precisions float32,bfloat16] [--low-memory]
        [--labels N] [--max-length 256]

--precisions scores the same pairs once in each precision (one after the other, in this
process) instead of the settings' own, and prints each one's seconds and how far its
calibrated scores are from the first's.
    .venv/bin/python scripts/bench_student.py --dataset nq_open_mini [--lake data_lake]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import resource
import tempfile
import time
from pathlib import Path

from bridge_assets.student.model import (
    Example,
    Student,
    StudentSettings,
    assign_splits,
    scoring_precision,
    train_student,
    weights_hash,
)


def lake_dataset(lake: str | None, dataset: str, settings: StudentSettings) -> None:
    """Train on the lake's verified labels of `dataset`, score its candidate pool."""
    from collections import defaultdict

    from bridge_assets.labeling.pairs import load_pairs
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.student.annotator import training_set
    from bridge_assets.student.assets import READS

    store = DuckDBStore(data_lake=lake or "")
    with store.snapshot(dataset, READS["student_annotator"]) as con:
        examples = training_set(con, dataset).examples()
    parts = assign_splits(examples, settings)
    print(f"{dataset}: {len(examples)} verified labels, {sum(e.target == 1.0 for e in examples)} relevant; "
          f"max_labels {settings.max_labels}: " + ", ".join(f"{parts.count(p)} {p}" for p in sorted(set(parts))))
    started = time.perf_counter()
    student = train_student(examples, settings)
    after = student.report.held_out.get("after") or {}
    print(f"training: {student.report.trained_on} labels x {settings.epochs} epochs, calibration "
          f"({student.report.calibration}) on {student.report.calibrated_on}: "
          f"{time.perf_counter() - started:.1f} s; held-out ECE {after.get('ece', float('nan')):.3f}, "
          f"AUROC {after.get('auroc', float('nan')):.3f}")
    with store.snapshot(dataset, ("candidate_pool", "queries", "corpus", "bridge_qrels")) as con:
        pairs = load_pairs(con, dataset, "select distinct query_id, doc_id from candidate_pool "
                                         "where dataset = $dataset")
        source = {(q, d): f"{src} {'relevant' if r else 'not relevant' if r == 0 else '(pending)'}"
                  for q, d, r, src in con.execute("select query_id, doc_id, relevance, source from "
                                                  "bridge_qrels where dataset = ?", [dataset]).fetchall()}
    started = time.perf_counter()
    scores = student.score([(p.query, p.chunk) for p in pairs])
    print(f"scoring: {len(pairs)} pool pairs: {time.perf_counter() - started:.1f} s, "
          f"{sum(p >= 0.5 for p in scores)} at P(relevant) >= 0.5")
    by_source: dict[str, list[float]] = defaultdict(list)
    for pair, p in zip(pairs, scores):
        by_source[source.get((pair.query_id, pair.doc_id), "not in the qrels")].append(p)
    for name, values in sorted(by_source.items()):
        print(f"  {name}: {len(values)} pairs, P(relevant) mean {sum(values) / len(values):.3f}, "
              f"min {min(values):.3f}, max {max(values):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", default="resources/goldsets/nq_scifact_hard/goldset.jsonl")
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--labels", type=int, default=0, help="train on the gold set's first N labels only "
                        "(0: all; a smoke test's size)")
    parser.add_argument("--epochs", type=int, default=StudentSettings().epochs)
    parser.add_argument("--max-length", type=int, default=StudentSettings().max_length,
                        help="tokens of query + chunk the student reads")
    parser.add_argument("--base-model", default=StudentSettings().base_model,
                        help="the encoder it starts from (a model of resources/retrievers.yaml)")
    parser.add_argument("--low-memory", action="store_true", help="train with low_memory (the same "
                        "weights in about half the memory; their sha256 is printed to compare)")
    parser.add_argument("--dataset", help="train on this dataset's verified labels in the lake instead")
    parser.add_argument("--lake", help="the data lake folder (default: BRIDGE_DATA_LAKE, else data_lake/)")
    parser.add_argument("--precisions", default="", help="score in each of these (comma-separated: "
                        "float32, bfloat16), side by side, instead of the settings' own")
    args = parser.parse_args()
    if args.dataset:
        lake_dataset(args.lake, args.dataset, StudentSettings(epochs=args.epochs, base_model=args.base_model,
                                                              low_memory=args.low_memory, max_length=args.max_length))
        print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
        return

    rows = [json.loads(line) for line in Path(args.gold).read_text().splitlines() if line.strip()]
    rows = rows[:args.labels] if args.labels else rows
    examples = [Example(row["query"], row["query"], row["chunk"], float(row["label"]), "gold") for row in rows]
    settings = StudentSettings(epochs=args.epochs, base_model=args.base_model, low_memory=args.low_memory,
                               max_length=args.max_length)

    started = time.perf_counter()
    student = train_student(examples, settings)
    train_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:  # scored as the pipeline does: from its saved files
        student.save(Path(folder))
        weights = weights_hash(Path(folder))
        student = Student.load(Path(folder))
        rng = random.Random(0)
        queries, chunks = [row["query"] for row in rows], [row["chunk"] for row in rows]
        pairs = [(queries[i % len(queries)], rng.choice(chunks)) for i in range(args.pairs)]
        arms = [p.strip() for p in args.precisions.split(",") if p.strip()] or [student.settings.precision]
        scored = {}
        for precision in arms:
            arm = dataclasses.replace(student, settings=student.settings.model_copy(update={"precision": precision}))
            started = time.perf_counter()
            scored[precision] = (arm.score(pairs), time.perf_counter() - started)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

    print(f"training ({settings.base_model}): {len(examples)} labels x {settings.epochs} epochs "
          f"({student.report.trained_on} trained on, {student.report.calibrated_on} calibrated on): "
          f"{train_seconds:.1f} s{' (low_memory)' if settings.low_memory else ''}; weights sha256 {weights}")
    first = next(iter(scored.values()))[0]
    for precision, (scores, seconds) in scored.items():
        apart = [abs(a - b) for a, b in zip(scores, first)]
        print(f"scoring in {precision} ({scoring_precision(precision)} here): {len(scores)} pairs: {seconds:.1f} s "
              f"({len(scores) / seconds:.0f} pairs/s); calibrated P against {arms[0]}'s: mean |diff| "
              f"{sum(apart) / len(apart):.5f}, max {max(apart):.5f}, same side of 0.5 "
              f"{sum((a >= 0.5) == (b >= 0.5) for a, b in zip(scores, first)):,}/{len(scores):,}")
    print(f"peak memory: {peak_gib:.2f} GiB")


if __name__ == "__main__":
    main()
