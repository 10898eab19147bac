"""TREC files in, trec_eval's report out: what `bridge eval` does, as plain functions."""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.ingest.loaders import read_trec_qrels
from bridge_assets.metrics.measures import MeasureSelection, compute_measures, format_value

RUN_SCHEMA = {"query_id": pl.Utf8, "doc_id": pl.Utf8, "score": pl.Float64}


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
    lines: list[int] = []
    run_id = ""
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
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
                lines.append(number)
                run_id = fields[5]
    # Text is decoded (and unzipped) in blocks, so the line at fault is after the last one read.
    except UnicodeDecodeError:
        raise DatasetError(f"not UTF-8 text after line {number}", path) from None
    except (OSError, EOFError) as exc:  # a damaged or truncated gzip file
        raise DatasetError(f"cannot read the file after line {number}: {exc}", path) from None
    if not lines:
        raise DatasetError("no results in the run", path)
    frame = pl.DataFrame({"query_id": query_ids, "doc_id": doc_ids, "score": scores}, schema=RUN_SCHEMA)
    repeated = ~frame.select(pl.struct("query_id", "doc_id").is_first_distinct()).to_series()
    if repeated.any():
        second = repeated.arg_true()[0]
        query, doc = frame["query_id"][second], frame["doc_id"][second]
        first = frame.with_row_index().filter((pl.col("query_id") == query) & (pl.col("doc_id") == doc))["index"][0]
        raise DatasetError(f'document "{doc}" retrieved twice for query "{query}" (first on line {lines[first]})',
                           path, lines[second])
    return TrecRun(frame, run_id, tuple(lines))


def evaluate_trec_files(qrels: Path, run: Path, selection: MeasureSelection, *,
                        original_qrels: Path | None = None, relevance_level: int = 1,
                        complete: bool = False, max_docs: int | None = None,
                        per_query: bool = False) -> tuple[pl.DataFrame, str]:
    """Evaluate a TREC run file against a TREC qrels file: (long frame, the run's tag)."""
    judgments, _ = read_trec_qrels(Path(qrels))
    if judgments.is_empty():
        raise DatasetError("no judgments in the qrels", qrels)
    trec_run = read_trec_run(Path(run))
    con = duckdb.connect()
    try:
        con.register("trec_run", trec_run.frame)
        con.register("trec_qrels", judgments)
        if original_qrels is not None:
            con.register("trec_original_qrels", read_trec_qrels(Path(original_qrels))[0])
        frame = compute_measures(con, selection, run="trec_run", qrels="trec_qrels",
                                 original_qrels="trec_original_qrels" if original_qrels else None,
                                 relevance_level=relevance_level, complete=complete,
                                 max_docs=max_docs, per_query=per_query)
    finally:
        con.close()
    if frame.filter(pl.col("query_id") == "all").is_empty():
        raise DatasetError(f"no query has both results in {run} and judgments", qrels)
    return frame, trec_run.run_id


def trec_eval_lines(frame: pl.DataFrame, selection: MeasureSelection, run_id: str,
                    per_query: bool = False) -> list[str]:
    """trec_eval's report: `%-22s\\t%s\\t%value` lines, per query (sorted by id, as trec_eval's
    qrels order) when asked, then the summary over 'all'."""
    values = {(q, m): v for q, m, v in frame.select("query_id", "measure", "value").iter_rows()}

    def line(name: str, query: str, text: str) -> str:
        return f"{name:<22}\t{query}\t{text}"

    out: list[str] = []
    if per_query:
        queries = frame.filter(pl.col("query_id") != "all")["query_id"].unique().sort().to_list()
        for query in queries:
            out.extend(line(name, query, format_value(selection.family_of[name], values[query, name]))
                       for name in selection.names if not selection.family_of[name].summary_only)
    for name in selection.names:
        text = run_id if name == "runid" else format_value(selection.family_of[name], values["all", name])
        out.append(line(name, "all", text))
    return out
