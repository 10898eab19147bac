"""TREC files: qrels (`qid iter docid rel`) and runs (`qid Q0 docid rank score tag`), read and
written in one place. Used by ingest (a `trec` dataset's qrels), `bridge eval` (metrics),
`bridge qrels import/export` and the bridge_qrels asset's export, and the retrieval stage
(run files as systems, `bridge retrievers export`).

Readers name the file and line of every problem (DatasetError). Qrels are read with the
ingest caps (bridge_assets.text_files); runs are read the way trec_eval reads them: blank lines
and lines starting with '#' skipped, fields after the tag ignored, the rank column ignored
(documents are ranked by score).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from bridge_assets.errors import DatasetError
from bridge_assets.text_files import lines

QRELS_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "relevance": pl.Int32}
RUN_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "score": pl.Float64}
_INT32 = (-(2**31), 2**31 - 1)


# --- qrels ---------------------------------------------------------------------------------

def parse_relevance(value: str, path: Path, line: int, field: str) -> int:
    """A judgment's relevance: a whole number in 32-bit range (`2.0` is fine, `1.5` is not)."""
    shown = value if len(value) <= 40 else f"{value[:40]}..."
    try:
        number = float(value)
    except ValueError:
        raise DatasetError(f'relevance "{shown}" is not a number', path, line, field) from None
    # float() also takes inf, nan and 1e999; the column holds 32-bit whole numbers
    if not number.is_integer() or not _INT32[0] <= number <= _INT32[1]:
        raise DatasetError(f'relevance "{shown}" is not a whole number in 32-bit range',
                           path, line, field)
    return int(number)


def dedupe_qrels(qrels: pl.DataFrame, path: Path, lines_: list[int]) -> pl.DataFrame:
    """`qrels` itself, or a DatasetError naming the line of a second judgment of a pair."""
    duplicated = qrels.select(pl.struct("query_id", "doc_id").is_duplicated()).to_series()
    if duplicated.any():
        index = int(duplicated.arg_true()[1] if duplicated.sum() > 1 else duplicated.arg_true()[0])
        row = qrels.row(index, named=True)
        raise DatasetError(f'duplicate judgment for query "{row["query_id"]}" and document '
                           f'"{row["doc_id"]}"', path, lines_[index])
    return qrels


def read_trec_qrels(path: Path) -> tuple[pl.DataFrame, list[int]]:
    """TREC qrels: `qid iteration docid relevance`, whitespace separated; (frame, the file's
    line number of each row)."""
    path = Path(path)
    rows, numbers = [], []
    for number, line in lines(path):
        fields = line.split()
        if not fields or fields[0].startswith("#"):  # trec_eval skips comment lines too
            continue
        if len(fields) != 4:
            raise DatasetError(f"expected 4 columns (qid iter docid rel), got {len(fields)}",
                               path, number)
        rows.append({"query_id": fields[0], "doc_id": fields[2],
                     "relevance": parse_relevance(fields[3], path, number, "rel")})
        numbers.append(number)
    frame = pl.DataFrame(rows, schema=QRELS_SCHEMA) if rows else pl.DataFrame(schema=QRELS_SCHEMA)
    return dedupe_qrels(frame, path, numbers), numbers


def write_trec_qrels(qrels: pl.DataFrame, path: Path) -> Path:
    """`qid 0 docid relevance` lines (judged-irrelevant pairs included), sorted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for query_id, doc_id, relevance in qrels.sort("query_id", "doc_id").select(
                "query_id", "doc_id", "relevance").iter_rows():
            handle.write(f"{query_id} 0 {doc_id} {relevance}\n")
    return path


# --- runs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrecRun:
    frame: pl.DataFrame  # query_id, doc_id, score
    run_id: str          # trec_eval keeps the tag of the file's last line
    lines: tuple[int, ...] = ()  # the file's line number of each row of `frame`


def read_trec_run(path: Path) -> TrecRun:
    """A TREC run, `qid Q0 docid rank score tag`, whitespace separated, as trec_eval reads it:
    blank lines and lines starting with '#' are skipped, fields after the tag are ignored,
    the rank column is ignored (documents are ranked by score)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError("file not found", path)
    query_ids: list[str] = []
    doc_ids: list[str] = []
    scores: list[float] = []
    numbers: list[int] = []
    run_id = ""
    # line by line as the corpus loaders read (text_files.lines): a byte that is not UTF-8 is
    # reported on the line that holds it
    for number, line in lines(path):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 6:
            raise DatasetError(f"expected 6 columns (qid Q0 docid rank score tag), got {len(fields)}",
                               path, number)
        try:
            score = float(fields[4])
        except ValueError:
            raise DatasetError(f'score "{fields[4]}" is not a number', path, number, "score") from None
        if not math.isfinite(score):
            raise DatasetError(f'score "{fields[4]}" is not finite', path, number, "score")
        query_ids.append(fields[0])
        doc_ids.append(fields[2])
        scores.append(score)
        numbers.append(number)
        run_id = fields[5]
    if not numbers:
        raise DatasetError("no results in the run", path)
    frame = pl.DataFrame({"query_id": query_ids, "doc_id": doc_ids, "score": scores}, schema=RUN_SCHEMA)
    repeated = ~frame.select(pl.struct("query_id", "doc_id").is_first_distinct()).to_series()
    if repeated.any():
        second = repeated.arg_true()[0]
        query, doc = frame["query_id"][second], frame["doc_id"][second]
        first = frame.with_row_index().filter((pl.col("query_id") == query) & (pl.col("doc_id") == doc))["index"][0]
        raise DatasetError(f'document "{doc}" retrieved twice for query "{query}" (first on line {numbers[first]})',
                           path, numbers[second])
    return TrecRun(frame, run_id, tuple(numbers))


def write_trec_run(run: pl.DataFrame, path: Path, tag: str) -> Path:
    """Write `run` (query_id, doc_id, rank, score) as a TREC run file: `qid Q0 docid rank score
    tag`, one line per row, by query and rank."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = run.sort(["query_id", "rank"]).select("query_id", "doc_id", "rank", "score").iter_rows()
    path.write_text("".join(f"{q} Q0 {d} {r} {s:.6f} {tag}\n" for q, d, r, s in rows))
    return path
