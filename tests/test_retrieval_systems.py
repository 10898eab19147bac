"""Real systems on the demo dataset (a slice of it where encoders are slow on CPU)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.runs import rank_problems
from bridge_assets.retrieval.systems import run_retriever

SLICE = 40  # documents: enough to rank, small enough to encode on two CPU cores in seconds


@pytest.fixture(scope="module")
def demo_texts():
    tables = load_dataset(get_dataset("demo"))
    return tables.corpus, tables.queries


@pytest.fixture(scope="module")
def demo_slice(demo_texts):
    """The judged documents of the demo queries plus the first others, up to SLICE documents."""
    corpus, queries = demo_texts
    judged = load_dataset(get_dataset("demo")).qrels["doc_id"].unique().to_list()
    others = corpus.filter(~pl.col("doc_id").is_in(judged)).head(SLICE - len(judged))["doc_id"].to_list()
    return corpus.filter(pl.col("doc_id").is_in(judged + others)), queries


@pytest.fixture(scope="module", autouse=True)
def own_index_cache():
    """This module builds indexes and says so: the lake's own cache, not the suite's shared
    BRIDGE_INDEX_DIR (tests/conftest.py), where another module may have built them first."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("BRIDGE_INDEX_DIR", raising=False)
        yield


@pytest.fixture(scope="module")
def index_lake(tmp_path_factory):
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def test_bm25_index_is_built_once_and_reused(demo_texts, index_lake, registry):
    corpus, queries = demo_texts
    first = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=index_lake)
    again = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=index_lake)
    assert first.metadata["indexes"]["bm25-lucene"]["built_now"] is True
    assert again.metadata["indexes"]["bm25-lucene"]["built_now"] is False
    assert first.run.equals(again.run)
    assert first.run.height == 10 * queries.height and rank_problems(first.run, 10) == []
    # the judged passage of most demo questions is in BM25's top-10
    qrels = load_dataset(get_dataset("demo")).qrels
    hits = first.run.join(qrels, on=["query_id", "doc_id"])["query_id"].n_unique()
    assert hits >= queries.height // 2


def test_lakes_share_the_index_folder_bridge_index_dir_names(demo_texts, registry, tmp_path, monkeypatch):
    corpus, queries = demo_texts
    corpus = corpus.head(60)
    shared = tmp_path / "shared_indexes"
    monkeypatch.setenv("BRIDGE_INDEX_DIR", str(shared))
    first = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=tmp_path / "lake_a")
    other = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=tmp_path / "lake_b")
    assert first.metadata["indexes"]["bm25-lucene"]["built_now"] is True
    assert other.metadata["indexes"]["bm25-lucene"]["built_now"] is False  # the other lake's index
    assert other.metadata["indexes"]["bm25-lucene"]["path"].startswith(str(shared))
    assert first.run.equals(other.run)
    assert not (tmp_path / "lake_a" / "indexes").exists() and not (tmp_path / "lake_b" / "indexes").exists()


@pytest.mark.parametrize("rm3", [None, {"fb_terms": 10, "fb_docs": 10, "original_query_weight": 0.5}])
def test_bm25_search_equals_pyserini_s_lucene_searcher(demo_texts, tmp_path, rm3):
    """lucene.search calls Anserini's SimpleSearcher itself (without pyserini.search's imports):
    the same hits, scores and order as pyserini's LuceneSearcher over the same index."""
    from bridge_assets.retrieval import lucene
    from bridge_assets.retrieval.registry import BM25Params

    corpus, queries = demo_texts
    lucene.build_index(corpus, tmp_path / "index")
    params = BM25Params.model_validate({"k1": 1.1, "b": 0.5, "rm3": rm3})
    ours = lucene.search(tmp_path / "index", queries, 20, params)
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(tmp_path / "index"))
    searcher.set_bm25(params.k1, params.b)
    if rm3:
        searcher.set_rm3(**rm3)
    hits = searcher.batch_search(queries["text"].to_list(), queries["query_id"].to_list(), k=20, threads=2)
    reference = [(q, h.docid, h.score) for q in queries["query_id"] for h in hits.get(q, [])]
    searcher.close()
    assert ours.height == len(reference) == 20 * queries.height
    assert list(ours.select("query_id", "doc_id", "score").iter_rows()) == reference


def test_changed_corpus_gets_a_new_index(demo_texts, index_lake, registry):
    corpus, queries = demo_texts
    base = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=index_lake)
    smaller = run_retriever("demo", "bm25", corpus.head(100), queries, registry=registry, lake=index_lake)
    assert smaller.metadata["indexes"]["bm25-lucene"]["built_now"] is True
    assert smaller.metadata["indexes"]["bm25-lucene"]["path"] != base.metadata["indexes"]["bm25-lucene"]["path"]
    assert set(smaller.run["doc_id"]) <= set(corpus.head(100)["doc_id"])


def test_dense_run_equals_brute_force_cosine_in_numpy(demo_slice, index_lake, registry):
    from sentence_transformers import SentenceTransformer

    from bridge_assets.retrieval.weights import resolve_model

    corpus, queries = demo_slice
    run = run_retriever("demo", "minilm", corpus, queries, k=5, registry=registry, lake=index_lake).run
    model = SentenceTransformer(resolve_model(registry.model("all-minilm-l6-v2")).location, device="cpu")
    texts = [f"{t} {x}".strip() for t, x in corpus.select("title", "text").iter_rows()]
    docs = model.encode(texts, convert_to_numpy=True)
    qs = model.encode(queries["text"].to_list(), convert_to_numpy=True)
    cosine = (qs / np.linalg.norm(qs, axis=1, keepdims=True)) @ (docs / np.linalg.norm(docs, axis=1, keepdims=True)).T
    doc_ids = corpus["doc_id"].to_numpy()
    for i, qid in enumerate(queries["query_id"].to_list()):
        expected = np.argsort(-cosine[i], kind="stable")[:5]
        got = run.filter(pl.col("query_id") == qid).sort("rank")
        assert got["doc_id"].to_list() == doc_ids[expected].tolist()
        np.testing.assert_allclose(got["score"].to_numpy(), cosine[i, expected], atol=1e-5)


def test_pair_scores_in_chunks_equal_one_gather(tmp_path, monkeypatch):
    """A re-ranking bi-encoder scores (query, document) pairs a chunk at a time; chunks of 3 over
    10 pairs (the last one short) give what gathering every pair at once gives."""
    from bridge_assets.retrieval import dense

    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(7, 4)).astype(np.float32)
    embedded = dense.Embeddings(tmp_path, np.array([f"d{i}" for i in range(7)]), matrix, "dot")
    queries = rng.normal(size=(3, 4)).astype(np.float32)
    doc_positions, query_rows = rng.integers(0, 7, size=10), rng.integers(0, 3, size=10)
    monkeypatch.setattr(dense, "PAIR_CHUNK", 3)
    got = dense.pair_scores(embedded, doc_positions, queries, query_rows)
    np.testing.assert_allclose(got, np.einsum("nd,nd->n", queries[query_rows], matrix[doc_positions]), rtol=1e-6)


@pytest.mark.parametrize("depth", [10, 20])
def test_reranker_only_reorders_its_first_stage(demo_slice, index_lake, registry, depth):
    corpus, queries = demo_slice
    spec = registry.system("minilm_rerank_bm25")
    local = registry.model_copy(update={"systems": {**registry.systems, "minilm_rerank_bm25": spec.model_copy(
        update={"parameters": {"depth": depth}})}})
    first = run_retriever("demo", "bm25", corpus, queries, k=depth, registry=local, lake=index_lake).run
    reranked = run_retriever("demo", "minilm_rerank_bm25", corpus, queries, k=10, registry=local, lake=index_lake).run
    assert rank_problems(reranked, 10) == []
    for qid in queries["query_id"].to_list():
        pool = set(first.filter(pl.col("query_id") == qid)["doc_id"])
        got = set(reranked.filter(pl.col("query_id") == qid)["doc_id"])
        assert got <= pool
        if depth == 10:
            assert got == pool
    assert not reranked.select("query_id", "doc_id", "rank").equals(
        first.filter(pl.col("rank") <= 10).select("query_id", "doc_id", "rank"))  # it did reorder


def _stored(result, run=None):
    """What the retrieval_run asset hands a re-ranker: a system's stored rows with what made them."""
    return (run if run is not None else result.run).with_columns(
        config_hash=pl.lit(result.config_hash), inputs_hash=pl.lit(result.inputs_hash))


def test_reranker_takes_a_current_stored_first_stage_and_reruns_a_stale_one(demo_slice, index_lake, registry):
    corpus, queries = demo_slice
    depth = registry.defaults.k  # the first stage's stored run (its default k) is deep enough
    spec = registry.system("minilm_rerank_bm25")
    registry = registry.model_copy(update={"systems": {**registry.systems, "minilm_rerank_bm25": spec.model_copy(
        update={"parameters": {"depth": depth}})}})
    first = run_retriever("demo", "bm25", corpus, queries, registry=registry, lake=index_lake)
    fresh = run_retriever("demo", "minilm_rerank_bm25", corpus, queries, registry=registry, lake=index_lake)
    assert fresh.metadata["first_stage"] == {"bm25": {"depth": depth, "stored_run_reused": False}}

    reused = run_retriever("demo", "minilm_rerank_bm25", corpus, queries, registry=registry, lake=index_lake,
                           stored_run=lambda system: _stored(first) if system == "bm25" else None)
    assert reused.metadata["first_stage"]["bm25"]["stored_run_reused"] is True
    assert reused.run.equals(fresh.run)

    # proof the rows came from the store: a document planted in the stored run is re-ranked
    q01 = queries["query_id"][0]
    outside = corpus.filter(~pl.col("doc_id").is_in(first.run.filter(pl.col("query_id") == q01)["doc_id"]
                                                        .to_list()))["doc_id"][0]
    planted = first.run.with_columns(doc_id=pl.when((pl.col("query_id") == q01) & (pl.col("rank") == 1))
                                     .then(pl.lit(outside)).otherwise(pl.col("doc_id")))
    taken = run_retriever("demo", "minilm_rerank_bm25", corpus, queries, registry=registry, lake=index_lake,
                          stored_run=lambda system: _stored(first, planted))
    assert outside in taken.run.filter(pl.col("query_id") == q01)["doc_id"].to_list()

    # made from other queries, by another configuration, or too shallow: run again
    other_queries = queries.with_columns(text=pl.col("text") + " ?")
    stale = [_stored(first).with_columns(inputs_hash=pl.lit(run_retriever(
                 "demo", "bm25", corpus, other_queries, registry=registry, lake=index_lake).inputs_hash)),
             _stored(first).with_columns(config_hash=pl.lit(registry.config_hash("bm25", 5))),
             _stored(run_retriever("demo", "bm25", corpus, queries, k=3, registry=registry, lake=index_lake))]
    for rows in stale:
        again = run_retriever("demo", "minilm_rerank_bm25", corpus, queries, registry=registry, lake=index_lake,
                              stored_run=lambda system, rows=rows: rows)
        assert again.metadata["first_stage"]["bm25"]["stored_run_reused"] is False
        assert again.run.equals(fresh.run)


def test_every_fast_offline_system_ranks_1_to_k_on_the_demo_slice(demo_slice, index_lake, registry):
    corpus, queries = demo_slice
    for name in registry.profile_systems("offline_fast"):
        result = run_retriever("demo", name, corpus, queries, k=7, registry=registry, lake=index_lake)
        assert rank_problems(result.run, 7) == [], name
        assert result.run["query_id"].n_unique() == queries.height, name
        assert set(result.run["doc_id"]) <= set(corpus["doc_id"]), name
        assert result.run.group_by("query_id").len()["len"].max() == 7, name


@pytest.mark.slow  # encodes the whole demo corpus: IVF-PQ needs >= 256 documents to train
def test_approximate_indexes_agree_with_exact_search(demo_texts, index_lake, registry):
    corpus, queries = demo_texts
    exact = run_retriever("demo", "minilm", corpus, queries, registry=registry, lake=index_lake).run
    for index, params in [("hnsw", {"index": "hnsw", "m": 16}), ("ivfpq", {"index": "ivfpq", "m": 16, "nprobe": 64}),
                          ("binary", {"index": "binary", "candidates": 100})]:
        spec = registry.system("minilm").model_copy(update={"name": f"minilm_{index}", "parameters": params})
        local = registry.model_copy(update={"systems": {**registry.systems, spec.name: spec}})
        approx = run_retriever("demo", spec.name, corpus, queries, registry=local, lake=index_lake).run
        assert rank_problems(approx, 10) == []
        overlap = exact.join(approx, on=["query_id", "doc_id"]).height / exact.height
        assert overlap >= {"hnsw": 0.95, "ivfpq": 0.5, "binary": 0.5}[index], (index, overlap)


@pytest.mark.parametrize("labels", [1, 2])
def test_cross_encoder_reranker_loads_from_a_local_folder_and_only_reorders(tmp_path, demo_texts, index_lake,
                                                                             registry, labels):
    """The paper's cross-encoders have no offline weights; a tiny untrained BERT classifier
    saved to a folder exercises the same loading and scoring path (1 label: a score; 2
    labels: P(relevant) from the softmax)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from bridge_assets.retrieval.registry import ModelSource, ModelSpec, SystemSpec
    from bridge_assets.retrieval.weights import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(registry.model("all-minilm-l6-v2")).location)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=labels))
    folder = tmp_path / f"tiny-ce-{labels}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    name = f"tiny-ce-{labels}"
    local = registry.model_copy(update={
        "models": {**registry.models, name: ModelSpec(name=name, backend="cross_encoder", max_length=128,
                                                      sources=(ModelSource(path=str(folder)),))},
        "systems": {**registry.systems, "tiny_ce_bm25": SystemSpec(
            name="tiny_ce_bm25", kind="rerank", first_stage="bm25", model=name, parameters={"depth": 10})}})
    corpus, queries = demo_texts
    first = run_retriever("demo", "bm25", corpus, queries, registry=local, lake=index_lake).run
    reranked = run_retriever("demo", "tiny_ce_bm25", corpus, queries, registry=local, lake=index_lake).run
    assert rank_problems(reranked, 10) == []
    assert sorted(reranked.select("query_id", "doc_id").rows()) == sorted(first.select("query_id", "doc_id").rows())
    if labels == 2:
        assert reranked["score"].is_between(0, 1).all()


def test_pca_reduction_survives_the_in_process_jvm(tmp_path):
    """BM25 starts pyserini's JVM in the process; a PCA-reduced dense search afterwards (a few
    thousand rows, as on nq_open_mini) used to kill the process with SIGSEGV inside scipy's
    multi-threaded OpenBLAS. In a subprocess, so a crash fails this test instead of pytest."""
    import subprocess
    import sys
    import textwrap

    from fixtures.paths import PROJECT_ROOT

    script = textwrap.dedent("""
        import numpy as np
        from bridge_assets.retrieval.dense import Embeddings, search
        from bridge_assets.retrieval.lucene import start_jvm
        from bridge_assets.retrieval.registry import DenseParams
        start_jvm()
        rng = np.random.default_rng(0)
        matrix = rng.random((2600, 384), dtype=np.float32)
        embeddings = Embeddings(folder=None, doc_ids=np.arange(2600).astype(str), matrix=matrix,
                                similarity="cosine")
        positions, scores = search(embeddings, matrix[:5], 10, DenseParams(index="flat", pca_dim=128))
        assert (positions[:, 0] == np.arange(5)).all(), positions[:, 0]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.returncode, done.stderr[-2000:])
