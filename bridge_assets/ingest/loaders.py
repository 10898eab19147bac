"""Loaders for local dataset formats. Each returns the three ingest tables, validated.

Every loader yields the same columns:
  corpus:  doc_id, title, text
  queries: query_id, text, answers (list of strings, empty when the dataset has none),
           description, narrative (a TREC topic's; NULL for every other kind), definition
           (the query's own relevance definition, DIRAS-style: a `definition` field of a BEIR
           or BRIDGE-release query line; NULL where it has none)
  qrels:   query_id, doc_id, relevance
Problems are raised as DatasetError naming the file, the line and the field.

Files are read as UTF-8 (a byte order mark on the first line is dropped), gzip when their name
ends in `.gz`; lines end with \n, \r\n or \r. TSV has no quoting: a `"` is text like any other.
Two caps guard against a broken file (a missing line break, a binary blob) passing for data:
  MAX_LINE_BYTES  one line, its line break excluded: 8 MiB
  MAX_TEXT_CHARS  one text (a document's text or title, a query, an id): 1,000,000 characters
A dataset entry overrides them with `max_line_bytes` / `max_text_chars`, else the environment
with BRIDGE_MAX_LINE_BYTES / BRIDGE_MAX_TEXT_CHARS. Exceeding one is a DatasetError too.
(Reading lines and the caps: bridge_assets.text_files; TREC qrels: bridge_assets.trec_io.)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from bridge_assets.ingest import remote
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.registry.datasets import DatasetSpec, QueryField
from bridge_assets.registry.relevance import validate_definition
from bridge_assets.text_files import MAX_LINE_BYTES, MAX_TEXT_CHARS, Limits, limits_for  # noqa: F401
from bridge_assets.text_files import capped as _capped
from bridge_assets.text_files import current_limits as _current_limits
from bridge_assets.text_files import lines as _lines
from bridge_assets.text_files import using_limits as _using_limits
from bridge_assets.trec_io import QRELS_SCHEMA, read_trec_qrels
from bridge_assets.trec_io import dedupe_qrels as _dedupe_qrels
from bridge_assets.trec_io import parse_relevance as _relevance

CORPUS_SCHEMA = {"doc_id": pl.Utf8, "title": pl.Utf8, "text": pl.Utf8}
QUERIES_SCHEMA = {"query_id": pl.Utf8, "text": pl.Utf8, "answers": pl.List(pl.Utf8),
                  "description": pl.Utf8, "narrative": pl.Utf8, "definition": pl.Utf8}
# A JSON escape of a UTF-16 surrogate: json.loads turns a lone one into a str that is not
# Unicode and that polars cannot store.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass
class DatasetTables:
    corpus: pl.DataFrame
    queries: pl.DataFrame
    qrels: pl.DataFrame

    def counts(self) -> dict[str, int]:
        return {"documents": self.corpus.height, "queries": self.queries.height,
                "qrels": self.qrels.height,
                "queries_with_answers": int((self.queries["answers"].list.len() > 0).sum())}


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a malformed line names itself."""
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"malformed JSON ({exc.msg} at column {exc.colno})",
                               path, number) from None
        except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep
            raise DatasetError(f"malformed JSON ({exc})", path, number) from None
        if not isinstance(record, dict):
            raise DatasetError("expected a JSON object", path, number)
        if _SURROGATE_ESCAPE.search(line) and not _is_unicode(record):
            raise DatasetError("a \\u escape makes a lone UTF-16 surrogate, which is not text",
                               path, number)
        yield number, record


def _is_unicode(record: dict[str, Any]) -> bool:
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    cap = _current_limits().text_chars
    if len(text) > cap:
        raise DatasetError(f"text of {len(text):,} characters is over the cap of {cap:,} (raise "
                           f"it with max_text_chars or BRIDGE_MAX_TEXT_CHARS)", path, line, field)
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
        self.path, self.field = path, field
        self.seen: dict[str, int] = {}  # id -> the line that declared it

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
                         "title": _text(fields[2] if len(fields) > 2 else "", path, number, "title",
                                        allow_empty=True)})
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


def read_answers(path: Path, query_ids: set[str] | None = None) -> dict[str, list[str]]:
    """Answers per query id; with `query_ids`, an answer for any other query is an error."""
    answers = {}
    for number, record in read_jsonl(path):
        query_id = _text(_field(record, ("query_id", "_id", "q_id"), path, number), path, number,
                         "query_id")
        if query_ids is not None and query_id not in query_ids:
            raise DatasetError(f'answers for unknown query "{query_id}"', path, number, "query_id")
        answers[query_id] = _answers(_field(record, ("answers",), path, number), path, number,
                                     "answers")
    return answers


def read_beir_queries(path: Path) -> pl.DataFrame:
    rows, ids = [], _UniqueIds(path, "_id")
    for number, record in read_jsonl(path):
        query_id = _text(_field(record, ("_id", "query_id", "id"), path, number), path, number, "_id")
        ids.add(query_id, number)
        metadata = record.get("metadata")
        inline = record.get("answers", metadata.get("answers") if isinstance(metadata, dict) else None)
        rows.append({"query_id": query_id,
                     "text": _text(_field(record, ("text", "query"), path, number), path, number, "text"),
                     "answers": _answers(inline, path, number, "answers"),
                     "definition": _definition(record, path, number)})
    return _frame(rows, QUERIES_SCHEMA)


def _definition(record: dict, path: Path, line: int) -> str | None:
    """A query line's own relevance definition (`definition`, or `metadata.definition`)."""
    metadata = record.get("metadata")
    value = record.get("definition", metadata.get("definition") if isinstance(metadata, dict) else None)
    if value is None:
        return None
    try:
        return validate_definition(value)
    except ValueError as exc:
        raise DatasetError(str(exc), path, line, "definition") from None


def _with_answers(queries: pl.DataFrame, answers: dict[str, list[str]]) -> pl.DataFrame:
    """The answers of a separate answers file replace those of the queries it names."""
    if not answers:
        return queries
    return queries.with_columns(
        pl.col("query_id").replace_strict(answers, default=pl.col("answers"),
                                          return_dtype=pl.List(pl.Utf8)).alias("answers"))


def _tsv_rows(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, list[str]]]:
    """The stripped tab-separated fields of each non-blank line. No quoting: with csv's default
    a field opening with `"` would swallow the following lines up to the next quote."""
    for number, line in lines:
        fields = [cell.strip() for cell in line.split("\t")]
        if any(fields):
            yield number, fields


def _read_tsv(path: Path) -> Iterator[tuple[int, list[str]]]:
    return _tsv_rows(_lines(path))


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


def read_trec_topics(path: Path, query_field: QueryField = "title") -> pl.DataFrame:
    """TREC topics: classic `<top><num>..<title>..<desc>..<narr>..</top>` blocks, or TSV
    `qid<TAB>text` (a title only). `query_field` picks the query's text; the description and
    narrative are kept beside it."""
    lines = list(_lines(path))
    content = "\n".join(line for _, line in lines)
    if "<top>" in content:
        return _read_top_blocks(content, path, query_field)
    if query_field != "title":
        raise DatasetError(f"query_field {query_field} needs <top> topics with <desc>; TSV topics "
                           "have a title only", path, field="query_field")
    rows, ids = [], _UniqueIds(path, "num")
    for number, fields in _tsv_rows(lines):
        if len(fields) < 2:
            raise DatasetError("expected qid<TAB>text", path, number)
        ids.add(fields[0], number)
        rows.append({"query_id": fields[0], "text": _text(fields[1], path, number, "text"),
                     "answers": []})
    return _frame(rows, QUERIES_SCHEMA)


def _tag_text(body: str, tag: str, label: str, path: Path, line: int) -> str | None:
    """The text after `<tag>` (and its `Label:` prefix) up to the next tag, its lines joined;
    None when the topic has no such tag."""
    found = re.search(rf"<{tag}>\s*(?:{label}:)?([^<]*)", body)
    if not found:
        return None
    return " ".join(_text(found.group(1), path, line, tag, allow_empty=True).split()) or None


def _query_text(title: str, description: str | None, query_field: QueryField, path: Path,
                line: int) -> str:
    if query_field == "title":
        return title
    if description is None:
        raise DatasetError(f"query_field {query_field} needs a <desc>, and this topic has none",
                           path, line, "desc")
    return description if query_field == "description" else f"{title} {description}"


_TOPIC_FIELD = re.compile(r"<(num|title|desc|narr)>")


def _no_topic_fields_between(content: str, start: int, stop: int, path: Path) -> None:
    """A topic field outside every <top>...</top> block means a lost <top>: refused with its line,
    never dropped silently."""
    field = _TOPIC_FIELD.search(content, start, stop)
    if field:
        raise DatasetError(f"<{field.group(1)}> outside a <top>...</top> block (is its <top> missing?)",
                           path, content.count("\n", 0, field.start()) + 1, field.group(1))


def _read_top_blocks(content: str, path: Path, query_field: QueryField) -> pl.DataFrame:
    # Scanned from one <top> to the next rather than with a lazy `<top>(.*?)</top>`, which would
    # merge a topic missing its </top> into the next one and rescan the rest once per <top>.
    rows: list[dict[str, Any]] = []
    ids = _UniqueIds(path, "num")
    tags = list(re.finditer("<top>", content))
    _no_topic_fields_between(content, 0, tags[0].start(), path)
    line, counted = 1, 0
    for tag, following in zip(tags, [t.start() for t in tags[1:]] + [len(content)]):
        line += content.count("\n", counted, tag.start())
        counted = tag.start()
        end = content.find("</top>", tag.end(), following)
        if end < 0:
            raise DatasetError("<top> without </top>", path, line)
        _no_topic_fields_between(content, end + len("</top>"), following, path)
        body = content[tag.end():end]
        # No pattern with two adjacent \s* or a lazy group: those backtrack quadratically.
        # The id stops at a `<`: `<num>301</num>` is topic 301.
        num = re.search(r"<num>\s*(?:Number:\s*)?([^\s<]+)", body)
        title = re.search(r"<title>\s*(?:Topic:)?([^<]*)", body)
        if not num or not title:
            raise DatasetError("topic without <num> or <title>", path, line)
        ids.add(num.group(1), line)
        title_text = _text(title.group(1), path, line, "title")
        description = _tag_text(body, "desc", "Description", path, line)
        rows.append({"query_id": num.group(1), "answers": [], "description": description,
                     "narrative": _tag_text(body, "narr", "Narrative", path, line),
                     "text": _query_text(title_text, description, query_field, path, line)})
    return _frame(rows, QUERIES_SCHEMA)


# --- one loader per kind -----------------------------------------------------------------

@_capped
def load_beir_folder(folder: Path, split: str = "test", answers_file: Path | None = None) -> DatasetTables:
    if not folder.is_dir():
        raise DatasetError("BEIR folder not found", folder)
    if answers_file is None and (folder / "answers.jsonl").exists():
        answers_file = folder / "answers.jsonl"
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = read_beir_queries(folder / "queries.jsonl")
    if answers_file:
        queries = _with_answers(queries, read_answers(answers_file, set(queries["query_id"])))
    qrels_file = folder / "qrels" / f"{split}.tsv"
    qrels, lines = read_beir_qrels(qrels_file)
    tables = DatasetTables(corpus, queries, qrels)
    check_references(tables, qrels_file, lines)
    return tables


def nq_passage_id(title: str, text: str) -> str:
    """Stable id from the passage's content, so identical passages merge into one document."""
    digest = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
    return f"nq-{digest}"


@_capped
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
        if not isinstance(ctxs, list) or not all(isinstance(c, dict) for c in ctxs):
            raise DatasetError("expected a list of passage objects", path, number, "ctxs")
        gold = [c for c in ctxs if c.get("isgold")] or ctxs[:1]
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


@_capped
def load_trec(corpus: Path, topics: Path, qrels_file: Path, answers_file: Path | None,
              query_field: QueryField = "title") -> DatasetTables:
    queries = read_trec_topics(topics, query_field)
    if answers_file:  # answers for queries that are not topics are ignored
        queries = _with_answers(queries, read_answers(answers_file))
    qrels, lines = read_trec_qrels(qrels_file)
    tables = DatasetTables(read_corpus(corpus), queries, qrels)
    check_references(tables, qrels_file, lines)
    return tables


@_capped
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
                        "answers": _answers(record.get("answers"), queries_file, number, "answers"),
                        "definition": _definition(record, queries_file, number)})
        doc_ids = _field(record, ("doc_id",), queries_file, number)
        if not isinstance(doc_ids, list):
            raise DatasetError("expected a list of document ids", queries_file, number, "doc_id")
        for doc_id in dict.fromkeys(str(d) for d in doc_ids):
            qrels.append({"query_id": query_id, "doc_id": doc_id, "relevance": 1})
            lines.append(number)
    tables = DatasetTables(read_corpus(corpus), _frame(queries, QUERIES_SCHEMA), _frame(qrels, QRELS_SCHEMA))
    check_references(tables, queries_file, lines)
    return tables


def _answers_file(spec: DatasetSpec) -> Path | None:
    """Resolved before the other files, so a missing answers file is the one an error names."""
    return spec.resolve(spec.answers, "answers") if spec.answers else None


def _load_beir(spec: DatasetSpec) -> DatasetTables:
    answers = _answers_file(spec)
    return load_beir_folder(spec.resolve(spec.path, "path"), spec.split, answers)


def _load_trec(spec: DatasetSpec) -> DatasetTables:
    answers = _answers_file(spec)
    return load_trec(spec.resolve(spec.corpus, "corpus"), spec.resolve(spec.topics, "topics"),
                     spec.resolve(spec.qrels, "qrels"), answers, spec.query_field)


def _load_bridge_release(spec: DatasetSpec) -> DatasetTables:
    return load_bridge_release(spec.resolve(spec.queries, "queries"), spec.resolve(spec.corpus, "corpus"))


# kind -> loader of the local kinds; a remote kind (remote.FETCHERS) is fetched into a local BEIR
# folder, then read as one (the same validation); remote.py only fetches (it does not import back)
LOADERS: dict[str, Callable[[DatasetSpec], DatasetTables]] = {
    "beir": _load_beir, "nq_open": lambda spec: load_nq_open(spec.resolve(spec.path, "path")),
    "trec": _load_trec, "bridge_release": _load_bridge_release}


def load_dataset(spec: DatasetSpec, downloads: Path | None = None) -> DatasetTables:
    """Load any registered dataset by its kind, under the entry's size caps. A remote kind is
    fetched into `downloads` (the lake's downloads/ folder: the ingest asset's store hands it)."""
    with _using_limits(limits_for(spec)):
        fetch = remote.FETCHERS.get(spec.kind)
        if fetch is None:
            return LOADERS[spec.kind](spec)
        if downloads is None:
            raise DatasetError(f"dataset '{spec.name}' of kind {spec.kind} is fetched into a lake's "
                               "downloads/ folder, and none was given", field="kind")
        return load_beir_folder(fetch(spec, downloads), spec.split)
