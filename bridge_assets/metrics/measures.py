"""trec_eval's retrieval measures, computed set-based in DuckDB over every system at once.

sql/retrieval_metrics.sql reads the run's judged rows and the judged queries; this module maps
the caller's tables onto the views it reads, checks the input the way trec_eval does (no
duplicate documents), lays each ranking out in trec_eval's order and returns a long polars
frame `(dataset, retriever, query_id | 'all', measure, value)`. The measures' names live in
measure_names.py, their definitions (one per family, as ir_measures keeps them) in
judged_rows.py. Conventions: docs/metrics.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import cast

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from bridge_assets.errors import DatasetError
from bridge_assets.metrics.judged_rows import JudgedRows, judgments, measure_values
from bridge_assets.metrics.measure_names import PIPELINE_MEASURES, MeasureError, MeasureSelection, resolve_measures
from bridge_assets.paths import read_sql

# --- mapping the caller's tables onto the views the SQL reads --------------------------------

def _columns(con: duckdb.DuckDBPyConnection, relation: str) -> list[str]:
    try:
        return [c[0] for c in con.execute(f"select * from {relation} limit 0").description]
    except duckdb.Error as exc:
        raise DatasetError(f"cannot read '{relation}': {exc}") from None


def _key_column(columns: list[str], name: str, relation: str, default: str | None) -> str:
    if name in columns:
        return f"{name}::varchar"
    if default is None:
        raise DatasetError(f"'{relation}' lacks the column '{name}'")
    return f"'{default}'"


@contextlib.contextmanager
def _metric_views(con: duckdb.DuckDBPyConnection, run: str, qrels: str,
                  original_qrels: str | None) -> Iterator[None]:
    run_cols, qrels_cols = _columns(con, run), _columns(con, qrels)
    if ("dataset" in run_cols) != ("dataset" in qrels_cols):
        raise DatasetError(f"'{run}' and '{qrels}' must both carry a 'dataset' column, or neither")
    if "score" in run_cols:
        # trec_eval keeps a score as a C float (TEXT_RESULTS.sim): scores apart only past single
        # precision tie, and the doc id orders them. A score past float's range reads NULL (refused)
        score = "try_cast(score::double as float)"
    elif "rank" in run_cols:
        score = "-rank::double"  # no scores: rank 1 first
    else:
        raise DatasetError(f"'{run}' needs a 'score' or a 'rank' column to order its documents")
    qrels_select = ("select {dataset} as dataset, {query} as query_id, {doc} as doc_id, "
                    "relevance::integer as relevance from {rel}")

    def qrels_view(relation: str, columns: list[str]) -> str:
        if "relevance" not in columns:
            raise DatasetError(f"'{relation}' lacks the column 'relevance'")
        return qrels_select.format(
            dataset=_key_column(columns, "dataset", relation, ""),
            query=_key_column(columns, "query_id", relation, None),
            doc=_key_column(columns, "doc_id", relation, None), rel=relation)

    views = {
        "metrics_run": (
            f"select {_key_column(run_cols, 'dataset', run, '')} as dataset, "
            f"{_key_column(run_cols, 'retriever', run, '')} as retriever, "
            f"{_key_column(run_cols, 'query_id', run, None)} as query_id, "
            f"{_key_column(run_cols, 'doc_id', run, None)} as doc_id, {score} as score from {run}"),
        "metrics_qrels": qrels_view(qrels, qrels_cols),
        "metrics_original_qrels": (
            qrels_view(original_qrels, _columns(con, original_qrels)) if original_qrels else
            "select ''::varchar as dataset, ''::varchar as query_id, ''::varchar as doc_id, "
            "0::integer as relevance where false"),
    }
    try:
        for name, select in views.items():
            con.execute(f"create or replace temp view {name} as {select}")
        yield
    finally:
        for name in views:
            con.execute(f"drop view if exists {name}")


def _check_judgments(con: duckdb.DuckDBPyConnection, qrels: str, original_qrels: str | None) -> None:
    """trec_eval refuses a document judged twice for one query; so do we. Counting distinct
    64-bit hashes first keeps the common case (no duplicate) cheap; a hash collision falls
    through to the exact query."""
    keys = "dataset, query_id, doc_id"
    for view, relation in (("metrics_qrels", qrels), ("metrics_original_qrels", original_qrels)):
        if relation is None:
            continue
        counts = con.execute(
            f"select count(*), count(distinct hash({keys})), count(*) - count(relevance) from {view}"
        ).fetchone()
        assert counts is not None  # an aggregate's one row
        rows, hashes, no_value = counts
        duplicate = None if rows == hashes else con.execute(
            f"select {keys} from {view} group by all having count(*) > 1 limit 1").fetchone()
        if duplicate:
            raise DatasetError(f"'{relation}': document '{duplicate[2]}' is judged twice for query "
                               f"'{duplicate[1]}' (dataset '{duplicate[0]}')")
        if no_value:
            raise DatasetError(f"'{relation}': a judgment has no relevance value")


KEYS = ["dataset", "retriever", "query_id"]
_MIX = np.uint64(0x9E3779B97F4A7C15)  # spreads the ranking number over the 64-bit doc hash


def _statements() -> tuple[str, str, str]:
    """sql/retrieval_metrics.sql: the run as stored (with its order checked), the run with its
    ids (when it is not in order), the judged queries."""
    stored, with_ids, queries = read_sql("retrieval_metrics").split("\n;\n")
    return stored, with_ids, queries


def _with_build_side_as_written(con: duckdb.DuckDBPyConnection, sql: str, *,
                                original: bool) -> pa.Table:
    """Run `sql` with the right side of each join as the hash table. DuckDB 1.5.5 cannot size an
    Arrow scan, and on the bench it hashed the 914,250 run rows to probe them with 55,202 qrels
    (0.7 s, against 0.1 s the other way round); the qrels are the small side. Without
    `original` (no hole_k asked for) the join with the original qrels is left out."""
    if not original:
        join = sql.index("left join metrics_original_qrels")
        sql = sql[:join].replace("o.relevance as original_relevance",
                                 "null::integer as original_relevance")
    setting = con.execute("select current_setting('disabled_optimizers')").fetchone()
    assert setting is not None  # a setting's one row
    previous = setting[0]
    con.execute("set disabled_optimizers = 'build_side_probe_side"
                + (f",{previous}'" if previous else "'"))
    try:
        # a relation is converted to Arrow as it runs, on every thread (measured 15-30% faster
        # here); an executed query is collected first, then converted on one
        return con.sql(sql).to_arrow_table()
    finally:
        if previous:
            con.execute(f"set disabled_optimizers = '{previous}'")
        else:
            con.execute("reset disabled_optimizers")


def _changes(columns: Sequence[pa.ChunkedArray | pa.Array]) -> np.ndarray:
    """True where a row starts a new run of equal keys (row 0 included); NULL equals NULL."""
    n = len(columns[0])
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
    for column in columns:
        if n < 2:
            break
        after, before = column.slice(1), column.slice(0, n - 1)
        differs = pc.not_equal(after, before)
        if differs.null_count:
            differs = pc.fill_null(differs, pc.not_equal(pc.is_null(after), pc.is_null(before)))
        new[1:] |= differs.to_numpy(zero_copy_only=False)
    return new


def _number_rankings(new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ranking): the row where each ranking starts, and each row's ranking number
    (new: True where a ranking starts, row 0 included)."""
    starts = np.flatnonzero(new)
    return starts, np.repeat(np.arange(len(starts)), np.diff(starts, append=len(new)))


def _ranking_problem(rows: pa.Table, run: str, at: int, problem: str) -> DatasetError:
    dataset, retriever, query_id = (rows.column(c)[int(at)].as_py() for c in KEYS)
    return DatasetError(f"'{run}': {problem} of query '{query_id}' (dataset '{dataset}', "
                        f"retriever '{retriever}')")


def _in_trec_order(rows: pa.Table, run: str) -> tuple[np.ndarray, np.ndarray]:
    """(at, new): `at[i]` is the row of `rows` that comes i-th when the run is laid out ranking
    by ranking, each in trec_eval's order (score descending, ties by doc id descending in byte
    order, strcmp); `new[i]` is True where a ranking starts.

    Read from statement 2, when statement 1 found what _as_stored cannot put right (a score
    rising within a ranking, a ranking's rows apart, a doc id hash repeated). The scan order is
    restored (the join does not keep it) and checked in one pass over numbers, the rankings told
    apart by DuckDB's 64-bit hash of (dataset, retriever, query_id). When a ranking's rows are
    not together, or two rankings' hashes are equal, the rows are grouped by the ids themselves;
    only rankings out of score order are sorted."""
    n = rows.num_rows
    at = np.empty(n, dtype=np.int64)
    at[rows.column("scan_position").to_numpy()] = np.arange(n)
    score = rows.column("score").to_numpy()
    if rows.column("score").null_count or not np.isfinite(score).all():
        bad = np.flatnonzero(~np.isfinite(score) | pc.is_null(rows.column("score")).to_numpy())
        raise _ranking_problem(rows, run, bad[0], "no finite score (in single precision) for some document")
    ranking_hash = rows.column("ranking_hash").to_numpy()[at]
    new = np.ones(n, dtype=bool)
    new[1:] = ranking_hash[1:] != ranking_hash[:-1]
    starts = np.flatnonzero(new)
    first_hashes = np.sort(ranking_hash[starts])
    if (first_hashes[1:] == first_hashes[:-1]).any():
        # a ranking's rows are not together: grouped by the hash (stably: their order kept),
        # then the boundaries read off the ids; should two rankings share a hash, by the ids
        at = at[np.argsort(ranking_hash, kind="stable")]
        keys = [rows.column(c).take(at) for c in KEYS]
        new = _changes(keys)
        firsts = np.flatnonzero(new)
        if pl.DataFrame([pl.Series(c, k.take(firsts), pl.String) for c, k in zip(KEYS, keys)]) \
                .is_duplicated().any():
            order = pl.DataFrame([pl.Series(c, k, pl.String) for c, k in zip(KEYS, keys)]) \
                .with_row_index().sort(KEYS, maintain_order=True)["index"].to_numpy()
            at = at[order]
            new = _changes([k.take(order) for k in keys])
    score = score[at]
    same = ~new[1:]
    out_of_order = same & (score[1:] > score[:-1])
    tied = np.flatnonzero(same & (score[1:] == score[:-1]))
    doc = rows.column("doc_id")
    if len(tied):
        in_order = pc.fill_null(pc.greater(doc.take(at[tied]), doc.take(at[tied + 1])), False)
        out_of_order[tied] |= ~in_order.to_numpy(zero_copy_only=False)
    if not out_of_order.any():
        return at, new
    _, ranking = _number_rankings(new)
    unsorted = np.zeros(ranking[-1] + 1, dtype=bool)
    unsorted[ranking[1:][out_of_order]] = True
    todo = np.flatnonzero(unsorted[ranking])  # the rows of the rankings out of order
    # by score descending within each ranking (numbers only), then each run of tied scores by
    # doc id descending (polars sorts strings in byte order); a tie run keeps its places
    todo = todo[np.lexsort((-score[todo], ranking[todo]))]
    tie = (ranking[todo][1:] == ranking[todo][:-1]) & (score[todo][1:] == score[todo][:-1])
    if tie.any():
        tied_rows = np.zeros(len(todo), dtype=bool)
        tied_rows[1:] |= tie
        tied_rows[:-1] |= tie
        slots = np.flatnonzero(tied_rows)
        todo[slots] = todo[slots][_tie_order(ranking[todo[slots]], score[todo[slots]],
                                             doc.take(at[todo[slots]]))]
    at[np.sort(todo)] = at[todo]
    return at, new


def _tie_order(ranking: np.ndarray, score: np.ndarray, doc_id: pa.ChunkedArray) -> np.ndarray:
    """The order that puts rows already in score order, ranking by ranking, into trec_eval's:
    each run of tied scores by doc id descending (polars sorts strings in byte order, as
    strcmp); every other row keeps its place."""
    part = pl.DataFrame({"ranking": ranking, "score": score,
                         "doc_id": pl.Series(doc_id, dtype=pl.String)})
    return part.with_row_index().sort(["ranking", "score", "doc_id"], descending=[False, True, True],
                                      maintain_order=True)["index"].to_numpy()


def _as_stored(rows: pa.Table) -> tuple[np.ndarray, np.ndarray, pl.DataFrame] | None:
    """(at, new) as _in_trec_order gives them and each ranking's keys, when the run is stored
    in trec_eval's order but maybe for the order of tied documents, every score is finite and
    every doc id present, each ranking's rows are together and no doc id hash repeats within a
    ranking; else None. Ties out of doc id order are put right here."""
    n = rows.num_rows
    at = np.empty(n, dtype=np.int64)
    at[rows.column("scan_position").to_numpy()] = np.arange(n)
    score, doc = rows.column("score"), rows.column("doc_id")
    if score.null_count or doc.null_count:
        return None
    score = score.to_numpy()[at]
    if not np.isfinite(score).all():
        return None
    new = rows.column("new_ranking").to_numpy(zero_copy_only=False)[at]
    new[0] = True
    same = ~new[1:]
    if (same & (score[1:] > score[:-1])).any():
        return None  # a score rises within a ranking
    starts, ranking = _number_rankings(new)
    # a ranking's rows are not together when its keys start two rankings: screened on a hash
    # of the keys, confirmed on the keys themselves
    # a pyarrow Table gives a DataFrame (pyarrow has no types, so mypy cannot pick the overload)
    keys = cast(pl.DataFrame, pl.from_arrow(rows.select(KEYS).take(at[starts])))
    hashes = np.sort(keys.select(pl.struct(KEYS).hash()).to_series().to_numpy())
    if (hashes[1:] == hashes[:-1]).any() and keys.is_duplicated().any():
        return None
    mixed = rows.column("doc_hash").to_numpy()[at] + ranking.astype(np.uint64) * _MIX
    ordered = np.sort(mixed)
    if (ordered[1:] == ordered[:-1]).any():
        return None  # maybe a document twice in a ranking: confirmed on the ids
    equal = score[1:] == score[:-1]
    tie = np.flatnonzero(same & equal)  # row tie + 1 ties with row tie in its ranking
    if len(tie):
        descending = pc.greater(doc.take(at[tie]), doc.take(at[tie + 1])).to_numpy(zero_copy_only=False)
        if not descending.all():
            fix = np.zeros(len(starts), dtype=bool)
            fix[ranking[tie[~descending]]] = True
            tied = np.zeros(n, dtype=bool)  # every row tied with a neighbour (a tie across
            tied[1:] |= equal               # two rankings is harmless: rankings stay apart)
            tied[:-1] |= equal
            slots = np.flatnonzero(tied & fix[ranking])  # the tied rows of those rankings
            at[slots] = at[slots][_tie_order(ranking[slots], score[slots], doc.take(at[slots]))]
    return at, new, keys


def _check_no_duplicates(rows: pa.Table, at: np.ndarray, ranking: np.ndarray, run: str) -> None:
    """trec_eval stops on a document retrieved twice for one query; so do we. DuckDB's 64-bit
    hash of each doc id, mixed with its ranking's number, is sorted (SIMD: ~10 ms for 1M) and
    neighbours compared; an equal pair is confirmed on the ids themselves."""
    mixed = rows.column("doc_hash").to_numpy()[at] + ranking.astype(np.uint64) * _MIX
    ordered = np.sort(mixed)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(repeated):
        return
    suspects = np.flatnonzero(np.isin(mixed, repeated))
    seen: set[tuple[int, object]] = set()
    for i, doc in zip(suspects, rows.column("doc_id").take(at[suspects]).to_pylist()):
        if (ranking[i], doc) in seen:
            raise _ranking_problem(rows, run, at[i], "a document appears twice in the ranking")
        seen.add((ranking[i], doc))




def _ideal_dcg(queries: pa.Table, cutoffs: Sequence[int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Each judged query's ideal DCG, in full and cut at each cutoff."""
    count = len(queries)
    if count == 0:
        return np.zeros(0), {k: np.zeros(0) for k in cutoffs}
    gains_list = queries.column("ideal_gains").combine_chunks()
    offsets = gains_list.offsets.to_numpy()
    gains = gains_list.values.to_numpy(zero_copy_only=False).astype(np.float64)
    query = np.repeat(np.arange(count), np.diff(offsets))
    rank = np.arange(len(gains)) - offsets[query] + 1
    discounted = gains / np.log2(rank + 1.0)
    full = np.bincount(query, weights=discounted, minlength=count)
    return full, {k: np.bincount(query, weights=np.where(rank <= k, discounted, 0.0), minlength=count)
                  for k in cutoffs}


def _evaluate(con: duckdb.DuckDBPyConnection, selection: MeasureSelection, run: str, *,
              relevance_level: int, complete: bool, max_docs: int | None,
              per_query: bool) -> pl.DataFrame:
    stored_sql, with_ids_sql, queries_sql = _statements()
    hole = selection.uses("hole")
    rows = _with_build_side_as_written(con, stored_sql, original=hole)
    ordered = _as_stored(rows) if rows.num_rows else \
        (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), None)
    if ordered is None:
        rows = _with_build_side_as_written(con, with_ids_sql, original=hole)
        ordered = (*_in_trec_order(rows, run), None)
    at, new, found = ordered
    queries = con.execute(queries_sql, {"relevance_level": relevance_level}).to_arrow_table()
    starts, ranking = _number_rankings(new)
    if max_docs is not None:  # trec_eval's -M: only the top max_docs of each ranking count
        keep = np.arange(len(at)) - starts[ranking] < max_docs
        at, new, ranking = at[keep], new[keep], ranking[keep]
        starts = np.flatnonzero(new)
    if found is None:  # read from statement 2 (_as_stored checked the run in order)
        _check_no_duplicates(rows, at, ranking, run)

    # which rankings are evaluated: those of a query the qrels know (with -c also the judged
    # queries a retriever did not answer, as empty rankings)
    if found is None:  # each ranking's keys, from its first row
        found = cast(pl.DataFrame, pl.from_arrow(rows.select(KEYS).take(at[starts])))  # see _as_stored
    judged = pl.DataFrame([pl.Series("dataset", queries.column("dataset"), pl.String),
                           pl.Series("query_id", queries.column("query_id"), pl.String)]) \
        .with_row_index("query")
    evaluated = found.with_row_index("ranking").join(judged, on=["dataset", "query_id"],
                                                     maintain_order="left")
    if complete:
        systems = found.select(KEYS[:2]).unique(maintain_order=True)
        missing = systems.join(judged, on="dataset").join(evaluated, on=KEYS, how="anti")
        evaluated = pl.concat([evaluated, missing.select(pl.lit(None, pl.UInt32).alias("ranking"),
                                                         *KEYS, "query")])
    answered = evaluated["ranking"].drop_nulls().to_numpy().astype(np.int64)
    number = np.full(len(starts), -1, dtype=np.int64)
    number[answered] = np.arange(len(answered))
    num_ret = np.zeros(evaluated.height, dtype=np.int64)
    num_ret[:len(answered)] = np.diff(np.append(starts, len(at)))[answered]

    # the judged documents of the evaluated rankings: all that the measures read
    valid = pc.is_valid(rows.column("relevance")).to_numpy(zero_copy_only=False)[at]
    if len(answered) < len(starts):
        valid &= number[ranking] >= 0
    judged_rows = np.flatnonzero(valid)
    row_ranking = ranking[judged_rows]
    query = evaluated["query"].to_numpy().astype(np.int64)
    ideal_dcg, ideal_dcg_at = _ideal_dcg(queries, selection.cutoffs)
    values = measure_values(selection, JudgedRows(
        relevance_level, num_ret, number[row_ranking], judged_rows - starts[row_ranking] + 1,
        pc.fill_null(rows.column("relevance"), 0).to_numpy()[at[judged_rows]].astype(np.int64),
        judgments(rows.column("original_relevance"), at[judged_rows]) if hole else None,
        queries.column("num_rel").to_numpy()[query].astype(np.float64),
        queries.column("num_nonrel").to_numpy()[query].astype(np.float64),
        ideal_dcg[query], {k: v[query] for k, v in ideal_dcg_at.items()}))
    return _long_frame(evaluated.select(KEYS), values, selection, per_query)


def _long_frame(keys: pl.DataFrame, values: dict[str, np.ndarray], selection: MeasureSelection,
                per_query: bool) -> pl.DataFrame:
    """One row per (ranking, measure), and each system's summary under query_id 'all': the
    mean over its evaluated queries, the sum for the num_* counts, num_q, and gm_map (geometric
    mean of average precision, each floored at trec_eval's MIN_GEO_MEAN 0.00001). The parts are
    put together without copying (one chunk per measure)."""
    schema = {**dict.fromkeys(KEYS, pl.String), "measure": pl.String, "value": pl.Float64}
    parts = []
    if per_query:
        parts = [keys.with_columns(measure=pl.lit(name), value=pl.Series(values[name]))
                 for name in values if not selection.family_of[name].summary_only]
    summary = []
    for name in selection.names:
        family = selection.family_of[name]
        if family.name == "num_q":
            summary.append(pl.len().cast(pl.Float64).alias(name))
        elif family.name == "gm_map":
            summary.append(pl.col(name).clip(lower_bound=0.00001).log().mean().exp())
        elif name in values:
            summary.append(pl.col(name).sum() if family.count else pl.col(name).mean())
    if summary and keys.height:
        wide = keys.select("dataset", "retriever").with_columns(
            **{name: pl.Series(name, v) for name, v in values.items()})
        totals = wide.group_by("dataset", "retriever", maintain_order=True).agg(*summary)
        parts.extend(totals.select("dataset", "retriever", query_id=pl.lit("all"),
                                   measure=pl.lit(name), value=pl.col(name).cast(pl.Float64))
                     for name in totals.columns[2:])
    return pl.concat(parts, rechunk=False) if parts else pl.DataFrame(schema=schema)


def compute_measures(con: duckdb.DuckDBPyConnection, selection: MeasureSelection, *,
                     run: str = "retrieval_run", qrels: str = "original_qrels",
                     original_qrels: str | None = None, relevance_level: int = 1,
                     complete: bool = False, max_docs: int | None = None,
                     per_query: bool = True) -> pl.DataFrame:
    """The selected measures for every (dataset, retriever, query) of `run` against `qrels`.

    `run`, `qrels`, `original_qrels` name tables or views of `con` (or are parenthesised
    queries, e.g. "(select * from retrieval_run where dataset = 'scifact')"). The run needs query_id,
    doc_id and score (or rank); dataset and retriever are optional. The qrels need query_id,
    doc_id, relevance (and dataset when the run has one). `original_qrels` is needed for
    `hole_k`: relevant in `qrels` but not judged in `original_qrels`. trec_eval's options:
    `relevance_level` (-l), `complete` (-c), `max_docs` (-M). Returns a long frame
    (dataset, retriever, query_id, measure, value); query_id 'all' holds the average over the
    evaluated queries (sums for the num_* counts). `runid` is not a number and is skipped.
    """
    if selection.uses("hole") and original_qrels is None:
        raise MeasureError("hole_k needs the original qrels (original_qrels=...)")
    if relevance_level < 0:
        raise MeasureError(f"relevance level must be 0 or more, got {relevance_level}")
    if max_docs is not None and max_docs < 1:
        raise MeasureError(f"max_docs must be positive, got {max_docs}")
    with _metric_views(con, run, qrels, original_qrels):
        _check_judgments(con, qrels, original_qrels)
        return _evaluate(con, selection, run, relevance_level=relevance_level, complete=complete,
                         max_docs=max_docs, per_query=per_query)


def compute_retrieval_metrics(con: duckdb.DuckDBPyConnection, *, run: str = "retrieval_run",
                              qrels: str = "original_qrels", measures: Sequence[str] | None = None,
                              k: int = 10, original_qrels: str | None = None,
                              relevance_level: int = 1, per_query: bool = True) -> pl.DataFrame:
    """The pipeline's entry point: `measures` (default PIPELINE_MEASURES, plus `hole` when
    `original_qrels` is given) with every bare cutoff family at `k`, e.g. P -> P_10.
    Explicit names such as `ndcg_cut_5` keep their own cutoff. See compute_measures."""
    if k < 1:
        raise MeasureError(f"k must be positive, got {k}")
    if measures is None:
        measures = PIPELINE_MEASURES + (("hole",) if original_qrels else ())
    selection = resolve_measures(measures, cutoffs=(k,))
    return compute_measures(con, selection, run=run, qrels=qrels, original_qrels=original_qrels,
                            relevance_level=relevance_level, per_query=per_query)
