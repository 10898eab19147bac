"""The trained retriever's training data: its settings, what it reads of the lake, each query's
positives (by label source) and hard negatives, query samples and folds, utility labels."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.labeling.pairs import chunk_text
from bridge_assets.lake.store import one_row
from bridge_assets.paths import read_sql

if TYPE_CHECKING:
    from bridge_assets.labeling.calls import Generate
    from bridge_assets.labeling.pairs import Pair

LabelSource = Literal["original", "refined", "utility"]



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
    known = one_row(con, "select count(*) from information_schema.tables where table_name = ?", [table])[0]
    rows = one_row(con, f"select count(*) from {table} where dataset = ?", [dataset])[0] if known else 0
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
