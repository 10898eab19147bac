"""Learned sparse retrieval (SPLADE): a cached document-term matrix, scored by dot product."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
from scipy import sparse

from bridge_assets.retrieval.encoders import SpladeEncoder
from bridge_assets.retrieval.runs import document_texts

log = logging.getLogger(__name__)

ENCODE_CHUNK = 256
QUERY_BLOCK = 256  # queries scored at once: the dense (documents x block) score matrix stays small


def encode_corpus(encoder: SpladeEncoder, corpus: pl.DataFrame, folder: Path, batch_size: int,
                  progress: Callable[[str], None] = log.info) -> dict:
    """Write the corpus's SPLADE vectors to folder/documents.npz (rows in corpus order).

    Resumable: each chunk is saved as parts/<first row>.npz as soon as it is encoded, and an
    interrupted encoding of the same corpus continues after its last saved chunk.
    """
    texts = document_texts(corpus)
    corpus.select("doc_id").write_parquet(folder / "doc_ids.parquet")
    parts_dir = folder / "parts"
    parts_dir.mkdir(exist_ok=True)
    parts = [sparse.load_npz(p) for p in sorted(parts_dir.glob("*.npz"))]
    done = first = sum(p.shape[0] for p in parts)
    if done:
        progress(f"splade: resuming an interrupted encoding at {done}/{len(texts)} documents")
    started = time.perf_counter()
    for start in range(done, len(texts), ENCODE_CHUNK):
        parts.append(encoder.encode(texts[start:start + ENCODE_CHUNK], batch_size))
        sparse.save_npz(parts_dir / f"{start:010d}.npz", parts[-1])
        done = start + parts[-1].shape[0]
        rate = (done - first) / max(time.perf_counter() - started, 1e-9)
        progress(f"splade: encoded {done}/{len(texts)} documents ({rate:.1f}/s, "
                 f"~{(len(texts) - done) / rate:.0f}s left)")
    matrix = sparse.vstack(parts).tocsr()
    sparse.save_npz(folder / "documents.npz", matrix)
    shutil.rmtree(parts_dir)
    return {"documents": matrix.shape[0], "vocabulary": matrix.shape[1],
            "mean_terms_per_document": round(matrix.nnz / max(matrix.shape[0], 1), 1)}


def load_documents(folder: Path) -> tuple[np.ndarray, sparse.csr_matrix]:
    doc_ids = pl.read_parquet(folder / "doc_ids.parquet")["doc_id"].to_numpy()
    return doc_ids, sparse.load_npz(folder / "documents.npz").tocsr()


def search(documents: sparse.csr_matrix, queries: sparse.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(corpus positions, scores) of the top-k documents per query; -1 where a query matches < k."""
    k = min(k, documents.shape[0])
    all_idx, all_scores = [], []
    for start in range(0, queries.shape[0], QUERY_BLOCK):
        scores = (documents @ queries[start:start + QUERY_BLOCK].T).T.toarray()
        idx = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(scores, idx, 1)
        order = np.argsort(-top, axis=1, kind="stable")
        idx, top = np.take_along_axis(idx, order, 1), np.take_along_axis(top, order, 1)
        all_idx.append(np.where(top > 0, idx, -1))  # no shared term: not retrieved
        all_scores.append(top)
    return np.vstack(all_idx), np.vstack(all_scores)
