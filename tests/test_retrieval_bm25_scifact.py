"""BM25 (pyserini Lucene) on SciFact against an independent BM25 (bm25s).

Both see the same tokens (Lucene's DefaultEnglishAnalyzer: lowercase, stopwords, Porter) and
the same k1, b; bm25s's "lucene" method uses Lucene's idf. What differs is Lucene's lossy
one-byte encoding of document lengths, so a few near-tied documents may swap at the rank-10
boundary: the top-10s must agree on most queries, not all.
"""

from __future__ import annotations

import bm25s
import numpy as np
import polars as pl
import pytest

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.retrieval.lucene import lucene_contents, start_jvm
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.runs import rank_problems
from bridge_assets.retrieval.systems import run_retriever
from fixtures.paths import shared_data


def lucene_tokens(texts: list[str]) -> list[list[str]]:
    start_jvm()
    from pyserini.analysis import Analyzer, get_lucene_analyzer

    analyzer = Analyzer(get_lucene_analyzer())
    return [list(analyzer.analyze(text)) for text in texts]


def test_bm25_agrees_with_bm25s_on_scifact(tmp_path):
    shared_data("scifact")
    tables = load_dataset(get_dataset("scifact"))
    registry = load_registry()
    params = registry.system("bm25").params()
    run = run_retriever("scifact", "bm25", tables.corpus, tables.queries, registry=registry, lake=tmp_path).run
    assert rank_problems(run, 10) == []

    reference = bm25s.BM25(k1=params.k1, b=params.b, method="lucene")
    reference.index(lucene_tokens(lucene_contents(tables.corpus).to_list()), show_progress=False)
    query_tokens = lucene_tokens(tables.queries["text"].to_list())
    doc_ids = tables.corpus["doc_id"].to_numpy()
    overlaps = []
    for qid, tokens in zip(tables.queries["query_id"].to_list(), query_tokens):
        found, scores = reference.retrieve([tokens], k=10, show_progress=False)
        expected = set(doc_ids[found[0][scores[0] > 0]])
        got = set(run.filter(pl.col("query_id") == qid)["doc_id"])
        overlaps.append(len(expected & got) / max(len(expected), 1))
    overlaps = np.array(overlaps)
    print(f"BM25 vs bm25s top-10 overlap on {len(overlaps)} SciFact queries: mean {overlaps.mean():.4f}, "
          f"identical sets {np.mean(overlaps == 1):.1%}, >= 0.9 {np.mean(overlaps >= 0.9):.1%}")
    assert overlaps.mean() >= 0.95
    assert np.mean(overlaps >= 0.9) >= 0.9


@pytest.mark.parametrize("k1, b", [(1.2, 0.75)])
def test_bm25_parameters_reach_lucene(tmp_path, k1, b):
    tables = load_dataset(get_dataset("demo"))
    registry = load_registry()
    spec = registry.system("bm25").model_copy(update={"name": "bm25_other", "parameters": {"k1": k1, "b": b}})
    local = registry.model_copy(update={"systems": {**registry.systems, "bm25_other": spec}})
    default = run_retriever("demo", "bm25", tables.corpus, tables.queries, registry=local, lake=tmp_path).run
    other = run_retriever("demo", "bm25_other", tables.corpus, tables.queries, registry=local, lake=tmp_path).run
    assert not np.allclose(default.sort(["query_id", "rank"])["score"].to_numpy(),
                           other.sort(["query_id", "rank"])["score"].to_numpy())
