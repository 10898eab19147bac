"""RAG alignment: do the refined qrels predict end-to-end answer quality better?

- rag_answers: for each system and query, an LLM answers the query from that system's top-k
  chunks only (resources/prompts/rag_answer.j2), or says "no relevant information".
- rag_judgments: an LLM judges each answer True/False against the gold answers
  (rag_judgment.j2, JSON {"correct": bool}). An answer that says "no relevant information"
  is False without a call: it cannot match a gold answer. A failed call leaves the judgment
  NULL (with its error), never a default.
- rag_alignment: per system and qrels version (original, refined), RAGAlign@k = the share of
  queries where Hit@k and the judgment agree, the point-biserial correlation between the
  judgment and nDCG@k, and across systems the Pearson correlation between a system's mean
  Hit@k / nDCG@k and its share of correct answers.

Every call goes through the LLM layer (cached in the call ledger): re-running with nothing
changed costs no model call. The local CPU model takes seconds per call, so the number of
queries (a stable sample) and systems is configurable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict

from bridge_assets.analysis.views import Scope, ScopeInfo, analysis_views, require_rows
from bridge_assets.errors import SettingsError
from bridge_assets.labeling.calls import Generate, parse_reply
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.llm.budget import CHARS_PER_TOKEN, prompt_tokens
from bridge_assets.llm.replay import NOT_ANSWERED, LedgerReplay, StageCalls
from bridge_assets.llm.types import LLMRequest
from bridge_assets.paths import read_sql

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

NO_INFORMATION = "no relevant information"
ANSWER_TEMPLATE = "rag_answer"
JUDGMENT_TEMPLATE = "rag_judgment"
JUDGMENT_SCHEMA = {"type": "object", "properties": {"correct": {"type": "boolean"}},
                   "required": ["correct"], "additionalProperties": False}

ANSWERS_SCHEMA: dict[str, PolarsDataType] = {
    "dataset": pl.Utf8, "retriever": pl.Utf8, "query_id": pl.Utf8, "doc_ids": pl.List(pl.Utf8),
    "answer": pl.Utf8, "no_information": pl.Boolean, "model": pl.Utf8, "prompt_hash": pl.Utf8,
    "call_key": pl.Utf8, "error": pl.Utf8,
}
JUDGMENTS_SCHEMA = {
    "dataset": pl.Utf8, "retriever": pl.Utf8, "query_id": pl.Utf8, "judgment": pl.Boolean,
    "decided_by": pl.Utf8, "model": pl.Utf8, "prompt_hash": pl.Utf8, "call_key": pl.Utf8,
    "error": pl.Utf8,
}
ALIGNMENT_SCHEMA = {
    "dataset": pl.Utf8, "retriever": pl.Utf8, "qrels_version": pl.Utf8, "statistic": pl.Utf8,
    "value": pl.Float64, "p_value": pl.Float64, "queries": pl.Int32,
}


class JudgmentReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    correct: bool


@dataclass(frozen=True)
class AnswerSettings:
    depth: int = 10            # chunks per answer: the system's top-k
    passage_chars: int = 300   # each chunk cut to this many characters (keeps prompts short)
    max_tokens: int = 32       # an answer is a few words


def rag_contexts(con: duckdb.DuckDBPyConnection, dataset: str, *, depth: int = 10, query_limit: int = 10,
                 systems: Sequence[str] = (), scope: Scope = "pooled") -> tuple[pl.DataFrame, ScopeInfo]:
    """Per (system, query): query text, gold answers, doc_ids and passages of the top-`depth`."""
    if depth < 1:
        raise ValueError(f"rag_answers: depth must be at least 1, got {depth}")
    require_rows(con, "queries", dataset, "rag_answers")
    require_rows(con, "corpus", dataset, "rag_answers")
    with analysis_views(con, dataset, scope, asset="rag_answers", refined=False) as info:
        unknown = sorted(set(systems) - set(info.retrievers))
        if unknown:
            raise SettingsError(f"rag_answers for dataset '{dataset}': no retrieval_run for system(s) "
                             f"{unknown} (known: {', '.join(info.retrievers)})")
        contexts = con.execute(read_sql("rag_answers"), {
            "dataset": dataset, "depth": depth, "query_limit": query_limit, "systems": list(systems)}).pl()
    return contexts, info


def says_no_information(answer: str) -> bool:
    """The answer says the passages hold no answer (case and punctuation ignored)."""
    return NO_INFORMATION in " ".join(re.findall(r"[a-z]+", answer.lower()))


def answer_request(question: str, passages: Sequence[str], prompts: Prompts,
                   settings: AnswerSettings) -> LLMRequest:
    cut = [p if len(p) <= settings.passage_chars else p[:settings.passage_chars].rstrip() + " ..."
           for p in passages]
    return LLMRequest(messages=prompts.messages(ANSWER_TEMPLATE, question=question, passages=cut),
                      max_tokens=settings.max_tokens, temperature=0.0, purpose="rag_answer")


def generate_answers(contexts: pl.DataFrame, generate: Generate, model: str, dataset: str, *,
                     prompts: Prompts | None = None, settings: AnswerSettings = AnswerSettings()) -> pl.DataFrame:
    """Rows of the rag_answers table: one answer per row of `contexts` (one batched call)."""
    prompts = prompts or Prompts()
    rows = contexts.select("retriever", "query_id", "query", "doc_ids", "passages").to_dicts()
    requests = [answer_request(r["query"], r["passages"], prompts, settings) for r in rows]
    results = generate(model, requests) if requests else []
    prompt_hash = prompts.hash(ANSWER_TEMPLATE)
    answers = []
    for row, result in zip(rows, results, strict=True):
        text = result.text.strip() if result.ok else None
        answers.append({"dataset": dataset, "retriever": row["retriever"], "query_id": row["query_id"],
                        "doc_ids": row["doc_ids"], "answer": text,
                        "no_information": says_no_information(text) if text is not None else None,
                        "model": model, "prompt_hash": prompt_hash, "call_key": result.key,
                        "error": result.error if not result.ok else ("empty answer" if not text else None)})
    return pl.DataFrame(answers, schema=ANSWERS_SCHEMA)


def judge_answers(answers: pl.DataFrame, queries: pl.DataFrame, generate: Generate, model: str,
                  dataset: str, *, prompts: Prompts | None = None, max_tokens: int = 16) -> pl.DataFrame:
    """Rows of the rag_judgments table. `queries` holds query_id, text, answers (gold)."""
    prompts = prompts or Prompts()
    prompt_hash = prompts.hash(JUDGMENT_TEMPLATE)
    gold = {q: (text, list(golds or [])) for q, text, golds in queries.select("query_id", "text", "answers").iter_rows()}
    rows: list[dict[str, Any]] = []
    to_ask: list[int] = []
    requests: list[LLMRequest] = []
    for answer in answers.iter_rows(named=True):
        row = {"dataset": dataset, "retriever": answer["retriever"], "query_id": answer["query_id"],
               "judgment": None, "decided_by": None, "model": None, "prompt_hash": None,
               "call_key": None, "error": None}
        question, golds = gold.get(answer["query_id"], (None, []))
        if answer["error"] is not None or answer["answer"] is None:
            row["error"] = f"no answer to judge: {answer['error']}"
        elif not golds:
            row["error"] = "the query has no gold answers"
        elif answer["no_information"]:
            row.update(judgment=False, decided_by="no_information")
        else:
            to_ask.append(len(rows))
            requests.append(LLMRequest(
                messages=prompts.messages(JUDGMENT_TEMPLATE, question=question, answers=golds,
                                          answer=answer["answer"]),
                json_schema=JUDGMENT_SCHEMA, max_tokens=max_tokens, temperature=0.0,
                purpose="rag_judgment"))
        rows.append(row)
    for index, result in zip(to_ask, generate(model, requests) if requests else [], strict=True):
        reply, error = parse_reply(result, JudgmentReply)
        rows[index].update(judgment=reply.correct if reply else None, decided_by="llm", model=model,
                           prompt_hash=prompt_hash, call_key=result.key, error=error)
    return pl.DataFrame(rows, schema=JUDGMENTS_SCHEMA)


# --- alignment ---------------------------------------------------------------------------------

def _varies(values: np.ndarray) -> bool:
    return len(values) > 1 and not np.allclose(values, values[0])


def point_biserial(judgment: np.ndarray, values: np.ndarray) -> tuple[float | None, float | None]:
    """scipy's point-biserial r and p-value; None when either side is constant (undefined)."""
    from scipy import stats

    if not (_varies(judgment) and _varies(values)) or len(values) < 3:
        return None, None
    result = stats.pointbiserialr(judgment, values)
    return float(result.statistic), float(result.pvalue)


def pearson(x: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
    """scipy's Pearson r and p-value; None with fewer than 3 points or a constant side."""
    from scipy import stats

    if len(x) < 3 or not (_varies(x) and _varies(y)):
        return None, None
    result = stats.pearsonr(x, y)
    return float(result.statistic), float(result.pvalue)


def alignment_statistics(joined: pl.DataFrame, k: int = 10) -> pl.DataFrame:
    """From rows (retriever, qrels_version, query_id, judgment 0/1, hit 0/1, ndcg): per system
    and version RAGAlign@k, point-biserial(judgment, nDCG@k), RAG accuracy, mean Hit@k and
    nDCG@k; per version over all systems ('all'): the same pooled over every (system, query),
    and the Pearson correlations across systems."""
    rows: list[dict] = []

    def add(retriever: str, version: str, statistic: str, value: float | None, p_value: float | None = None,
            queries: int = 0) -> None:
        rows.append({"retriever": retriever, "qrels_version": version, "statistic": statistic,
                     "value": value, "p_value": p_value, "queries": queries})

    def describe(retriever: str, version: str, group: pl.DataFrame) -> None:
        judgment = group["judgment"].to_numpy().astype(float)
        hit = group["hit"].fill_null(0.0).to_numpy()
        ndcg = group["ndcg"].fill_null(0.0).to_numpy()
        n = len(judgment)
        add(retriever, version, f"rag_align_{k}", float(np.mean((hit > 0) == (judgment > 0))), queries=n)
        r, p = point_biserial(judgment, ndcg)
        add(retriever, version, f"point_biserial_ndcg_{k}", r, p, n)
        add(retriever, version, "rag_accuracy", float(judgment.mean()), queries=n)
        add(retriever, version, f"hit_{k}", float(hit.mean()), queries=n)
        add(retriever, version, f"ndcg_{k}", float(ndcg.mean()), queries=n)

    for (version,), by_version in joined.sort("qrels_version", "retriever").group_by(
            ["qrels_version"], maintain_order=True):
        per_system = []
        for (retriever,), group in by_version.group_by(["retriever"], maintain_order=True):
            describe(retriever, version, group)
            per_system.append((group["hit"].fill_null(0.0).mean(), group["ndcg"].fill_null(0.0).mean(),
                               group["judgment"].mean()))
        describe("all", version, by_version)
        hits, ndcgs, accuracy = (np.array(column, dtype=float) for column in zip(*per_system))
        r, p = pearson(hits, accuracy)
        add("all", version, f"pearson_hit_{k}", r, p, len(per_system))
        r, p = pearson(ndcgs, accuracy)
        add("all", version, f"pearson_ndcg_{k}", r, p, len(per_system))
    return pl.DataFrame(rows, schema={k_: v for k_, v in ALIGNMENT_SCHEMA.items() if k_ != "dataset"})


def compute_rag_alignment(con: duckdb.DuckDBPyConnection, dataset: str, k: int = 10) -> pl.DataFrame:
    """Rows of the rag_alignment table for `dataset`."""
    require_rows(con, "rag_judgments", dataset, "rag_alignment")
    require_rows(con, "retrieval_metrics", dataset, "rag_alignment")
    joined = con.execute(read_sql("rag_alignment"), {"dataset": dataset, "hit": f"success_{k}",
                                                      "ndcg": f"ndcg_cut_{k}"}).pl()
    statistics = alignment_statistics(joined, k)
    return (statistics.with_columns(pl.lit(dataset).alias("dataset")).select(list(ALIGNMENT_SCHEMA))
            .cast(ALIGNMENT_SCHEMA))  # type: ignore[arg-type]  # polars' cast() types: see qrels/merge.py


def estimate_rag_calls(con: duckdb.DuckDBPyConnection, dataset: str, answers_config: Any,
                       judgments_config: Any, answer_model: str, judge_model: str,
                       replay: LedgerReplay) -> list[StageCalls]:
    """rag_answers' calls (known from the runs), and rag_judgments': known for answers in the
    ledger, bounded by one per answer not made yet (its prompt with an answer at its most).
    `answers_config` / `judgments_config`: the assets' resolved settings (`bridge run --dry-run`)."""
    contexts, _ = rag_contexts(con, dataset, depth=answers_config.depth,
                               query_limit=answers_config.query_limit,
                               systems=answers_config.systems, scope=answers_config.scope)
    settings = AnswerSettings(depth=answers_config.depth, passage_chars=answers_config.passage_chars,
                              max_tokens=answers_config.max_tokens)
    answers = generate_answers(contexts, replay, answer_model, dataset, settings=settings)
    answer_stage = replay.stage("rag_answers", answer_model, "rag_answer")
    for key, error in answers.select("call_key", "error").iter_rows():
        answer_stage.add(key, replay.requests[key], error != NOT_ANSWERED)
    queries = con.execute("select query_id, text, answers from queries where dataset = ?", [dataset]).pl()
    waiting = pl.col("error").eq_missing(NOT_ANSWERED)
    judge_stage = replay.stage("rag_judgments", judge_model, "rag_judgment")
    known = judge_answers(answers.filter(~waiting), queries, replay, judge_model, dataset,
                          max_tokens=judgments_config.max_tokens)
    for key, error in known.filter(pl.col("call_key").is_not_null()).select("call_key", "error").iter_rows():
        judge_stage.add(key, replay.requests[key], error != NOT_ANSWERED)
    longest = "x" * (answers_config.max_tokens * CHARS_PER_TOKEN)
    placeholders = answers.filter(waiting).with_columns(
        answer=pl.lit(longest), no_information=pl.lit(False), error=pl.lit(None, pl.Utf8))
    sizing = LedgerReplay(None)
    judge_answers(placeholders, queries, sizing, judge_model, dataset,
                  max_tokens=judgments_config.max_tokens)
    for request in sizing.requests.values():
        judge_stage.add_bound(prompt_tokens(request), request.max_tokens)
    return [answer_stage, judge_stage]
