"""Runs as polars frames (query_id, doc_id, rank, score) and as TREC run files.

Every system's scores pass through `top_k`, the one place ranks are assigned: sorted by score
(descending), ties broken by doc_id, one row per (query, document), ranks 1..k.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import polars as pl

from bridge_assets.paths import LakeLocation
from bridge_assets.retrieval.errors import MissingRun
from bridge_assets.trec_io import read_trec_run, write_trec_run

RUN_SCHEMA = {"query_id": pl.String, "doc_id": pl.String, "rank": pl.Int32, "score": pl.Float64}
SCORED_SCHEMA = {"query_id": pl.String, "doc_id": pl.String, "score": pl.Float64}


def document_texts(corpus: pl.DataFrame) -> list[str]:
    """What encoders read of a document: its title, then its text (BEIR's convention)."""
    return corpus.select(
        pl.concat_str([pl.col("title").fill_null(""), pl.col("text").fill_null("")], separator=" ")
        .str.strip_chars()).to_series().to_list()


def scored(query_ids: list[str], doc_ids: np.ndarray, indices: np.ndarray, scores: np.ndarray) -> pl.DataFrame:
    """A (query, doc, score) frame from per-query arrays of corpus positions (-1 = none)."""
    rows_q, rows_d, rows_s = [], [], []
    for qid, idx_row, score_row in zip(query_ids, indices, scores):
        keep = idx_row >= 0
        rows_q.extend([qid] * int(keep.sum()))
        rows_d.extend(doc_ids[idx_row[keep]].tolist())
        rows_s.extend(score_row[keep].astype(np.float64).tolist())
    return pl.DataFrame({"query_id": rows_q, "doc_id": rows_d, "score": rows_s}, schema=SCORED_SCHEMA)


def top_k(candidates: pl.DataFrame, k: int) -> pl.DataFrame:
    """The best k documents per query, ranked 1..k (ties: smaller doc_id first)."""
    return (candidates.select(pl.col("query_id").cast(pl.String), pl.col("doc_id").cast(pl.String),
                              pl.col("score").cast(pl.Float64))
            .sort(["query_id", "score", "doc_id"], descending=[False, True, False])
            .unique(["query_id", "doc_id"], keep="first", maintain_order=True)
            .with_columns(rank=pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("query_id"))
            .filter(pl.col("rank") <= k)
            .select(list(RUN_SCHEMA)))


def rank_problems(run: pl.DataFrame, k: int) -> list[str]:
    """What breaks the run contract (empty when none): ranks 1..n<=k, unique, one row per doc."""
    problems = []
    per_query = run.group_by("query_id").agg(
        n=pl.len(), distinct_ranks=pl.col("rank").n_unique(), distinct_docs=pl.col("doc_id").n_unique(),
        min_rank=pl.col("rank").min(), max_rank=pl.col("rank").max())
    bad = per_query.filter((pl.col("distinct_ranks") != pl.col("n")) | (pl.col("distinct_docs") != pl.col("n"))
                           | (pl.col("min_rank") != 1) | (pl.col("max_rank") != pl.col("n"))
                           | (pl.col("n") > k))
    if bad.height:
        problems.append(f"{bad.height} queries without unique ranks 1..n<={k}, e.g. "
                        f"{bad.head(3).to_dicts()}")
    return problems


write_trec = write_trec_run  # `qid Q0 docid rank score tag` (bridge_assets.trec_io)


def read_trec(path: Path) -> pl.DataFrame:
    """A TREC run file as a run frame, ranked by score as every system is (trec_eval's reading,
    bridge_assets.trec_io.read_trec_run; the file's rank column is not trusted)."""
    run = read_trec_run(path).frame
    # the longest ranking (None: no rows); polars types a Series' max as any Python value
    longest = cast(int | None, run.group_by("query_id").len()["len"].max())
    return top_k(run, longest or 1)


def export_trec_run(dataset: str, retriever: str, path: Path, lake: LakeLocation) -> tuple[Path, int]:
    """Write the stored run of (dataset, retriever) from `retrieval_run` as a TREC run file
    tagged with the retriever's name. MissingRun (a LookupError) when there is no such run."""
    from bridge_assets.lake import store

    with store.connect(lake) as con:
        if not store.table_exists(con, "retrieval_run"):
            raise MissingRun("no retrieval_run table yet: materialize retrieval_run first")
        run = con.execute("select query_id, doc_id, rank, score from retrieval_run "
                          "where dataset = ? and retriever = ?", [dataset, retriever]).pl()
    if run.is_empty():
        raise MissingRun(f"no stored run of retriever '{retriever}' on dataset '{dataset}'")
    return write_trec(run, path, tag=retriever), run.height
