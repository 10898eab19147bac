"""The annotation plan: the pending pairs in the order the queue serves them (by impact, from
the pipeline's pending_impact table), which of them decide a rank change, and how many labels
are left to the stopping point (bridge_assets.analysis.impact): until every rank change is
robust and, with significance (pending_impact read the significance table), until every
significance call that differs between the bounds is settled too.

pending_impact is a reading of the bounds when it was materialized; votes cast since then are
counted here from the votes store, so a pair people have completed meanwhile leaves the plan
(and the stopping point falls) before the pipeline runs again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from bridge_assets.human.tables import REQUIRED_VOTES, ensure_schema
from bridge_assets.lake.store import int_max, one_row

if TYPE_CHECKING:
    from polars._typing import PolarsDataType


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """store.table_exists without a Python parameter: DuckDB (1.5) imports pandas, ~0.5 s, the
    first time a query binds one, and a plan answers without it (its queries inline their values)."""
    return bool(one_row(con, "select count(*) from information_schema.tables "
                        f"where table_name = {_sql_text(table)}")[0])


def measure_label(measure: str) -> str:
    """`ndcg_cut_10` -> `nDCG@10` (the only measure pending_impact scores). Not imported from
    bridge_assets.analysis: that package imports scipy and more, seconds a plan need not wait."""
    family, _, cutoff = measure.rpartition("_")
    return f"nDCG@{cutoff}" if family == "ndcg_cut" and cutoff.isdigit() else measure


PLAN_SCHEMA: dict[str, PolarsDataType] = {"dataset": pl.Utf8, "impact_rank": pl.Int32, "query_id": pl.Utf8, "doc_id": pl.Utf8,
               "votes": pl.Int32, "impact": pl.Float64, "decides": pl.Int32, "reason": pl.Utf8,
               "system_pairs": pl.List(pl.Utf8), "measure": pl.Utf8, "pairs_in_doubt": pl.Int32,
               "flips": pl.Int32, "significance_in_doubt": pl.Int32}


@dataclass(frozen=True)
class Plan:
    dataset: str
    pairs: pl.DataFrame          # the pairs still open, impact order (PLAN_SCHEMA)
    completed: int               # pending when pending_impact was made, completed by votes since
    measure: str | None          # None: pending_impact not materialized for the dataset
    pairs_in_doubt: int
    significance_in_doubt: int | None = None  # None: pending_impact read no significance

    @property
    def deciding(self) -> pl.DataFrame:
        return self.pairs.filter(pl.col("decides") > 0)

    def _labels_until(self, needed: pl.Expr) -> int:
        """Open pairs, in impact order, up to the last one `needed` marks."""
        last = self.pairs.filter(needed)["impact_rank"].max()
        return 0 if last is None else self.pairs.filter(pl.col("impact_rank") <= last).height

    @property
    def stopping_point(self) -> int:
        """Labels left, in impact order, until every system pair now in doubt is decided (every
        rank change robust): up to the last open pair that decides one."""
        return self._labels_until(pl.col("decides") > 0)

    @property
    def stopping_point_with_significance(self) -> int | None:
        """Labels left, in impact order, until every significance call in doubt is settled too
        (every pair that may flip one labelled: an upper figure); None without significance."""
        if self.significance_in_doubt is None:
            return None
        return self._labels_until((pl.col("decides") > 0) | (pl.col("flips") > 0))

    def deciding_between(self, system_a: str, system_b: str) -> pl.DataFrame:
        """The open pairs whose label can decide the order of `system_a` and `system_b`."""
        names = {f"{system_a} vs {system_b}", f"{system_b} vs {system_a}"}
        return self.deciding.filter(pl.col("system_pairs").list.eval(pl.element().is_in(list(names))).list.any())


def _has_significance(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether pending_impact has the significance columns (a table made before them has not)."""
    return bool(one_row(con, "select count(*) from information_schema.columns where table_name = "
                        "'pending_impact' and column_name = 'significance_in_doubt'")[0])


def impact_order(con: duckdb.DuckDBPyConnection, dataset: str | None = None) -> pl.DataFrame:
    """pending_impact's rows (of `dataset`, or all) with their accepted votes so far, those with
    their votes complete left out: impact order. Empty without the table."""
    ensure_schema(con)
    if not _has_table(con, "pending_impact"):
        return pl.DataFrame(schema=PLAN_SCHEMA)
    frame = con.execute(_order_sql(dataset, significance=_has_significance(con))).pl()
    return frame.cast({**PLAN_SCHEMA, "completed": pl.Boolean})  # type: ignore[dict-item]  # see qrels/merge.py


def _order_sql(dataset: str | None, pairs_as_text: bool = True, significance: bool = True) -> str:
    """impact_order's query, its two values inlined (see _has_table); system_pairs as 'A vs B'
    texts, or as pending_impact holds them (`pairs_as_text` False: cheaper to filter);
    `significance` False: a pending_impact without the significance columns (none read)."""
    values = {"dataset": "null" if dataset is None else _sql_text(dataset), "required": str(int(REQUIRED_VOTES))}
    sql = """
        with votes as (
            select dataset, query_id, doc_id, list_sort(list(label)) as labels, count(*) as n
            from human_votes
            where status = 'accepted' and not is_attention_check
              and ($dataset is null or dataset = $dataset)
            group by all
        )
        select i.dataset, i.impact_rank, i.query_id, i.doc_id, coalesce(v.n, 0)::integer as votes,
               i.impact, i.decides, i.reason,
               PAIRS as system_pairs,
               i.measure, i.pairs_in_doubt, SIGNIFICANCE,
               coalesce(v.n >= $required and v.labels[(v.n + 1) // 2] = v.labels[v.n // 2 + 1], false)
                   as completed
        from pending_impact i
        left join votes v on v.dataset = i.dataset and v.query_id = i.query_id and v.doc_id = i.doc_id
        where $dataset is null or i.dataset = $dataset
        order by i.dataset, i.impact_rank"""
    sql = sql.replace("PAIRS", "list_transform(i.system_pairs, lambda p: p.system_a || ' vs ' || p.system_b)"
                      if pairs_as_text else "i.system_pairs")
    sql = sql.replace("SIGNIFICANCE", "coalesce(i.flips, 0)::integer as flips, i.significance_in_doubt"
                      if significance else "0 as flips, null::integer as significance_in_doubt")
    return re.sub(r"\$(dataset|required)\b", lambda m: values[m.group(1)], sql)


def annotation_plan(con: duckdb.DuckDBPyConnection, dataset: str) -> Plan:
    frame = impact_order(con, dataset)
    if frame.is_empty() or "completed" not in frame.columns:
        return Plan(dataset, pl.DataFrame(schema=PLAN_SCHEMA), 0, None, 0)
    open_pairs = frame.filter(~pl.col("completed")).drop("completed")
    return Plan(dataset, open_pairs, frame.height - open_pairs.height, frame["measure"][0],
                int_max(frame["pairs_in_doubt"]) or 0, int_max(frame["significance_in_doubt"]))


def stopping_points(con: duckdb.DuckDBPyConnection, datasets: tuple[str, ...] | None = None) -> dict[str, int]:
    """Per dataset with a pending_impact table: labels left to its stopping point (open pairs,
    in impact order, up to the last open one that decides a rank change)."""
    frame = impact_order(con)
    if frame.is_empty() or "completed" not in frame.columns:
        return {}
    if datasets is not None:
        frame = frame.filter(pl.col("dataset").is_in(list(datasets)))
    open_pairs = frame.filter(~pl.col("completed"))
    last = open_pairs.filter(pl.col("decides") > 0).group_by("dataset").agg(pl.col("impact_rank").max().alias("last"))
    counts = (frame.select("dataset").unique()
              .join(open_pairs.join(last, on="dataset").filter(pl.col("impact_rank") <= pl.col("last"))
                    .group_by("dataset").agg(pl.len().alias("left")), on="dataset", how="left")
              .with_columns(pl.col("left").fill_null(0).cast(pl.Int64)))
    return dict(counts.sort("dataset").iter_rows())


def describe(plan: Plan, *, systems: tuple[str, str] | None = None, limit: int = 20) -> str:
    """The plan as `bridge annotate plan` prints it."""
    if plan.measure is None:
        return _text(plan.dataset, None, 0, 0, 0, 0, systems, 0, [], limit)
    shown = plan.deciding_between(*systems) if systems is not None else plan.pairs
    rows = shown.head(limit).select("impact_rank", "query_id", "doc_id", "votes", "impact", "reason").rows()
    return _text(plan.dataset, plan.measure, plan.pairs.height, plan.pairs_in_doubt, plan.completed,
                 plan.stopping_point, systems, shown.height, rows, limit,
                 significance=(plan.stopping_point_with_significance, plan.significance_in_doubt))


def plan_text(con: duckdb.DuckDBPyConnection, dataset: str, *, systems: tuple[str, str] | None = None,
              limit: int = 20) -> str:
    """describe(annotation_plan(con, dataset), ...) computed in SQL: the counts and the rows
    shown only, no frame of every pending pair (what `bridge annotate plan` runs: on 10,000
    pending pairs it spares converting them, and importing pyarrow for it)."""
    ensure_schema(con)
    if not _has_table(con, "pending_impact"):
        return _text(dataset, None, 0, 0, 0, 0, systems, 0, [], limit)
    source, where = f"({_order_sql(dataset, pairs_as_text=False, significance=_has_significance(con))}) o", \
        "not completed"
    if systems is not None:  # the pairs deciding them, by their system pairs unnested (cheaper than a lambda)
        a, b = map(_sql_text, systems)
        source += f""" left join (
            select distinct query_id, doc_id, true as chosen
            from (select query_id, doc_id, unnest(system_pairs) as p from pending_impact
                  where dataset = {_sql_text(dataset)})
            where (p.system_a = {a} and p.system_b = {b}) or (p.system_a = {b} and p.system_b = {a})
        ) k using (query_id, doc_id)"""
        where += " and decides > 0 and coalesce(k.chosen, false)"
    # the stopping points: open pairs up to the last open one that decides a rank change (or,
    # with significance, may flip a significance call)
    measure, open_pairs, completed, deciding, with_significance, in_doubt, significance_in_doubt, shown = \
        one_row(con, f"""
        select any_value(measure), count(*) filter (where not completed), count(*) filter (where completed),
               count(*) filter (where not completed and impact_rank <= last_rank),
               count(*) filter (where not completed and impact_rank <= last_flip),
               coalesce(max(pairs_in_doubt), 0), max(significance_in_doubt),
               count(*) filter (where listed)
        from (select *, ({where}) as listed,
                     coalesce(max(case when decides > 0 and not completed then impact_rank end) over (), 0)
                         as last_rank,
                     coalesce(max(case when (decides > 0 or flips > 0) and not completed then impact_rank end)
                              over (), 0) as last_flip
              from {source})""")
    if measure is None:
        return _text(dataset, None, 0, 0, 0, 0, systems, 0, [], limit)
    rows = con.execute(f"""select impact_rank, query_id, doc_id, votes, impact, reason from {source}
                           where {where} order by impact_rank limit {int(limit)}""").fetchall()
    return _text(dataset, measure, open_pairs, in_doubt, completed, deciding, systems, shown, rows, limit,
                 significance=(None if significance_in_doubt is None else with_significance, significance_in_doubt))


def _text(dataset: str, measure: str | None, open_pairs: int, in_doubt: int, completed: int, deciding: int,
          systems: tuple[str, str] | None, shown: int, rows: list[tuple], limit: int, *,
          significance: tuple[int | None, int | None] = (None, None)) -> str:
    if measure is None:
        return (f"{dataset}: no pending_impact table (materialize pending_impact for "
                f"'{dataset}': bridge run --dataset {dataset}); the queue serves in its "
                "plain order meanwhile")
    label = measure_label(measure)
    lines = [f"{dataset}: {open_pairs} pending pair(s) open on {label}; "
             f"{in_doubt} system pair(s) in doubt (their order differs between the bounds, and with it "
             "whether a rank change holds)"
             + (f"; {completed} completed by votes since pending_impact was made" if completed else "")]
    lines.append(f"stopping point: {deciding} label(s), in impact order, make every rank change on {label} "
                 f"robust; the other {open_pairs - deciding} cannot change any")
    lines.append(significance_line(label, *significance))
    if systems is not None:
        lines.append(f"pairs that decide {systems[0]} vs {systems[1]}: {shown}")
    if rows:
        wq = max(5, *(len(row[1]) for row in rows))
        wd = max(5, *(len(row[2]) for row in rows))
        lines.append(f"{'#':>5}  {'query':<{wq}} {'chunk':<{wd}} {'votes':>5} {'impact':>7}  reason")
        for rank, query_id, doc_id, votes, impact, reason in rows:
            lines.append(f"{rank:>5}  {query_id:<{wq}} {doc_id:<{wd}} {votes:>5} {impact:>7.3f}  {reason}")
        if shown > limit:
            lines.append(f"  ... and {shown - limit} more (--limit)")
    return "\n".join(lines)


def significance_line(label: str, labels: int | None, in_doubt: int | None) -> str:
    """The stopping point with significance, as the plan prints it."""
    if labels is None or in_doubt is None:
        return ("with significance: not known (pending_impact read no significance of "
                f"{label} at both bounds: materialize significance, then pending_impact)")
    if in_doubt == 0:
        return (f"with significance: {labels} label(s) too; no significance call on {label} differs "
                "between the bounds")
    return (f"with significance: {labels} label(s), in impact order, also settle every significance call on "
            f"{label} that differs between the bounds ({in_doubt} system pair(s)); an upper figure: "
            "every pair that may flip a call is counted, though one label may settle it")
