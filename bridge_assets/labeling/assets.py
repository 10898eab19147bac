"""The labeling stage's assets, per dataset: candidate_pool -> filtered_pool (+ filter_votes) ->
debate_labels (+ debate_turns), the last written by the dataset's labeler (DREAM by default;
labeler.py).

Thin wiring: read the declared tables, call the plain functions of this package with the LLM
resource's clients, write each asset's tables in one transaction, report what it cost.
Every run sends every pair through the labelers; the LLM call ledger answers what was already
asked, so an unchanged re-run makes no model call and a new retriever costs only the pairs
it surfaced. The LLM client records calls chunk by chunk as they return, so a killed run repeats no
answered call.
"""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import time
from collections.abc import Iterator
from typing import Any, cast

import dagster as dg
import polars as pl
from pydantic import Field

from bridge_assets.labeling import pooling
from bridge_assets.labeling.calls import MeteredGenerate
from bridge_assets.labeling.debate import DebateOutcome, labels_frame, turns_frame
from bridge_assets.labeling.filter import KEEP_P_YES, run_filter, votes_frame
from bridge_assets.labeling.filter import filtered_pool as summarize_votes
from bridge_assets.labeling.labeler import (
    DEFAULT_LABELER,
    LabelerSettings,
    labeler_settings,
    pipeline_items,
    pipeline_labeler,
    pipeline_pairs,
)
from bridge_assets.labeling.pairs import load_pairs
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.labeling.review import AUDIT, CALIBRATION, pair_trusted_by_rule, review_sample
from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import table_exists
from bridge_assets.llm.resource import LLMResource
from bridge_assets.pipeline import asset_config, automation
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import reuse_when_current
from bridge_assets.registry.datasets import get_dataset

GROUP = "labeling"
# The tables each labeling op reads, declared once: its deps and its snapshot
# (tests/test_lineage.py checks it reads no more).
READS: dict[str, tuple[str, ...]] = {
    "candidate_pool": ("retrieval_run", "original_qrels"),
    "filter_pool": ("candidate_pool", "queries", "corpus"),
    "debate": ("filtered_pool", "queries", "corpus"),
}
LABELING_ASSETS = ("debate_labels", "debate_turns", "review_sample")  # the labeling stage's op writes all

class CandidatePoolConfig(dg.Config):
    depth: int = Field(10, ge=1, description="Each system's top-k that enters the pool (paper: 10).")
    query_limit: int = Field(0, ge=0, description="> 0: pool only a stable sample of this many "
                             "queries (chosen by md5 of the query id); 0: every query.")


class FilterConfig(dg.Config):
    models: list[str] = Field(default_factory=list, description="Filter model profiles (paper: 3); "
                              "empty: the LLM resource's `filter` role (models.yaml defaults).")
    max_tokens: int = Field(32, ge=8)
    keep_p_yes: float = Field(KEEP_P_YES, ge=0.0, le=1.0, description="Under a relevance definition "
                              "(useful or your own), binary scale: keep a pair unless the scorer's "
                              "P(yes) is under this (docs/labeler-eval.md).")
    label_judged_pairs: bool = Field(False, description="Also filter (and so debate) pairs the "
                                     "original qrels already judge.")


class LabelingConfig(dg.PermissiveConfig):
    """The labeler and its settings, flat: `labeler` names it, every other key is one of its
    settings (DREAM's: rounds, agents, models, prompt, reason_words, checks, budget, ...; see
    bridge_assets/labeling/dream.py or `bridge label-eval --help`), validated by the labeler."""

    labeler: str = Field(DEFAULT_LABELER, description="A labeler of bridge_assets/labeling/"
                         "labeler.py LABELERS (dream, judge, ...) or module:Class of your own.")

    @staticmethod
    def build_settings(values: dict[str, Any]) -> LabelerSettings:
        return labeler_settings(values)

    @staticmethod
    def applicable_entry(entry: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
        """The dataset's entry holds the settings of its own labeler: a run that names another
        labeler takes that labeler's defaults, not those settings."""
        named = explicit.get("labeler")
        return entry if named is None or named == entry.get("labeler", DEFAULT_LABELER) else {}


def _previous_keys(store: DuckDBStore, table: str, columns: str, dataset: str) -> set[tuple]:
    with store.connect() as con:
        if not table_exists(con, table):
            return set()
        return set(con.execute(f"select distinct {columns} from {table} where dataset = ?",
                               [dataset]).fetchall())


def _seconds(started: float) -> float:
    return round(time.monotonic() - started, 2)


# the LLM stages' output depends on the profiles and prompts, and on what relevant means
LLM_AND_RELEVANCE = asset_config.reads_tags(asset_config.LLM_FILES, asset_config.RELEVANCE)

@dg.asset(
    partitions_def=dataset_partitions, group_name=GROUP,
    # retrieval_run is partitioned by (dataset, retriever); Dagster maps a dataset's pool to
    # every retriever's run of that dataset (MultiToSingleDimensionPartitionMapping).
    deps=list(READS["candidate_pool"]),
    description="Union of every retrieval system's top-k per query: one row per (query, doc) "
                "with the systems and ranks that surfaced it; pairs the original qrels judge are marked.")
@reuse_when_current
def candidate_pool(context: dg.AssetExecutionContext, config: CandidatePoolConfig,
                   store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    settings = asset_config.for_run(context, config)
    config = settings.config
    started = time.monotonic()
    before = _previous_keys(store, "candidate_pool", "query_id, doc_id", dataset)
    with snapshots.inputs(store, dataset, READS["candidate_pool"]) as con:
        pool = pooling.candidate_pool(con, dataset, config.depth, config.query_limit)
    store.write_partitions({"candidate_pool": pool}, dataset=dataset)
    pairs = set(zip(pool["query_id"], pool["doc_id"]))
    systems = sorted({s for row in pool["systems"] for s in row})
    return dg.MaterializeResult(metadata={
        **settings.metadata(), "dagster/row_count": pool.height, "pairs": pool.height,
        "new_pairs": len(pairs - before),
        "queries": pool["query_id"].n_unique(), "systems": len(systems),
        "system_names": ", ".join(systems), "depth": config.depth,
        "judged_pairs": int(pool["in_original_qrels"].sum()), "time_s": _seconds(started)},
        data_version=snapshots.frame_version(pool))


@dg.multi_asset(
    specs=[
        dg.AssetSpec("filtered_pool", deps=READS["filter_pool"], tags=LLM_AND_RELEVANCE,
                     description="Candidate pairs after the LLM filter: dropped only when every "
                                 "filter model says the chunk supports no answer."),
        dg.AssetSpec("filter_votes", deps=READS["filter_pool"], tags=LLM_AND_RELEVANCE,
                     description="Every filter model's vote on every pair (NULL + error when the call failed)."),
    ],
    partitions_def=dataset_partitions, group_name=GROUP, can_subset=False)
@reuse_when_current
def filter_pool(context: dg.AssetExecutionContext, config: FilterConfig, store: DuckDBStore,
                llm: LLMResource) -> Iterator[dg.MaterializeResult]:
    dataset = context.partition_key
    settings = asset_config.for_run(context, config)
    config = settings.config
    started = time.monotonic()
    judged = "" if config.label_judged_pairs else "and not in_original_qrels"
    with snapshots.inputs(store, dataset, READS["filter_pool"]) as con:
        spec = get_dataset(dataset)
        pairs = load_pairs(con, dataset, "select query_id, doc_id from candidate_pool "
                                         f"where dataset = $dataset {judged}",
                           spec.label_scale, spec.relevance.definition)
    before = _previous_keys(store, "filter_votes", "pair_key", dataset)
    models = config.models or llm.profiles_for("filter")
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.lake) as capped:
        votes = votes_frame(run_filter(pairs, models, generate, max_tokens=config.max_tokens,
                                       keep_p_yes=config.keep_p_yes), dataset)
    pool = summarize_votes(votes)
    store.write_partitions({"filter_votes": votes, "filtered_pool": pool}, dataset=dataset)
    kept = int(pool["kept"].sum()) if pool.height else 0
    stats = generate.stats.as_metadata()
    yield dg.MaterializeResult(asset_key="filtered_pool", metadata={
        **settings.metadata(), "dagster/row_count": pool.height, "pairs": len(pairs),
        "new_pairs": len({p.key for p in pairs} - {k for (k,) in before}),
        "kept": kept, "dropped": pool.height - kept, "models": ", ".join(models), **stats, **capped,
        "time_s": _seconds(started)}, data_version=snapshots.frame_version(pool))
    yield dg.MaterializeResult(asset_key="filter_votes", metadata={
        **settings.metadata(), "dagster/row_count": votes.height,
        "failed_votes": int(votes["is_supported"].is_null().sum()), "models": ", ".join(models)},
        data_version=snapshots.frame_version(votes))


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


@dg.multi_asset(
    specs=[
        dg.AssetSpec("debate_labels", deps=READS["debate"], tags=LLM_AND_RELEVANCE,
                     description="DREAM outcome per kept pair: consensus label, or escalated / "
                                 "failed (to humans or the optional LLM adjudicator)."),
        dg.AssetSpec("debate_turns", deps=READS["debate"], tags=LLM_AND_RELEVANCE,
                     description="Every debate turn: round, agent, stance, model, quoted "
                                 "sentences, reason, answer, call key."),
        dg.AssetSpec("review_sample", deps=READS["debate"], tags=asset_config.reads_tags(asset_config.RELEVANCE),
                     description="The model labels people check: a seeded random share of the "
                                 "filter's drops (audit) and, where the debate's labels are not "
                                 "trusted by rule, a calibration sample of its consensus labels "
                                 "(labeling/review.py; the dataset's `relevance:` settings)."),
    ],
    partitions_def=dataset_partitions, group_name=GROUP, can_subset=False)
@reuse_when_current
def debate(context: dg.AssetExecutionContext, config: LabelingConfig, store: DuckDBStore,
           llm: LLMResource) -> Iterator[dg.MaterializeResult]:
    dataset = context.partition_key
    settings = asset_config.for_run(context, config)
    started = time.monotonic()
    spec = get_dataset(dataset)
    scale, definition = spec.label_scale, spec.relevance.definition
    # resolve() validates a LabelingConfig into the labeler's own settings (its build_settings)
    labeler = pipeline_labeler(cast(LabelerSettings, settings.config), llm.profiles_for, scale)
    with snapshots.inputs(store, dataset, READS["debate"]) as con:
        pairs = pipeline_pairs(con, dataset, scale, definition)
        filtered = con.execute("select query_id, doc_id, kept from filtered_pool where dataset = ?",
                               [dataset]).pl()
    prompts = Prompts()
    config_hash = labeler.config_hash(prompts, scale, items=len(pairs),
                                      model_id=lambda name: llm.client(name).model_id,
                                      definition=definition)
    before = _previous_keys(store, "debate_labels", "pair_key, config_hash", dataset)
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.lake) as capped:
        run = labeler.label(pipeline_items(pairs), generate, prompts)
    labels = labels_frame(DebateOutcome(run.labels, run.turns), dataset, config_hash).with_columns(
        pl.Series("trusted_by_rule", [pair_trusted_by_rule(pair.relevance.kind, label.answer_present)
                                      for pair, label in zip(pairs, run.labels, strict=True)],
                  dtype=pl.Boolean))
    turns = turns_frame(DebateOutcome(run.labels, run.turns), dataset)
    sample = review_sample(filtered, labels, spec.relevance,
                           trusted_by_rule=bool(labels["trusted_by_rule"].all()) if labels.height else False,
                           previous=_previous_keys(store, "review_sample", "query_id, doc_id, kind", dataset)
                           ).with_columns(pl.lit(dataset).alias("dataset"))
    store.write_partitions({"debate_labels": labels, "debate_turns": turns, "review_sample": sample},
                           dataset=dataset)

    n = len(pairs)
    consensus = run.extra.get("consensus_by_round", {})
    escalated, failed = run.count("escalated"), run.count("failed")
    metadata: dict[str, Any] = {
        **settings.metadata(), "dagster/row_count": n, "pairs": n,
        "new_pairs": len({(p.key, config_hash) for p in pairs} - before),
        "config_hash": config_hash, "labeler": settings.config.labeler, **labeler.describe(n),
        "label_scale": scale,
        **{f"consensus_after_round_{r}": count for r, count in consensus.items()},
        **{f"consensus_share_after_round_{r}": _share(count, n) for r, count in consensus.items()},
        "relevant": int(((labels["label"] >= 1) & (labels["outcome"] == "consensus")).sum()),
        "irrelevant": int(((labels["label"] == 0) & (labels["outcome"] == "consensus")).sum()),
        "escalated": escalated, "failed": failed, "unverified_labels": run.count("vote"),
        "escalation_ratio": _share(escalated + failed, n),
        **{f"escalated_{flag}": count for flag, count in run.extra.get("flags", {}).items()},
        **generate.stats.as_metadata(), **capped, "time_s": _seconds(started)}
    if getattr(labeler, "adjudicator", ""):
        metadata["adjudicated"] = int(labels["adjudicator_label"].is_not_null().sum())
        metadata["adjudicator_failures"] = int(labels["adjudicator_error"].is_not_null().sum())
    yield dg.MaterializeResult(asset_key="debate_labels", metadata=metadata,
                               data_version=snapshots.frame_version(labels))
    yield dg.MaterializeResult(asset_key="debate_turns", metadata={
        **settings.metadata(), "dagster/row_count": turns.height,
        "failed_turns": int(turns["error"].is_not_null().sum())},
        data_version=snapshots.frame_version(turns))
    yield dg.MaterializeResult(asset_key="review_sample", metadata={
        **settings.metadata(), "dagster/row_count": sample.height,
        "audit_pairs": int((sample["kind"] == AUDIT).sum()),
        "calibration_pairs": int((sample["kind"] == CALIBRATION).sum()),
        "filter_drops": int((~filtered["kept"]).sum()) if filtered.height else 0},
        data_version=snapshots.frame_version(sample))
