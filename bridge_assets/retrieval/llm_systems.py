"""The LLM-based systems: pointwise P(yes) re-ranking and query rewriting (HyDE, Query2doc,
MuGI). Every call goes through bridge_assets.llm's LLMClient, so it is cached in the call
ledger: re-running a system with nothing changed makes no model call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import polars as pl

from bridge_assets.llm import progress as llm_progress
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.scores import yes_probability
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.retrieval.errors import RetrievalError
from bridge_assets.retrieval.registry import RewriteParams

log = logging.getLogger(__name__)

CALL_CHUNK = 64         # requests per generate(): each chunk reaches the ledger before the next
TOP_LOGPROBS = 10       # alternatives kept at each generated token (P(yes) needs yes and no)
RERANK_MAX_TOKENS = 3   # the yes/no token may follow a quote or a space
MAX_FAILED_SHARE = 0.5  # more failed calls than this: the setup is broken, the run fails


def _generate(client: LLMClient, requests: Sequence[LLMRequest], what: str, context: str | None,
              progress: Callable[[str], None]) -> list[LLMResult]:
    results: list[LLMResult] = []
    llm_progress.asked(len(requests))
    for start in range(0, len(requests), CALL_CHUNK):
        answered = client.generate(requests[start:start + CALL_CHUNK], context=context)
        llm_progress.answered(answered)
        results.extend(answered)
        progress(f"{what}: {len(results)}/{len(requests)} LLM requests answered "
                 f"({client.stats.cache_hits} from the ledger)")
    return results


def _check_failures(failed: int, total: int, what: str, results: Sequence[LLMResult]) -> None:
    if total and failed / total > MAX_FAILED_SHARE:
        errors = sorted({r.error for r in results if r.error})[:3]
        raise RetrievalError(f"{what}: {failed} of {total} LLM calls gave no usable answer "
                             f"(errors: {errors or 'no yes/no token in the reply'})")


def rerank_requests(client: LLMClient, prompt: str, pairs: pl.DataFrame, query_texts: dict[str, str],
                    doc_texts: dict[str, str]) -> list[LLMRequest]:
    """The P(yes) request of each (query_id, doc_id) of `pairs`, in their order."""
    return [client.request([("user", prompt.format(query=query_texts[q], document=doc_texts[d]))],
                           purpose="rerank", max_tokens=RERANK_MAX_TOKENS, top_logprobs=TOP_LOGPROBS)
            for q, d in pairs.select("query_id", "doc_id").iter_rows()]


def llm_rerank(client: LLMClient, prompt: str, candidates: pl.DataFrame, query_texts: dict[str, str],
               doc_texts: dict[str, str], *, context: str | None = None,
               progress: Callable[[str], None] = log.info) -> tuple[pl.DataFrame, dict]:
    """Re-score a first stage's candidates (query_id, doc_id, rank) by the LLM's P(yes).

    A pair whose reply carries no yes/no token has no score: it ranks after every scored
    document of its query, in its first-stage order (score = -first-stage rank), and is
    counted in the returned metadata.
    """
    pairs = candidates.sort(["query_id", "rank"])
    requests = rerank_requests(client, prompt, pairs, query_texts, doc_texts)
    results = _generate(client, requests, "llm re-rank", context, progress)
    p_yes = [yes_probability(r.logprobs) if r.ok else None for r in results]
    failed = sum(p is None for p in p_yes)
    _check_failures(failed, len(results), "llm re-rank", results)
    if failed:
        log.warning("llm re-rank: %d of %d pairs unscored (ranked after the scored ones)", failed, len(results))
    rescored = pairs.with_columns(
        score=pl.Series(p_yes, dtype=pl.Float64).fill_null(-pairs["rank"].cast(pl.Float64)))
    return rescored, {"pairs": len(results), "unscored_pairs": failed}


def passage_requests(client: LLMClient, prompt: str, query: str, params: RewriteParams) -> list[LLMRequest]:
    temperature = params.temperature if params.temperature is not None else client.profile.sampling.temperature
    if params.passages > 1 and temperature == 0:
        raise RetrievalError(f"{params.method}: {params.passages} passages per query need a "
                             "temperature > 0 (identical passages otherwise)")
    return [client.request([("user", prompt.format(query=query))], purpose=params.method,
                           max_tokens=params.max_tokens, temperature=temperature, seed=seed)
            for seed in range(params.passages)]


def expanded_query(method: str, query: str, passages: list[str], params: RewriteParams) -> str:
    """The text the first stage searches with, from the query and its generated passages."""
    if not passages:
        return query
    if method == "hyde":  # search with the hypothetical document(s) alone
        return "\n".join(passages)
    if method == "query2doc":  # the query repeated so it outweighs the (longer) passage
        return " ".join([query] * params.query_repeats + passages)
    # MuGI: repeat the query in proportion to the passages' length, t = |P| / (|q| * beta)
    repeats = max(1, round(sum(len(p.split()) for p in passages) / (max(len(query.split()), 1) * params.beta)))
    return " ".join([query] * repeats + passages)


def rewrite_queries(client: LLMClient, prompt: str, queries: pl.DataFrame, params: RewriteParams, *,
                    context: str | None = None,
                    progress: Callable[[str], None] = log.info) -> tuple[pl.DataFrame, dict]:
    """Queries (query_id, text) with text replaced by the method's LLM-expanded query.

    A query whose every generation failed keeps its original text; the count is returned in
    the metadata (and more than half failing fails the run).
    """
    ids, texts = queries["query_id"].to_list(), queries["text"].to_list()
    requests = [r for text in texts for r in passage_requests(client, prompt, text, params)]
    results = _generate(client, requests, params.method, context, progress)
    failed_calls = sum(not (r.ok and r.text.strip()) for r in results)
    _check_failures(failed_calls, len(results), params.method, results)
    rewritten, unchanged = [], 0
    for i, text in enumerate(texts):
        chunk = results[i * params.passages:(i + 1) * params.passages]
        passages = [r.text.strip() for r in chunk if r.ok and r.text.strip()]
        unchanged += not passages
        rewritten.append(expanded_query(params.method, text, passages, params))
    if unchanged:
        log.warning("%s: %d queries kept their original text (every generation failed)", params.method, unchanged)
    return (pl.DataFrame({"query_id": ids, "text": rewritten}),
            {"llm_requests": len(results), "failed_generations": failed_calls, "queries_not_rewritten": unchanged})
