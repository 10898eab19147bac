"""Dagster wiring of the re-benchmark and analysis assets, per dataset.

retrieval_metrics -> ranking_shift, significance; pool_saturation; pool_coverage; partial_annotation_study;
rag_answers -> rag_judgments -> rag_alignment. Each reads one dataset's rows into an
in-memory DuckDB (snapshots.inputs), computes with the plain functions of this package, and
replaces its partition in one transaction (AnalysisRun: the body every asset here shares).

Lineage is declared once: READS names the tables each asset reads, and both its Dagster deps
and its snapshot come from that tuple (tests/test_lineage.py checks that the computation reads
nothing else).
"""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import dagster as dg
import duckdb
import polars as pl
from pydantic import Field

from bridge_assets.analysis import rag
from bridge_assets.analysis.coverage import MIN_SYSTEMS, compute_pool_coverage
from bridge_assets.analysis.coverage import RESAMPLES as COVERAGE_RESAMPLES
from bridge_assets.analysis.partial import DEFAULT_FRACTIONS, compute_partial_annotation_study
from bridge_assets.analysis.partial import DEFAULT_MEASURES as PARTIAL_MEASURES
from bridge_assets.analysis.retrieval import QRELS_VERSIONS, compute_dataset_metrics, measure_label, measures_at
from bridge_assets.analysis.saturation import DEFAULT_MEASURES as SATURATION_MEASURES
from bridge_assets.analysis.saturation import compute_pool_saturation
from bridge_assets.analysis.shift import DEFAULT_MEASURES as SHIFT_MEASURES
from bridge_assets.analysis.shift import compute_ranking_shift
from bridge_assets.analysis.significance import ALPHA, RESAMPLES, compute_significance, concordance_summary
from bridge_assets.analysis.significance import DEFAULT_MEASURES as SIGNIFICANCE_MEASURES
from bridge_assets.analysis.views import Scope, ScopeInfo
from bridge_assets.labeling.calls import MeteredGenerate
from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.budget import DEFERRED
from bridge_assets.llm.resource import LLMResource
from bridge_assets.pipeline import asset_config, automation
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import reuse_when_current
from bridge_assets.registry.datasets import GRADES, get_dataset

GROUP = "analysis"
# retrieval_run is partitioned by (dataset, retriever): a dataset's analysis reads every
# retriever's run of that dataset. (The mapping is marked beta; its behaviour is what we need.)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)
    RUN_DEP = dg.AssetDep("retrieval_run", partition_mapping=dg.MultiToSingleDimensionPartitionMapping(
        partition_dimension_name="dataset"))
# The tables each asset reads (analysis_views: retrieval_run, original_qrels, bridge_qrels
# unless refined=False, candidate_pool for the pooled scope, queries for every query;
# student_rerank_run, the evaluation-only systems' runs, where the benchmark's rankings are read).
READS: dict[str, tuple[str, ...]] = {
    "retrieval_metrics": ("retrieval_run", "student_rerank_run", "original_qrels", "bridge_qrels",
                          "candidate_pool", "queries"),
    "ranking_shift": ("retrieval_metrics",),
    "significance": ("retrieval_metrics",),
    "pending_impact": ("retrieval_metrics", "retrieval_run", "student_rerank_run", "bridge_qrels",
                       "significance"),  # impact_asset.py
    "pool_saturation": ("candidate_pool", "bridge_qrels", "retrieval_run", "original_qrels", "queries"),
    "pool_coverage": ("candidate_pool", "bridge_qrels", "retrieval_run", "original_qrels", "queries"),
    "partial_annotation_study": ("bridge_qrels", "retrieval_run", "corpus", "candidate_pool",
                                 "original_qrels", "queries"),
    "rag_answers": ("retrieval_run", "queries", "corpus", "candidate_pool", "original_qrels"),
    "rag_judgments": ("rag_answers", "queries"),
    "rag_alignment": ("rag_judgments", "retrieval_metrics"),
}


def deps(asset: str) -> list:
    """The Dagster deps of `asset`: its READS (retrieval_run through RUN_DEP)."""
    return [RUN_DEP if table == "retrieval_run" else table for table in READS[asset]]


def analysis_asset(name: str, description: str, reads: tuple[str, ...] = ()) -> Callable:
    """The asset `name` of this group, one partition per dataset, its deps from READS; `reads`:
    what else its output depends on (asset_config.reads_tags)."""
    asset = dg.asset(name=name, partitions_def=dataset_partitions, group_name=GROUP, deps=deps(name),
                     description=description, tags=asset_config.reads_tags(*reads) if reads else None)
    return lambda compute: asset(reuse_when_current(compute))


@dataclass
class AnalysisRun:
    """One materialization of an analysis asset: its dataset partition, its resolved settings;
    `inputs` is the snapshot of what it declares, `finish` writes its table and reports it."""

    asset: str
    dataset: str
    settings: asset_config.Resolved
    started: float

    @classmethod
    def start(cls, context: dg.AssetExecutionContext, config: dg.Config) -> "AnalysisRun":
        return cls(context.asset_key.to_user_string(), context.partition_key,
                   asset_config.for_run(context, config), time.monotonic())

    @property
    def config(self) -> Any:
        return self.settings.config

    def inputs(self, store: DuckDBStore) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """`with run.inputs(store) as con:` the snapshot of the tables this asset declares."""
        return snapshots.inputs(store, self.dataset, READS[self.asset])

    def finish(self, store: DuckDBStore, frame: pl.DataFrame, metadata: dict, *,
               timed: bool = True) -> dg.MaterializeResult:
        """Replace the partition with `frame`; the result carries its row count, `metadata`, the
        seconds since start (unless not `timed`: those assets never reported them) and a data
        version of its rows, so what reads it goes stale only when they change."""
        store.write_partitions({self.asset: frame}, dataset=self.dataset)
        seconds = {"time_s": round(time.monotonic() - self.started, 2)} if timed else {}
        return dg.MaterializeResult(
            metadata={**self.settings.metadata(), "dagster/row_count": frame.height, **metadata, **seconds},
            data_version=snapshots.frame_version(frame))


ScopeField: Scope = Field("pooled", description="pooled: only the queries of the candidate pool (those "
                   "the pipeline re-judged; every query without a pool); all: every query.")


def _scope_metadata(info: ScopeInfo) -> dict:
    return {"scope": info.applied, "queries": info.queries, "systems": len(info.retrievers),
            "system_names": ", ".join(info.retrievers)}


def _markdown(frame: pl.DataFrame, digits: int = 4) -> str:
    def cell(value: object) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else ("" if value is None else str(value))
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines)


# --- retrieval_metrics, ranking_shift ------------------------------------------------------------

class RetrievalMetricsConfig(dg.Config):
    k: int = Field(10, ge=1, description="Cutoff of the @k measures (paper: 10).")
    scope: Literal["pooled", "all"] = ScopeField
    relevance_level: int = Field(1, ge=1, description="The lowest relevance that counts as relevant "
                                 "in every measure but nDCG, whose gains are the grades (trec_eval "
                                 "-l; e.g. 2 on a graded dataset: highly relevant and up).")


def metrics_summary(frame: pl.DataFrame, k: int) -> pl.DataFrame:
    """Per system: Hit/nDCG/Recall@k on the original qrels and on the refined ones (both
    bounds over pending pairs), and Hole@k."""
    names = measures_at(k)
    wanted = [names["hit"], names["ndcg"], names["recall"], names["hole"]]
    means = frame.filter((pl.col("query_id") == "all") & pl.col("measure").is_in(wanted))
    wide = means.with_columns((pl.col("measure").map_elements(measure_label, return_dtype=pl.Utf8)
                               + " " + pl.col("qrels_version")).alias("column")) \
        .pivot(on="column", index="retriever", values="value").sort("retriever")
    ordered = [c for name in wanted for c in (f"{measure_label(name)} {version}" for version in QRELS_VERSIONS)
               if c in wide.columns and not (name == names["hole"] and c.endswith("original"))]
    return wide.select("retriever", *ordered)


@analysis_asset("retrieval_metrics",
                "Every system on the original and on the refined qrels, per query and "
                "averaged ('all'): Hit, Recall, P, MRR, nDCG @k, MAP, Judged@k, Hole@k "
                "(trec_eval conventions). Long table: dataset, retriever, qrels_version, "
                "query_id, measure, value.")
def retrieval_metrics(context: dg.AssetExecutionContext, config: RetrievalMetricsConfig,
                      store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    top_grade = GRADES[-1] if get_dataset(run.dataset).label_scale == "graded" else 1
    with run.inputs(store) as con:
        frame, info = compute_dataset_metrics(con, run.dataset, k=config.k, scope=config.scope,
                                              relevance_level=config.relevance_level, top_grade=top_grade)
    return run.finish(store, frame, {
        **_scope_metadata(info), "k": config.k, "relevance_level": config.relevance_level,
        "summary": dg.MetadataValue.md(_markdown(metrics_summary(frame, config.k)))})


class RankingShiftConfig(dg.Config):
    measures: list[str] = Field(list(SHIFT_MEASURES), description="retrieval_metrics measures to rank by.")


@analysis_asset("ranking_shift",
                "System ranking before (original qrels) and after (refined qrels), per "
                "measure: scores, places, rank changes, Kendall tau and tau-b.")
def ranking_shift(context: dg.AssetExecutionContext, config: RankingShiftConfig,
                  store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    with run.inputs(store) as con:
        frame = compute_ranking_shift(con, run.dataset, run.config.measures)
    taus = frame.unique("measure", maintain_order=True).select("measure", "kendall_tau", "kendall_tau_b")
    return run.finish(store, frame, {
        "systems": frame["retriever"].n_unique(),
        "moved_systems": frame.filter(pl.col("rank_change") != 0)["retriever"].n_unique(),
        "robustly_moved_systems": frame.filter(pl.col("robust_rank_change") != 0)["retriever"].n_unique(),
        "kendall_tau": dg.MetadataValue.md(_markdown(taus))}, timed=False)


class SignificanceConfig(dg.Config):
    measures: list[str] = Field(list(SIGNIFICANCE_MEASURES), description="retrieval_metrics measures to test.")
    qrels_versions: list[str] = Field(list(QRELS_VERSIONS), description="Of original, refined (pending "
                                      "pairs irrelevant), refined_upper (pending pairs relevant).")
    resamples: int = Field(RESAMPLES, ge=1, description="Resamples of the randomization test (exact "
                           "when 2^queries is at most this).")
    seed: int = 0
    alpha: float = Field(ALPHA, gt=0, lt=1, description="Significance level of the Holm-corrected p-values.")


@analysis_asset("significance",
                "Every pair of systems, per measure, on the original and on the refined qrels: "
                "two-sided paired t-test and randomization test over the queries, p-values "
                "Holm-Bonferroni corrected over the system pairs, significant at alpha; each "
                "pair's conclusion and its concordance with the original qrels (D-MERIT). Long "
                "table: dataset, measure, qrels_version, system_a, system_b, queries, mean_a, "
                "mean_b, test, statistic, p_value, p_holm, significant, conclusion, "
                "agrees_with_original, concordance, concordance_significant.")
def significance(context: dg.AssetExecutionContext, config: SignificanceConfig,
                 store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        frame = compute_significance(con, run.dataset, measures=config.measures,
                                     qrels_versions=config.qrels_versions, resamples=config.resamples,
                                     seed=config.seed, alpha=config.alpha)
    counts = frame.group_by("measure", "qrels_version", "test", maintain_order=True).agg(
        pl.len().alias("pairs"), pl.col("significant").sum().alias("significant"))
    return run.finish(store, frame, {
        "systems": len(set(frame["system_a"]) | set(frame["system_b"])),
        "resamples": config.resamples, "seed": config.seed, "alpha": config.alpha,
        "significant_pairs": dg.MetadataValue.md(_markdown(counts)),
        "concordance": dg.MetadataValue.md(_markdown(concordance_summary(frame)))})


# --- pool_saturation, partial_annotation_study ------------------------------------------------

class PoolSaturationConfig(dg.Config):
    orders: int = Field(10, ge=1, description="Random orders of adding systems (paper: 10).")
    seed: int = 0
    measures: list[str] = Field(list(SATURATION_MEASURES), description="Measures of the marginal contribution.")
    k: int = Field(10, ge=1)
    scope: Literal["pooled", "all"] = ScopeField


@analysis_asset("pool_saturation",
                "Pool saturation from the stored labels (no LLM call): filled holes found "
                "and growth rate GR(m) as systems are added (mean/std over seeded random "
                "orders), each system's marginal contribution MC(r) for Hit@10, "
                "nDCG@10, Recall@10, and the marginal-contribution curve as the pool grows "
                "(mean over the orders of what the m-th system added brings), with the systems' "
                "order by their mean contribution.")
def pool_saturation(context: dg.AssetExecutionContext, config: PoolSaturationConfig,
                    store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        frame, info, holes = compute_pool_saturation(con, run.dataset, orders=config.orders, seed=config.seed,
                                                     measures=config.measures, k=config.k, scope=config.scope)
    last_growth = frame.filter(pl.col("statistic") == "growth_rate").sort("systems_added").tail(1)
    contributions = frame.filter(pl.col("statistic") == "marginal_contribution") \
        .pivot(on="measure", index="retriever", values="value")
    return run.finish(store, frame, {
        **_scope_metadata(info), "holes": holes, "orders": config.orders, "seed": config.seed,
        "last_growth_rate": dg.MetadataValue.float(last_growth["value"][0])
        if last_growth.height and last_growth["value"][0] is not None else "undefined",
        "marginal_contribution": dg.MetadataValue.md(_markdown(contributions)),
        "contribution_curve": dg.MetadataValue.md(_markdown(
            frame.filter(pl.col("statistic") == "marginal_contribution_curve")
            .pivot(on="measure", index="systems_added", values="value").sort("systems_added")))})


class PoolCoverageConfig(dg.Config):
    orders: int = Field(20, ge=1, description="Random orders of adding systems (the curve's mean and band).")
    seed: int = 0
    resamples: int = Field(COVERAGE_RESAMPLES, ge=1, description="Pools drawn from the fitted curve for "
                           "the interval of the extrapolation (parametric bootstrap).")
    min_systems: int = Field(MIN_SYSTEMS, ge=3, description="Fewest systems for which the extrapolation "
                             "is shown (fewer points cannot tell a levelling curve from a straight line).")
    scope: Literal["pooled", "all"] = ScopeField


@analysis_asset("pool_coverage",
                "TREC-style pool coverage from the stored labels (no LLM call): relevant chunks "
                "in the pool as systems are added (mean, std and 5-95% band over seeded random "
                "orders), at both bounds over pending pairs, and a Michaelis-Menten saturation "
                "curve fitted to it: how many relevant chunks systems like these would still "
                "find outside the pool, with a 95% interval (parametric bootstrap), shown only "
                "with enough systems and a levelling curve (the note says why not).")
def pool_coverage(context: dg.AssetExecutionContext, config: PoolCoverageConfig,
                  store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        frame, info = compute_pool_coverage(con, run.dataset, orders=config.orders, seed=config.seed,
                                            resamples=config.resamples, min_systems=config.min_systems,
                                            scope=config.scope)
    estimates = frame.filter(pl.col("statistic").is_in(["in_pool", "known_outside_pool", "outside_pool_estimate"])) \
        .select("qrels_version", "statistic", "value", "low", "high", "note")
    return run.finish(store, frame, {
        **_scope_metadata(info), "orders": config.orders, "seed": config.seed, "resamples": config.resamples,
        "min_systems": config.min_systems, "extrapolation": dg.MetadataValue.md(_markdown(estimates, 1))})


class PartialAnnotationConfig(dg.Config):
    measures: list[str] = Field(list(PARTIAL_MEASURES))
    samples: int = Field(1000, ge=1, description="Random single-relevant draws (D-MERIT: 1000).")
    fractions: list[float] = Field(list(DEFAULT_FRACTIONS), description="Fractions of known relevant items.")
    sweep_samples: int = Field(20, ge=1, description="Draws per fraction.")
    seed: int = 0
    scope: Literal["pooled", "all"] = ScopeField


@analysis_asset("partial_annotation_study",
                "D-MERIT: Kendall tau-b and error rate between system rankings under partial "
                "and full (refined) qrels: random single-relevant (x samples), most popular / "
                "longest / shortest single-relevant, system-based single-relevant (base "
                "left out), a sweep over the fraction of known relevant items, and error "
                "rates per paired t-test p-value bucket.")
def partial_annotation_study(context: dg.AssetExecutionContext, config: PartialAnnotationConfig,
                             store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        frame, info, notes = compute_partial_annotation_study(
            con, run.dataset, measures=config.measures, samples=config.samples, fractions=config.fractions,
            sweep_samples=config.sweep_samples, seed=config.seed, scope=config.scope)
    found = notes.pop("base_system_found_relevant", {})
    if notes.get("queries_with_several_relevant") == 0:
        notes["note"] = ("every query has a single relevant document: partial annotation equals the "
                         "full qrels in every setting")
    headline = frame.filter((pl.col("p_bucket") == "all") & pl.col("base_system").is_null()
                            & (pl.col("statistic") == "kendall_tau_b")) \
        .select("setting", "fraction", "measure", "mean", "std")
    return run.finish(store, frame, {
        **_scope_metadata(info), **notes, **({"base_system_found_relevant": found} if found else {}),
        "kendall_tau_b": dg.MetadataValue.md(_markdown(headline))})


# --- RAG -------------------------------------------------------------------------------------

class RagAnswersConfig(dg.Config):
    model: str = Field("", description="LLM profile; empty: the LLM resource's `judge` role.")
    systems: list[str] = Field(default_factory=list, description="Systems to answer with; empty: every system.")
    query_limit: int = Field(10, ge=0, description="Stable sample of this many queries with gold "
                             "answers (0: all; each answer is one LLM call per system).")
    depth: int = Field(10, ge=1, description="Chunks an answer is generated from (the top-k).")
    passage_chars: int = Field(300, ge=50, description="Each chunk cut to this many characters.")
    max_tokens: int = Field(32, ge=4)
    scope: Literal["pooled", "all"] = ScopeField


@analysis_asset("rag_answers",
                "Per system and query (a stable sample), an answer generated by the LLM "
                "from that system's top-k chunks only, or 'no relevant information'.",
                reads=(asset_config.LLM_FILES,))
def rag_answers(context: dg.AssetExecutionContext, config: RagAnswersConfig, store: DuckDBStore,
                llm: LLMResource) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        contexts, info = rag.rag_contexts(con, run.dataset, depth=config.depth, query_limit=config.query_limit,
                                          systems=config.systems, scope=config.scope)
    model = config.model or llm.profile_for("judge")
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.lake) as capped:
        answers = rag.generate_answers(contexts, generate, model, run.dataset, settings=rag.AnswerSettings(
            depth=config.depth, passage_chars=config.passage_chars, max_tokens=config.max_tokens))
    return run.finish(store, answers, {
        **_scope_metadata(info), "model": model, "answered_queries": answers["query_id"].n_unique(),
        "no_information": int(answers["no_information"].sum() or 0),
        # a call deferred by the automation cap was never sent: not a failure (the cap reports it)
        "failed": int((answers["error"].is_not_null() & (answers["error"] != DEFERRED)).sum()),
        **generate.stats.as_metadata(), **capped})


class RagJudgmentsConfig(dg.Config):
    model: str = Field("", description="LLM profile; empty: the LLM resource's `judge` role.")
    max_tokens: int = Field(16, ge=4)


@analysis_asset("rag_judgments",
                "Each RAG answer judged True/False against the gold answers by the LLM "
                "('no relevant information' is False without a call; failed calls stay NULL).",
                reads=(asset_config.LLM_FILES,))
def rag_judgments(context: dg.AssetExecutionContext, config: RagJudgmentsConfig, store: DuckDBStore,
                  llm: LLMResource) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    config = run.config
    with run.inputs(store) as con:
        answers = con.execute("select * from rag_answers order by retriever, query_id").pl()
        queries = con.execute("select query_id, text, answers from queries").pl()
    model = config.model or llm.profile_for("judge")
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.lake) as capped:
        judgments = rag.judge_answers(answers, queries, generate, model, run.dataset, max_tokens=config.max_tokens)
    decided = judgments.filter(pl.col("judgment").is_not_null())
    return run.finish(store, judgments, {
        "model": model, "judged": decided.height, "correct": int(decided["judgment"].sum() or 0),
        "undecided": judgments.height - decided.height, **generate.stats.as_metadata(), **capped})


class RagAlignmentConfig(dg.Config):
    k: int = Field(10, ge=1, description="Cutoff of Hit@k / nDCG@k (retrieval_metrics must hold it).")


@analysis_asset("rag_alignment",
                "RAGAlign@k on original and refined qrels (agreement of Hit@k with the RAG "
                "judgment), point-biserial correlation with nDCG@k, and the Pearson "
                "correlation across systems.")
def rag_alignment(context: dg.AssetExecutionContext, config: RagAlignmentConfig,
                  store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    with run.inputs(store) as con:
        frame = rag.compute_rag_alignment(con, run.dataset, k=run.config.k)
    overall = frame.filter(pl.col("retriever") == "all").select("qrels_version", "statistic", "value", "p_value")
    return run.finish(store, frame, {"summary": dg.MetadataValue.md(_markdown(overall))}, timed=False)
