"""Retrievers trained on the labels (issue 25, item 3): fine-tune the shipped MiniLM bi-encoder
on a training split of queries, with positives from one label source, and measure it on the
held-out queries against both the original and the refined qrels.

Label sources (positives of a training query):
  original   the benchmark's own qrels (relevance > 0)
  refined    the verified relevant judgments of bridge_qrels (sql/student_training_set.sql, the
             student annotator's selection): never a pending pair, never a model's unverified
             guess on one
  utility    LLM utility labels (UtilSel over the query's candidate pool), given by the caller

Hard negatives are the stored runs' best-ranked documents (retrieval_run) that the source does
not call relevant; with the refined source a pending pair is no negative either (it is unknown,
not irrelevant). The original source does use them: it cannot know them, which is the point.

Loss: an in-batch softmax over every document of a batch of queries (all their positives and
hard negatives), with the marginal likelihood of *all* of a query's positives as the target
(-log sum_{p in P(q)} softmax(s(q, .))_p), a small custom loss rather than
MultipleNegativesRankingLoss, whose one-positive rows would make a query's other positives its
in-batch negatives. Training is seeded: the same seed, labels and base model give identical
weights (tests/test_trained_retriever.py).

This module retrieves with a trained encoder, scores it and compares the label sources; the
training data is read in retriever_data.py, the encoder fine-tuned in retriever_training.py.

Plain functions, no Dagster: scripts/trained_retriever.py prints the comparison table, and
`trained_retriever_run` is the registry's evaluation-only `kind: trained_retriever` (the
student stage's student_rerank_run asset writes its run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl

from bridge_assets.retrieval.cache import ensure_built, read_meta
from bridge_assets.student.retriever_data import (
                                                 LabelSource,
                                                 LakeData,
                                                 TrainedRetrieverError,
                                                 TrainingQuery,
                                                 TrainSettings,
                                                 query_folds,
                                                 training_queries,
)
from bridge_assets.student.retriever_training import (
                                                     TrainingLog,
                                                     load_encoder,
                                                     torch_threads,
                                                     train_retriever,
                                                     weights_digest,
)

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

MEASURES = ("ndcg_cut_10", "recall_10")
QRELS_VERSIONS = ("original", "refined")   # refined: bridge_qrels, pending counted not relevant
BOOTSTRAP_RESAMPLES = 2000


# --- retrieval and evaluation ------------------------------------------------------------------

def retrieve(model: SentenceTransformer, queries: Mapping[str, str], corpus: Mapping[str, str], *, k: int = 10,
             batch_size: int = 32, threads: int = 1) -> pl.DataFrame:
    """Exact cosine top-k over the whole corpus: (query_id, doc_id, score, rank)."""
    doc_ids = list(corpus)
    query_ids = list(queries)
    with torch_threads(threads):
        docs = model.encode([corpus[d] for d in doc_ids], batch_size=batch_size, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
        asked = model.encode([queries[q] for q in query_ids], batch_size=batch_size,
                             normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    scores = asked @ docs.T
    rows: list[dict[str, object]] = []
    for i, query_id in enumerate(query_ids):
        top = np.argsort(-scores[i], kind="stable")[:k]
        rows.extend({"query_id": query_id, "doc_id": doc_ids[j], "score": float(scores[i, j]), "rank": r}
                    for r, j in enumerate(top, start=1))
    return pl.DataFrame(rows, schema={"query_id": pl.Utf8, "doc_id": pl.Utf8, "score": pl.Float64,
                                      "rank": pl.Int64})


def per_query_measures(run: pl.DataFrame, qrels: pl.DataFrame) -> dict[str, dict[str, float]]:
    """measure -> query_id -> value, by the project's trec_eval measures
    (bridge_assets.metrics.measures), for the run's queries the qrels know."""
    from bridge_assets.metrics import compute_measures, resolve_measures

    con = duckdb.connect()
    try:
        con.register("trained_run", run.select("query_id", "doc_id", "score").to_arrow())
        con.register("trained_qrels", qrels.select("query_id", "doc_id", "relevance").to_arrow())
        frame = compute_measures(con, resolve_measures(MEASURES), run="trained_run", qrels="trained_qrels")
    finally:
        con.close()
    frame = frame.filter(pl.col("query_id") != "all")
    return {m: dict(frame.filter(pl.col("measure") == m).select("query_id", "value").iter_rows())
            for m in MEASURES}


def bootstrap_interval(values: Sequence[float], seed: int = 0,
                       confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): a percentile bootstrap over queries (scipy, seeded)."""
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return math.nan, math.nan, math.nan
    if len(data) == 1 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean()), float(data.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap((data,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                 confidence_level=confidence, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return float(data.mean()), float(low), float(high)


@dataclass
class SystemResult:
    """One row of the comparison: per-query values pooled over the folds' test queries."""

    name: str
    values: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (qrels, measure) -> q -> v
    train_queries: list[int] = field(default_factory=list)      # per fold
    test_queries: list[int] = field(default_factory=list)
    positives: list[int] = field(default_factory=list)
    seconds: float = 0.0
    digests: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, run: pl.DataFrame, data: LakeData) -> None:
        for version, qrels in (("original", data.original_qrels), ("refined", data.refined_qrels)):
            for measure, per_query in per_query_measures(run, qrels).items():
                self.values.setdefault((version, measure), {}).update(per_query)

    def summary(self, version: str, measure: str, seed: int) -> tuple[float, float, float, int]:
        per_query = self.values.get((version, measure), {})
        mean, low, high = bootstrap_interval([per_query[q] for q in sorted(per_query)], seed)
        return mean, low, high, len(per_query)


def paired_difference(a: SystemResult, b: SystemResult, version: str, measure: str,
                      seed: int) -> tuple[float, float, float, int]:
    """Mean of a - b over the queries both scored, with its bootstrap interval (paired)."""
    left, right = a.values.get((version, measure), {}), b.values.get((version, measure), {})
    shared = sorted(set(left) & set(right))
    mean, low, high = bootstrap_interval([left[q] - right[q] for q in shared], seed)
    return mean, low, high, len(shared)


@dataclass(frozen=True)
class Curriculum:
    """Train on `first`, then continue on `then` (the paper's LLM labels first, people's after)."""

    first: LabelSource
    then: LabelSource


def run_comparison(data: LakeData, location: str, sources: Sequence[LabelSource | Curriculum], *,
                   settings: TrainSettings, folds: int = 2, utility: Mapping[str, set[str]] | None = None,
                   progress: Callable[[str], None] | None = None) -> list[SystemResult]:
    """The untrained encoder, then one trained retriever per source (per fold), each scored on
    its fold's held-out queries; the folds' test queries together are every query."""
    say = progress or (lambda text: None)
    split = query_folds(data.queries, folds, settings.seed)
    untrained = SystemResult("untrained MiniLM")
    started = time.perf_counter()
    untrained.add(retrieve(load_encoder(location, settings.max_length), data.queries, data.corpus,
                           threads=settings.threads), data)
    untrained.seconds = time.perf_counter() - started
    untrained.test_queries = [len(test) for _, test in split]
    results = [untrained]
    for source in sources:
        name = (f"curriculum: {source.first} then {source.then}" if isinstance(source, Curriculum)
                else f"trained on {source}")
        result = SystemResult(name)
        started = time.perf_counter()
        for fold, (train, test) in enumerate(split):
            model = load_encoder(location, settings.max_length)
            stages = (source.first, source.then) if isinstance(source, Curriculum) else (source,)
            trained_queries = positives = 0
            for stage in stages:
                queries = training_queries(data, train, stage, settings, utility)
                if not queries:  # e.g. UtilSel selected nothing in this fold: the stage is skipped, said
                    say(f"{name}, fold {fold + 1}/{folds}, {stage}: no training query has a positive, not trained")
                    result.note += f"fold {fold + 1} {stage}: nothing to train on. "
                    continue
                log = train_retriever(model, queries, settings)
                trained_queries, positives = max(trained_queries, log.queries), positives + log.positives
                say(f"{name}, fold {fold + 1}/{folds}, {stage}: {log.queries} queries, {log.positives} "
                    f"positives, {log.negatives} negatives, {log.steps} steps, {log.loss_trend()}, "
                    f"{log.seconds:.0f} s")
            result.train_queries.append(trained_queries)
            result.positives.append(positives)
            result.test_queries.append(len(test))
            result.digests.append(weights_digest(model)[:12])
            result.add(retrieve(model, {q: data.queries[q] for q in test}, data.corpus,
                                threads=settings.threads), data)
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results


@dataclass
class TrainedRun:
    """A trained retriever's run over every query (query_id, doc_id, rank, score, fold,
    student_key: the fold model's weights sha256[:16]), each fold's report, or why no run."""

    run: pl.DataFrame
    folds: list[dict] = field(default_factory=list)
    not_trained: str | None = None


def _empty_trained_run() -> pl.DataFrame:
    return pl.DataFrame(schema={"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32,
                                "score": pl.Float64, "fold": pl.Int32, "student_key": pl.String})


def trained_retriever_folder(lake_folder: Path, dataset: str) -> Path:
    """Where a lake keeps its trained retrievers' fold models (beside its students)."""
    return lake_folder / "trained_retrievers" / dataset


def trained_model_key(queries: Sequence[TrainingQuery], settings: TrainSettings, base: Mapping) -> str:
    """What a fold's weights follow from: its training queries (texts, positives, negatives),
    the settings and what the base encoder is (retrievers.yaml's identity, not its folder)."""
    config = {"training": [dataclasses.asdict(q) for q in queries], "settings": dataclasses.asdict(settings),
              "base": dict(base)}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FoldModel:
    model: SentenceTransformer
    weights_hash: str       # weights_digest[:16]
    log: TrainingLog
    trained_now: bool


def fold_model(location: str, queries: Sequence[TrainingQuery], settings: TrainSettings, *,
               store: Path | None = None, base: Mapping | None = None) -> FoldModel:
    """The encoder at `location` fine-tuned on `queries`. With `store` (and the base's identity),
    kept in store/<trained_model_key>/ and found there again while its inputs stay the same: a
    seed gives the same weights anyway, so training again would only cost the minutes."""
    def train() -> tuple[SentenceTransformer, TrainingLog]:
        model = load_encoder(location, settings.max_length)
        return model, train_retriever(model, queries, settings)

    if store is None:
        model, log = train()
        return FoldModel(model, weights_digest(model)[:16], log, True)
    if base is None:
        raise TrainedRetrieverError("a stored trained retriever needs its base encoder's identity")

    def build(folder: Path) -> dict:
        model, log = train()
        model.save(str(folder))
        return {"weights_hash": weights_digest(model)[:16], "log": dataclasses.asdict(log),
                "settings": dataclasses.asdict(settings), "base": dict(base)}

    folder, built_now = ensure_built(store / trained_model_key(queries, settings, base), build)
    meta = read_meta(folder)
    return FoldModel(load_encoder(str(folder), settings.max_length), meta["weights_hash"],
                     TrainingLog(**meta["log"]), built_now)


def trained_retriever_run(data: LakeData, location: str, source: LabelSource, settings: TrainSettings, *,
                          folds: int, k: int, progress: Callable[[str], None] | None = None,
                          store: Path | None = None, base: Mapping | None = None,
                          utility: Mapping[str, set[str]] | None = None) -> TrainedRun:
    """The registry's `trained_retriever`: the queries dealt into `folds` (seeded); each fold's
    queries are ranked (exact cosine over the whole corpus, top `k`) by the encoder at `location`
    fine-tuned on the `source` labels of the other folds' queries only, so no query is ranked
    by a model that learned its labels. No run when a fold has nothing to train on: a run
    trained for some queries only would be compared with full runs. With `store`, each fold's
    model is kept there and found again (fold_model). `utility`: the positives of `source`
    utility (utility_positives)."""
    say = progress or (lambda text: None)
    queries = sorted(data.queries)
    if len(queries) < folds:
        return TrainedRun(_empty_trained_run(), not_trained=f"{len(queries)} queries cannot make {folds} folds")
    split = query_folds(queries, folds, settings.seed)
    training = [training_queries(data, train, source, settings, utility) for train, _ in split]
    for fold, queries_of_fold in enumerate(training):  # every fold checked before any trains
        if not queries_of_fold:
            return TrainedRun(_empty_trained_run(), not_trained=f"fold {fold + 1} of {folds}: no training "
                                                               f"query has a positive in the {source} labels")
    parts, reports = [], []
    for fold, ((_, test), queries_of_fold) in enumerate(zip(split, training)):
        found = fold_model(location, queries_of_fold, settings, store=store, base=base)
        log, key = found.log, found.weights_hash
        run = retrieve(found.model, {q: data.queries[q] for q in test}, data.corpus, k=k, threads=settings.threads)
        parts.append(run.with_columns(pl.col("rank").cast(pl.Int32), fold=pl.lit(fold, dtype=pl.Int32),
                                      student_key=pl.lit(key, dtype=pl.String)))
        reports.append({"fold": fold, "queries": len(test), "trained_on_queries": log.queries,
                        "positives": log.positives, "negatives": log.negatives, "steps": log.steps,
                        "weights_hash": key, "seconds": round(log.seconds, 1), "trained_now": found.trained_now})
        trained = (f"trained on {log.queries} queries' {source} labels ({log.positives} positives, "
                   f"{log.negatives} hard negatives, {log.steps} steps, {log.loss_trend()}, {log.seconds:.0f} s)")
        say(f"fold {fold + 1}/{folds}: " + (f"{trained}, weights {key}" if found.trained_now
                                            else f"weights {key} found again, {trained} before")
            + f"; ranked {len(test)} held-out queries")
    return TrainedRun(pl.concat(parts).select(_empty_trained_run().columns).sort("query_id", "rank"), reports)


def format_table(results: Sequence[SystemResult], seed: int) -> str:
    """The comparison as a markdown table: mean [95% interval] over the held-out queries."""
    headers = ["system", "train q (per fold)", "test q",
               *[f"{label} {version}" for version in QRELS_VERSIONS
                 for label in ("nDCG@10", "R@10")]]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in results:
        cells = [result.name, "/".join(map(str, result.train_queries)) or "-", str(sum(result.test_queries))]
        for version in QRELS_VERSIONS:
            for measure in MEASURES:
                mean, low, high, _ = result.summary(version, measure, seed)
                cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_differences(results: Sequence[SystemResult], seed: int) -> str:
    """Each trained row minus the untrained one, paired over queries, with 95% intervals."""
    base = results[0]
    headers = ["system - untrained", *[f"{label} {version}" for version in QRELS_VERSIONS
                                       for label in ("nDCG@10", "R@10")]]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in results[1:]:
        cells = [result.name]
        for version in QRELS_VERSIONS:
            for measure in MEASURES:
                mean, low, high, _ = paired_difference(result, base, version, measure, seed)
                cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
