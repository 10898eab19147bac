"""trec_eval's retrieval measures, computed set-based in DuckDB over every system at once.

The measures themselves are sql/retrieval_metrics.sql; this module names them (trec_eval's
names and cutoffs), maps the caller's tables onto the views that SQL reads, checks the input
the way trec_eval does (no duplicate documents) and returns a long polars frame
`(dataset, retriever, query_id | 'all', measure, value)`. Conventions: docs/metrics.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError, DatasetError
from bridge_assets.paths import read_sql

TREC_CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
RECALL_LEVELS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
NO_LIMIT = 2**62  # trec_eval's default -M (MAXLONG): every retrieved document counts

ParamKind = Literal["none", "cutoff", "level"]


@dataclass(frozen=True)
class MeasureFamily:
    """One measure as trec_eval knows it; `cutoff`/`level` families expand to `name_param`."""

    name: str
    params: ParamKind = "none"
    defaults: tuple[float, ...] = ()
    count: bool = False         # printed as an integer and summed (not averaged) over queries
    summary_only: bool = False  # trec_eval prints it for 'all' only


# In trec_eval's printing order (its measures.c), then BRIDGE's own measures.
FAMILIES: dict[str, MeasureFamily] = {f.name: f for f in (
    MeasureFamily("runid", summary_only=True),
    MeasureFamily("num_q", count=True, summary_only=True),
    MeasureFamily("num_ret", count=True),
    MeasureFamily("num_rel", count=True),
    MeasureFamily("num_rel_ret", count=True),
    MeasureFamily("map"),
    MeasureFamily("gm_map", summary_only=True),
    MeasureFamily("Rprec"),
    MeasureFamily("bpref"),
    MeasureFamily("recip_rank"),
    MeasureFamily("iprec_at_recall", "level", RECALL_LEVELS),
    MeasureFamily("P", "cutoff", TREC_CUTOFFS),
    MeasureFamily("recall", "cutoff", TREC_CUTOFFS),
    MeasureFamily("ndcg"),
    MeasureFamily("ndcg_cut", "cutoff", TREC_CUTOFFS),
    MeasureFamily("map_cut", "cutoff", TREC_CUTOFFS),
    MeasureFamily("success", "cutoff", (1, 5, 10)),
    MeasureFamily("num_nonrel_judged_ret", count=True),
    MeasureFamily("unj", "cutoff", (5, 10, 20)),
    # BRIDGE's own: MRR@k, Judged@k, Hole@k (docs/metrics.md)
    MeasureFamily("recip_rank_cut", "cutoff", (5, 10, 20)),
    MeasureFamily("judged", "cutoff", (5, 10, 20)),
    MeasureFamily("hole", "cutoff", (5, 10, 20)),
)}

NICKNAMES = {
    # trec_eval's default when no -m is given
    "official": ("runid", "num_q", "num_ret", "num_rel", "num_rel_ret", "map", "gm_map",
                 "Rprec", "bpref", "recip_rank", "iprec_at_recall", "P"),
}

# What the pipeline's retrieval_metrics asset reports (cutoff families at its k).
PIPELINE_MEASURES = ("success", "recall", "P", "recip_rank_cut", "ndcg_cut", "map", "judged",
                     "num_rel", "num_rel_ret")


class MeasureError(BridgeError, ValueError):
    """A measure name or parameter that this module does not offer."""


@dataclass(frozen=True)
class MeasureSelection:
    """Requested measures, expanded: ordered names and the cutoffs/levels they need."""

    names: tuple[str, ...]
    family_of: dict[str, MeasureFamily]
    cutoffs: tuple[int, ...]
    levels: tuple[float, ...]
    param_of: dict[str, float] = field(default_factory=dict)  # P_10 -> 10, iprec_at_recall_0.10 -> 0.1

    def uses(self, family: str) -> bool:
        return any(f.name == family for f in self.family_of.values())

    @property
    def depth(self) -> int | None:
        """How deep a ranking these measures read: the largest cutoff when every measure is a
        cutoff measure (their values are then the same under trec_eval's -M depth), else None."""
        if self.cutoffs and all(f.params == "cutoff" for f in self.family_of.values()):
            return max(self.cutoffs)
        return None


def _param_name(family: MeasureFamily, value: float) -> str:
    # trec_eval: "%s_%ld" for cutoffs, "%s_%3.2f" for recall levels
    return f"{family.name}_{int(value)}" if family.params == "cutoff" else f"{family.name}_{value:.2f}"


def _parse_params(family: MeasureFamily, text: str, spec: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        try:
            value = int(part) if family.params == "cutoff" else float(part)
        except ValueError:
            raise MeasureError(f"measure '{spec}': parameter '{part}' is not "
                               f"{'an integer' if family.params == 'cutoff' else 'a number'}") from None
        if family.params == "cutoff" and value <= 0:
            raise MeasureError(f"measure '{spec}': cutoffs must be positive")
        if family.params == "level" and not 0.0 <= value <= 1.0:
            raise MeasureError(f"measure '{spec}': recall levels lie between 0 and 1")
        values.append(value)
    if len(set(values)) != len(values):
        raise MeasureError(f"measure '{spec}': duplicate parameters")
    return values


def _split_spec(spec: str) -> tuple[MeasureFamily, list[float] | None]:
    """`P` -> (P, None: defaults); `P.5,10` (trec_eval) or `P_10` (pytrec_eval) -> (P, [..])."""
    if spec in FAMILIES:
        return FAMILIES[spec], None
    name, dot, params = spec.partition(".")
    if dot and name in FAMILIES and FAMILIES[name].params != "none":
        return FAMILIES[name], _parse_params(FAMILIES[name], params, spec)
    name, underscore, param = spec.rpartition("_")
    if underscore and name in FAMILIES and FAMILIES[name].params != "none":
        return FAMILIES[name], _parse_params(FAMILIES[name], param, spec)
    offered = ", ".join(f.name for f in FAMILIES.values())
    raise MeasureError(f"unknown measure '{spec}' (offered: {offered}; nickname: official)")


def resolve_measures(specs: Iterable[str], cutoffs: Sequence[int] | None = None) -> MeasureSelection:
    """Expand measure names into the values to compute, in trec_eval's printing order.

    A bare cutoff family (`P`, `ndcg_cut`, ...) takes `cutoffs` when given (the pipeline's k),
    otherwise trec_eval's default cutoffs. Several requests for one family are united.
    """
    wanted: dict[str, set[float] | None] = {}
    for spec in specs:
        for item in NICKNAMES.get(spec, (spec,)):
            family, params = _split_spec(item)
            if family.params == "none":
                wanted[family.name] = None
                continue
            if params is None:
                params = list(cutoffs) if cutoffs and family.params == "cutoff" else list(family.defaults)
            wanted.setdefault(family.name, set()).update(params)
    names: list[str] = []
    family_of: dict[str, MeasureFamily] = {}
    param_of: dict[str, float] = {}
    needed_cutoffs: set[int] = set()
    needed_levels: set[float] = set()
    for family in FAMILIES.values():
        if family.name not in wanted:
            continue
        params = wanted[family.name]
        if params is None:
            names.append(family.name)
            family_of[family.name] = family
            continue
        for value in sorted(params):
            name = _param_name(family, value)
            names.append(name)
            family_of[name] = family
            param_of[name] = value
        if family.params == "cutoff":
            needed_cutoffs.update(int(v) for v in params)
        else:
            needed_levels.update(params)
    if not names:
        raise MeasureError("no measure requested")
    return MeasureSelection(tuple(names), family_of, tuple(sorted(needed_cutoffs)),
                            tuple(sorted(needed_levels)), param_of)


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
        score = "score::double"
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


def _first_duplicate(con: duckdb.DuckDBPyConnection, view: str, keys: str) -> tuple | None:
    """A key that occurs twice in `view`, if any. Counting distinct 64-bit hashes first keeps
    the common case (no duplicate) cheap; a hash collision falls through to the exact query."""
    rows, hashes = con.execute(f"select count(*), count(distinct hash({keys})) from {view}").fetchone()
    if rows == hashes:
        return None
    return con.execute(f"select {keys} from {view} group by all having count(*) > 1 limit 1").fetchone()


def _check_judgments(con: duckdb.DuckDBPyConnection, qrels: str, original_qrels: str | None) -> None:
    """trec_eval refuses a document judged twice for one query; so do we."""
    for view, relation in (("metrics_qrels", qrels), ("metrics_original_qrels", original_qrels)):
        duplicate = _first_duplicate(con, view, "dataset, query_id, doc_id")
        if duplicate:
            raise DatasetError(f"'{relation}': document '{duplicate[2]}' is judged twice for query "
                             f"'{duplicate[1]}' (dataset '{duplicate[0]}')")
        if con.execute(f"select count(*) from {view} where relevance is null").fetchone()[0]:
            raise DatasetError(f"'{relation}': a judgment has no relevance value")


KEYS = ["dataset", "retriever", "query_id"]


def _long_frame(wide: pl.DataFrame, selection: MeasureSelection) -> pl.DataFrame:
    """The SQL's wide rows (a column per family; a row per ranking, and per ranking and cutoff
    or recall level) as one row per requested value, under trec_eval's names (P at depth 10 ->
    P_10). Vectorised: one filter and select per requested name, not per row."""
    whole = wide.filter(pl.col("depth").is_null() & pl.col("level").is_null())
    at_depth = wide.filter(pl.col("depth").is_not_null()).partition_by("depth", as_dict=True)
    at_level = wide.filter(pl.col("level").is_not_null()).partition_by("level", as_dict=True)
    parts = []
    for name in selection.names:
        family = selection.family_of[name]
        if name == "runid":
            continue
        if family.params == "cutoff":
            rows = at_depth.get((int(selection.param_of[name]),))
        elif family.params == "level":
            rows = at_level.get((selection.param_of[name],))
        else:
            rows = whole
        if rows is not None:
            parts.append(rows.select(*KEYS, pl.lit(name).alias("measure"),
                                     pl.col(family.name).cast(pl.Float64).alias("value"))
                         .drop_nulls("value"))
    schema = {**dict.fromkeys(KEYS, pl.String), "measure": pl.String, "value": pl.Float64}
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


@contextlib.contextmanager
def _without_join_reordering(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB 1.5.5's join-order optimizer turns the SQL's -c branch (judged queries a run did
    not answer) into a plan that never finishes once a run has a few hundred queries (366
    queries x 100 documents: stalled for minutes, against 0.3 s without it); the order the SQL
    is written in is a good plan, so that optimizer is off for this statement only."""
    previous = con.execute("select current_setting('disabled_optimizers')").fetchone()[0]
    con.execute("set disabled_optimizers = 'join_order" + (f",{previous}'" if previous else "'"))
    try:
        yield
    finally:
        if previous:
            con.execute(f"set disabled_optimizers = '{previous}'")
        else:
            con.execute("reset disabled_optimizers")


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
    with _metric_views(con, run, qrels, original_qrels), \
            (_without_join_reordering(con) if complete else contextlib.nullcontext()):
        _check_judgments(con, qrels, original_qrels)
        try:
            wide = con.execute(read_sql("retrieval_metrics"), {
                "relevance_level": relevance_level,
                "max_docs": max_docs or NO_LIMIT,
                "complete": complete,
                "cutoffs": list(selection.cutoffs),
                "recall_levels": list(selection.levels),
                "families": sorted({f.name for f in selection.family_of.values()}),
                "per_query": per_query,
            }).pl()
        except duckdb.InvalidInputException as exc:  # the SQL's own refusal of a bad ranking
            raise DatasetError(f"'{run}': {str(exc).partition('Error: ')[2] or exc}") from None
        return _long_frame(wide, selection)


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


def format_value(family: MeasureFamily, value: float) -> str:
    """trec_eval's printf: `%ld` for counts, `%6.4f` for the rest."""
    return str(int(value)) if family.count else f"{value:6.4f}"
