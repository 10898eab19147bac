"""TREC files in, trec_eval's report out: what `bridge eval` does, as plain functions (the files
are read by bridge_assets.trec_io)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from bridge_assets.errors import DatasetError
from bridge_assets.metrics.measure_names import MeasureSelection, format_value
from bridge_assets.metrics.measures import compute_measures
from bridge_assets.trec_io import RUN_SCHEMA, TrecRun, read_trec_qrels, read_trec_run  # noqa: F401  (re-exported)


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
