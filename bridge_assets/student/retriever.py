"""Retrievers trained on the labels (issue 25, item 3): fine-tune the shipped MiniLM bi-encoder
on a training split of queries, with positives from one label source, and measure it on the
held-out queries against both the original and the refined qrels.

Label sources (positives of a training query):
  original   the benchmark's own qrels (relevance > 0)
  refined    the verified relevant judgments of bridge_qrels (sql/student_training_set.sql, the
             student annotator's selection): never a pending pair, never a model's unverified
             guess on one
  utility    LLM utility labels (UtilSel over the query's candidate pool), given by the caller

Hard negatives are the stored runs' best-ranked documents (retrieval_run) that the source does
not call relevant; with the refined source a pending pair is no negative either (it is unknown,
not irrelevant). The original source does use them: it cannot know them, which is the point.

Loss: an in-batch softmax over every document of a batch of queries (all their positives and
hard negatives), with the marginal likelihood of *all* of a query's positives as the target
(-log sum_{p in P(q)} softmax(s(q, .))_p), a small custom loss rather than
MultipleNegativesRankingLoss, whose one-positive rows would make a query's other positives its
in-batch negatives. Training is seeded: the same seed, labels and base model give identical
weights (tests/test_trained_retriever.py).

Plain functions, no Dagster: scripts/trained_retriever.py prints the comparison table, and
`trained_retriever_run` is the registry's evaluation-only `kind: trained_retriever` (the
student stage's student_rerank_run asset writes its run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import duckdb
import numpy as np
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.labeling.pairs import chunk_text
from bridge_assets.paths import read_sql
from bridge_assets.retrieval.cache import ensure_built, read_meta

if TYPE_CHECKING:
    from bridge_assets.labeling.calls import Generate
    from bridge_assets.labeling.pairs import Pair

LabelSource = Literal["original", "refined", "utility"]
MEASURES = ("ndcg_cut_10", "recall_10")
QRELS_VERSIONS = ("original", "refined")   # refined: bridge_qrels, pending counted not relevant
BOOTSTRAP_RESAMPLES = 2000


class TrainedRetrieverError(BridgeError, ValueError):
    """Missing tables, or nothing to train on."""


@dataclass(frozen=True)
class TrainSettings:
    """How a retriever is fine-tuned (small on purpose: minutes on 2 CPU cores)."""

    epochs: int = 2
    batch_queries: int = 8          # queries per step; their positives and negatives share one softmax
    learning_rate: float = 2e-5
    scale: float = 20.0             # 1 / temperature of the cosine softmax (MNRL's default)
    negatives_per_query: int = 4
    negative_depth: int = 10        # hard negatives come from the runs' top-N
    max_length: int = 256           # retrievers.yaml's max_length for all-minilm-l6-v2
    seed: int = 0
    # texts encoded with their graph at a time (cached_gradient_step): bounds a step's memory,
    # not its gradients
    encode_chunk: int = 8
    # One thread: on this shared 2-core machine two torch threads beside other work ran a step
    # 2-6x slower than one (OpenMP threads wait on each other); one also fixes the float
    # summation order, part of what makes a seed reproduce the same weights.
    threads: int = 1


@dataclass(frozen=True)
class LakeData:
    """What training and evaluation read of one dataset in a lake."""

    dataset: str
    queries: dict[str, str]          # query_id -> text
    corpus: dict[str, str]           # doc_id -> chunk as labelers see it (title above text)
    original_qrels: pl.DataFrame     # query_id, doc_id, relevance
    refined_qrels: pl.DataFrame      # bridge_qrels, pending as 0 (the pipeline's lower bound)
    refined_positives: dict[str, set[str]]   # verified relevant only
    pending: set[tuple[str, str]]    # (query_id, doc_id) escalated pairs nobody voted on
    runs: pl.DataFrame               # retriever, query_id, doc_id, rank


@dataclass(frozen=True)
class TrainingQuery:
    query_id: str
    query: str
    positives: tuple[str, ...]       # texts
    negatives: tuple[str, ...]       # texts


def _require(con: duckdb.DuckDBPyConnection, table: str, dataset: str) -> None:
    known = con.execute("select count(*) from information_schema.tables where table_name = ?", [table]).fetchone()[0]
    rows = con.execute(f"select count(*) from {table} where dataset = ?", [dataset]).fetchone()[0] if known else 0
    if not rows:
        raise TrainedRetrieverError(f"the lake has no '{table}' rows for dataset '{dataset}': run "
                                    f"`bridge run --dataset {dataset}` first")


def load_lake_data(con: duckdb.DuckDBPyConnection, dataset: str) -> LakeData:
    """Queries, corpus, both qrels and the stored runs of `dataset` (read only)."""
    for table in ("queries", "corpus", "original_qrels", "bridge_qrels", "retrieval_run"):
        _require(con, table, dataset)
    args = {"dataset": dataset}
    queries = con.execute("select query_id, text from queries where dataset = $dataset", args).pl()
    corpus = con.execute("select doc_id, title, text from corpus where dataset = $dataset", args).pl()
    runs = con.execute("select retriever, query_id, doc_id, rank from retrieval_run where dataset = $dataset",
                       args).pl()
    verified = con.execute(read_sql("student_training_set"), args).pl()
    return lake_data(con, dataset, queries=queries, corpus=corpus, runs=runs, verified=verified)


def lake_data(con: duckdb.DuckDBPyConnection, dataset: str, *, queries: pl.DataFrame, corpus: pl.DataFrame,
              runs: pl.DataFrame, verified: pl.DataFrame) -> LakeData:
    """LakeData from what a caller read already (queries: query_id, text; corpus: doc_id, title,
    text; runs: retriever, query_id, doc_id, rank; verified: sql/student_training_set.sql's rows),
    with both qrels read from `con`."""
    args = {"dataset": dataset}
    original = con.execute("select query_id, doc_id, relevance::integer as relevance from original_qrels "
                           "where dataset = $dataset order by query_id, doc_id", args).pl()
    refined = con.execute("select query_id, doc_id, coalesce(relevance, 0)::integer as relevance "
                          "from bridge_qrels where dataset = $dataset order by query_id, doc_id", args).pl()
    pending = set(con.execute("select query_id, doc_id from bridge_qrels where dataset = $dataset "
                              "and relevance is null", args).fetchall())
    # the refined qrels' verified relevant pairs: the student annotator's selection, so a
    # pending pair or an unverified guess never gets here
    positives = _grouped(verified.filter(pl.col("label") == 1).select("query_id", "doc_id").iter_rows())
    return LakeData(dataset, dict(queries.sort("query_id").select("query_id", "text").iter_rows()),
                    {doc_id: chunk_text(title, text)
                     for doc_id, title, text in corpus.sort("doc_id").select("doc_id", "title", "text").iter_rows()},
                    original, refined, positives, pending,
                    runs.select("retriever", "query_id", "doc_id", "rank").sort("retriever", "query_id", "rank", "doc_id"))


def original_positives(data: LakeData) -> dict[str, set[str]]:
    rows = data.original_qrels.filter(pl.col("relevance") > 0).select("query_id", "doc_id").iter_rows()
    return _grouped(rows)


def _grouped(pairs: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    grouped: dict[str, set[str]] = {}
    for query_id, doc_id in pairs:
        grouped.setdefault(query_id, set()).add(doc_id)
    return grouped


def positives_of(data: LakeData, source: LabelSource,
                 utility: Mapping[str, set[str]] | None = None) -> dict[str, set[str]]:
    if source == "original":
        return original_positives(data)
    if source == "refined":
        return data.refined_positives
    if utility is None:
        raise TrainedRetrieverError("the utility source needs the LLM utility labels (utility=...)")
    return {q: set(docs) for q, docs in utility.items() if docs}


def hard_negatives(data: LakeData, query_id: str, positives: set[str], *, exclude: set[str],
                   depth: int, count: int) -> list[str]:
    """The runs' best-ranked documents of `query_id` (best rank over systems, then doc id) that
    are neither positives nor excluded (unknown pairs)."""
    ranked = (data.runs.filter((pl.col("query_id") == query_id) & (pl.col("rank") <= depth))
              .group_by("doc_id").agg(pl.col("rank").min().alias("best")).sort("best", "doc_id"))
    chosen = [d for d in ranked["doc_id"] if d not in positives and d not in exclude and d in data.corpus]
    return chosen[:count]


def training_queries(data: LakeData, query_ids: Iterable[str], source: LabelSource, settings: TrainSettings,
                     utility: Mapping[str, set[str]] | None = None) -> list[TrainingQuery]:
    """One TrainingQuery per query of `query_ids` that has a positive under `source`."""
    positives = positives_of(data, source, utility)
    out = []
    for query_id in sorted(query_ids):
        docs = sorted(d for d in positives.get(query_id, ()) if d in data.corpus)
        if not docs or query_id not in data.queries:
            continue
        unknown = {d for q, d in data.pending if q == query_id} if source == "refined" else set()
        negatives = hard_negatives(data, query_id, set(docs), exclude=unknown,
                                   depth=settings.negative_depth, count=settings.negatives_per_query)
        out.append(TrainingQuery(query_id, data.queries[query_id], tuple(data.corpus[d] for d in docs),
                                 tuple(data.corpus[d] for d in negatives)))
    return out


def sample_queries(data: LakeData, count: int, seed: int) -> LakeData:
    """`data` restricted to `count` of its queries drawn uniformly (seeded), with their qrels,
    labels and runs; the corpus stays whole, so retrieval still searches every chunk. For
    datasets too large to train on every query's fold on a CPU (a training step of 8 queries
    with their positives and negatives is seconds here)."""
    if count < 1:
        raise TrainedRetrieverError(f"a sample needs at least one query, got {count}")
    if count >= len(data.queries):
        return data
    chosen = set(random.Random(seed).sample(sorted(data.queries), count))
    in_sample = pl.col("query_id").is_in(sorted(chosen))
    return dataclasses.replace(
        data, queries={q: text for q, text in data.queries.items() if q in chosen},
        original_qrels=data.original_qrels.filter(in_sample), refined_qrels=data.refined_qrels.filter(in_sample),
        refined_positives={q: docs for q, docs in data.refined_positives.items() if q in chosen},
        pending={pair for pair in data.pending if pair[0] in chosen}, runs=data.runs.filter(in_sample))


def query_folds(query_ids: Iterable[str], folds: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """(train, test) query ids per fold: the queries shuffled (seeded) and dealt into `folds`
    disjoint test parts; each fold trains on the others. Every query is tested exactly once,
    by a model that never saw it."""
    if folds < 2:
        raise TrainedRetrieverError(f"folds must be 2 or more, got {folds}")
    ordered = sorted(set(query_ids))
    if len(ordered) < folds:
        raise TrainedRetrieverError(f"{len(ordered)} queries cannot make {folds} folds")
    random.Random(seed).shuffle(ordered)
    parts = [sorted(ordered[i::folds]) for i in range(folds)]
    return [(sorted(q for j, part in enumerate(parts) if j != i for q in part), parts[i]) for i in range(folds)]


@dataclass(frozen=True)
class UtilityLabels:
    """UtilSel's useful passages per query, over the query's candidate pool."""

    positives: dict[str, set[str]]
    queries: int               # queries asked (one LLM call each)
    candidates: int            # pairs shown
    failed: dict[str, str]     # query text -> why its reply was unusable (no labels for it)
    seconds: float


def pool_pairs(con: duckdb.DuckDBPyConnection, dataset: str, query_ids: Iterable[str] | None = None) -> list[Pair]:
    """The candidate pool's pairs of `dataset` (of `query_ids` only, when given), with the texts
    a labeler reads."""
    from bridge_assets.labeling.pairs import load_pairs

    _require(con, "candidate_pool", dataset)
    pairs = load_pairs(con, dataset, "select distinct query_id, doc_id from candidate_pool where dataset = $dataset")
    if query_ids is None:
        return pairs
    wanted = set(query_ids)
    return [pair for pair in pairs if pair.query_id in wanted]


def utility_positives(pairs: Sequence[Pair], generate: Generate, profile: str) -> UtilityLabels:
    """(c): one UtilSel call per query over its candidate-pool `pairs` (the listwise utility
    labeler of `bridge label-eval`, bridge_assets/evaluation/utility.py); `generate` is a
    labeling Generate(profile, requests). A query whose reply fails gets no positive."""
    from bridge_assets.evaluation.utility import utility_labels
    from bridge_assets.labeling.labeler import LabelItem

    items = [LabelItem(f"{p.query_id}|{p.doc_id}", p) for p in pairs]
    started = time.perf_counter()
    outcome = utility_labels(items, "utilsel", profile, generate)
    useful = ((item.pair.query_id, item.pair.doc_id) for item in items if outcome.labels.get(item.id) == 1)
    return UtilityLabels(_grouped(useful), len({p.query_id for p in pairs}), len(items), dict(outcome.errors),
                         time.perf_counter() - started)


# --- the model -------------------------------------------------------------------------------

def base_location(name: str = "all-minilm-l6-v2") -> str:
    """The local folder of a retrievers.yaml model, through its declared sources (no download
    when HF_HUB_OFFLINE is set)."""
    from bridge_assets.student.model import base_model_location

    return base_model_location(name)


def load_encoder(location: str, max_length: int):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(location, device="cpu")
    model.max_seq_length = max_length
    return model


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _embed(model, texts: Sequence[str]):
    import torch.nn.functional as F

    features = model.tokenize(list(texts))
    return F.normalize(model(features)["sentence_embedding"], dim=-1)


def cached_gradient_step(model, texts: Sequence[str], loss_of: Callable, chunk: int) -> float:
    """One step's gradients of `loss_of(embeddings of texts)` accumulated into `model`, with at
    most `chunk` texts' activations held at a time (gradient caching, Gao et al. 2021, as
    sentence-transformers' CachedMultipleNegativesRankingLoss): the embeddings are computed
    without a graph, the loss's gradient with respect to them is taken, then each chunk is
    encoded again with its graph (the same dropout: its RNG state replayed) and back-propagates
    its part. The gradients are the whole batch's; the memory is one chunk's (a batch of 8
    queries with 5 positives and 4 negatives of 256 tokens: 8.7 GiB in one graph, 1.7 GiB in
    chunks of 8; scripts/bench_retriever_step.py, docs/trained-retriever.md)."""
    import torch

    states, parts = [], []
    with torch.no_grad():
        for start in range(0, len(texts), chunk):
            states.append(torch.get_rng_state())
            parts.append(_embed(model, texts[start:start + chunk]))
    embeddings = torch.cat(parts).requires_grad_()
    loss = loss_of(embeddings)
    loss.backward()
    for n, start in enumerate(range(0, len(texts), chunk)):
        torch.set_rng_state(states[n])
        _embed(model, texts[start:start + chunk]).backward(embeddings.grad[start:start + chunk])
    return float(loss.detach())


def multi_positive_loss(query_embeddings, doc_embeddings, positive_mask, scale: float):
    """Mean over queries of -log(sum of the softmax over all batch documents at the query's
    positives): every positive counts, no positive is its own query's negative."""
    import torch

    scores = scale * query_embeddings @ doc_embeddings.T
    positive_scores = scores.masked_fill(~positive_mask, float("-inf"))
    return (torch.logsumexp(scores, dim=1) - torch.logsumexp(positive_scores, dim=1)).mean()


def _batch(queries: Sequence[TrainingQuery]):
    """The batch's distinct document texts and which are each query's positives."""
    import torch

    texts: list[str] = []
    index: dict[str, int] = {}
    for q in queries:
        for text in (*q.positives, *q.negatives):
            if text not in index:
                index[text] = len(texts)
                texts.append(text)
    mask = torch.zeros(len(queries), len(texts), dtype=torch.bool)
    for row, q in enumerate(queries):
        for text in q.positives:
            mask[row, index[text]] = True
    return texts, mask


@dataclass
class TrainingLog:
    queries: int
    positives: int
    negatives: int
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def loss_trend(self, window: int = 5) -> str:
        """The mean loss of the first and of the last `window` steps (at most half the steps
        each): one batch's loss says more about that batch than about the training."""
        n = max(1, min(window, len(self.losses) // 2))
        return (f"mean loss of the first {n} step(s) {sum(self.losses[:n]) / n:.3f} -> of the last {n} "
                f"{sum(self.losses[-n:]) / n:.3f}")


def train_retriever(model, queries: Sequence[TrainingQuery], settings: TrainSettings) -> TrainingLog:
    """Fine-tune `model` (a SentenceTransformer, changed in place) on `queries`. Seeded: the
    batch order comes from random.Random(seed), dropout from torch.manual_seed(seed)."""
    import torch

    from bridge_assets.student.model import release_resident_llm

    if not queries:
        raise TrainedRetrieverError("no training query has a positive")
    release_resident_llm()  # the LLM of labels: utility (UtilSel) asked before the training
    log = TrainingLog(len(queries), sum(len(q.positives) for q in queries), sum(len(q.negatives) for q in queries))
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    order_rng = random.Random(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    model.train()
    with torch_threads(settings.threads):
        for _ in range(settings.epochs):
            order = list(queries)
            order_rng.shuffle(order)
            for start in range(0, len(order), settings.batch_queries):
                batch = order[start:start + settings.batch_queries]
                texts, mask = _batch(batch)
                queries_first = [q.query for q in batch] + texts   # one pass encodes both, in chunks
                optimizer.zero_grad()
                loss = cached_gradient_step(
                    model, queries_first, lambda e, n=len(batch), mask=mask: multi_positive_loss(
                        e[:n], e[n:], mask, settings.scale), settings.encode_chunk)
                optimizer.step()
                log.steps += 1
                log.losses.append(loss)
    model.eval()
    log.seconds = time.perf_counter() - started
    return log


def weights_digest(model) -> str:
    """sha256 over every parameter and buffer (name, dtype, bytes): equal iff the weights are."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# --- retrieval and evaluation ------------------------------------------------------------------

def retrieve(model, queries: Mapping[str, str], corpus: Mapping[str, str], *, k: int = 10,
             batch_size: int = 32, threads: int = 1) -> pl.DataFrame:
    """Exact cosine top-k over the whole corpus: (query_id, doc_id, score, rank)."""
    doc_ids = list(corpus)
    query_ids = list(queries)
    with torch_threads(threads):
        docs = model.encode([corpus[d] for d in doc_ids], batch_size=batch_size, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
        asked = model.encode([queries[q] for q in query_ids], batch_size=batch_size,
                             normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    scores = asked @ docs.T
    rows = []
    for i, query_id in enumerate(query_ids):
        top = np.argsort(-scores[i], kind="stable")[:k]
        rows.extend({"query_id": query_id, "doc_id": doc_ids[j], "score": float(scores[i, j]), "rank": r}
                    for r, j in enumerate(top, start=1))
    return pl.DataFrame(rows, schema={"query_id": pl.Utf8, "doc_id": pl.Utf8, "score": pl.Float64,
                                      "rank": pl.Int64})


def per_query_measures(run: pl.DataFrame, qrels: pl.DataFrame) -> dict[str, dict[str, float]]:
    """measure -> query_id -> value, by the project's trec_eval measures
    (bridge_assets.metrics.measures), for the run's queries the qrels know."""
    from bridge_assets.metrics import compute_measures, resolve_measures

    con = duckdb.connect()
    try:
        con.register("trained_run", run.select("query_id", "doc_id", "score").to_arrow())
        con.register("trained_qrels", qrels.select("query_id", "doc_id", "relevance").to_arrow())
        frame = compute_measures(con, resolve_measures(MEASURES), run="trained_run", qrels="trained_qrels")
    finally:
        con.close()
    frame = frame.filter(pl.col("query_id") != "all")
    return {m: dict(frame.filter(pl.col("measure") == m).select("query_id", "value").iter_rows())
            for m in MEASURES}


def bootstrap_interval(values: Sequence[float], seed: int = 0,
                       confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): a percentile bootstrap over queries (scipy, seeded)."""
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return math.nan, math.nan, math.nan
    if len(data) == 1 or np.all(data == data[0]):
        return float(data.mean()), float(data.mean()), float(data.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap((data,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                                 confidence_level=confidence, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return float(data.mean()), float(low), float(high)


@dataclass
class SystemResult:
    """One row of the comparison: per-query values pooled over the folds' test queries."""

    name: str
    values: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (qrels, measure) -> q -> v
    train_queries: list[int] = field(default_factory=list)      # per fold
    test_queries: list[int] = field(default_factory=list)
    positives: list[int] = field(default_factory=list)
    seconds: float = 0.0
    digests: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, run: pl.DataFrame, data: LakeData) -> None:
        for version, qrels in (("original", data.original_qrels), ("refined", data.refined_qrels)):
            for measure, per_query in per_query_measures(run, qrels).items():
                self.values.setdefault((version, measure), {}).update(per_query)

    def summary(self, version: str, measure: str, seed: int) -> tuple[float, float, float, int]:
        per_query = self.values.get((version, measure), {})
        mean, low, high = bootstrap_interval([per_query[q] for q in sorted(per_query)], seed)
        return mean, low, high, len(per_query)


def paired_difference(a: SystemResult, b: SystemResult, version: str, measure: str,
                      seed: int) -> tuple[float, float, float, int]:
    """Mean of a - b over the queries both scored, with its bootstrap interval (paired)."""
    left, right = a.values.get((version, measure), {}), b.values.get((version, measure), {})
    shared = sorted(set(left) & set(right))
    mean, low, high = bootstrap_interval([left[q] - right[q] for q in shared], seed)
    return mean, low, high, len(shared)


@dataclass(frozen=True)
class Curriculum:
    """Train on `first`, then continue on `then` (the paper's LLM labels first, people's after)."""

    first: LabelSource
    then: LabelSource


def run_comparison(data: LakeData, location: str, sources: Sequence[LabelSource | Curriculum], *,
                   settings: TrainSettings, folds: int = 2, utility: Mapping[str, set[str]] | None = None,
                   progress: Callable[[str], None] | None = None) -> list[SystemResult]:
    """The untrained encoder, then one trained retriever per source (per fold), each scored on
    its fold's held-out queries; the folds' test queries together are every query."""
    say = progress or (lambda text: None)
    split = query_folds(data.queries, folds, settings.seed)
    untrained = SystemResult("untrained MiniLM")
    started = time.perf_counter()
    untrained.add(retrieve(load_encoder(location, settings.max_length), data.queries, data.corpus,
                           threads=settings.threads), data)
    untrained.seconds = time.perf_counter() - started
    untrained.test_queries = [len(test) for _, test in split]
    results = [untrained]
    for source in sources:
        name = (f"curriculum: {source.first} then {source.then}" if isinstance(source, Curriculum)
                else f"trained on {source}")
        result = SystemResult(name)
        started = time.perf_counter()
        for fold, (train, test) in enumerate(split):
            model = load_encoder(location, settings.max_length)
            stages = (source.first, source.then) if isinstance(source, Curriculum) else (source,)
            trained_queries = positives = 0
            for stage in stages:
                queries = training_queries(data, train, stage, settings, utility)
                if not queries:  # e.g. UtilSel selected nothing in this fold: the stage is skipped, said
                    say(f"{name}, fold {fold + 1}/{folds}, {stage}: no training query has a positive, not trained")
                    result.note += f"fold {fold + 1} {stage}: nothing to train on. "
                    continue
                log = train_retriever(model, queries, settings)
                trained_queries, positives = max(trained_queries, log.queries), positives + log.positives
                say(f"{name}, fold {fold + 1}/{folds}, {stage}: {log.queries} queries, {log.positives} "
                    f"positives, {log.negatives} negatives, {log.steps} steps, {log.loss_trend()}, "
                    f"{log.seconds:.0f} s")
            result.train_queries.append(trained_queries)
            result.positives.append(positives)
            result.test_queries.append(len(test))
            result.digests.append(weights_digest(model)[:12])
            result.add(retrieve(model, {q: data.queries[q] for q in test}, data.corpus,
                                threads=settings.threads), data)
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results


@dataclass
class TrainedRun:
    """A trained retriever's run over every query (query_id, doc_id, rank, score, fold,
    student_key: the fold model's weights sha256[:16]), each fold's report, or why no run."""

    run: pl.DataFrame
    folds: list[dict] = field(default_factory=list)
    not_trained: str | None = None


def _empty_trained_run() -> pl.DataFrame:
    return pl.DataFrame(schema={"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32,
                                "score": pl.Float64, "fold": pl.Int32, "student_key": pl.String})


def trained_retriever_folder(lake_folder: Path, dataset: str) -> Path:
    """Where a lake keeps its trained retrievers' fold models (beside its students)."""
    return lake_folder / "trained_retrievers" / dataset


def trained_model_key(queries: Sequence[TrainingQuery], settings: TrainSettings, base: Mapping) -> str:
    """What a fold's weights follow from: its training queries (texts, positives, negatives),
    the settings and what the base encoder is (retrievers.yaml's identity, not its folder)."""
    config = {"training": [dataclasses.asdict(q) for q in queries], "settings": dataclasses.asdict(settings),
              "base": dict(base)}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FoldModel:
    model: object           # a SentenceTransformer
    weights_hash: str       # weights_digest[:16]
    log: TrainingLog
    trained_now: bool


def fold_model(location: str, queries: Sequence[TrainingQuery], settings: TrainSettings, *,
               store: Path | None = None, base: Mapping | None = None) -> FoldModel:
    """The encoder at `location` fine-tuned on `queries`. With `store` (and the base's identity),
    kept in store/<trained_model_key>/ and found there again while its inputs stay the same: a
    seed gives the same weights anyway, so training again would only cost the minutes."""
    def train() -> tuple[object, TrainingLog]:
        model = load_encoder(location, settings.max_length)
        return model, train_retriever(model, queries, settings)

    if store is None:
        model, log = train()
        return FoldModel(model, weights_digest(model)[:16], log, True)
    if base is None:
        raise TrainedRetrieverError("a stored trained retriever needs its base encoder's identity")

    def build(folder: Path) -> dict:
        model, log = train()
        model.save(str(folder))
        return {"weights_hash": weights_digest(model)[:16], "log": dataclasses.asdict(log),
                "settings": dataclasses.asdict(settings), "base": dict(base)}

    folder, built_now = ensure_built(store / trained_model_key(queries, settings, base), build)
    meta = read_meta(folder)
    return FoldModel(load_encoder(str(folder), settings.max_length), meta["weights_hash"],
                     TrainingLog(**meta["log"]), built_now)


def trained_retriever_run(data: LakeData, location: str, source: LabelSource, settings: TrainSettings, *,
                          folds: int, k: int, progress: Callable[[str], None] | None = None,
                          store: Path | None = None, base: Mapping | None = None,
                          utility: Mapping[str, set[str]] | None = None) -> TrainedRun:
    """The registry's `trained_retriever`: the queries dealt into `folds` (seeded); each fold's
    queries are ranked (exact cosine over the whole corpus, top `k`) by the encoder at `location`
    fine-tuned on the `source` labels of the other folds' queries only, so no query is ranked
    by a model that learned its labels. No run when a fold has nothing to train on: a run
    trained for some queries only would be compared with full runs. With `store`, each fold's
    model is kept there and found again (fold_model). `utility`: the positives of `source`
    utility (utility_positives)."""
    say = progress or (lambda text: None)
    queries = sorted(data.queries)
    if len(queries) < folds:
        return TrainedRun(_empty_trained_run(), not_trained=f"{len(queries)} queries cannot make {folds} folds")
    split = query_folds(queries, folds, settings.seed)
    training = [training_queries(data, train, source, settings, utility) for train, _ in split]
    for fold, queries_of_fold in enumerate(training):  # every fold checked before any trains
        if not queries_of_fold:
            return TrainedRun(_empty_trained_run(), not_trained=f"fold {fold + 1} of {folds}: no training "
                                                               f"query has a positive in the {source} labels")
    parts, reports = [], []
    for fold, ((_, test), queries_of_fold) in enumerate(zip(split, training)):
        found = fold_model(location, queries_of_fold, settings, store=store, base=base)
        log, key = found.log, found.weights_hash
        run = retrieve(found.model, {q: data.queries[q] for q in test}, data.corpus, k=k, threads=settings.threads)
        parts.append(run.with_columns(pl.col("rank").cast(pl.Int32), fold=pl.lit(fold, dtype=pl.Int32),
                                      student_key=pl.lit(key, dtype=pl.String)))
        reports.append({"fold": fold, "queries": len(test), "trained_on_queries": log.queries,
                        "positives": log.positives, "negatives": log.negatives, "steps": log.steps,
                        "weights_hash": key, "seconds": round(log.seconds, 1), "trained_now": found.trained_now})
        trained = (f"trained on {log.queries} queries' {source} labels ({log.positives} positives, "
                   f"{log.negatives} hard negatives, {log.steps} steps, {log.loss_trend()}, {log.seconds:.0f} s)")
        say(f"fold {fold + 1}/{folds}: " + (f"{trained}, weights {key}" if found.trained_now
                                            else f"weights {key} found again, {trained} before")
            + f"; ranked {len(test)} held-out queries")
    return TrainedRun(pl.concat(parts).select(_empty_trained_run().columns).sort("query_id", "rank"), reports)


def format_table(results: Sequence[SystemResult], seed: int) -> str:
    """The comparison as a markdown table: mean [95% interval] over the held-out queries."""
    headers = ["system", "train q (per fold)", "test q",
               *[f"{label} {version}" for version in QRELS_VERSIONS
                 for label in ("nDCG@10", "R@10")]]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in results:
        cells = [result.name, "/".join(map(str, result.train_queries)) or "-", str(sum(result.test_queries))]
        for version in QRELS_VERSIONS:
            for measure in MEASURES:
                mean, low, high, _ = result.summary(version, measure, seed)
                cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_differences(results: Sequence[SystemResult], seed: int) -> str:
    """Each trained row minus the untrained one, paired over queries, with 95% intervals."""
    base = results[0]
    headers = ["system - untrained", *[f"{label} {version}" for version in QRELS_VERSIONS
                                       for label in ("nDCG@10", "R@10")]]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in results[1:]:
        cells = [result.name]
        for version in QRELS_VERSIONS:
            for measure in MEASURES:
                mean, low, high, _ = paired_difference(result, base, version, measure, seed)
                cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
