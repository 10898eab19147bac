"""Benchmark: the student annotator's training and scoring time and memory on this machine.

Trains a student (the pipeline's default settings) on the labelled triplets of a gold set
(default the hard one, 224 labels), then scores N (query, chunk) pairs made from the gold
set's queries and chunks (every query against chunks drawn at random, seeded), and prints
the seconds of each and the process's peak resident memory. The issue's targets: training
under 10 minutes, 10,000 pairs scored under 2 minutes, under 3 GiB, on 2 cores.

    .venv/bin/python scripts/bench_student.py [--gold resources/goldsets/nq_scifact_hard/goldset.jsonl]
        [--pairs 10000] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from pathlib import Path

from bridge_assets.student.model import Example, Student, StudentSettings, train_student


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", default="resources/goldsets/nq_scifact_hard/goldset.jsonl")
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=StudentSettings().epochs)
    args = parser.parse_args()

    rows = [json.loads(line) for line in Path(args.gold).read_text().splitlines() if line.strip()]
    examples = [Example(row["query"], row["query"], row["chunk"], float(row["label"]), "gold") for row in rows]
    settings = StudentSettings(epochs=args.epochs)

    started = time.perf_counter()
    student = train_student(examples, settings)
    train_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:  # scored as the pipeline does: from its saved files
        student.save(Path(folder))
        student = Student.load(Path(folder))
        rng = random.Random(0)
        queries, chunks = [row["query"] for row in rows], [row["chunk"] for row in rows]
        pairs = [(queries[i % len(queries)], rng.choice(chunks)) for i in range(args.pairs)]
        started = time.perf_counter()
        scores = student.score(pairs)
        score_seconds = time.perf_counter() - started
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

    print(f"training: {len(examples)} labels x {settings.epochs} epochs "
          f"({student.report.trained_on} trained on, {student.report.calibrated_on} calibrated on): "
          f"{train_seconds:.1f} s")
    print(f"scoring: {len(scores)} pairs: {score_seconds:.1f} s ({len(scores) / score_seconds:.0f} pairs/s)")
    print(f"peak memory: {peak_gib:.2f} GiB")


if __name__ == "__main__":
    main()
