"""The LLM filter: each filter model says whether a chunk supports any of the query's answers
(without answers, whether it gives what a TREC topic's description and narrative ask for; on
the graded scale, whether it has anything to do with the query: a dropped pair is grade 0).
Under a definition (`useful`, or the dataset's or query's own text) on the binary scale it asks
the pointwise scorer's question instead and keeps the pair unless P(yes) is under `keep_p_yes`:
the 1.5B's yes/no there dropped most relevant pairs of the silver set, a low threshold on its
P(yes) keeps them (docs/labeler-eval.md, "Relevance definitions").

A pair is dropped only when every model says false (sql/filtered_pool.sql); a failed vote is
recorded with its error and keeps the pair, so an outage never silently removes candidates. A
drop is a model's unverified "no": bridge_qrels stores it unverified, and people audit a sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import duckdb
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from bridge_assets.labeling.calls import Generate, generate_grouped, parse_reply
from bridge_assets.labeling.labeler import (
    Labeler,
    LabelerError,
    LabelerRun,
    LabelerSettings,
    LabelItem,
    ProfilesFor,
    outcome_label,
)
from bridge_assets.labeling.pairs import Pair
from bridge_assets.labeling.pointwise import read_score, score_request
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.llm.types import LLMRequest
from bridge_assets.paths import read_sql

FILTER_TEMPLATE = "filter"
# Under a definition: keep a pair unless the scorer's P(yes) is under this (chosen on the silver
# set's calibration questions to keep its relevant pairs: docs/labeler-eval.md).
KEEP_P_YES = 0.2
FILTER_SCHEMA = {
    "type": "object",
    "properties": {"is_supported": {"type": "boolean"}},
    "required": ["is_supported"],
    "additionalProperties": False,
}


class FilterReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    is_supported: StrictBool


@dataclass(frozen=True)
class FilterVote:
    query_id: str
    doc_id: str
    pair_key: str
    model: str                 # the filter model's profile name
    is_supported: bool | None  # None: the call failed (see error)
    call_key: str
    error: str | None
    p_yes: float | None = None  # the scorer's P(yes), where the filter asked it (a definition)


VOTE_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "pair_key": pl.Utf8, "model": pl.Utf8,
               "is_supported": pl.Boolean, "call_key": pl.Utf8, "error": pl.Utf8, "p_yes": pl.Float64}


def scored(pair: Pair) -> bool:
    """Whether the filter asks the scorer's question about `pair` (a definition, binary scale)."""
    return pair.scale == "binary" and pair.relevance.kind in ("useful", "custom")


def filter_request(pair: Pair, prompts: Prompts, max_tokens: int = 32) -> LLMRequest:
    if scored(pair):
        return score_request(pair, prompts, purpose="filter")
    return LLMRequest(
        messages=prompts.messages(FILTER_TEMPLATE, **pair.prompt_context()),
        json_schema=FILTER_SCHEMA, max_tokens=max_tokens, temperature=0.0, purpose="filter")


def run_filter(pairs: Sequence[Pair], models: Sequence[str], generate: Generate,
               prompts: Prompts | None = None, max_tokens: int = 32,
               keep_p_yes: float = KEEP_P_YES) -> list[FilterVote]:
    """Every model votes on every pair: one batched generate call per model. Votes come back
    model by model, pairs in order."""
    if not models:
        raise ValueError("the filter needs at least one model profile")
    prompts = prompts or Prompts()
    requests = [filter_request(pair, prompts, max_tokens) for pair in pairs]
    slots = [(model, pair) for model in models for pair in pairs]
    results = generate_grouped([(model, request) for model in models for request in requests],
                               generate)
    votes = []
    for (model, pair), result in zip(slots, results, strict=True):
        if scored(pair):
            score = read_score(result)
            keep = None if score.p_yes is None else score.p_yes >= keep_p_yes
            votes.append(FilterVote(pair.query_id, pair.doc_id, pair.key, model, keep, result.key,
                                    score.error, score.p_yes))
            continue
        reply, error = parse_reply(result, FilterReply)
        votes.append(FilterVote(pair.query_id, pair.doc_id, pair.key, model,
                                reply.is_supported if reply else None, result.key, error))
    return votes


def votes_frame(votes: Sequence[FilterVote], dataset: str) -> pl.DataFrame:
    """The `filter_votes` table rows of `dataset`."""
    frame = pl.DataFrame([asdict(vote) for vote in votes], schema=VOTE_SCHEMA)
    return frame.with_columns(pl.lit(dataset).alias("dataset"))


def filtered_pool(votes: pl.DataFrame) -> pl.DataFrame:
    """The `filtered_pool` rows: sql/filtered_pool.sql over a `filter_votes` frame."""
    with duckdb.connect() as con:
        con.register("filter_votes", votes.to_arrow())
        return con.execute(read_sql("filtered_pool")).pl()


def estimate_filter(pairs: Sequence[Pair], models: Sequence[str], replay: LedgerReplay,
                    max_tokens: int = 32, keep_p_yes: float = KEEP_P_YES
                    ) -> tuple[list[StageCalls], list[Pair], set[tuple[str, str]]]:
    """Every vote's call, replayed from the ledger (`bridge run --dry-run`). Returns the
    stages, the pairs the filter may keep (a vote not answered yet keeps its pair, as a failed
    one does) and those of them it may still drop (no answered vote keeps them)."""
    stages = {model: replay.stage("filter", model, "filter") for model in models}
    votes = run_filter(pairs, models, replay, max_tokens=max_tokens, keep_p_yes=keep_p_yes)
    for vote in votes:
        stages[vote.model].add(vote.call_key, replay.requests[vote.call_key], vote.error != NOT_ANSWERED)
    answered = [vote for vote in votes if vote.error != NOT_ANSWERED]
    kept = filtered_pool(votes_frame(votes, "")).filter(pl.col("kept"))
    surely = filtered_pool(votes_frame(answered, "")).filter(pl.col("kept"))
    kept_ids = set(zip(kept["query_id"], kept["doc_id"]))
    unsure = kept_ids - set(zip(surely["query_id"], surely["doc_id"]))
    return list(stages.values()), [p for p in pairs if (p.query_id, p.doc_id) in kept_ids], unsure


class FilterSettings(LabelerSettings):
    max_tokens: int = Field(32, ge=8)
    keep_p_yes: float = Field(KEEP_P_YES, ge=0.0, le=1.0, description="Under a definition: keep a "
                              "pair unless the scorer's P(yes) is under this.")


class FilterLabeler(Labeler):
    """One filter model as a labeler: its vote is the label (a `vote`); a failed call has none."""

    Settings = FilterSettings
    role = "filter"
    templates = (FILTER_TEMPLATE, "diras_score")
    settings: FilterSettings

    def __init__(self, settings: FilterSettings, profiles_for: ProfilesFor):
        if settings.temperature:
            raise LabelerError("the filter samples at temperature 0 only")
        super().__init__(settings, profiles_for)

    def label(self, items: Sequence[LabelItem], generate: Generate,
              prompts: Prompts | None = None) -> LabelerRun:
        pairs = [item.pair for item in items]
        votes = run_filter(pairs, [self.model], generate, prompts=prompts,
                           max_tokens=self.settings.max_tokens, keep_p_yes=self.settings.keep_p_yes)
        labels = [outcome_label(pair, None if vote.is_supported is None else int(vote.is_supported),
                                p_yes=vote.p_yes)
                  for pair, vote in zip(pairs, votes, strict=True)]
        scores = [vote.p_yes for vote in votes]
        return LabelerRun(labels, details=[vote.error for vote in votes], models=[self.model],
                          scores=scores if any(s is not None for s in scores) else None)
