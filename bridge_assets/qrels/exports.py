"""The refined qrels in the formats people load them with.

- TREC qrels (`qid 0 docid rel`): for trec_eval, pytrec_eval, ranx, `bridge eval`.
- A BEIR folder (corpus.jsonl, queries.jsonl with answers, qrels/test.tsv): for BEIR loaders.
- The BRIDGE release layout: queries.jsonl with `q_id`, `query`, `doc_id` (the relevant
  documents) and `answers`, beside corpus.jsonl.
- A Hugging Face dataset (`datasets.DatasetDict.save_to_disk`) with qrels, queries, corpus.

Each reads back with the project's own loaders (bridge_assets.ingest.loaders), so an export
can be registered as a dataset in resources/datasets.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import Enum
from pathlib import Path

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import table_exists
from bridge_assets.registry.datasets import validate_dataset_name
from bridge_assets.trec_io import write_trec_qrels


class ExportFormat(str, Enum):
    trec = "trec"
    beir = "beir"
    bridge = "bridge"
    hf = "hf"


class ExportError(BridgeError, LookupError):
    """What an export needs is not in the data lake."""


def _read(con: duckdb.DuckDBPyConnection, table: str, dataset: str, columns: str, order: str) -> pl.DataFrame:
    if not table_exists(con, table):
        raise ExportError(f"table {table} does not exist yet: materialize it for dataset '{dataset}'")
    frame = con.execute(f"select {columns} from {table} where dataset = ? order by {order}", [dataset]).pl()
    if frame.is_empty():
        raise ExportError(f"no {table} rows for dataset '{dataset}': materialize it first")
    return frame


def read_bridge_qrels(con: duckdb.DuckDBPyConnection, dataset: str) -> pl.DataFrame:
    """The labels of the refined qrels: pending pairs (awaiting people) are not labels."""
    qrels = _read(con, "bridge_qrels", dataset, "query_id, doc_id, relevance, source", "query_id, doc_id")
    return qrels.filter(pl.col("source") != "pending")


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _corpus_records(corpus: pl.DataFrame) -> Iterable[dict]:
    for doc_id, title, text in corpus.select("doc_id", "title", "text").iter_rows():
        yield {"_id": doc_id, "title": title or "", "text": text}


def write_beir_folder(con: duckdb.DuckDBPyConnection, dataset: str, folder: Path,
                      split: str = "test") -> Path:
    """corpus.jsonl, queries.jsonl (`_id`, `text`, `answers`), qrels/<split>.tsv."""
    qrels = read_bridge_qrels(con, dataset)
    corpus = _read(con, "corpus", dataset, "doc_id, title, text", "doc_id")
    queries = _read(con, "queries", dataset, "query_id, text, answers", "query_id")
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl", _corpus_records(corpus))
    write_jsonl(folder / "queries.jsonl", ({"_id": q, "text": t, "answers": list(a or [])}
                                           for q, t, a in queries.iter_rows()))
    with (folder / "qrels" / f"{split}.tsv").open("w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for query_id, doc_id, relevance in qrels.select("query_id", "doc_id", "relevance").iter_rows():
            handle.write(f"{query_id}\t{doc_id}\t{relevance}\n")
    return folder


def write_bridge_release(con: duckdb.DuckDBPyConnection, dataset: str, folder: Path) -> Path:
    """queries.jsonl with q_id, query, doc_id (relevant documents, best first by relevance,
    then id), answers; corpus.jsonl beside it. Queries without a relevant document keep an
    empty list."""
    qrels = read_bridge_qrels(con, dataset)
    corpus = _read(con, "corpus", dataset, "doc_id, title, text", "doc_id")
    queries = _read(con, "queries", dataset, "query_id, text, answers", "query_id")
    relevant = (qrels.filter(pl.col("relevance") > 0)
                .sort(["query_id", "relevance", "doc_id"], descending=[False, True, False])
                .group_by("query_id", maintain_order=True).agg(pl.col("doc_id")))
    doc_ids = dict(relevant.iter_rows())
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "queries.jsonl", (
        {"q_id": q, "query": t, "doc_id": doc_ids.get(q, []), "answers": list(a or [])}
        for q, t, a in queries.iter_rows()))
    write_jsonl(folder / "corpus.jsonl", _corpus_records(corpus))
    return folder


def write_hf_dataset(con: duckdb.DuckDBPyConnection, dataset: str, folder: Path) -> Path:
    """A `datasets.DatasetDict` (splits qrels, queries, corpus) saved with save_to_disk;
    load it with `datasets.load_from_disk(folder)`."""
    import datasets

    qrels = read_bridge_qrels(con, dataset)
    corpus = _read(con, "corpus", dataset, "doc_id, title, text", "doc_id")
    queries = _read(con, "queries", dataset, "query_id, text, answers", "query_id")
    bundle = datasets.DatasetDict({
        "qrels": datasets.Dataset.from_polars(qrels),
        "queries": datasets.Dataset.from_polars(queries),
        "corpus": datasets.Dataset.from_polars(corpus),
    })
    bundle.save_to_disk(str(folder))
    return folder


def export_qrels(con: duckdb.DuckDBPyConnection, dataset: str, fmt: ExportFormat, out: Path) -> Path:
    """Write `dataset`'s refined qrels as `fmt` under `out` (a file for trec, else a folder)."""
    validate_dataset_name(dataset)  # it names the trec file
    if fmt is ExportFormat.trec:
        target = out if out.suffix else out / f"{dataset}.bridge.qrels"
        return write_trec_qrels(read_bridge_qrels(con, dataset), target)
    if fmt is ExportFormat.beir:
        return write_beir_folder(con, dataset, out)
    if fmt is ExportFormat.bridge:
        return write_bridge_release(con, dataset, out)
    return write_hf_dataset(con, dataset, out)
