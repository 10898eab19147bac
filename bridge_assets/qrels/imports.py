"""`bridge qrels import`: judgments from elsewhere (UMBRELA output, a second assessor, an
earlier BRIDGE export) become a named label source of the refined qrels.

Formats: TREC qrels (`qid iter docid rel`), a BEIR qrels TSV (`query-id corpus-id score`,
header optional) and the BRIDGE release layout (queries.jsonl with `q_id` and a `doc_id` list,
each listed document relevance 1; a folder means its queries.jsonl). A malformed line stops
the import naming the file and line (the ingest readers' rules), and so does a negative grade.

The judgments are stored in `imported_qrels`, the source in `qrels_sources` (see
bridge_assets.qrels.sources), both in one transaction; sql/bridge_qrels.sql merges them by
precedence. Lines whose query or document the dataset does not know are skipped and counted
(or, with unknown_ids='error', the first is an error), like run files. A correction source
holds only pairs the original qrels judge: its other lines are skipped and counted too (import
the file again as an ordinary source for those).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Literal

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.ingest.loaders import read_beir_qrels, read_jsonl
from bridge_assets.lake.store import one_row, table_exists, transaction
from bridge_assets.qrels.sources import SourceError, ensure_tables, place, precedences, registered, validate_source_name
from bridge_assets.registry.datasets import validate_dataset_name
from bridge_assets.trec_io import read_trec_qrels

UnknownIds = Literal["skip", "error"]
EXAMPLES_SHOWN = 5


class ImportFormat(str, Enum):
    trec = "trec"
    beir_tsv = "beir-tsv"
    bridge = "bridge"


# The names each format gives the query and document fields, for errors.
FIELDS = {ImportFormat.trec: ("qid", "docid", "rel"), ImportFormat.beir_tsv: ("query-id", "corpus-id", "score"),
          ImportFormat.bridge: ("q_id", "doc_id", "doc_id")}


class QrelsImportError(BridgeError, LookupError):
    """What the import needs is not in the data lake, or the source exists already."""


@dataclass(frozen=True)
class ImportReport:
    dataset: str
    source: str
    file: str
    format: str
    precedence: float
    verified: bool
    corrects_original: bool
    lines: int                      # judgments read from the file
    stored: int                     # kept in imported_qrels
    unknown_query_lines: int
    unknown_document_lines: int
    not_original_lines: int         # a correction source's lines on pairs the original qrels lack
    corrections: int                # a correction source's lines that change the original grade
    disagreeing_original: int       # an ordinary source's lines that differ from the original (it wins)
    order: str                      # every source, best first
    examples: list[str] = field(default_factory=list)  # 'line N: unknown query "q9"', ...

    @property
    def skipped(self) -> int:
        return self.unknown_query_lines + self.unknown_document_lines + self.not_original_lines


def read_bridge_release_qrels(path: Path) -> tuple[pl.DataFrame, list[int]]:
    """(query_id, doc_id, relevance 1) for each document listed in `doc_id` of each line."""
    rows, lines = [], []
    seen: dict[str, int] = {}  # query id -> the line it is on
    for number, record in read_jsonl(path):
        query_id = record.get("q_id")
        if not isinstance(query_id, (str, int)) or not str(query_id).strip():
            raise DatasetError("missing or empty query id", path, number, "q_id")
        query_id = str(query_id).strip()
        if query_id in seen:
            raise DatasetError(f'duplicate id "{query_id}" (first on line {seen[query_id]})', path, number, "q_id")
        seen[query_id] = number
        doc_ids = record.get("doc_id")
        if not isinstance(doc_ids, list) or not all(isinstance(d, (str, int)) and str(d).strip() for d in doc_ids):
            raise DatasetError("expected a list of document ids", path, number, "doc_id")
        for doc_id in dict.fromkeys(str(d).strip() for d in doc_ids):
            rows.append((query_id, doc_id, 1))
            lines.append(number)
    return pl.DataFrame(rows, schema={"query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32},
                        orient="row"), lines


def read_judgments(path: Path, fmt: ImportFormat) -> tuple[pl.DataFrame, Path]:
    """query_id, doc_id, relevance, line of every judgment in `path`, and the file read."""
    if fmt is ImportFormat.bridge and path.is_dir():
        path = path / "queries.jsonl"
    reader = {ImportFormat.trec: read_trec_qrels, ImportFormat.beir_tsv: read_beir_qrels,
              ImportFormat.bridge: read_bridge_release_qrels}[fmt]
    frame, lines = reader(path)
    frame = frame.with_columns(pl.Series("line", lines, dtype=pl.Int32))
    negative = frame.filter(pl.col("relevance") < 0)
    if negative.height:  # bridge_qrels holds grades 0 and up (some TREC qrels use -1/-2 for junk)
        row = negative.row(0, named=True)
        raise DatasetError(f"relevance {row['relevance']} is negative: bridge_qrels holds grades 0 and "
                           "up (map such grades to 0 first)", path, row["line"], FIELDS[fmt][2])
    return frame, path


def _require_ingested(con: duckdb.DuckDBPyConnection, dataset: str) -> None:
    for table in ("corpus", "queries", "original_qrels"):
        if not table_exists(con, table) or not one_row(
                con, f"select count(*) from {table} where dataset = ?", [dataset])[0]:
            raise QrelsImportError(f"no {table} rows for dataset '{dataset}': materialize the "
                                   f"dataset's ingest assets first (bridge materialize -d {dataset} corpus)")


def _classified(con: duckdb.DuckDBPyConnection, dataset: str, judgments: pl.DataFrame) -> pl.DataFrame:
    """The judgments with whether their query and document are known and the original grade."""
    con.register("_judgments", judgments.to_arrow())
    try:
        return con.execute("""
            select j.query_id, j.doc_id, j.relevance, j.line,
                   q.query_id is null as unknown_query,
                   q.query_id is not null and c.doc_id is null as unknown_document,
                   o.relevance::integer as original_relevance
            from _judgments j
            left join (select distinct query_id from queries where dataset = $dataset) q using (query_id)
            left join (select distinct doc_id from corpus where dataset = $dataset) c using (doc_id)
            left join (select query_id, doc_id, relevance from original_qrels where dataset = $dataset) o
                   using (query_id, doc_id)
            order by j.line, j.doc_id""", {"dataset": dataset}).pl()
    finally:
        con.unregister("_judgments")


def import_qrels(con: duckdb.DuckDBPyConnection, dataset: str, path: Path, source: str, *,
                 fmt: ImportFormat = ImportFormat.trec, precedence: float | None = None,
                 before: str | None = None, after: str | None = None, verified: bool = False,
                 corrects_original: bool = False, unknown_ids: UnknownIds = "skip",
                 replace: bool = False) -> ImportReport:
    """Read `path` and store its judgments as source `source` of `dataset` (see the module doc).
    Nothing is written when the file, the source or its place is wrong."""
    validate_dataset_name(dataset)
    validate_source_name(source)
    judgments, path = read_judgments(Path(path), fmt)
    _require_ingested(con, dataset)
    imported = registered(con, dataset)
    if source in imported["source"].to_list():
        if not replace:
            raise QrelsImportError(f"source '{source}' is already imported for dataset '{dataset}': "
                                   "import it again with --replace, or bridge qrels remove")
        imported = imported.filter(pl.col("source") != source)
    precedence = place(precedences(imported), precedence=precedence, before=before, after=after,
                       corrects_original=corrects_original)

    rows = _classified(con, dataset, judgments)
    query_field, doc_field, _ = FIELDS[fmt]
    unknown_query, unknown_doc = rows.filter(pl.col("unknown_query")), rows.filter(pl.col("unknown_document"))
    if unknown_ids == "error" and (unknown_query.height or unknown_doc.height):
        first = min((f for f in (unknown_query.head(1), unknown_doc.head(1)) if f.height),
                    key=lambda f: f["line"][0]).row(0, named=True)
        what, name, where = (("query", first["query_id"], query_field) if first["unknown_query"]
                             else ("document", first["doc_id"], doc_field))
        raise DatasetError(f'unknown {what} "{name}" in dataset \'{dataset}\'', path, first["line"], where)
    known = rows.filter(~pl.col("unknown_query") & ~pl.col("unknown_document"))
    not_original = known.filter(pl.col("original_relevance").is_null()) if corrects_original else known.clear()
    kept = known.filter(pl.col("original_relevance").is_not_null()) if corrects_original else known
    differs = kept.filter(pl.col("original_relevance").is_not_null()
                          & (pl.col("relevance") != pl.col("original_relevance")))
    examples = [f'line {r["line"]}: unknown query "{r["query_id"]}"'
                for r in unknown_query.head(EXAMPLES_SHOWN).iter_rows(named=True)]
    examples += [f'line {r["line"]}: unknown document "{r["doc_id"]}"'
                 for r in unknown_doc.head(EXAMPLES_SHOWN).iter_rows(named=True)]
    examples += [f'line {r["line"]}: query "{r["query_id"]}", document "{r["doc_id"]}" is not an '
                 "original judgment" for r in not_original.head(EXAMPLES_SHOWN).iter_rows(named=True)]

    now = datetime.now(UTC).replace(tzinfo=None)
    file = str(path.resolve())
    stored = kept.select(pl.lit(dataset).alias("dataset"), pl.lit(source).alias("source"), "query_id",
                         "doc_id", "relevance", pl.lit(file).alias("file"), "line",
                         pl.lit(now).alias("imported_at"))
    entry = pl.DataFrame([{
        "dataset": dataset, "source": source, "precedence": precedence, "verified": verified,
        "corrects_original": corrects_original, "format": fmt.value, "file": file, "lines": rows.height,
        "stored": stored.height, "unknown_query_lines": unknown_query.height,
        "unknown_document_lines": unknown_doc.height, "not_original_lines": not_original.height,
        "imported_at": now}])
    ensure_tables(con)
    with transaction(con):
        for table, frame in (("imported_qrels", stored), ("qrels_sources", entry)):
            con.execute(f"delete from {table} where dataset = ? and source = ?", [dataset, source])
            con.register("_incoming", frame.to_arrow())
            con.execute(f"insert into {table} by name select * from _incoming")
            con.unregister("_incoming")
    return ImportReport(
        dataset=dataset, source=source, file=file, format=fmt.value, precedence=precedence,
        verified=verified, corrects_original=corrects_original, lines=rows.height, stored=stored.height,
        unknown_query_lines=unknown_query.height, unknown_document_lines=unknown_doc.height,
        not_original_lines=not_original.height, corrections=differs.height if corrects_original else 0,
        disagreeing_original=0 if corrects_original else differs.height,
        order=" > ".join(precedences(registered(con, dataset))), examples=examples)


def remove_source(con: duckdb.DuckDBPyConnection, dataset: str, source: str) -> int:
    """Delete an imported source of `dataset` and its judgments; how many judgments went."""
    if source not in registered(con, dataset)["source"].to_list():
        raise QrelsImportError(f"dataset '{dataset}' has no imported source '{source}'")
    with transaction(con):
        removed = one_row(con, "delete from imported_qrels where dataset = ? and source = ?",
                          [dataset, source])[0]
        con.execute("delete from qrels_sources where dataset = ? and source = ?", [dataset, source])
    return removed


__all__ = ["ImportFormat", "ImportReport", "QrelsImportError", "SourceError", "import_qrels",
           "read_judgments", "remove_source"]
