"""DREAM's pipeline assets, per dataset: candidate_pool -> filtered_pool (+ filter_votes) ->
debate_labels (+ debate_turns).

Thin wiring: read the tables, call the plain functions of this package with the LLM
resource's clients, write each asset's tables in one transaction, report what it cost.
Every run sends every pair through the labelers; the LLM call ledger answers what was already
asked, so an unchanged re-run makes no model call and a new retriever costs only the pairs
it surfaced. The LLM client records calls chunk by chunk as they return, so a killed run repeats no
answered call.
"""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import hashlib
import time
from typing import Any, Literal

import dagster as dg
import polars as pl
from pydantic import Field

from bridge_assets import automation, run_settings
from bridge_assets.ingest.registry import get_dataset
from bridge_assets.labeling import pooling
from bridge_assets.labeling.adjudicator import ADJUDICATOR_TEMPLATE, adjudicate, adjudicator_schema
from bridge_assets.labeling.calls import Generate, MeteredGenerate
from bridge_assets.labeling.debate import (DEBATE_TEMPLATES, AgentConfig, DebateChecks, DebateOutcome,
                                           debate_agents, debate_config_hash,
                                           escalation_count, fewshot_examples, labels_frame, run_debate,
                                           turns_frame)
from bridge_assets.labeling.filter import filtered_pool as summarize_votes
from bridge_assets.labeling.filter import run_filter, votes_frame
from bridge_assets.labeling.pairs import Pair, load_pairs
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.resource import LLMResource
from bridge_assets.partitions import dataset_partitions
from bridge_assets.resources import DuckDBStore
from bridge_assets.store import table_exists

GROUP = "labeling"
ADJUDICATOR_MAX_TOKENS = 256

class CandidatePoolConfig(dg.Config):
    depth: int = Field(10, ge=1, description="Each system's top-k that enters the pool (paper: 10).")
    query_limit: int = Field(0, ge=0, description="> 0: pool only a stable sample of this many "
                             "queries (chosen by md5 of the query id); 0: every query.")


class FilterConfig(dg.Config):
    models: list[str] = Field(default_factory=list, description="Filter model profiles (paper: 3); "
                              "empty: the LLM resource's `filter` role (models.yaml defaults).")
    max_tokens: int = Field(32, ge=8)
    label_judged_pairs: bool = Field(False, description="Also filter (and so debate) pairs the "
                                     "original qrels already judge.")


class DebateConfig(dg.Config):
    rounds: int = Field(2, ge=1, description="Maximum rounds R before escalation (paper: 2).")
    agents: int = Field(2, ge=2, description="Number of agents, half per stance (2 or 4).")
    models: list[str] = Field(default_factory=list, description="One profile for every agent or "
                              "one per agent; empty: the LLM resource's `debate` role.")
    temperature: float = Field(0.0, ge=0.0)
    stance_order: Literal["relevant_first", "irrelevant_first"] = Field(
        "relevant_first", description="Which opening stance agent A (listed first) takes.")
    prompt: Literal["paper", "soft_stance"] = Field(
        "soft_stance", description="The debate prompt: the paper's (agents defend their stance) "
        "or a softer one (a stance is a starting point to test).")
    fewshot: bool = Field(False, description="Worked examples (resources/prompts/examples.yaml) in "
                          "the agents' prompt.")
    answer_first: bool = Field(False, description="Each turn gives its yes/no before its quotes and "
                               "reason (the paper's turns argue first).")
    reason_words: int = Field(40, ge=5, le=300, description="The word limit of each turn's reason "
                              "(the reply's JSON schema bounds it, so it also bounds the cost).")
    evidence_check: bool = Field(False, description="Escalate a 'yes' consensus that no agent backs "
                                 "with a quote found in the chunk.")
    answer_check: Literal["off", "short", "all"] = Field(
        "short", description="Escalate a 'yes' consensus on a chunk that contains no reference "
        "answer: on pairs whose answers are short spans (NQ-style), on all pairs with answers, or off.")
    min_confidence: float = Field(0.0, ge=0.0, le=1.0, description="Escalate a consensus whose "
                                  "weakest agent gives its answer a probability below this (0: off).")
    escalation_budget: int = Field(0, ge=0, description="> 0: escalate at most this many pairs, "
                                   "least confident first; the others get the agents' pooled vote "
                                   "(outcome 'vote', an unverified label).")
    escalation_budget_ratio: float = Field(0.0, ge=0.0, le=1.0, description="> 0: the same budget "
                                           "as a share of the debated pairs.")
    adjudicate: bool = Field(False, description="Let an LLM adjudicator decide escalated and "
                             "failed pairs (stored as adjudicator_label, apart from consensus; "
                             "always reported as unverified, never as found holes).")
    adjudicator_model: str = Field("", description="Empty: the LLM resource's `adjudicator` role.")
    grade_consensus: Literal["exact", "within_one"] = Field(
        "exact", description="On a graded dataset (label_scale: graded), when the agents' grades "
        "agree: exact (all equal), or within_one (at most one grade apart, the lower grade kept).")

    def checks(self, pairs: int) -> DebateChecks:
        budgets = [b for b in (self.escalation_budget,
                               escalation_count(pairs, self.escalation_budget_ratio)
                               if self.escalation_budget_ratio else 0) if b > 0]
        return DebateChecks(evidence=self.evidence_check, answer_presence=self.answer_check,
                            min_confidence=self.min_confidence, budget=min(budgets) if budgets else None)

    def debate_agents(self, models: list[str]) -> tuple[AgentConfig, ...]:
        return debate_agents(models, self.agents, self.stance_order, template=DEBATE_TEMPLATES[self.prompt])

    def run(self, pairs: list[Pair], models: list[str], generate: Generate,
            prompts: Prompts | None = None) -> DebateOutcome:
        """The debate this configuration describes (the asset's and the dry run's one way)."""
        return run_debate(pairs, self.debate_agents(models), generate, rounds=self.rounds,
                          temperature=self.temperature, reason_words=self.reason_words,
                          examples=fewshot_examples(self.fewshot), prompts=prompts,
                          checks=self.checks(len(pairs)), grade_consensus=self.grade_consensus,
                          answer_first=self.answer_first)


def _previous_keys(store: DuckDBStore, table: str, columns: str, dataset: str) -> set[tuple]:
    with store.connect() as con:
        if not table_exists(con, table):
            return set()
        return set(con.execute(f"select distinct {columns} from {table} where dataset = ?",
                               [dataset]).fetchall())


def data_version(frame: pl.DataFrame) -> dg.DataVersion:
    """Changes only when the rows do, so Dagster marks downstream stale only then."""
    rows = frame.drop("dataset")
    rows = rows.select(sorted(rows.columns)).sort(
        [c for c, kind in rows.schema.items() if not isinstance(kind, pl.List)])
    return dg.DataVersion(hashlib.sha256(rows.write_ipc(None).getvalue()).hexdigest()[:16])


def _seconds(started: float) -> float:
    return round(time.monotonic() - started, 2)


@dg.asset(
    partitions_def=dataset_partitions, group_name=GROUP,
    # retrieval_run is partitioned by (dataset, retriever); Dagster maps a dataset's pool to
    # every retriever's run of that dataset (MultiToSingleDimensionPartitionMapping).
    deps=["retrieval_run", "original_qrels"],
    description="Union of every retrieval system's top-k per query: one row per (query, doc) "
                "with the systems and ranks that surfaced it; pairs the original qrels judge are marked.")
def candidate_pool(context: dg.AssetExecutionContext, config: CandidatePoolConfig,
                   store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    settings = run_settings.for_run(context, config)
    config = settings.config
    started = time.monotonic()
    before = _previous_keys(store, "candidate_pool", "query_id, doc_id", dataset)
    with store.connect() as con:
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
        data_version=data_version(pool))


@dg.multi_asset(
    specs=[
        dg.AssetSpec("filtered_pool", deps=["candidate_pool", "queries", "corpus"],
                     description="Candidate pairs after the LLM filter: dropped only when every "
                                 "filter model says the chunk supports no answer."),
        dg.AssetSpec("filter_votes", deps=["candidate_pool", "queries", "corpus"],
                     description="Every filter model's vote on every pair (NULL + error when the call failed)."),
    ],
    partitions_def=dataset_partitions, group_name=GROUP, can_subset=False)
def filter_pool(context: dg.AssetExecutionContext, config: FilterConfig, store: DuckDBStore,
                llm: LLMResource):
    dataset = context.partition_key
    settings = run_settings.for_run(context, config)
    config = settings.config
    started = time.monotonic()
    judged = "" if config.label_judged_pairs else "and not in_original_qrels"
    with store.connect() as con:
        pairs = load_pairs(con, dataset, "select query_id, doc_id from candidate_pool "
                                         f"where dataset = $dataset {judged}",
                           get_dataset(dataset).label_scale)
    before = _previous_keys(store, "filter_votes", "pair_key", dataset)
    models = config.models or llm.profiles_for("filter")
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.db_path) as capped:
        votes = votes_frame(run_filter(pairs, models, generate, max_tokens=config.max_tokens), dataset)
    pool = summarize_votes(votes)
    store.write_partitions({"filter_votes": votes, "filtered_pool": pool}, dataset=dataset)
    kept = int(pool["kept"].sum()) if pool.height else 0
    stats = generate.stats.as_metadata()
    yield dg.MaterializeResult(asset_key="filtered_pool", metadata={
        **settings.metadata(), "dagster/row_count": pool.height, "pairs": len(pairs),
        "new_pairs": len({p.key for p in pairs} - {k for (k,) in before}),
        "kept": kept, "dropped": pool.height - kept, "models": ", ".join(models), **stats, **capped,
        "time_s": _seconds(started)}, data_version=data_version(pool))
    yield dg.MaterializeResult(asset_key="filter_votes", metadata={
        **settings.metadata(), "dagster/row_count": votes.height,
        "failed_votes": int(votes["is_supported"].is_null().sum()), "models": ", ".join(models)},
        data_version=data_version(votes))


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


@dg.multi_asset(
    specs=[
        dg.AssetSpec("debate_labels", deps=["filtered_pool", "queries", "corpus"],
                     description="DREAM outcome per kept pair: consensus label, or escalated / "
                                 "failed (to humans or the optional LLM adjudicator)."),
        dg.AssetSpec("debate_turns", deps=["filtered_pool", "queries", "corpus"],
                     description="Every debate turn: round, agent, stance, model, quoted "
                                 "sentences, reason, answer, call key."),
    ],
    partitions_def=dataset_partitions, group_name=GROUP, can_subset=False)
def debate(context: dg.AssetExecutionContext, config: DebateConfig, store: DuckDBStore,
           llm: LLMResource):
    dataset = context.partition_key
    settings = run_settings.for_run(context, config)
    config = settings.config
    started = time.monotonic()
    scale = get_dataset(dataset).label_scale
    if scale == "graded" and config.fewshot:
        raise ValueError(f"dataset '{dataset}' is graded: the worked examples (fewshot) answer "
                         "yes/no, so they cannot show a graded debate")
    with store.connect() as con:
        pairs = load_pairs(con, dataset,
                           "select query_id, doc_id from filtered_pool where dataset = $dataset and kept",
                           scale)
    models = config.models or [llm.profile_for("debate")]
    agents = config.debate_agents(models)
    checks = config.checks(len(pairs))
    examples = fewshot_examples(config.fewshot)
    prompts = Prompts()
    adjudicator_model = (config.adjudicator_model or llm.profile_for("adjudicator")) \
        if config.adjudicate else None
    model_ids = {name: llm.client(name).model_id for name in {*models, adjudicator_model} if name}
    adjudicator: dict[str, Any] | None = None
    if adjudicator_model:
        adjudicator = {"model": adjudicator_model, "model_id": model_ids[adjudicator_model],
                       "prompt": prompts.hash(ADJUDICATOR_TEMPLATE),
                       "schema": adjudicator_schema(ADJUDICATOR_MAX_TOKENS, scale)}
    config_hash = debate_config_hash(agents, rounds=config.rounds, temperature=config.temperature,
                                     reason_words=config.reason_words, prompts=prompts,
                                     model_ids=model_ids, adjudicator=adjudicator, checks=checks,
                                     examples=examples, scale=scale,
                                     grade_consensus=config.grade_consensus,
                                     answer_first=config.answer_first)
    before = _previous_keys(store, "debate_labels", "pair_key, config_hash", dataset)
    generate = MeteredGenerate(llm.generate_fn(context.run_id, context.log.info))
    with automation.llm_cap(context, llm.db_path) as capped:
        outcome = config.run(pairs, models, generate, prompts)
        if adjudicator_model:
            outcome = adjudicate(outcome, pairs, adjudicator_model, generate, prompts=prompts,
                                 max_tokens=ADJUDICATOR_MAX_TOKENS)
    labels = labels_frame(outcome, dataset, config_hash)
    turns = turns_frame(outcome, dataset)
    store.write_partitions({"debate_labels": labels, "debate_turns": turns}, dataset=dataset)

    n = len(pairs)
    escalated, failed = outcome.count("escalated"), outcome.count("failed")
    consensus = outcome.consensus_by_round()
    metadata: dict[str, Any] = {
        **settings.metadata(), "dagster/row_count": n, "pairs": n,
        "new_pairs": len({(p.key, config_hash) for p in pairs} - before),
        "config_hash": config_hash, "agents": ", ".join(f"{a.name}:{a.stance}:{a.model}" for a in agents),
        "rounds": config.rounds, "label_scale": scale,
        **{f"consensus_after_round_{r}": count for r, count in consensus.items()},
        **{f"consensus_share_after_round_{r}": _share(count, n) for r, count in consensus.items()},
        "relevant": int(((labels["label"] >= 1) & (labels["outcome"] == "consensus")).sum()),
        "irrelevant": int(((labels["label"] == 0) & (labels["outcome"] == "consensus")).sum()),
        "escalated": escalated, "failed": failed, "voted_over_budget": outcome.count("vote"),
        "escalation_ratio": _share(escalated + failed, n),
        **{f"escalated_{flag}": count for flag, count in outcome.flag_counts().items()},
        "checks": ", ".join(f"{k}={v}" for k, v in checks.as_config().items()),
        **generate.stats.as_metadata(), **capped, "time_s": _seconds(started)}
    if adjudicator_model:
        metadata["adjudicated"] = int(labels["adjudicator_label"].is_not_null().sum())
        metadata["adjudicator_failures"] = int(labels["adjudicator_error"].is_not_null().sum())
    yield dg.MaterializeResult(asset_key="debate_labels", metadata=metadata,
                               data_version=data_version(labels))
    yield dg.MaterializeResult(asset_key="debate_turns", metadata={
        **settings.metadata(), "dagster/row_count": turns.height,
        "failed_turns": int(turns["error"].is_not_null().sum())},
        data_version=data_version(turns))
