"""The evaluation-only systems of the registry, run after the labels: the student re-ranker
(`kind: student_rerank` in resources/retrievers.yaml), a first stage's top documents re-scored by
a student annotator, and the trained retriever (`kind: trained_retriever`, retriever.py), a
bi-encoder fine-tuned on the labels; so the benchmark shows what the labels taught. Plain
functions (no Dagster): the student stage's `student_rerank_run` asset wires them.

It is cross-fitted by query: the queries are dealt into `folds` (seeded) and each fold's
queries are scored by a student trained on the verified labels of the other folds only, so no
query is ranked by a model that learned its labels. Each fold's student is stored and found
again like the student annotator's (annotator.ensure_student: same labels and settings, same
student). The run is evaluation-only: its documents were never pooled, so under the refined
qrels an unjudged document counts as not relevant (Judged@10 beside its scores says how many).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bridge_assets.labeling.calls import Generate
from bridge_assets.labeling.pairs import Pair
from bridge_assets.llm.budget import DEFERRED
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.retrieval.registry import RetrieverRegistry
from bridge_assets.retrieval.runs import document_texts, top_k
from bridge_assets.retrieval.systems import STORED_COLUMNS, RunContext, first_stage_candidates
from bridge_assets.student.annotator import SCORE_BATCH, TrainingSet, ensure_student, training_set
from bridge_assets.student.model import StudentSettings, resolve_base_model, untrainable
from bridge_assets.student.retriever import trained_retriever_folder, trained_retriever_run
from bridge_assets.student.retriever_data import (
    LakeData,
    TrainSettings,
    lake_data,
    pool_pairs,
    query_folds,
    utility_positives,
)

log = logging.getLogger(__name__)

# what student_rerank_run stores per row besides the run's (query_id, doc_id, rank, score)
FOLD_COLUMNS = {"fold": pl.Int32, "student_key": pl.String}
# the table student_rerank_run: the runs of every evaluation-only system of a dataset. first_stage
# is null for a trained retriever; student_key is the key of the student (student_rerank) or the
# fine-tuned weights' sha256[:16] (trained_retriever) that ranked the query
RERANK_SCHEMA = {"dataset": pl.String, "retriever": pl.String, "query_id": pl.String, "doc_id": pl.String,
                 "rank": pl.Int32, "score": pl.Float64, "config_hash": pl.String, "first_stage": pl.String,
                 "fold": pl.Int32, "student_key": pl.String}


@dataclass
class StudentRerank:
    """A re-ranked run (query_id, doc_id, rank, score, fold, student_key), or why there is none."""

    run: pl.DataFrame
    folds: list[dict[str, Any]] = field(default_factory=list)
    not_trained: str | None = None


def empty_run() -> pl.DataFrame:
    return pl.DataFrame(schema={"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32,
                                "score": pl.Float64, **FOLD_COLUMNS})


def student_rerank(candidates: pl.DataFrame, query_texts: Mapping[str, str], doc_texts: Mapping[str, str],
                   data: TrainingSet, settings: StudentSettings, *, folds: int, k: int, lake_folder: Path,
                   dataset: str, progress: Callable[[str], None] = log.info) -> StudentRerank:
    """`candidates` (query_id, doc_id: the first stage's top documents) re-scored by the
    calibrated P(relevant) of a student trained on the verified labels (`data`) of the other
    query folds, then cut to the best `k` per query. No run when a fold's student cannot be
    trained (too few labels of both classes outside it): a run re-ranked for some queries only
    would be compared with full runs."""
    queries = sorted(set(candidates["query_id"].to_list()))
    if len(queries) < folds:
        return StudentRerank(empty_run(), not_trained=f"{len(queries)} queries cannot make {folds} folds")
    held_outs = [held_out for _, held_out in query_folds(queries, folds, settings.seed)]
    trains = [data.without_queries(set(held_out)) for held_out in held_outs]
    for fold, train in enumerate(trains):  # every fold checked before any student trains
        problem = untrainable(train.examples(), settings)
        if problem:
            return StudentRerank(empty_run(), not_trained=f"fold {fold + 1} of {folds}: {problem}")
    parts = []
    reports = []
    for fold, (held_out, train) in enumerate(zip(held_outs, trains)):
        stored = ensure_student(lake_folder, dataset, train, settings)
        scored = candidates.filter(pl.col("query_id").is_in(held_out)).select("query_id", "doc_id")
        pairs = [(query_texts[q], doc_texts[d]) for q, d in scored.iter_rows()]
        scores = stored.load().score(pairs, batch_size=SCORE_BATCH)
        ranked = top_k(scored.with_columns(score=pl.Series(scores, dtype=pl.Float64)), k)
        parts.append(ranked.with_columns(fold=pl.lit(fold, dtype=pl.Int32),
                                         student_key=pl.lit(stored.key, dtype=pl.String)))
        reports.append({"fold": fold, "queries": len(held_out), "pairs": len(pairs), "student_key": stored.key,
                        "weights_hash": stored.meta["weights_hash"], "trained_now": stored.trained_now,
                        "trained_on": stored.meta["report"]["trained_on"]})
        progress(f"fold {fold + 1}/{folds}: {len(held_out)} queries, {len(pairs)} pairs scored by student "
                 f"{stored.key} ({'trained now' if stored.trained_now else 'found again'}, "
                 f"{stored.meta['report']['trained_on']} labels of the other folds)")
    return StudentRerank(pl.concat(parts).sort("query_id", "rank"), reports)


@dataclass(frozen=True)
class RerankInputs:
    """What the evaluation-only systems of one dataset read: its verified labels, corpus,
    queries and the pooled systems' stored runs (the re-rankers' first stages), and the same as
    the trained retrievers read them (with the original qrels and pending pairs)."""

    data: TrainingSet
    corpus: pl.DataFrame        # doc_id, title, text
    queries: pl.DataFrame       # query_id, text
    stored_runs: pl.DataFrame   # retriever + systems.STORED_COLUMNS
    lake: LakeData
    pool: list[Pair]            # the candidate pool's pairs (what a utility labeler selects from)

    @classmethod
    def read(cls, con: duckdb.DuckDBPyConnection, dataset: str, *, teacher: bool = False) -> RerankInputs:
        corpus = con.execute("select doc_id, title, text from corpus where dataset = ? order by doc_id",
                             [dataset]).pl()
        queries = con.execute("select query_id, text from queries where dataset = ? order by query_id",
                              [dataset]).pl()
        runs = con.execute("select * from retrieval_run where dataset = ?", [dataset]).pl()
        # a run from before runs recorded their inputs is never taken as current
        stored = (runs.select("retriever", *STORED_COLUMNS) if set(STORED_COLUMNS) <= set(runs.columns)
                  else pl.DataFrame(schema=dict.fromkeys(["retriever", *STORED_COLUMNS], pl.String)))
        data = training_set(con, dataset, teacher=teacher)
        return cls(data, corpus, queries, stored,
                   lake_data(con, dataset, queries=queries, corpus=corpus, runs=runs, verified=data.labels),
                   pool_pairs(con, dataset))


@dataclass
class EvaluationRuns:
    """student_rerank_run's rows of one dataset, and per system what made them (or why none)."""

    frame: pl.DataFrame
    details: dict[str, Any] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)


def run_evaluation_systems(registry: RetrieverRegistry, systems: list[str], inputs: RerankInputs,
                           settings: StudentSettings, *, lake_folder: Path, dataset: str,
                           progress: Callable[[str], None] = log.info,
                           generate: Generate | None = None) -> EvaluationRuns:
    """Each evaluation-only system of `systems` on `dataset`. A student_rerank: its first stage's
    candidates (the stored run when current and deep enough, else that stage run again),
    re-ranked out of fold by students with `settings`. A trained_retriever: its model
    fine-tuned out of fold with the system's own parameters; with `labels: utility`, on the
    pool candidates its `llm` selects as useful (one UtilSel call per query through
    `generate`; no run while a call is deferred by the run's LLM budget)."""
    ctx = RunContext(dataset, inputs.corpus, registry, lake_folder, progress=progress,
                     stored_run=lambda system: inputs.stored_runs.filter(pl.col("retriever") == system)
                     .drop("retriever"))
    query_texts = dict(zip(inputs.queries["query_id"].to_list(), inputs.queries["text"].to_list()))
    doc_texts = dict(zip(inputs.corpus["doc_id"].to_list(), document_texts(inputs.corpus)))
    found = EvaluationRuns(pl.DataFrame(schema=RERANK_SCHEMA))
    frames = [found.frame]
    for name in systems:
        spec = registry.system(name)
        say = (lambda line, name=name: progress(f"{name}: {line}"))
        if spec.kind == "trained_retriever":
            params = spec.params()
            model = spec.required_model()
            utility = None
            if params.labels == "utility":
                if generate is None:
                    raise ValueError(f"{name}: utility labels need an LLM (generate)")
                profile = spec.required_llm().profile_name()
                selected = utility_positives(inputs.pool, generate, profile)
                deferred = sum(why == DEFERRED for why in selected.failed.values())
                if deferred:
                    found.not_run[name] = (f"{deferred} of {selected.queries} UtilSel calls deferred by the "
                                           f"run's LLM budget (a run trained on some queries' labels only "
                                           f"would change once they come)")
                    continue
                utility = selected.positives
                say(f"UtilSel by {profile}: {selected.queries} queries, {selected.candidates} "
                    f"candidates, {sum(map(len, utility.values()))} selected as useful, "
                    f"{len(selected.failed)} replies unusable")
            train = TrainSettings(epochs=params.epochs, learning_rate=params.learning_rate,
                                  negatives_per_query=params.negatives, seed=params.seed,
                                  max_length=registry.model(model).max_length or TrainSettings.max_length)
            base = resolve_base_model(model)
            trained = trained_retriever_run(inputs.lake, base.location, params.labels, train,
                                            folds=params.folds, k=registry.system_k(name), progress=say,
                                            store=trained_retriever_folder(lake_folder, dataset), base=base.identity,
                                            utility=utility)
            run, folds, not_trained = trained.run, trained.folds, trained.not_trained
            found.details[name] = {"model": spec.model, "labels": params.labels, "folds": folds}
            if utility is not None:
                found.details[name]["utility"] = {
                    "profile": profile, "queries": selected.queries,
                    "candidates": selected.candidates, "selected": sum(map(len, utility.values())),
                    "unusable": selected.failed}
        else:
            candidates = first_stage_candidates(ctx, spec, inputs.queries)
            result = student_rerank(candidates, query_texts, doc_texts, inputs.data, settings,
                                    folds=spec.params().folds, k=registry.system_k(name), lake_folder=lake_folder,
                                    dataset=dataset, progress=say)
            run, not_trained = result.run, result.not_trained
            found.details[name] = {"first_stage": spec.first_stage, "folds": result.folds,
                                   **ctx.metadata.get("first_stage", {}).get(spec.first_stage, {})}
        if not_trained:  # too few labels: no run, said so (never a partial one)
            found.not_run[name] = not_trained
            continue
        frames.append(run.with_columns(dataset=pl.lit(dataset), retriever=pl.lit(name),
                                       config_hash=pl.lit(registry.config_hash(name)),
                                       first_stage=pl.lit(spec.first_stage, dtype=pl.String))
                      .select(list(RERANK_SCHEMA)).cast(RERANK_SCHEMA))  # type: ignore[arg-type]  # see qrels/merge.py
    found.frame = pl.concat(frames)
    return found


def estimate_utility_calls(registry: RetrieverRegistry, pool: list[Pair], replay: LedgerReplay) -> list[StageCalls]:
    """`bridge run --dry-run`: the UtilSel calls of the profile's `labels: utility` trained
    retrievers over `pool` (one per query; answered when the ledger holds it)."""
    stages = []
    for name in registry.evaluation_systems():
        spec = registry.system(name)
        if spec.kind != "trained_retriever" or spec.params().labels != "utility":
            continue
        selector = spec.required_llm().profile_name()
        stage = replay.stage("student_rerank_run", selector, "utilsel")

        def tally(profile: str, requests: Sequence[LLMRequest], stage: StageCalls = stage) -> list[LLMResult]:
            results = replay(profile, requests)
            for result, request in zip(results, requests, strict=True):
                stage.add(result.key, request, result.error != NOT_ANSWERED)
            return results

        utility_positives(pool, tally, selector)
        stages.append(stage)
    return stages
