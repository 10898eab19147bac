"""Benchmark: the annotation app's work per page, in process, called as its routes call it (what
`GET /annotate` and `POST /annotate` run in their database thread, each on a short connection:
the item chosen and loaded, the annotator's progress; then the vote recorded), without HTTP and
templates.

Writes --pairs escalated pairs (each with a two-round debate) into a fresh lake, adds
--annotators annotators, then each votes --votes times in turn; prints the page's and the vote's
mean, median and 95th percentile, and a checksum of the progress every page showed (the same
figures from two versions of the code mean the same pages).

    .venv/bin/python scripts/bench_annotation_page.py [--pairs 200 --annotators 3 --votes 30]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

PROJECT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(PROJECT), str(PROJECT / "tests")]


def quantile_95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--annotators", type=int, default=3)
    parser.add_argument("--votes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-page-") as folder:
        run(Path(folder), args.pairs, args.annotators, args.votes)


def run(lake: Path, pairs: int, annotators: int, rounds: int) -> None:
    os.environ["BRIDGE_DATA_LAKE"] = str(lake)

    from bridge_assets.human.annotators import add_annotator
    from bridge_assets.human.app import AppSettings
    from bridge_assets.human.app.annotation import annotation_page
    from bridge_assets.human.app.state import AppState
    from bridge_assets.human.votes import record_vote
    from bridge_assets.lake.location import lake_location
    from fixtures.escalated_pairs import write_escalated_pairs
    from fixtures.paths import annotations

    write_escalated_pairs("bench", pairs)
    with annotations() as con:
        people = [f"a{i}" for i in range(annotators)]
        for name in people:
            add_annotator(con, name)
    state = AppState(AppSettings(lake=lake_location(lake), secret="bench-page-secret-0123456789",
                                 attention_rate=0.0), time.time)
    page = getattr(state.db, "page", state.db.run)  # as the app calls it (run before 2026-11-29)
    pages, votes, shown = [], [], 0
    for n in range(rounds):
        for who in people:
            started = time.perf_counter()
            item, progress = anyio.run(page, annotation_page, state, who)
            pages.append(time.perf_counter() - started)
            shown += progress.remaining_for_you + progress.labelled + progress.decided_pairs
            started = time.perf_counter()
            anyio.run(functools.partial(state.db.votes, record_vote, assignment_id=item.assignment_id,
                                        annotator_id=who, label=n % 2, comment=None))
            votes.append(time.perf_counter() - started)
    print(f"{pairs} escalated pairs, {annotators} annotators x {rounds} votes")
    for name, times in (("page", pages), ("vote", votes)):
        print(f"{name}: mean {statistics.mean(times) * 1000:.0f} ms, median {statistics.median(times) * 1000:.0f} ms, "
              f"p95 {quantile_95(times) * 1000:.0f} ms ({len(times)})")
    print(f"progress checksum {shown}")


if __name__ == "__main__":
    main()
