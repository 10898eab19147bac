"""Dense retrieval: cached document embeddings and Faiss search (exact, HNSW, IVF-PQ, binary).

Document embeddings are computed once per (dataset, encoder), in batches written straight to
a memory-mapped .npy file (memory stays bounded by one batch), with progress in the logs.
Every system on the same encoder reads them: exact search, PCA-reduced search
(Dim-Reduction), approximate indexes (cached beside the embeddings) and BPR-style hashing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import polars as pl

from bridge_assets.retrieval import cache
from bridge_assets.retrieval.encoders import DenseEncoder
from bridge_assets.retrieval.errors import RetrievalError
from bridge_assets.retrieval.registry import DenseParams
from bridge_assets.retrieval.runs import document_texts

log = logging.getLogger(__name__)

ENCODE_CHUNK = 256  # documents per encode call; one chunk is the most held in memory at once
PROGRESS_FILE = "progress.json"  # rows written so far, while an encoding is under way


@dataclass
class Embeddings:
    folder: Path
    doc_ids: np.ndarray   # corpus position -> doc_id
    matrix: np.ndarray    # (documents, dim) float32, memory-mapped
    similarity: str

    def positions(self, doc_ids: list[str]) -> np.ndarray:
        lookup = {d: i for i, d in enumerate(self.doc_ids.tolist())}
        return np.array([lookup[d] for d in doc_ids], dtype=np.int64)


PAIR_CHUNK = 32_768  # (query, document) pairs scored at once: two float32 (chunk, dim) blocks


def pair_scores(embedded: Embeddings, doc_positions: np.ndarray, query_vectors: np.ndarray,
                query_rows: np.ndarray) -> np.ndarray:
    """Dot product of each (query_vectors[query_rows[i]], document doc_positions[i]) pair, a
    chunk at a time: gathering all pairs at once (queries x re-rank depth x dim) took a
    gigabyte on nq_open_mini."""
    out = np.empty(len(doc_positions), dtype=np.float64)
    for start in range(0, len(doc_positions), PAIR_CHUNK):
        end = start + PAIR_CHUNK
        out[start:end] = np.einsum("nd,nd->n", query_vectors[query_rows[start:end]],
                                   embedded.matrix[doc_positions[start:end]])
    return out


def encode_corpus(encoder: DenseEncoder, corpus: pl.DataFrame, folder: Path, batch_size: int,
                  progress: Callable[[str], None] = log.info) -> dict:
    """Write the corpus's embeddings to folder/embeddings.npy and its ids to doc_ids.parquet.

    Resumable: after each chunk, progress.json records how many rows are written, and a
    folder left by an interrupted encoding of the same corpus continues from there.
    """
    texts = document_texts(corpus)
    corpus.select("doc_id").write_parquet(folder / "doc_ids.parquet")
    done, matrix = _resume(folder, len(texts))
    if done:
        progress(f"resuming an interrupted encoding at {done}/{len(texts)} documents")
    started, first = time.perf_counter(), done
    for start in range(done, len(texts), ENCODE_CHUNK):
        chunk = encoder.encode_documents(texts[start:start + ENCODE_CHUNK], batch_size)
        if matrix is None:
            matrix = np.lib.format.open_memmap(folder / "embeddings.npy", mode="w+", dtype=np.float32,
                                               shape=(len(texts), chunk.shape[1]))
        matrix[start:start + len(chunk)] = chunk
        matrix.flush()
        done = start + len(chunk)
        (folder / PROGRESS_FILE).write_text(json.dumps({"rows": len(texts), "done": done}))
        rate = (done - first) / max(time.perf_counter() - started, 1e-9)
        progress(f"encoded {done}/{len(texts)} documents ({rate:.1f}/s, "
                 f"~{(len(texts) - done) / rate:.0f}s left)")
    if matrix is None:
        raise RetrievalError("cannot embed an empty corpus")
    (folder / PROGRESS_FILE).unlink()
    return {"documents": len(texts), "dim": int(matrix.shape[1]),
            "docs_per_second": round((done - first) / max(time.perf_counter() - started, 1e-9), 2)}


def _resume(folder: Path, rows: int) -> tuple[int, np.memmap | None]:
    """(rows already encoded, the open matrix) from an interrupted encoding, else (0, None)."""
    progress_file, matrix_file = folder / PROGRESS_FILE, folder / "embeddings.npy"
    if not (progress_file.exists() and matrix_file.exists()):
        return 0, None
    state = json.loads(progress_file.read_text())
    matrix = np.load(matrix_file, mmap_mode="r+")
    if state.get("rows") != rows or matrix.shape[0] != rows:
        return 0, None
    return int(state["done"]), matrix


def load_embeddings(folder: Path, similarity: str) -> Embeddings:
    doc_ids = pl.read_parquet(folder / "doc_ids.parquet")["doc_id"].to_numpy()
    matrix = np.load(folder / "embeddings.npy", mmap_mode="r")
    return Embeddings(folder, doc_ids, matrix, similarity)


def _top(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores, indices = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return indices, scores


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _hnsw_index(embeddings: Embeddings, params: DenseParams) -> faiss.Index:
    m = params.m or 32

    def build(folder: Path) -> dict:
        index = faiss.IndexHNSWFlat(embeddings.matrix.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.ef_construction
        for start in range(0, len(embeddings.matrix), 10_000):
            index.add(np.ascontiguousarray(embeddings.matrix[start:start + 10_000]))
        faiss.write_index(index, str(folder / "index.faiss"))
        return {"index": "hnsw", "m": m, "ef_construction": params.ef_construction}

    folder, _ = cache.ensure_built(embeddings.folder / f"hnsw_m{m}_efc{params.ef_construction}", build)
    index = faiss.read_index(str(folder / "index.faiss"))
    assert isinstance(index, faiss.IndexHNSWFlat)  # read_index gives the class it wrote
    index.hnsw.efSearch = max(params.ef_search, 1)
    return index


def _ivfpq_index(embeddings: Embeddings, params: DenseParams) -> faiss.Index:
    n, dim = embeddings.matrix.shape
    m = params.m or 16
    if dim % m:
        raise RetrievalError(f"ivfpq: embedding dimension {dim} is not a multiple of m={m}")
    if n < 256:
        raise RetrievalError(f"ivfpq needs at least 256 documents to train its codebooks (corpus has {n}); "
                             "use index: hnsw or flat")
    nlist = params.nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))

    def build(folder: Path) -> dict:
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 100_000), replace=False)
        index.train(np.ascontiguousarray(embeddings.matrix[np.sort(sample)]))
        for start in range(0, n, 10_000):
            index.add(np.ascontiguousarray(embeddings.matrix[start:start + 10_000]))
        faiss.write_index(index, str(folder / "index.faiss"))
        return {"index": "ivfpq", "nlist": nlist, "m": m}

    folder, _ = cache.ensure_built(embeddings.folder / f"ivfpq_nlist{nlist}_m{m}", build)
    index = faiss.read_index(str(folder / "index.faiss"))
    assert isinstance(index, faiss.IndexIVFPQ)  # read_index gives the class it wrote
    index.nprobe = params.nprobe
    return index


def _binary_search(embeddings: Embeddings, queries: np.ndarray, k: int,
                   params: DenseParams) -> tuple[np.ndarray, np.ndarray]:
    """BPR: Hamming-distance candidates on sign bits, re-scored by <query, +-1 document code>."""
    dim = embeddings.matrix.shape[1]
    if dim % 8:
        raise RetrievalError(f"binary index: embedding dimension {dim} is not a multiple of 8")
    bits = np.asarray(embeddings.matrix) > 0
    index = faiss.IndexBinaryFlat(dim)
    index.add(np.packbits(bits, axis=1))
    candidates = min(max(params.candidates, k), len(bits))
    _, found = index.search(np.packbits(queries > 0, axis=1), candidates)
    rescored = np.stack([np.where(bits[row], 1.0, -1.0).astype(np.float32) @ query
                         for query, row in zip(queries, found)])
    order = np.argsort(-rescored, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(found, order, 1), np.take_along_axis(rescored, order, 1)


def search(embeddings: Embeddings, queries: np.ndarray, k: int,
           params: DenseParams) -> tuple[np.ndarray, np.ndarray]:
    """(corpus positions, scores) of the top-k documents of each query vector (-1: none)."""
    k = min(k, len(embeddings.matrix))
    if params.pca_dim:
        from sklearn.decomposition import PCA
        from threadpoolctl import threadpool_limits

        if params.index != "flat":
            raise RetrievalError("pca_dim is supported with index: flat")
        matrix = np.asarray(embeddings.matrix)
        # One BLAS thread: with pyserini's JVM in the process (BM25 ran before), scipy's
        # multi-threaded OpenBLAS inside PCA crashes the process (SIGSEGV) on a few thousand
        # rows; a single thread is as fast at this size.
        with threadpool_limits(limits=1):
            pca = PCA(n_components=min(params.pca_dim, *matrix.shape), random_state=0).fit(matrix)
            docs, queries = pca.transform(matrix).astype(np.float32), pca.transform(queries).astype(np.float32)
        if embeddings.similarity == "cosine":
            docs, queries = _normalise(docs), _normalise(queries)
        index = faiss.IndexFlatIP(docs.shape[1])
        index.add(docs)
        return _top(index, queries, k)
    if params.index == "binary":
        return _binary_search(embeddings, queries, k, params)
    if params.index == "hnsw":
        return _top(_hnsw_index(embeddings, params), queries, k)
    if params.index == "ivfpq":
        return _top(_ivfpq_index(embeddings, params), queries, k)
    index = faiss.IndexFlatIP(embeddings.matrix.shape[1])
    for start in range(0, len(embeddings.matrix), 10_000):
        index.add(np.ascontiguousarray(embeddings.matrix[start:start + 10_000]))
    return _top(index, queries, k)
