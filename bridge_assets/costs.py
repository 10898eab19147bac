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
stages ask is paid once, by the first.

Tokens: prompts are estimated at 4 characters a token (llm.budget.prompt_tokens); replies
are counted at their max_tokens (an upper bound) and at the mean reply of the same purpose
in the ledger (typical).
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bridge_assets import store
from bridge_assets.analysis import rag
from bridge_assets.analysis.assets import RagAnswersConfig, RagJudgmentsConfig
from bridge_assets.analysis.views import dataset_snapshot
from bridge_assets.ingest.registry import get_dataset
from bridge_assets.labeling import pooling
from bridge_assets.labeling.adjudicator import adjudicate
from bridge_assets.labeling.assets import (ADJUDICATOR_MAX_TOKENS, CandidatePoolConfig, DebateConfig,
                                           FilterConfig)
from bridge_assets.labeling.debate import DebateOutcome, Turn, turn_max_tokens
from bridge_assets.labeling.filter import filtered_pool, run_filter, votes_frame
from bridge_assets.labeling.pairs import Pair, load_pairs
from bridge_assets.llm import ledger
from bridge_assets.llm.budget import CHARS_PER_TOKEN, Budget, prompt_tokens
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.profiles import get_profile
from bridge_assets.llm.resource import LLMResource
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.paths import duckdb_path
from bridge_assets.retrieval.assets import RetrievalRunConfig
from bridge_assets.retrieval.llm_systems import RERANK_MAX_TOKENS, passage_requests, rerank_requests
from bridge_assets.retrieval.registry import RetrieverRegistry, load_registry
from bridge_assets.retrieval.runs import document_texts

NOT_ANSWERED = "not answered yet (dry run)"
# The tables the estimate reads, copied for one dataset into memory (the lake is not written).
INPUTS = ["queries", "corpus", "original_qrels", "retrieval_run"]


class LedgerReplay:
    """A `Generate` answering from the call ledger only; a request the ledger lacks comes back
    failed with NOT_ANSWERED. Remembers every request it saw, by key."""

    def __init__(self, db_path: Path | None):
        self.db_path = db_path  # None: an empty ledger
        self.requests: dict[str, LLMRequest] = {}
        self.made: set[str] = set()  # keys a stage surely asks: answered for any stage after it
        self._clients: dict[str, LLMClient] = {}

    def stage(self, name: str, profile: str, purpose: str) -> StageCalls:
        return StageCalls(name, profile, purpose, self.made)

    def client(self, profile: str) -> LLMClient:
        """The profile's client, for its keys and request defaults only: it never calls."""
        if profile not in self._clients:
            self._clients[profile] = LLMClient(profile, db_path=self.db_path)
        return self._clients[profile]

    def __call__(self, profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        keys = [self.client(profile).key(r) for r in requests]
        self.requests.update(zip(keys, requests))
        answered = ledger.lookup(keys, self.db_path) if self.db_path else {}
        return [answered.get(key) or LLMResult(key=key, error=NOT_ANSWERED) for key in keys]


@dataclass
class StageCalls:
    """The calls one stage makes to one model profile."""

    stage: str
    profile: str
    purpose: str                 # the ledger's purpose of these calls (for the typical reply)
    made: set[str] = field(repr=False)  # keys asked by earlier stages (shared): answered by then
    answered: int = 0            # requests known, already in the ledger: free
    new: int = 0                 # requests known, not in the ledger
    bound: int = 0               # at most this many more, whose requests depend on replies not made yet
    prompt_tokens: int = 0       # estimated, of the new and bounded calls
    reply_tokens: int = 0        # their max_tokens: an upper bound
    typical_reply: float | None = None  # mean reply tokens of this purpose in the ledger
    _keys: set[str] = field(default_factory=set, repr=False)

    @property
    def calls(self) -> int:
        return self.answered + self.new + self.bound

    @property
    def to_make(self) -> int:
        return self.new + self.bound

    def add(self, key: str, request: LLMRequest, answered: bool, surely: bool = True) -> None:
        """A request whose key is known (identical requests are one call). `surely` False: it is
        asked only if a reply not made yet leads there (a filter vote keeps its pair)."""
        if key in self._keys:
            return
        self._keys.add(key)
        if answered or key in self.made:
            self.answered += 1
            return
        if surely:
            self.new += 1
            self.made.add(key)
        else:
            self.bound += 1
        self.prompt_tokens += prompt_tokens(request)
        self.reply_tokens += request.max_tokens

    def add_bound(self, prompt: int, reply: int, calls: int = 1) -> None:
        """`calls` calls that may be made, each of about `prompt` tokens and at most `reply`."""
        self.bound += calls
        self.prompt_tokens += prompt * calls
        self.reply_tokens += reply * calls

    @property
    def typical_reply_tokens(self) -> float | None:
        return None if self.typical_reply is None else self.typical_reply * self.to_make

    def price(self, reply_tokens: float) -> tuple[str, float] | None:
        """(currency, price) of the calls to make with `reply_tokens` of replies in all; None
        for a profile without prices (a local model)."""
        prices = get_profile(self.profile).prices
        return (prices.currency, prices.cost(self.prompt_tokens, round(reply_tokens))) if prices else None


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


def _config(config: Mapping[str, Mapping[str, Any]], *assets: str) -> dict[str, Any]:
    """An op's config from the per-asset run config (a multi-asset's entries merged)."""
    merged: dict[str, Any] = {}
    for asset in assets:
        merged.update(config.get(asset, {}))
    return merged


def estimate_run(dataset: str, config: Mapping[str, Mapping[str, Any]]) -> RunEstimate:
    """What the main job would do on `dataset` with `config` (asset name -> config fields)."""
    path = duckdb_path()
    estimate = RunEstimate(dataset)
    written = store.exists(path)
    replay = LedgerReplay(path if written else None)
    con = dataset_snapshot(path, dataset, INPUTS) if written else duckdb.connect()
    with contextlib.closing(con):
        _estimate(estimate, con, config, replay)
    typical = _typical_replies(replay.db_path)
    for stage in estimate.stages:
        stage.typical_reply = typical.get((stage.profile, stage.purpose), typical.get((None, stage.purpose)))
    return estimate


def _estimate(estimate: RunEstimate, con: duckdb.DuckDBPyConnection, config: Mapping[str, Mapping[str, Any]],
              replay: LedgerReplay) -> None:
    """Fill `estimate`: the retrieval systems' calls and what must run first, or the pool and
    the calls of every stage after it."""
    dataset = estimate.dataset
    registry = load_registry()
    systems = registry.profile_systems()
    if not _has_rows(con, "queries", dataset):
        estimate.first += ["ingest (corpus, queries, original_qrels; no LLM)",
                           f"retrieval_run: {', '.join(systems)}"]
        estimate.llm_systems = _llm_systems(registry, systems)
        return
    k = RetrievalRunConfig(**_config(config, "retrieval_run")).k
    current = _current_runs(con, dataset, registry, _with_upstream(registry, systems), k)
    estimate.stages += _retrieval_calls(con, dataset, registry, systems, current, replay)
    stale = [name for name in systems if name not in current]
    if stale:
        estimate.first.append(f"retrieval_run: {', '.join(stale)}")
        return
    llm = LLMResource()
    pool_config = CandidatePoolConfig(**_config(config, "candidate_pool"))
    filter_config = FilterConfig(**_config(config, "filtered_pool", "filter_votes"))
    estimate.pool, pairs = _pool(con, dataset, systems, pool_config, filter_config)
    kept, unsure = _filter_calls(estimate, pairs, config, llm, replay)
    _debate_calls(estimate, kept, unsure, config, llm, replay)
    _rag_calls(estimate, con, dataset, config, llm, replay)


def _has_rows(con: duckdb.DuckDBPyConnection, table: str, dataset: str) -> bool:
    return store.table_exists(con, table) and con.execute(
        f"select count(*) > 0 from {table} where dataset = ?", [dataset]).fetchone()[0]


def _llm_systems(registry: RetrieverRegistry, systems: Sequence[str]) -> list[str]:
    """A line per system (or upstream system) that calls an LLM, for when queries are unknown."""
    lines = []
    for name in _with_upstream(registry, systems):
        spec = registry.system(name)
        if spec.llm is not None:
            params = spec.params()
            if spec.kind == "rewrite":
                per_query = f"{params.passages} call(s) per query"
            else:
                depth = params.depth or registry.defaults.rerank_depth
                per_query = f"a call per query and re-ranked document (top-{depth})"
            lines.append(f"{name} calls {spec.llm.profile_name()}: {per_query}")
    return lines


def _with_upstream(registry: RetrieverRegistry, systems: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(name for system in systems for name in [*registry.upstream(system), system]))


def _current_runs(con: duckdb.DuckDBPyConnection, dataset: str, registry: RetrieverRegistry,
                  systems: Sequence[str], k: int) -> dict[str, int]:
    """The systems whose stored run of `dataset` their current configuration made, with its
    depth (a run_file system without a file for this dataset has an empty run: current)."""
    stored = dict(con.execute("select retriever, any_value(config_hash) from retrieval_run "
                              "where dataset = ? group by retriever", [dataset]).fetchall()) \
        if store.table_exists(con, "retrieval_run") else {}
    current = {}
    for name in systems:
        depth = k or registry.system_k(name)
        no_file = registry.system(name).kind == "run_file" and not registry.run_file(name, dataset).exists()
        if no_file or stored.get(name) == registry.config_hash(name, depth):
            current[name] = depth
    return current


def _retrieval_calls(con: duckdb.DuckDBPyConnection, dataset: str, registry: RetrieverRegistry,
                     systems: Sequence[str], current: Mapping[str, int],
                     replay: LedgerReplay) -> list[StageCalls]:
    """The LLM calls of the retrieval systems (every run re-runs them, the ledger answering
    what it holds). A rewrite's requests are known from the queries, a re-ranker's from its
    first stage's stored run when that is current and deep enough; otherwise they are bounded
    by queries x re-rank depth, each prompt estimated with the mean query and document."""
    queries = con.execute("select query_id, text from queries where dataset = ? order by query_id",
                          [dataset]).pl()
    stages = []
    for name in _with_upstream(registry, systems):
        spec = registry.system(name)
        if spec.llm is None:
            continue
        profile, params = spec.llm.profile_name(), spec.params()
        rewrite = spec.kind == "rewrite"
        stage = replay.stage(f"retrieval {name}", profile, params.method if rewrite else "rerank")
        depth = 0 if rewrite else params.depth or registry.defaults.rerank_depth
        if rewrite:
            prompt = registry.prompt(params.method)
            requests = [r for text in queries["text"]
                        for r in passage_requests(replay.client(profile), prompt, text, params)]
        elif depth <= current.get(spec.first_stage, 0):
            candidates = con.execute("select query_id, doc_id, rank from retrieval_run where dataset = ? "
                                     "and retriever = ? and rank <= ? order by query_id, rank",
                                     [dataset, spec.first_stage, depth]).pl()
            corpus = con.execute("select doc_id, title, text from corpus where dataset = ?", [dataset]).pl()
            requests = rerank_requests(replay.client(profile), registry.prompt("rerank"), candidates,
                                       dict(zip(queries["query_id"], queries["text"])),
                                       dict(zip(corpus["doc_id"], document_texts(corpus))))
        else:
            query_chars, doc_chars = con.execute(
                "select (select avg(length(text)) from queries), "
                "(select avg(length(coalesce(title, '') || ' ' || text)) from corpus)").fetchone()
            prompt = (len(registry.prompt("rerank")) + query_chars + doc_chars) / CHARS_PER_TOKEN
            stage.add_bound(round(prompt), RERANK_MAX_TOKENS, queries.height * depth)
            requests = []
        for result in replay(profile, requests) if requests else ():
            stage.add(result.key, replay.requests[result.key], result.error != NOT_ANSWERED)
        stages.append(stage)
    return stages


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
    pairs = load_pairs(con, dataset, "select query_id, doc_id from candidate_pool "
                                     f"where dataset = $dataset {judged}", get_dataset(dataset).label_scale)
    info = PoolInfo(pool.height, pool["query_id"].n_unique(), int(pool["in_original_qrels"].sum()),
                    len(pairs), tuple(sorted({s for row in pool["systems"] for s in row})),
                    config.depth, config.query_limit)
    return info, pairs


def _filter_calls(estimate: RunEstimate, pairs: list[Pair], config: Mapping[str, Mapping[str, Any]],
                  llm: LLMResource, replay: LedgerReplay) -> tuple[list[Pair], set[tuple[str, str]]]:
    """Every filter vote's call. Returns the pairs the filter may keep (a vote not answered
    yet keeps its pair, as a failed one does), and those of them it may still drop (no
    answered vote keeps them)."""
    filter_config = FilterConfig(**_config(config, "filtered_pool", "filter_votes"))
    models = filter_config.models or llm.profiles_for("filter")
    stages = {model: replay.stage("filter", model, "filter") for model in models}
    votes = run_filter(pairs, models, replay, max_tokens=filter_config.max_tokens)
    for vote in votes:
        stages[vote.model].add(vote.call_key, replay.requests[vote.call_key], vote.error != NOT_ANSWERED)
    estimate.stages += stages.values()
    answered = [vote for vote in votes if vote.error != NOT_ANSWERED]
    kept = filtered_pool(votes_frame(votes, estimate.dataset)).filter(pl.col("kept"))
    surely = filtered_pool(votes_frame(answered, estimate.dataset)).filter(pl.col("kept"))
    kept_ids = set(zip(kept["query_id"], kept["doc_id"]))
    unsure = kept_ids - set(zip(surely["query_id"], surely["doc_id"]))
    return [pair for pair in pairs if (pair.query_id, pair.doc_id) in kept_ids], unsure


def _open_rounds(history: list[list[Turn]], rounds: int) -> int:
    """Rounds a replayed debate may still take: after a round with an unanswered turn (and no
    failed one, which ends the pair in any case), every round up to the last."""
    last = history[-1]
    waiting = any(t.error == NOT_ANSWERED for t in last)
    failed = any(t.error not in (None, NOT_ANSWERED) for t in last)
    return rounds - len(history) if waiting and not failed else 0


def _debate_calls(estimate: RunEstimate, pairs: list[Pair], unsure: set[tuple[str, str]],
                  config: Mapping[str, Mapping[str, Any]], llm: LLMResource, replay: LedgerReplay) -> None:
    """Every debate turn whose request is known, per round (bounded for `unsure` pairs, which
    the filter may drop), the later rounds of debates that wait on a reply bounded (each later
    prompt grows by one round of turns at their most), and the adjudicator's calls when it is
    opted in."""
    debate_config = DebateConfig(**_config(config, "debate_labels", "debate_turns"))
    rounds = debate_config.rounds
    models = debate_config.models or [llm.profile_for("debate")]
    agents = debate_config.debate_agents(models)
    purpose = "debate_paper" if debate_config.prompt == "paper" else "debate"
    stages = {(r, m): replay.stage(f"debate round {r}", m, purpose)
              for r in range(1, rounds + 1) for m in dict.fromkeys(a.model for a in agents)}
    outcome = debate_config.run(pairs, models, replay)
    reply = turn_max_tokens(debate_config.reason_words)
    open_turns: dict[tuple[str, str], int] = {}  # turns not answered yet, per pair
    for pair, history in outcome.histories().items():
        for turns in history:
            for turn in turns:
                stages[(turn.round, turn.model)].add(turn.call_key, replay.requests[turn.call_key],
                                                     turn.error != NOT_ANSWERED, pair not in unsure)
        later = _open_rounds(history, rounds)
        for turn in history[-1] if later else ():
            asked = prompt_tokens(replay.requests[turn.call_key])
            for step in range(1, later + 1):
                stages[(turn.round + step, turn.model)].add_bound(asked + step * len(agents) * reply, reply)
        waiting = sum(t.error == NOT_ANSWERED for turns in history for t in turns)
        open_turns[pair] = waiting + later * len(agents)
    estimate.stages += stages.values()
    if debate_config.adjudicate:
        model = debate_config.adjudicator_model or llm.profile_for("adjudicator")
        estimate.stages.append(_adjudicator_calls(outcome, pairs, unsure, model, open_turns, reply, replay))


def _adjudicator_calls(outcome: DebateOutcome, pairs: list[Pair], unsure: set[tuple[str, str]],
                       model: str, open_turns: dict[tuple[str, str], int], reply: int,
                       replay: LedgerReplay) -> StageCalls:
    """A call per pair left open: known for debates the ledger answered whole, else bounded
    (the prompt grows by the turns not answered yet)."""
    stage = replay.stage("adjudicator", model, "adjudicator")
    decided = adjudicate(outcome, pairs, model, replay, max_tokens=ADJUDICATOR_MAX_TOKENS)
    for label in decided.labels:
        if label.adjudicator_call_key is None:
            continue
        pair = (label.query_id, label.doc_id)
        request = replay.requests[label.adjudicator_call_key]
        if open_turns.get(pair):
            stage.add_bound(prompt_tokens(request) + open_turns[pair] * reply, request.max_tokens)
        else:
            stage.add(label.adjudicator_call_key, request, label.adjudicator_error != NOT_ANSWERED,
                      pair not in unsure)
    return stage


def _rag_calls(estimate: RunEstimate, con: duckdb.DuckDBPyConnection, dataset: str,
               config: Mapping[str, Mapping[str, Any]], llm: LLMResource, replay: LedgerReplay) -> None:
    """rag_answers' calls (known from the runs), and rag_judgments': known for answers in the
    ledger, bounded by one per answer not made yet (its prompt with an answer at its most)."""
    answers_config = RagAnswersConfig(**_config(config, "rag_answers"))
    judgments_config = RagJudgmentsConfig(**_config(config, "rag_judgments"))
    answer_model = answers_config.model or llm.profile_for("judge")
    judge_model = judgments_config.model or llm.profile_for("judge")
    contexts, _ = rag.rag_contexts(con, dataset, depth=answers_config.depth,
                                   query_limit=answers_config.query_limit,
                                   systems=answers_config.systems, scope=answers_config.scope)
    settings = rag.AnswerSettings(depth=answers_config.depth, passage_chars=answers_config.passage_chars,
                                  max_tokens=answers_config.max_tokens)
    answers = rag.generate_answers(contexts, replay, answer_model, dataset, settings=settings)
    answer_stage = replay.stage("rag_answers", answer_model, "rag_answer")
    for key, error in answers.select("call_key", "error").iter_rows():
        answer_stage.add(key, replay.requests[key], error != NOT_ANSWERED)
    queries = con.execute("select query_id, text, answers from queries where dataset = ?", [dataset]).pl()
    waiting = pl.col("error").eq_missing(NOT_ANSWERED)
    judge_stage = replay.stage("rag_judgments", judge_model, "rag_judgment")
    known = rag.judge_answers(answers.filter(~waiting), queries, replay, judge_model, dataset,
                              max_tokens=judgments_config.max_tokens)
    for key, error in known.filter(pl.col("call_key").is_not_null()).select("call_key", "error").iter_rows():
        judge_stage.add(key, replay.requests[key], error != NOT_ANSWERED)
    longest = "x" * (answers_config.max_tokens * CHARS_PER_TOKEN)
    placeholders = answers.filter(waiting).with_columns(
        answer=pl.lit(longest), no_information=pl.lit(False), error=pl.lit(None, pl.Utf8))
    sizing = LedgerReplay(None)
    rag.judge_answers(placeholders, queries, sizing, judge_model, dataset,
                      max_tokens=judgments_config.max_tokens)
    for request in sizing.requests.values():
        judge_stage.add_bound(prompt_tokens(request), request.max_tokens)
    estimate.stages += [answer_stage, judge_stage]


def _typical_replies(db_path: Path | None) -> dict[tuple[str | None, str], float]:
    """Mean reply tokens of answered calls per (profile, purpose), and per (None, purpose)."""
    if db_path is None:
        return {}
    with store.connect(db_path) as con:
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
    return "\n".join(lines)


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
    rows, maximum, typical = [], {}, {}
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
