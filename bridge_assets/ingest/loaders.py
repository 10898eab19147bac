"""Loaders for local dataset formats. Each returns the three ingest tables, validated.

Every loader yields the same columns:
  corpus:  doc_id, title, text
  queries: query_id, text, answers (list of strings, empty when the dataset has none)
  qrels:   query_id, doc_id, relevance
Problems are raised as DatasetError naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.ingest.registry import DatasetSpec

CORPUS_SCHEMA = {"doc_id": pl.Utf8, "title": pl.Utf8, "text": pl.Utf8}
QUERIES_SCHEMA = {"query_id": pl.Utf8, "text": pl.Utf8, "answers": pl.List(pl.Utf8)}
QRELS_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32}


@dataclass
class DatasetTables:
    corpus: pl.DataFrame
    queries: pl.DataFrame
    qrels: pl.DataFrame

    def counts(self) -> dict[str, int]:
        return {"documents": self.corpus.height, "queries": self.queries.height,
                "qrels": self.qrels.height,
                "queries_with_answers": int((self.queries["answers"].list.len() > 0).sum())}


# --- reading helpers ---------------------------------------------------------------------

def _open_text(path: Path):
    if not path.exists():
        raise DatasetError("file not found", path)
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a malformed line names itself."""
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"malformed JSON ({exc.msg} at column {exc.colno})",
                                   path, number) from None
            if not isinstance(record, dict):
                raise DatasetError("expected a JSON object", path, number)
            yield number, record


def _field(record: dict, names: tuple[str, ...], path: Path, line: int, *, required: bool = True,
           default: Any = None) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    if required:
        raise DatasetError("missing field", path, line, names[0])
    return default


def _text(value: Any, path: Path, line: int, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, (str, int)):
        raise DatasetError(f"expected a string, got {type(value).__name__}", path, line, field)
    text = str(value).strip()
    if not text and not allow_empty:
        raise DatasetError("empty value", path, line, field)
    return text


def _answers(value: Any, path: Path, line: int, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(a, (str, int, float)) for a in value):
        raise DatasetError("expected a list of strings", path, line, field)
    return [str(a).strip() for a in value if str(a).strip()]


class _UniqueIds:
    """Remembers ids with the line that declared them, to report duplicates precisely."""

    def __init__(self, path: Path, field: str):
        self.path, self.field, self.seen = path, field, {}

    def add(self, key: str, line: int) -> None:
        if key in self.seen:
            raise DatasetError(f'duplicate id "{key}" (first on line {self.seen[key]})',
                               self.path, line, self.field)
        self.seen[key] = line


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def check_references(tables: DatasetTables, qrels_file: Path, lines: list[int] | None = None) -> None:
    """Every qrels row must name a known query and a known document."""
    doc_ids = set(tables.corpus["doc_id"].to_list())
    query_ids = set(tables.queries["query_id"].to_list())
    for index, row in enumerate(tables.qrels.iter_rows(named=True)):
        line = lines[index] if lines else None
        if row["query_id"] not in query_ids:
            raise DatasetError(f'unknown query "{row["query_id"]}"', qrels_file, line, "query-id")
        if row["doc_id"] not in doc_ids:
            raise DatasetError(f'unknown document "{row["doc_id"]}"', qrels_file, line, "corpus-id")


# --- corpus and queries ------------------------------------------------------------------

def read_corpus(path: Path) -> pl.DataFrame:
    """A BEIR-style corpus.jsonl (`_id`, `title`, `text`) or a TSV `doc_id<TAB>text[<TAB>title]`."""
    rows, ids = [], _UniqueIds(path, "_id")
    if path.suffix in {".tsv", ".txt"}:
        for number, fields in _read_tsv(path):
            if len(fields) < 2:
                raise DatasetError("expected doc_id<TAB>text", path, number)
            ids.add(fields[0], number)
            rows.append({"doc_id": fields[0], "text": _text(fields[1], path, number, "text"),
                         "title": fields[2] if len(fields) > 2 else ""})
        return _frame(rows, CORPUS_SCHEMA)
    for number, record in read_jsonl(path):
        doc_id = _text(_field(record, ("_id", "doc_id", "id"), path, number), path, number, "_id")
        ids.add(doc_id, number)
        rows.append({
            "doc_id": doc_id,
            "title": _text(record.get("title") or "", path, number, "title", allow_empty=True),
            "text": _text(_field(record, ("text", "contents"), path, number), path, number, "text"),
        })
    return _frame(rows, CORPUS_SCHEMA)


def read_answers(path: Path) -> dict[str, list[str]]:
    answers = {}
    for number, record in read_jsonl(path):
        query_id = _text(_field(record, ("query_id", "_id", "q_id"), path, number), path, number,
                         "query_id")
        answers[query_id] = _answers(_field(record, ("answers",), path, number), path, number,
                                     "answers")
    return answers


def read_beir_queries(path: Path, answers: dict[str, list[str]] | None = None) -> pl.DataFrame:
    rows, ids = [], _UniqueIds(path, "_id")
    for number, record in read_jsonl(path):
        query_id = _text(_field(record, ("_id", "query_id", "id"), path, number), path, number, "_id")
        ids.add(query_id, number)
        inline = record.get("answers", (record.get("metadata") or {}).get("answers"))
        rows.append({"query_id": query_id,
                     "text": _text(_field(record, ("text", "query"), path, number), path, number, "text"),
                     "answers": _answers(inline, path, number, "answers")})
    queries = _frame(rows, QUERIES_SCHEMA)
    if answers:
        known = set(queries["query_id"].to_list())
        for query_id in answers:
            if query_id not in known:
                raise DatasetError(f'answers for unknown query "{query_id}"', path, field="query_id")
        queries = queries.with_columns(
            pl.col("query_id").replace_strict(answers, default=pl.col("answers"),
                                              return_dtype=pl.List(pl.Utf8)).alias("answers"))
    return queries


def _read_tsv(path: Path) -> Iterator[tuple[int, list[str]]]:
    with _open_text(path) as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if row and any(cell.strip() for cell in row):
                yield number, [cell.strip() for cell in row]


def _relevance(value: str, path: Path, line: int, field: str) -> int:
    try:
        return int(float(value))
    except ValueError:
        raise DatasetError(f'relevance "{value}" is not a number', path, line, field) from None


def read_beir_qrels(path: Path) -> tuple[pl.DataFrame, list[int]]:
    rows, lines = [], []
    for number, fields in _read_tsv(path):
        if number == 1 and fields[0].lower() in {"query-id", "query_id", "qid"}:
            continue
        if len(fields) != 3:
            raise DatasetError(f"expected 3 tab-separated columns, got {len(fields)}", path, number)
        rows.append({"query_id": fields[0], "doc_id": fields[1],
                     "relevance": _relevance(fields[2], path, number, "score")})
        lines.append(number)
    return _dedupe_qrels(_frame(rows, QRELS_SCHEMA), path, lines), lines


def read_trec_qrels(path: Path) -> tuple[pl.DataFrame, list[int]]:
    """TREC qrels: `qid iteration docid relevance`, whitespace separated."""
    rows, lines = [], []
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):  # trec_eval skips comment lines too
                continue
            if len(fields) != 4:
                raise DatasetError(f"expected 4 columns (qid iter docid rel), got {len(fields)}",
                                   path, number)
            rows.append({"query_id": fields[0], "doc_id": fields[2],
                         "relevance": _relevance(fields[3], path, number, "rel")})
            lines.append(number)
    return _dedupe_qrels(_frame(rows, QRELS_SCHEMA), path, lines), lines


def _dedupe_qrels(qrels: pl.DataFrame, path: Path, lines: list[int]) -> pl.DataFrame:
    duplicated = qrels.select(pl.struct("query_id", "doc_id").is_duplicated()).to_series()
    if duplicated.any():
        index = int(duplicated.arg_true()[1] if duplicated.sum() > 1 else duplicated.arg_true()[0])
        row = qrels.row(index, named=True)
        raise DatasetError(f'duplicate judgment for query "{row["query_id"]}" and document '
                           f'"{row["doc_id"]}"', path, lines[index])
    return qrels


def read_trec_topics(path: Path) -> pl.DataFrame:
    """TREC topics: classic `<top><num>..<title>..</top>` blocks, or TSV `qid<TAB>text`."""
    with _open_text(path) as handle:
        content = handle.read()
    rows, ids = [], _UniqueIds(path, "num")
    if "<top>" in content:
        for block in re.finditer(r"<top>(.*?)</top>", content, flags=re.S):
            line = content.count("\n", 0, block.start()) + 1
            num = re.search(r"<num>\s*(?:Number:)?\s*(\S+)", block.group(1))
            title = re.search(r"<title>\s*(?:Topic:)?\s*(.*?)\s*(?=<|$)", block.group(1), flags=re.S)
            if not num or not title:
                raise DatasetError("topic without <num> or <title>", path, line)
            ids.add(num.group(1), line)
            rows.append({"query_id": num.group(1), "text": _text(title.group(1), path, line, "title"),
                         "answers": []})
        return _frame(rows, QUERIES_SCHEMA)
    for number, fields in _read_tsv(path):
        if len(fields) < 2:
            raise DatasetError("expected qid<TAB>text", path, number)
        ids.add(fields[0], number)
        rows.append({"query_id": fields[0], "text": _text(fields[1], path, number, "text"),
                     "answers": []})
    return _frame(rows, QUERIES_SCHEMA)


# --- one loader per kind -----------------------------------------------------------------

def load_beir_folder(folder: Path, split: str = "test", answers_file: Path | None = None) -> DatasetTables:
    if not folder.is_dir():
        raise DatasetError("BEIR folder not found", folder)
    if answers_file is None and (folder / "answers.jsonl").exists():
        answers_file = folder / "answers.jsonl"
    answers = read_answers(answers_file) if answers_file else None
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = read_beir_queries(folder / "queries.jsonl", answers)
    qrels_file = folder / "qrels" / f"{split}.tsv"
    qrels, lines = read_beir_qrels(qrels_file)
    tables = DatasetTables(corpus, queries, qrels)
    check_references(tables, qrels_file, lines)
    return tables


def nq_passage_id(title: str, text: str) -> str:
    """Stable id from the passage's content, so identical passages merge into one document."""
    digest = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
    return f"nq-{digest}"


def load_nq_open(path: Path) -> DatasetTables:
    """NQ-open jsonl: corpus = the gold passages (merged when identical), qrels question -> passage."""
    docs: dict[str, dict] = {}
    queries, qrels = [], []
    for number, record in read_jsonl(path):
        question = _text(_field(record, ("question",), path, number), path, number, "question")
        answers = _answers(_field(record, ("answers",), path, number), path, number, "answers")
        if not answers:
            raise DatasetError("question without answers", path, number, "answers")
        ctxs = _field(record, ("ctxs",), path, number)
        if not isinstance(ctxs, list):
            raise DatasetError("expected a list of passages", path, number, "ctxs")
        gold = [c for c in ctxs if isinstance(c, dict) and c.get("isgold")] or ctxs[:1]
        if not gold:
            raise DatasetError("no gold passage", path, number, "ctxs")
        query_id = f"nq-q{number:05d}"
        queries.append({"query_id": query_id, "text": question, "answers": answers})
        for ctx in gold:
            text = _text(ctx.get("text"), path, number, "ctxs.text")
            title = _text(ctx.get("title") or "", path, number, "ctxs.title", allow_empty=True)
            doc_id = nq_passage_id(title, text)
            docs.setdefault(doc_id, {"doc_id": doc_id, "title": title, "text": text})
            qrels.append({"query_id": query_id, "doc_id": doc_id, "relevance": 1})
    return DatasetTables(_frame(list(docs.values()), CORPUS_SCHEMA), _frame(queries, QUERIES_SCHEMA),
                         _frame(qrels, QRELS_SCHEMA).unique(maintain_order=True))


def load_trec(corpus: Path, topics: Path, qrels_file: Path, answers_file: Path | None) -> DatasetTables:
    queries = read_trec_topics(topics)
    if answers_file:
        answers = read_answers(answers_file)
        queries = queries.with_columns(
            pl.col("query_id").replace_strict(answers, default=pl.col("answers"),
                                              return_dtype=pl.List(pl.Utf8)).alias("answers"))
    qrels, lines = read_trec_qrels(qrels_file)
    tables = DatasetTables(read_corpus(corpus), queries, qrels)
    check_references(tables, qrels_file, lines)
    return tables


def load_bridge_release(queries_file: Path, corpus: Path) -> DatasetTables:
    """The BRIDGE release layout: one line per query with `q_id`, `query`, `doc_id` list, `answers`."""
    queries, qrels, lines = [], [], []
    ids = _UniqueIds(queries_file, "q_id")
    for number, record in read_jsonl(queries_file):
        query_id = _text(_field(record, ("q_id",), queries_file, number), queries_file, number, "q_id")
        ids.add(query_id, number)
        queries.append({"query_id": query_id,
                        "text": _text(_field(record, ("query",), queries_file, number),
                                      queries_file, number, "query"),
                        "answers": _answers(record.get("answers"), queries_file, number, "answers")})
        doc_ids = _field(record, ("doc_id",), queries_file, number)
        if not isinstance(doc_ids, list):
            raise DatasetError("expected a list of document ids", queries_file, number, "doc_id")
        for doc_id in dict.fromkeys(str(d) for d in doc_ids):
            qrels.append({"query_id": query_id, "doc_id": doc_id, "relevance": 1})
            lines.append(number)
    tables = DatasetTables(read_corpus(corpus), _frame(queries, QUERIES_SCHEMA), _frame(qrels, QRELS_SCHEMA))
    check_references(tables, queries_file, lines)
    return tables


def load_dataset(spec: DatasetSpec) -> DatasetTables:
    """Load any registered dataset by its kind."""
    from bridge_assets.ingest import remote

    answers = spec.resolve(spec.answers, "answers") if spec.answers else None
    if spec.kind == "beir":
        return load_beir_folder(spec.resolve(spec.path, "path"), spec.split, answers)
    if spec.kind == "nq_open":
        return load_nq_open(spec.resolve(spec.path, "path"))
    if spec.kind == "trec":
        return load_trec(spec.resolve(spec.corpus, "corpus"), spec.resolve(spec.topics, "topics"),
                         spec.resolve(spec.qrels, "qrels"), answers)
    if spec.kind == "bridge_release":
        return load_bridge_release(spec.resolve(spec.queries, "queries"),
                                   spec.resolve(spec.corpus, "corpus"))
    return remote.load_remote(spec)
