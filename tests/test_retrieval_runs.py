"""Run frames, TREC files, fusion, query expansion, resumable encoding: the model-free parts."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import sparse

from bridge_assets.retrieval import cache, dense, splade
from bridge_assets.retrieval.llm_systems import expanded_query
from bridge_assets.retrieval.registry import RewriteParams
from bridge_assets.retrieval.runs import document_texts, rank_problems, read_trec, top_k, write_trec
from bridge_assets.retrieval.systems import reciprocal_rank_fusion


def test_top_k_ranks_by_score_breaks_ties_by_doc_id_and_drops_duplicates():
    candidates = pl.DataFrame({
        "query_id": ["q1"] * 5 + ["q2"] * 2,
        "doc_id": ["b", "a", "c", "a", "d", "x", "y"],
        "score": [2.0, 2.0, 3.0, 1.0, 0.5, 1.0, 2.0],
    })
    run = top_k(candidates, 3)
    assert run.filter(pl.col("query_id") == "q1").select("doc_id", "rank").rows() == [("c", 1), ("a", 2), ("b", 3)]
    assert run.filter(pl.col("query_id") == "q2")["doc_id"].to_list() == ["y", "x"]
    assert run.schema == {"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32, "score": pl.Float64}
    assert rank_problems(run, 3) == []


@pytest.mark.parametrize("rows", [
    [("q1", "a", 1), ("q1", "b", 1)],          # duplicate rank
    [("q1", "a", 1), ("q1", "a", 2)],          # duplicate document
    [("q1", "a", 2), ("q1", "b", 3)],          # does not start at 1
    [("q1", "a", 1), ("q1", "b", 3)],          # a gap
    [("q1", d, r) for r, d in enumerate("abcd", 1)],  # more than k
])
def test_rank_problems_catches_every_broken_run(rows):
    run = pl.DataFrame(rows, schema=["query_id", "doc_id", "rank"], orient="row").with_columns(score=pl.lit(1.0))
    assert rank_problems(run, 3)


def test_trec_run_round_trip(tmp_path):
    run = top_k(pl.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["d1", "d2", "d3"],
                              "score": [0.9, 0.5, 0.1]}), 10)
    path = write_trec(run, tmp_path / "run.trec", tag="bm25")
    assert path.read_text().splitlines()[0] == "q1 Q0 d1 1 0.900000 bm25"
    assert read_trec(path).sort(["query_id", "rank"]).equals(run.sort(["query_id", "rank"]))


def test_reciprocal_rank_fusion_sums_inverse_ranks():
    a = pl.DataFrame({"query_id": ["q"] * 2, "doc_id": ["x", "y"], "rank": [1, 2]})
    b = pl.DataFrame({"query_id": ["q"] * 2, "doc_id": ["y", "z"], "rank": [1, 2]})
    fused = {d: s for d, s in reciprocal_rank_fusion([a, b], 60).select("doc_id", "score").iter_rows()}
    assert fused["y"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["x"] == pytest.approx(1 / 61) and fused["z"] == pytest.approx(1 / 62)
    assert top_k(reciprocal_rank_fusion([a, b], 60), 3)["doc_id"].to_list() == ["y", "x", "z"]


def test_query_expansion_of_each_method():
    query, passages = "what is bm25", ["bm25 is a ranking function " * 4]  # 20 words
    assert expanded_query("hyde", query, passages, RewriteParams(method="hyde")) == passages[0]
    q2d = expanded_query("query2doc", query, passages, RewriteParams(method="query2doc", query_repeats=5))
    assert q2d.count(query) == 5 and q2d.endswith(passages[0])
    mugi = expanded_query("mugi", query, passages * 2, RewriteParams(method="mugi", passages=2, beta=2))
    assert mugi.count(query) == round(40 / (3 * 2))  # |passages| / (|query| * beta) repeats
    assert expanded_query("mugi", query, [], RewriteParams(method="mugi")) == query  # nothing generated


class _CountingEncoder:
    """Deterministic vectors from the text; fails on call `fail_on` (to interrupt a build)."""

    similarity = "cosine"

    def __init__(self, fail_on: int | None = None):
        self.calls, self.fail_on, self.encoded = 0, fail_on, []

    def encode_documents(self, texts, batch_size):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt("interrupted")
        self.encoded.extend(texts)
        return np.array([[len(t), sum(map(ord, t)) % 97, 1.0, 0.5] for t in texts], dtype=np.float32)

    def encode(self, texts, batch_size):  # the SPLADE encoder's interface
        return sparse.csr_matrix(self.encode_documents(texts, batch_size))


@pytest.mark.parametrize("module, output", [(dense, "embeddings.npy"), (splade, "documents.npz")])
def test_an_interrupted_encoding_resumes_where_it_stopped(tmp_path, monkeypatch, module, output):
    monkeypatch.setattr(module, "ENCODE_CHUNK", 4)
    corpus = pl.DataFrame({"doc_id": [f"d{i:02d}" for i in range(10)], "title": ["t"] * 10,
                           "text": [f"document number {i}" for i in range(10)]})
    folder = tmp_path / "artifact"
    interrupted = _CountingEncoder(fail_on=3)
    with pytest.raises(KeyboardInterrupt):
        cache.ensure_built(folder, lambda tmp: module.encode_corpus(interrupted, corpus, tmp, 2), resumable=True)
    assert not cache.is_built(folder) and len(interrupted.encoded) == 8
    resumed = _CountingEncoder()
    folder, built = cache.ensure_built(folder, lambda tmp: module.encode_corpus(resumed, corpus, tmp, 2),
                                       resumable=True)
    assert built and resumed.encoded == ["t document number 8", "t document number 9"]  # only the rest
    full = _CountingEncoder()
    expected = full.encode_documents(document_texts(corpus), 2)
    if module is dense:
        got = dense.load_embeddings(folder, "cosine").matrix
    else:
        got = splade.load_documents(folder)[1].toarray()
    np.testing.assert_array_equal(got, expected)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["doc_ids.parquet", output, "meta.json"])
