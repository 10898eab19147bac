"""`bridge run --dry-run`: the candidate pool, and the LLM calls each stage of the main job will
make at most, how many of them the call ledger already answered (free), their tokens and their
price, computed without running an asset or calling a model.

The pool is built in memory from the stored retrieval runs (plain SQL) when every system of
the active retriever profile has a current one; otherwise the estimate names the runs that
must come first. The stages then run on a `LedgerReplay`: a generate that answers from the
ledger only and fails every request the ledger lacks. A labeler never reads a failed call as
a label (a failed vote keeps its pair, a failed turn ends the debate), so a replay renders the
exact request, and key, of every call whose inputs are known: the retrieval systems' rewrites
(and re-rankings, from their first stage's stored run), every filter vote, every first-round
debate turn, the RAG answers, and whatever depends on answered calls only. What depends on a
reply not made yet is an upper bound: the debate of a pair the filter may still drop, a
debate that meets an unanswered turn in round r (it may go on to the last round), the
adjudicator's call on every pair left open, a judgment of every answer not made yet. A key two
stages ask is paid once, by the first. Each stage estimates its own calls beside its code
(retrieval/estimate.py, labeling/filter.py, the labeler's `estimate`, analysis/rag.py) with the
settings its asset resolves for the dataset, so the estimate follows what the run would do.

Tokens: prompts are estimated at 4 characters a token (llm.budget.prompt_tokens); replies
are counted at their max_tokens (an upper bound) and at the mean reply of the same purpose
in the ledger (typical).
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb

from bridge_assets.analysis.rag import estimate_rag_calls
from bridge_assets.analysis.views import dataset_snapshot
from bridge_assets.human.cost import PeopleCost, annotator_rate, people_cost
from bridge_assets.human.cost import describe as describe_people
from bridge_assets.labeling import pooling
from bridge_assets.labeling.filter import estimate_filter
from bridge_assets.labeling.labeler import pipeline_items, pipeline_labeler
from bridge_assets.labeling.pairs import Pair, load_pairs
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import ledger
from bridge_assets.llm.budget import Budget
from bridge_assets.llm.replay import LedgerReplay, StageCalls
from bridge_assets.llm.resource import LLMResource
from bridge_assets.orchestration.runs import asset_settings
from bridge_assets.paths import LakeLocation
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.retrieval.estimate import current_runs, estimate_retrieval_calls, llm_system_lines, with_upstream
from bridge_assets.retrieval.registry import load_registry

if TYPE_CHECKING:
    from bridge_assets.labeling.assets import CandidatePoolConfig, FilterConfig

# The tables the estimate reads, copied for one dataset into memory (the lake is not written).
INPUTS = ["queries", "corpus", "original_qrels", "retrieval_run"]


@dataclass
class PoolInfo:
    pairs: int
    queries: int
    judged: int                  # pairs the original qrels judge
    to_label: int                # pairs sent to the filter
    systems: tuple[str, ...]
    depth: int
    query_limit: int


@dataclass
class RunEstimate:
    dataset: str
    pool: PoolInfo | None = None
    first: list[str] = field(default_factory=list)   # what must run before the pool is known
    stages: list[StageCalls] = field(default_factory=list)
    llm_systems: list[str] = field(default_factory=list)  # retrieval's LLM calls per query (no ingest yet)
    people: PeopleCost | None = None  # people's time so far and to finish, at BRIDGE_ANNOTATOR_RATE


def estimate_run(dataset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> RunEstimate:
    """What the main job would do on `dataset`, with `overrides` (asset name -> fields, as the
    run's explicit config) over the dataset's own settings."""
    lake = DuckDBStore().lake
    estimate = RunEstimate(dataset)
    written = store.exists(lake)
    replay = LedgerReplay(lake if written else None)
    con = dataset_snapshot(lake, dataset, INPUTS) if written else duckdb.connect()
    with contextlib.closing(con):
        _estimate(estimate, con, overrides or {}, replay)
    typical = _typical_replies(replay.lake)
    for stage in estimate.stages:
        stage.typical_reply = typical.get((stage.profile, stage.purpose), typical.get((None, stage.purpose)))
    estimate.people = _people(lake, dataset) if written else None
    return estimate


def _people(lake: LakeLocation, dataset: str) -> PeopleCost | None:
    """People's time on `dataset` so far and the votes its open pairs need, priced at
    BRIDGE_ANNOTATOR_RATE (None before anyone voted or a debate escalated anything)."""
    from bridge_assets.human.tables import HUMAN_VOTES
    from bridge_assets.human.votes_store import copy_votes

    with contextlib.closing(store.dataset_snapshot(lake, dataset, ["debate_labels"])) as con:
        if lake.votes_db.exists():
            copy_votes(con, dataset, lake)
        else:  # nobody voted yet: a dry run creates no votes store
            con.execute(HUMAN_VOTES.replace(" default nextval('human_vote_ids')", ""))
        people = people_cost(con, dataset, annotator_rate())
    return people if people.votes or people.open_pairs else None


def _estimate(estimate: RunEstimate, con: duckdb.DuckDBPyConnection, overrides: Mapping[str, Mapping[str, Any]],
              replay: LedgerReplay) -> None:
    """Fill `estimate`: the retrieval systems' calls and what must run first, or the pool and
    the calls of every stage after it, each stage estimating its own with the settings its
    asset resolves (orchestration.asset_settings)."""
    dataset = estimate.dataset

    def settings(asset: str) -> Any:
        return asset_settings(asset, dataset, {name: dict(fields) for name, fields in overrides.items()})

    registry = load_registry()
    systems = registry.profile_systems()
    if not _has_rows(con, "queries", dataset):
        estimate.first += ["ingest (corpus, queries, original_qrels; no LLM)",
                           f"retrieval_run: {', '.join(systems)}"]
        estimate.llm_systems = llm_system_lines(registry, systems)
        return
    current = current_runs(con, dataset, registry, with_upstream(registry, systems),
                           settings("retrieval_run").k)
    estimate.stages += estimate_retrieval_calls(con, dataset, registry, systems, current, replay)
    stale = [name for name in systems if name not in current]
    if stale:
        estimate.first.append(f"retrieval_run: {', '.join(stale)}")
        return
    llm = LLMResource()
    filtering = settings("filtered_pool")
    estimate.pool, pairs = _pool(con, dataset, systems, settings("candidate_pool"), filtering)
    stages, kept, unsure = estimate_filter(pairs, filtering.models or llm.profiles_for("filter"), replay,
                                           max_tokens=filtering.max_tokens, keep_p_yes=filtering.keep_p_yes)
    labeler = pipeline_labeler(settings("debate_labels"), llm.profiles_for, get_dataset(dataset).label_scale)
    stages += labeler.estimate(pipeline_items(kept), unsure, replay)
    answers, judgments = settings("rag_answers"), settings("rag_judgments")
    stages += estimate_rag_calls(con, dataset, answers, judgments, answers.model or llm.profile_for("judge"),
                                 judgments.model or llm.profile_for("judge"), replay)
    if registry.evaluation_systems():  # a trained retriever on UtilSel labels asks one call per query
        from bridge_assets.student.rerank import estimate_utility_calls
        from bridge_assets.student.retriever_data import pool_pairs

        stages += estimate_utility_calls(registry, pool_pairs(con, dataset), replay)
    estimate.stages += stages


def _has_rows(con: duckdb.DuckDBPyConnection, table: str, dataset: str) -> bool:
    return store.table_exists(con, table) and store.one_row(
        con, f"select count(*) > 0 from {table} where dataset = ?", [dataset])[0]


def _pool(con: duckdb.DuckDBPyConnection, dataset: str, systems: Sequence[str], config: CandidatePoolConfig,
          filter_config: FilterConfig) -> tuple[PoolInfo, list[Pair]]:
    """The candidate pool of the active systems' runs, as the `candidate_pool` table of `con`
    (which `bridge run` builds the same way), and the pairs sent to the filter."""
    con.execute("delete from retrieval_run where not list_contains(?, retriever)", [list(systems)])
    pool = pooling.candidate_pool(con, dataset, config.depth, config.query_limit)
    con.register("_pool", pool.to_arrow())
    con.execute("create table candidate_pool as select * from _pool")
    con.unregister("_pool")
    judged = "" if filter_config.label_judged_pairs else "and not in_original_qrels"
    spec = get_dataset(dataset)
    pairs = load_pairs(con, dataset, "select query_id, doc_id from candidate_pool "
                                     f"where dataset = $dataset {judged}", spec.label_scale,
                       spec.relevance.definition)
    info = PoolInfo(pool.height, pool["query_id"].n_unique(), int(pool["in_original_qrels"].sum()),
                    len(pairs), tuple(sorted({s for row in pool["systems"] for s in row})),
                    config.depth, config.query_limit)
    return info, pairs


def _typical_replies(lake: LakeLocation | None) -> dict[tuple[str | None, str], float]:
    """Mean reply tokens of answered calls per (profile, purpose), and per (None, purpose)."""
    if lake is None:
        return {}
    with store.connect(lake) as con:
        if not store.table_exists(con, ledger.TABLE):
            return {}
        rows = con.execute(f"""select profile, purpose, avg(tokens_out) from {ledger.TABLE}
                               where error is null
                               group by grouping sets ((profile, purpose), (purpose))""").fetchall()
    return {(profile, purpose): mean for profile, purpose, mean in rows}


# --- what the command prints -------------------------------------------------------------------

TABLE_NOTE = ("answered: in the LLM ledger (or asked by a stage above), free. '≤': calls that depend "
              "on replies not made yet (an upper bound). Prompt tokens are estimated at 4 characters a "
              "token; replies are counted at their max_tokens (max) and at the ledger's mean reply of "
              "the same purpose (typical; the max where the ledger has none). Models without prices "
              "show '-'.")


def _count(value: int, bounded: bool) -> str:
    return f"{'≤ ' if bounded else ''}{value:,}"


def _money(amounts: Mapping[str, float]) -> str:
    """'0.0123 USD' (several currencies joined by '+'); '-' when nothing is priced."""
    return " + ".join(f"{amount:.4f} {currency}" for currency, amount in sorted(amounts.items())) or "-"


def _add(totals: dict[str, float], priced: tuple[str, float] | None) -> dict[str, float]:
    if priced is not None:
        totals[priced[0]] = totals.get(priced[0], 0.0) + priced[1]
    return totals


def render(estimate: RunEstimate, budget: Budget | None = None) -> str:
    """The dry run's report: the pool (or what must run first) and a table of the LLM calls."""
    lines = [f"Dry run of the main job on '{estimate.dataset}': nothing was run, no model was called."]
    pool = estimate.pool
    if pool is not None:
        sample = f", a sample of {pool.query_limit} queries" if pool.query_limit else ""
        lines.append(f"Pool: {pool.pairs:,} pairs over {pool.queries:,} queries from {len(pool.systems)} "
                     f"system(s) (top-{pool.depth} of each{sample}); {pool.judged:,} judged by the "
                     f"original qrels, {pool.to_label:,} to label.")
    if estimate.first:
        lines.append("The pool is not known yet: these must run first (`bridge run` runs them, "
                     "within its budget), then the labeling stages can be estimated:")
        lines += [f"  {item}" for item in estimate.first]
    if estimate.llm_systems:
        lines.append("Retrieval systems that call an LLM (the ledger answers what it holds):")
        lines += [f"  {line}" for line in estimate.llm_systems]
    if estimate.stages:
        lines += ["", "LLM calls:", _table(estimate.stages, partial=pool is None), "",
                  textwrap.fill(TABLE_NOTE, 100)]
    if budget is not None and estimate.stages:
        lines.append(_budget_line(estimate.stages, budget))
    if estimate.people is not None:
        lines += ["", *describe_people(estimate.people, _llm_per_pair(estimate))]
    return "\n".join(lines)


def _llm_per_pair(estimate: RunEstimate) -> str | None:
    """The LLM calls still to make, at their typical price, per pair sent to the labelers."""
    if estimate.pool is None or not estimate.pool.to_label or not estimate.stages:
        return None
    typical: dict[str, float] = {}
    for s in estimate.stages:
        usual = s.typical_reply_tokens
        _add(typical, (s.price(usual) if usual is not None else None) or s.price(s.reply_tokens))
    if not typical:
        return (f"the calls to make for the {estimate.pool.to_label:,} pair(s) to label are unpriced "
                "(no `prices:` in their profiles)")
    per_pair = {currency: amount / estimate.pool.to_label for currency, amount in typical.items()}
    return (f"{_money(typical)} typical for the calls still to make on the {estimate.pool.to_label:,} "
            f"pair(s) to label: {_money(per_pair)} per pair")


def _budget_line(stages: Sequence[StageCalls], budget: Budget) -> str:
    tokens = sum(s.prompt_tokens + s.reply_tokens for s in stages)
    usd: dict[str, float] = {}
    for s in stages:
        _add(usd, s.price(s.reply_tokens))  # other currencies: --budget-usd refuses them when called
    need = [f"{tokens:,} tokens"] if budget.tokens is not None else []
    fits = budget.tokens is None or tokens <= budget.tokens
    if budget.usd is not None:
        need.append(f"{usd.get('USD', 0.0):.4f} USD")
        fits = fits and usd.get("USD", 0.0) <= budget.usd
    return (f"Budget: the calls to make need at most {' and '.join(need)}, "
            + ("within the budget." if fits else "more than the budget: the run stops before the "
               "chunk that would pass it, and the next run resumes from the ledger."))


def _table(stages: Sequence[StageCalls], partial: bool) -> str:
    header = ("stage", "model", "calls", "answered", "to make", "prompt tok", "reply tok max",
              "typical", "price max", "typical")
    rows = []
    maximum: dict[str, float] = {}  # currency -> total
    typical: dict[str, float] = {}
    for s in stages:
        top, usual = s.price(s.reply_tokens), s.typical_reply_tokens
        mid = s.price(usual) if usual is not None else None
        _add(maximum, top)
        _add(typical, mid or top)
        rows.append((s.stage, s.profile, _count(s.calls, s.bound > 0), f"{s.answered:,}",
                     _count(s.to_make, s.bound > 0), f"{s.prompt_tokens:,}", f"{s.reply_tokens:,}",
                     f"{usual:,.0f}" if usual is not None else "-", _money(_add({}, top)),
                     _money(_add({}, mid))))
    bounded = any(s.bound for s in stages)
    rows.append(("total" + (" so far" if partial else ""), "", _count(sum(s.calls for s in stages), bounded),
                 f"{sum(s.answered for s in stages):,}", _count(sum(s.to_make for s in stages), bounded),
                 f"{sum(s.prompt_tokens for s in stages):,}", f"{sum(s.reply_tokens for s in stages):,}",
                 "", _money(maximum), _money(typical)))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  " + "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in [header, *rows])
