"""Benchmark: BRIDGE's metrics vs pytrec_eval vs ranx on the same data (and BRIDGE's previous implementation).

The paper's scale, synthetic: 25 systems x 3,657 queries x top-10 (914,250 run rows), about
37,000 relevant pairs (graded 1-3) plus judged non-relevant ones. Every tool starts from the
same data: by default (--source tables) the run and the qrels as tables of an in-memory DuckDB,
which is how the pipeline's assets hold the lake's rows (`dataset_snapshot`); with --source
frames, from polars frames. Each tool is timed with its own input conversion (what a user pays:
pytrec_eval and ranx read the tables and build their nested dicts) and for the evaluation
alone, wall-clock and CPU (all threads), best of --repeat runs, the tools taking turns. Values are
asserted equal per query (1e-9) for every shared measure. Scores are distinct, also as the C
floats trec_eval keeps them as, so ranx's unstable tie order (and its doubles) cannot matter;
ranx's numba kernels are compiled before timing.
--layout ties-ascending rounds the scores to 0.1 and stores each ranking's ties by doc id
ascending, as BRIDGE keeps its own runs (ranx is left out then), --layout shuffled scatters
the rows; the default stores them in trec_eval's order.

--previous REV also times BRIDGE's metrics as of git revision REV (its bridge_assets and sql/,
from `git archive`), in the same run, its values asserted equal too;
the default is the last revision before statement 1's window was cut (docs/metrics.md).

    .venv/bin/python scripts/bench_metrics.py [--systems 25 --queries 3657 --seed 7 --repeat 3]
                                              [--previous REV | --previous none]
                                              [--source tables | --source frames]
                                              [--layout trec-order | ties-ascending | shuffled]
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytrec_eval
from ranx import Qrels, Run, evaluate

from bridge_assets.metrics import compute_measures, resolve_measures
from bridge_assets.paths import PROJECT_ROOT

K = 10
# statement 1 as it was before its window was cut to the ranking boundaries (issue 28); 2c63e2e
# is the numpy rewrite before the join ran on every thread, 0991ec8 the one-statement SQL version
PREVIOUS = "85867d9"
# our name -> (pytrec_eval measure request or None, ranx metric or None)
SHARED = {
    "map": ("map", "map"),
    "Rprec": ("Rprec", "r-precision"),
    "bpref": ("bpref", "bpref"),
    "recip_rank": ("recip_rank", "mrr"),
    f"recip_rank_cut_{K}": (None, f"mrr@{K}"),
    f"P_{K}": (f"P.{K}", f"precision@{K}"),
    f"recall_{K}": (f"recall.{K}", f"recall@{K}"),
    f"ndcg_cut_{K}": (f"ndcg_cut.{K}", f"ndcg@{K}"),
    f"map_cut_{K}": (f"map_cut.{K}", f"map@{K}"),
    f"success_{K}": (f"success.{K}", f"hit_rate@{K}"),
    "num_rel_ret": ("num_rel_ret", "hits"),
}
OURS_ONLY = [f"judged_{K}", "num_ret", "num_rel"]


def synthetic(systems: int, queries: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(run: retriever, query_id, doc_id, score; qrels: query_id, doc_id, relevance)."""
    rng = np.random.default_rng(seed)
    corpus, candidates_per_query = 1_000_000, 50
    # each query: 1..19 relevant documents (mean 10 -> ~37k pairs), 5 judged non-relevant,
    # the rest of its 50 candidates unjudged
    n_rel = rng.integers(1, 20, size=queries)
    candidates = np.empty((queries, candidates_per_query), dtype=np.int64)
    for q in range(queries):
        drawn = np.unique(rng.integers(0, corpus, size=candidates_per_query * 2))
        candidates[q] = rng.permutation(drawn)[:candidates_per_query]
    position = np.arange(candidates_per_query)
    relevant = position[None, :] < n_rel[:, None]
    judged_nonrel = (position[None, :] >= n_rel[:, None]) & (position[None, :] < n_rel[:, None] + 5)
    grades = rng.integers(1, 4, size=(queries, candidates_per_query))
    qrels = pl.DataFrame({
        "query_id": np.repeat(np.arange(queries), candidates_per_query),
        "doc": candidates.ravel(),
        "relevance": np.where(relevant, grades, 0).ravel(),
        "judged": (relevant | judged_nonrel).ravel(),
    }).filter(pl.col("judged"))
    # each system ranks a query's candidates by noise plus a system-specific pull to relevance
    quality = rng.uniform(0.1, 1.2, size=systems)
    keys = rng.random((systems, queries, candidates_per_query)) + quality[:, None, None] * relevant[None]
    top = np.argsort(-keys, axis=2)[:, :, :K]
    run = pl.DataFrame({
        "retriever": np.repeat(np.arange(systems), queries * K),
        "query_id": np.tile(np.repeat(np.arange(queries), K), systems),
        "doc": np.take_along_axis(np.broadcast_to(candidates, keys.shape), top, axis=2).ravel(),
        "score": apart_in_single_precision(np.take_along_axis(keys, top, axis=2)).ravel(),
    })
    run = run.with_columns(pl.format("s{}", "retriever").alias("retriever"),
                           pl.format("q{}", "query_id").alias("query_id"),
                           pl.format("d{}", "doc").alias("doc_id")).drop("doc")
    qrels = qrels.with_columns(pl.format("q{}", "query_id").alias("query_id"),
                               pl.format("d{}", "doc").alias("doc_id"),
                               pl.col("relevance").cast(pl.Int32)).select("query_id", "doc_id", "relevance")
    assert run.select(pl.struct("retriever", "query_id", pl.col("score").cast(pl.Float32))
                      .is_duplicated().any()).item() is False
    return run, qrels


def apart_in_single_precision(scores: np.ndarray) -> np.ndarray:
    """`scores` (each ranking along the last axis, strictly falling) with every score that
    would tie its predecessor as a C float set to the next float below it: trec_eval (and
    pytrec_eval) keep scores as floats and order such a tie by doc id, ranx keeps doubles. The
    order is the same in both precisions; 25 x 1,000 queries had one such pair (s19, q582)."""
    scores = scores.copy()
    below = np.float32(-np.inf)
    for j in range(1, scores.shape[-1]):
        previous = scores[..., j - 1].astype(np.float32)
        tied = scores[..., j].astype(np.float32) >= previous
        scores[..., j] = np.where(tied, np.nextafter(previous, below).astype(np.float64), scores[..., j])
    return scores


LAYOUTS = ("trec-order", "ties-ascending", "shuffled")


def laid_out(run: pl.DataFrame, layout: str) -> pl.DataFrame:
    """The run's rows as `layout` stores them (synthetic() gives them in trec_eval's order)."""
    if layout == "ties-ascending":
        return run.with_columns(pl.col("score").round(1)).sort(
            ["retriever", "query_id", "score", "doc_id"], descending=[False, False, True, False])
    if layout == "shuffled":
        return run.sample(fraction=1.0, shuffle=True, seed=1)
    return run


@dataclass
class Timing:
    conversion: float = 0.0  # wall-clock seconds to turn the frames into the tool's input
    evaluation: float = 0.0  # wall-clock seconds of the evaluation itself
    cpu: float = 0.0         # CPU seconds of both, all threads

    @property
    def total(self) -> float:
        return self.conversion + self.evaluation


class Stopwatch:
    """Wall-clock and CPU time of the conversion and evaluation steps of one tool run."""

    def __init__(self) -> None:
        self.timing = Timing()
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, step: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        setattr(self.timing, step, wall - self._wall)
        self.timing.cpu += cpu - self._cpu
        self._wall, self._cpu = wall, cpu


def best_of(repeat: int, tools: dict[str, Callable[[], tuple[dict, Timing]]]) -> dict[str, tuple[dict, Timing]]:
    """Each tool's best run of `repeat`, the tools taking turns (one run each per round): a
    process runs large allocations faster once its heap has grown, so a tool timed only
    before the others would pay for that alone."""
    best: dict[str, tuple[dict, Timing]] = {}
    for _ in range(repeat):
        for name, tool in tools.items():
            values, timing = tool()
            if name not in best or timing.total < best[name][1].total:
                best[name] = (best[name][0] if name in best else values, timing)
            del values  # every run gives the same values; one copy is kept
    return best


def previous_measures(revision: str) -> types.ModuleType:
    """bridge_assets.metrics.measures as of `revision`: that revision's package and SQL (`git
    archive` into a temporary folder) imported under their own names, this process's
    bridge_assets set aside meanwhile and put back after. The module keeps its own imports
    (measure_names, judged_rows, paths, whatever the revision had), so any revision loads."""
    folder = Path(tempfile.mkdtemp(prefix=f"bridge-{revision[:12]}-"))
    atexit.register(shutil.rmtree, folder, True)  # its SQL is read as the measures run
    archive = subprocess.run(["git", "archive", revision, "bridge_assets", "sql"], cwd=PROJECT_ROOT,
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")

    def ours() -> list[str]:
        return [name for name in sys.modules if name == "bridge_assets" or name.startswith("bridge_assets.")]

    current = {name: sys.modules.pop(name) for name in ours()}
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("bridge_assets.metrics.measures")
    finally:
        sys.path.remove(str(folder))
        for name in ours():
            del sys.modules[name]
        sys.modules.update(current)


@dataclass
class Source:
    """Where every tool starts: DuckDB tables (what an asset computes on) or polars frames."""

    run: pl.DataFrame
    qrels: pl.DataFrame
    tables: duckdb.DuckDBPyConnection | None = None

    @classmethod
    def of(cls, kind: str, run: pl.DataFrame, qrels: pl.DataFrame) -> Source:
        if kind == "frames":
            return cls(run, qrels)
        tables = duckdb.connect()
        for name, frame in (("bench_run", run), ("bench_qrels", qrels)):
            tables.register("_frame", frame)
            tables.execute(f"create table {name} as select * from _frame")
            tables.unregister("_frame")
        return cls(run, qrels, tables)

    def connection(self) -> tuple[duckdb.DuckDBPyConnection, bool]:
        """A connection holding bench_run and bench_qrels, and whether to close it after."""
        if self.tables is not None:
            return self.tables, False
        con = duckdb.connect()  # DuckDB reads the registered polars frames in place (Arrow)
        con.register("bench_run", self.run)
        con.register("bench_qrels", self.qrels)
        return con, True

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The run and the qrels as polars frames (read from the tables when there are some)."""
        if self.tables is None:
            return self.run, self.qrels
        return (self.tables.execute("select retriever, query_id, doc_id, score from bench_run").pl(),
                self.tables.execute("select query_id, doc_id, relevance from bench_qrels").pl())


def run_ours(source: Source, measures: types.ModuleType | None = None) -> tuple[dict, Timing]:
    """All systems in one call, straight from the tables (or the registered frames)."""
    resolve, compute = ((measures.resolve_measures, measures.compute_measures) if measures
                        else (resolve_measures, compute_measures))
    selection = resolve([*SHARED, *OURS_ONLY])
    watch = Stopwatch()
    con, close = source.connection()
    watch.lap("conversion")
    frame = compute(con, selection, run="bench_run", qrels="bench_qrels")
    watch.lap("evaluation")
    if close:
        con.close()
    rows = frame.select("retriever", "query_id", "measure", "value").iter_rows()
    return {(s, q, m): v for s, q, m, v in rows}, watch.timing


def nested(frame: pl.DataFrame, value: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for query_id, doc_id, v in frame.select("query_id", "doc_id", value).iter_rows():
        out[query_id][doc_id] = v
    return dict(out)


def run_pytrec(source: Source) -> tuple[dict, Timing]:
    """pytrec_eval takes nested dicts, one run per call."""
    watch = Stopwatch()
    run, qrels = source.frames()
    qrels_dict = nested(qrels, "relevance")
    runs = {s: nested(part, "score") for (s,), part in run.partition_by("retriever", as_dict=True).items()}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels_dict, {p for p, _ in SHARED.values() if p})
    watch.lap("conversion")
    results = {system: evaluator.evaluate(system_run) for system, system_run in runs.items()}
    watch.lap("evaluation")
    return {(s, q, m): v for s, per_query in results.items() for q, measures in per_query.items()
            for m, v in measures.items()}, watch.timing


def run_ranx(source: Source) -> tuple[dict, Timing]:
    """ranx takes its Qrels/Run objects (numba kernels, parallel over queries), one run per call."""
    metrics = [r for _, r in SHARED.values() if r]
    watch = Stopwatch()
    run, qrels = source.frames()
    ranx_qrels = Qrels(nested(qrels, "relevance"))
    runs = {s: Run(nested(part, "score"))
            for (s,), part in run.partition_by("retriever", as_dict=True).items()}
    watch.lap("conversion")
    for system_run in runs.values():
        evaluate(ranx_qrels, system_run, metrics)
    watch.lap("evaluation")
    return {(s, q, m): v for s, r in runs.items() for m in metrics
            for q, v in r.scores[m].items()}, watch.timing


def warm_up_ranx() -> None:
    """numba compiles ranx's kernels on first use; keep that out of the timing."""
    evaluate(Qrels({"q": {"a": 1, "b": 0}}), Run({"q": {"a": 0.5, "b": 0.7, "c": 0.1}}),
             [r for _, r in SHARED.values() if r])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", type=int, default=25)
    parser.add_argument("--queries", type=int, default=3657)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool; the best counts")
    parser.add_argument("--previous", default=PREVIOUS,
                        help="git revision of BRIDGE's metrics to time alongside ('none': skip)")
    parser.add_argument("--source", choices=("tables", "frames"), default="tables",
                        help="where every tool starts: DuckDB tables (as the pipeline's assets "
                             "hold the lake's rows) or polars frames")
    parser.add_argument("--layout", choices=LAYOUTS, default="trec-order",
                        help="how the run's rows are stored: in trec_eval's order; with scores "
                             "rounded to 0.1 and ties by doc id ascending (as BRIDGE keeps its "
                             "own runs; ranx is then left out: its tie order is undefined); "
                             "shuffled")
    args = parser.parse_args()

    run, qrels = synthetic(args.systems, args.queries, args.seed)
    run = laid_out(run, args.layout)
    with_ranx = args.layout != "ties-ascending"
    relevant = qrels.filter(pl.col("relevance") > 0).height
    print(f"data: {args.systems} systems x {args.queries} queries x top-{K} = {run.height:,} run rows; "
          f"{qrels.height:,} judgments, {relevant:,} relevant")
    print(f"every tool starts from {'DuckDB tables' if args.source == 'tables' else 'polars frames'}")
    source = Source.of(args.source, run, qrels)
    if with_ranx:  # numba compiles its kernels on first use (cached on disk after)
        warm_up_ranx()
    timed = {"ours": lambda: run_ours(source)}
    if args.previous != "none":
        previous = previous_measures(args.previous)
        timed["before"] = lambda: run_ours(source, previous)
    timed["pytrec"] = lambda: run_pytrec(source)
    if with_ranx:
        timed["ranx"] = lambda: run_ranx(source)
    best = best_of(args.repeat, timed)
    (ours, ours_t), (pytrec, pytrec_t) = best["ours"], best["pytrec"]
    ranx_values, ranx_t = best["ranx"] if with_ranx else ({}, None)
    if args.previous != "none":
        before, before_t = best["before"]
        assert before.keys() == ours.keys()
        for key, value in before.items():
            assert abs(value - ours[key]) <= 1e-9, (key, value, ours[key])

    checked = 0
    for (system, query_id, name), value in ours.items():
        if query_id == "all" or name not in SHARED:
            continue
        pytrec_name, ranx_name = SHARED[name]
        if pytrec_name:
            assert abs(value - pytrec[system, query_id, name]) <= 1e-9, (system, query_id, name, value)
            checked += 1
        if ranx_name and with_ranx:
            assert abs(value - ranx_values[system, query_id, ranx_name]) <= 1e-9, \
                (system, query_id, name, value)
            checked += 1
    print(f"equal values: {checked:,} per-query comparisons within 1e-9 "
          f"({len(SHARED)} shared measures; ours also computed {', '.join(OURS_ONLY)})")
    tools = [("BRIDGE", ours_t), ("pytrec_eval", pytrec_t)] + ([("ranx", ranx_t)] if with_ranx else [])
    if args.previous != "none":
        print(f"BRIDGE before ({args.previous[:7]}): all {len(before):,} values (every measure, "
              "every query and 'all') equal to BRIDGE's within 1e-9")
        tools.insert(1, (f"BRIDGE {args.previous[:7]}", before_t))
    print(f"best of {args.repeat} runs each, seconds:")
    print(f"{'tool':<16}{'with conversion':>16}{'evaluation only':>17}{'CPU (all threads)':>19}")
    for name, t in tools:
        print(f"{name:<16}{t.total:>16.2f}{t.evaluation:>17.2f}{t.cpu:>19.2f}")
    print("ratios, their time / BRIDGE's (> 1: BRIDGE is faster):")
    for name, t in tools[1:]:
        print(f"  {name:<15} with conversion {t.total / ours_t.total:.1f}x, evaluation only "
              f"{t.evaluation / ours_t.evaluation:.1f}x, CPU {t.cpu / ours_t.cpu:.1f}x")


if __name__ == "__main__":
    main()
