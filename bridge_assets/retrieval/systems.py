"""Run any registered system on a dataset: `run_retriever(...)` -> top-k run frame.

Plain functions, no Dagster: the `retrieval_run` asset, the CLI, the benchmark script and the
tests all call `run_retriever`. Systems compose: a re-ranker runs its first stage to the
re-rank depth, a fusion runs its inputs, a rewrite runs its first stage on rewritten queries.
Indexes and embeddings come from the per-(dataset, encoder) cache (see cache.py). Where the
caller can read stored runs (the `retrieval_run` asset), a re-ranker takes its first stage's
stored run when the current configuration made it from the same corpus and queries, instead of
running that stage (and loading its models) again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from bridge_assets.retrieval import cache, dense, encoders, lucene, splade
from bridge_assets.retrieval.errors import RetrievalError
from bridge_assets.retrieval.registry import RetrieverRegistry, SystemSpec, load_registry
from bridge_assets.retrieval.runs import RUN_SCHEMA, document_texts, scored, top_k
from bridge_assets.retrieval.weights import resolve_model

if TYPE_CHECKING:
    from bridge_assets.llm.client import LLMClient

log = logging.getLogger(__name__)

LUCENE_FAMILY = "bm25-lucene"


@dataclass
class RunContext:
    """What every system of one run shares: the dataset's corpus, the registry, the caches."""

    dataset: str
    corpus: pl.DataFrame
    registry: RetrieverRegistry
    lake: Path                                                 # the lake folder (its indexes/)
    progress: Callable[[str], None] = log.info
    llm_client: Callable[[str], LLMClient] | None = None        # profile -> its client
    llm_context: str | None = None                              # recorded with new LLM calls
    metadata: dict[str, Any] = field(default_factory=dict)      # indexes built/reused, LLM counts
    stored_run: Callable[[str], pl.DataFrame] | None = None     # system -> its stored rows (STORED_COLUMNS)

    @cached_property
    def corpus_hash(self) -> str:
        return cache.corpus_fingerprint(self.corpus)

    @cached_property
    def doc_texts(self) -> dict[str, str]:
        return dict(zip(self.corpus["doc_id"].to_list(), document_texts(self.corpus)))

    def client(self, profile: str) -> LLMClient:
        if self.llm_client is not None:
            return self.llm_client(profile)
        from bridge_assets.llm.client import LLMClient

        return LLMClient(profile)

    def note_artifact(self, family: str, folder: Path, built: bool) -> None:
        meta = cache.read_meta(folder)
        self.metadata.setdefault("indexes", {})[family] = {
            "path": str(folder), "built_now": built, "build_seconds": meta.get("build_seconds")}


def inputs_fingerprint(corpus_hash: str, queries: pl.DataFrame) -> str:
    """What a run was computed from besides its configuration: the corpus and the queries."""
    digest = hashlib.sha256(corpus_hash.encode())
    for query_id, text in queries.select("query_id", "text").sort("query_id").iter_rows():
        digest.update(f"\x00{query_id}\x01{text}".encode())
    return digest.hexdigest()[:16]


# What `RunContext.stored_run` returns for a system: its stored run with what made it.
STORED_COLUMNS = ["query_id", "doc_id", "rank", "score", "config_hash", "inputs_hash"]


def stored_first_stage(ctx: RunContext, system: str, queries: pl.DataFrame, depth: int) -> pl.DataFrame | None:
    """`system`'s stored run cut to `depth`, when its current configuration made it, from these
    corpus and queries, at least that deep (its k is the system's default or its deepest rank);
    None otherwise. Equal to running it again, up to ties at the cut-off."""
    if ctx.stored_run is None:
        return None
    rows = ctx.stored_run(system)
    made_by = rows.select("config_hash", "inputs_hash").unique()
    if rows.is_empty() or made_by.height != 1:
        return None
    config_hash, inputs_hash = made_by.row(0)
    if inputs_hash != inputs_fingerprint(ctx.corpus_hash, queries):
        return None
    deepest = rows["rank"].max()
    assert isinstance(deepest, int)  # a run's ranks are integers, and it has rows
    ks = {ctx.registry.system_k(system), deepest}
    if not any(k >= depth and ctx.registry.config_hash(system, k) == config_hash for k in ks):
        return None
    # polars' cast() types: see qrels/merge.py
    return rows.filter(pl.col("rank") <= depth).select(RUN_SCHEMA.keys()).cast(RUN_SCHEMA)  # type: ignore[arg-type]


def _bm25(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    key = cache.artifact_key(ctx.corpus_hash, {"indexer": "pyserini SimpleIndexer", "docvectors": True})
    folder, built = cache.ensure_built(cache.artifact_dir(ctx.dataset, LUCENE_FAMILY, key, ctx.lake),
                                       lambda tmp: lucene.build_index(ctx.corpus, tmp))
    ctx.note_artifact(LUCENE_FAMILY, folder, built)
    return top_k(lucene.search(folder, queries, k, spec.params()), k)


def _model_key(ctx: RunContext, model: str, system: str) -> tuple[str, Path]:
    """The cache folder of `model`'s document representation of this corpus."""
    spec = ctx.registry.model(model)
    key = cache.artifact_key(ctx.corpus_hash, resolve_model(spec, system).identity(spec))
    return key, cache.artifact_dir(ctx.dataset, model, key, ctx.lake)


def embeddings(ctx: RunContext, model: str, system: str) -> tuple[dense.Embeddings, Any]:
    """The corpus's cached embeddings under `model` (built now if absent) and the encoder."""
    encoder = encoders.dense_encoder(ctx.registry, model, system)
    _, folder = _model_key(ctx, model, system)
    folder, built = cache.ensure_built(folder, lambda tmp: dense.encode_corpus(
        encoder, ctx.corpus, tmp, ctx.registry.defaults.batch_size, ctx.progress), resumable=True)
    ctx.note_artifact(model, folder, built)
    return dense.load_embeddings(folder, encoder.similarity), encoder


def _dense(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    embedded, encoder = embeddings(ctx, spec.required_model(), spec.name)
    vectors = encoder.encode_queries(queries["text"].to_list(), ctx.registry.defaults.batch_size)
    indices, scores = dense.search(embedded, vectors, k, spec.params())
    return top_k(scored(queries["query_id"].to_list(), embedded.doc_ids, indices, scores), k)


def _splade(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    model = spec.required_model()
    encoder = encoders.splade_encoder(ctx.registry, model, spec.name)
    _, folder = _model_key(ctx, model, spec.name)
    batch = min(ctx.registry.defaults.batch_size, 8)  # logits are (batch, tokens, vocabulary) floats
    folder, built = cache.ensure_built(folder, lambda tmp: splade.encode_corpus(
        encoder, ctx.corpus, tmp, batch, ctx.progress), resumable=True)
    ctx.note_artifact(model, folder, built)
    doc_ids, documents = splade.load_documents(folder)
    indices, scores = splade.search(documents, encoder.encode(queries["text"].to_list(), batch), k)
    return top_k(scored(queries["query_id"].to_list(), doc_ids, indices, scores), k)


def reciprocal_rank_fusion(runs: list[pl.DataFrame], rrf_k: int) -> pl.DataFrame:
    """score(q, d) = sum over runs of 1 / (rrf_k + rank of d for q)."""
    return (pl.concat([r.select("query_id", "doc_id", "rank") for r in runs])
            .group_by("query_id", "doc_id")
            .agg(score=(1.0 / (rrf_k + pl.col("rank"))).sum()))


def _fusion(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    params = spec.params()
    runs = [retrieve(ctx, name, queries, params.depth) for name in spec.inputs]
    return top_k(reciprocal_rank_fusion(runs, params.rrf_k), k)


def first_stage_candidates(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame) -> pl.DataFrame:
    """The top-`depth` documents of a re-ranker's first stage: its stored run when current,
    else the first stage run again."""
    depth = spec.params().depth or ctx.registry.defaults.rerank_depth
    first_stage = spec.required_first_stage()
    first = stored_first_stage(ctx, first_stage, queries, depth)
    ctx.metadata.setdefault("first_stage", {})[first_stage] = {
        "depth": depth, "stored_run_reused": first is not None}
    if first is None:
        return retrieve(ctx, first_stage, queries, depth)
    ctx.progress(f"{first_stage}: its stored run is current, top-{depth} taken from it")
    return first


def _rerank(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    params = spec.params()
    first = first_stage_candidates(ctx, spec, queries)
    query_texts = dict(zip(queries["query_id"].to_list(), queries["text"].to_list()))
    if spec.llm:
        from bridge_assets.retrieval.llm_systems import llm_rerank

        rescored, counts = llm_rerank(ctx.client(spec.llm.profile_name()), ctx.registry.prompt("rerank"),
                                      first, query_texts, ctx.doc_texts, context=ctx.llm_context,
                                      progress=ctx.progress)
        ctx.metadata.update(counts)
        return top_k(rescored, k)
    model_name = spec.required_model()  # the other kind of rerank: a model, no llm
    model = ctx.registry.model(model_name)
    if model.backend in ("cross_encoder", "monot5"):
        scorer = encoders.scorer(ctx.registry, model_name, spec.name)
        pairs = [(query_texts[q], ctx.doc_texts[d]) for q, d in first.select("query_id", "doc_id").iter_rows()]
        scores = scorer.score(pairs, params.batch_size)
    else:  # a bi-encoder re-scores with the cached document embeddings
        embedded, encoder = embeddings(ctx, model_name, spec.name)
        vectors = encoder.encode_queries(queries["text"].to_list(), ctx.registry.defaults.batch_size)
        row_of = {q: i for i, q in enumerate(queries["query_id"].to_list())}
        scores = dense.pair_scores(embedded, embedded.positions(first["doc_id"].to_list()), vectors,
                                   np.array([row_of[q] for q in first["query_id"].to_list()]))
    return top_k(first.with_columns(score=pl.Series(scores, dtype=pl.Float64)), k)


def _rewrite(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    from bridge_assets.retrieval.llm_systems import rewrite_queries

    params = spec.params()
    rewritten, counts = rewrite_queries(ctx.client(spec.required_llm().profile_name()),
                                        ctx.registry.prompt(params.method), queries, params,
                                        context=ctx.llm_context, progress=ctx.progress)
    ctx.metadata.update(counts)
    return retrieve(ctx, spec.required_first_stage(), rewritten, k)


def _run_file(ctx: RunContext, spec: SystemSpec, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    from bridge_assets.retrieval.run_files import read_run_file

    path = ctx.registry.run_file(spec.name, ctx.dataset)
    found = ctx.metadata.setdefault("run_files", {})
    if not path.exists():  # one file per dataset: a dataset without one has no run of this system
        ctx.progress(f"{spec.name}: no run file for dataset '{ctx.dataset}' at {path}; the run is empty")
        found[spec.name] = {"path": str(path), "missing": True}
        return pl.DataFrame(schema=RUN_SCHEMA)
    rows, report = read_run_file(path, ctx.dataset, set(queries["query_id"].to_list()),
                                 set(ctx.corpus["doc_id"].to_list()), spec.params().unknown_ids)
    found[spec.name] = report.as_metadata()
    if report.kept < report.lines:
        ctx.progress(f"{spec.name}: {path}: skipped {report.lines - report.kept} of {report.lines} lines "
                     f"({report.unknown_query_lines} with unknown query ids, {report.unknown_document_lines} "
                     f"with unknown document ids), e.g. {'; '.join(report.examples)}")
    return top_k(rows, k)


KINDS = {"bm25": _bm25, "dense": _dense, "splade": _splade, "fusion": _fusion, "rerank": _rerank,
         "rewrite": _rewrite, "run_file": _run_file}


def retrieve(ctx: RunContext, system: str, queries: pl.DataFrame, k: int) -> pl.DataFrame:
    """Top-k of `system` for each query (query_id, text): (query_id, doc_id, rank, score)."""
    spec = ctx.registry.system(system)
    if spec.evaluation_only:
        raise RetrievalError(f"'{system}' is a {spec.kind} system: it learns from the dataset's verified "
                             f"labels, so the student stage builds its run (student_rerank_run), not retrieval")
    started = time.perf_counter()
    run = KINDS[spec.kind](ctx, spec, queries, k)
    ctx.progress(f"{system}: {queries.height} queries, top-{k}, {time.perf_counter() - started:.1f}s")
    return run


@dataclass
class RunResult:
    run: pl.DataFrame            # query_id, doc_id, rank, score
    config_hash: str
    inputs_hash: str             # inputs_fingerprint of the corpus and queries
    metadata: dict[str, Any]


def run_retriever(dataset: str, system: str, corpus: pl.DataFrame, queries: pl.DataFrame, *,
                  lake: Path, k: int | None = None, registry: RetrieverRegistry | None = None,
                  llm_client: Callable[[str], Any] | None = None, llm_context: str | None = None,
                  progress: Callable[[str], None] = log.info,
                  stored_run: Callable[[str], pl.DataFrame] | None = None) -> RunResult:
    """Run `system` on `dataset`'s queries over its corpus; the top-k per query and provenance.

    corpus: doc_id, title, text; queries: query_id, text. k defaults to the system's (`system_k`).
    stored_run(system) -> that system's stored rows (STORED_COLUMNS), empty if none: re-rankers
    reuse a current first stage from it. `lake`: the lake folder whose indexes/ caches what is
    built (the store resource's).
    """
    registry = registry or load_registry()
    k = k or registry.system_k(system)
    if corpus.is_empty():
        raise RetrievalError(f"{dataset}: the corpus is empty; materialize `corpus` first")
    ctx = RunContext(dataset, corpus, registry, lake, progress, llm_client, llm_context, stored_run=stored_run)
    queries = queries.select("query_id", "text")
    started = time.perf_counter()
    run = retrieve(ctx, system, queries, k)
    seconds = time.perf_counter() - started
    ctx.metadata.update({"queries": queries.height, "rows": run.height, "k": k, "seconds": round(seconds, 3),
                         "queries_per_second": round(queries.height / max(seconds, 1e-9), 2)})
    return RunResult(run, registry.config_hash(system, k), inputs_fingerprint(ctx.corpus_hash, queries),
                     ctx.metadata)
