"""`pool_saturation`: is the pool of systems large enough to find the holes?

From the stored labels only (no LLM call):
- H(C_m): the filled holes (pairs relevant in the refined qrels, unjudged in the original
  ones) found in the pool of the first m systems of an order. Growth rate
  GR(m) = (|H(C_m)| - |H(C_{m-1})|) / |H(C_{m-1})| (undefined while |H(C_{m-1})| = 0),
  averaged over `orders` seeded random orders of adding the systems (mean and std).
- Marginal contribution MC(r) = |Perf_{D_all}(r) - Perf_{D_without r}(r)|: system r's score on
  the refined qrels minus its score on the qrels built without r's pool (the new judgments of
  pairs only r surfaced removed; sql/pool_saturation_qrels.sql), for Hit@10, nDCG@10,
  Recall@10. MC does not depend on the order in which systems are added, so it is computed
  once (averaging it over orders would return the same number).
- The marginal-contribution curve as the pool grows (the DREAM paper's Figure 3b): in each of
  the same seeded random orders, the m-th system r_m contributes
  MC_m = |Perf_{D(C_m)}(r_m) - Perf_{D(C_m-1)}(r_m)|, where D(C) is the qrels the pipeline would
  have built from the pools of the systems C only (original judgments and new judgments of
  pairs outside the pool kept; sql/pool_saturation_prefix_qrels.sql). Rows
  'marginal_contribution_curve' (per m and measure): mean and std over the orders where both
  scores are defined. Rows 'mean_contribution' (per system and measure): the mean over the
  orders of what the system contributed when it was added, and 'contribution_rank': the
  systems' order by it (1: the largest; equal means share a place). The last step of an order
  is the leave-one-out MC of its last system.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl

from bridge_assets.analysis.views import Scope, ScopeInfo, analysis_views, require_rows
from bridge_assets.metrics import MeasureSelection, compute_measures, compute_retrieval_metrics, resolve_measures
from bridge_assets.paths import read_sql

DEFAULT_MEASURES = ("success_10", "ndcg_cut_10", "recall_10")
# measure families whose values an irrelevant judgment changes only through the queries
# evaluated (sql/pool_saturation_prefix_qrels.sql leaves such judgments out where it can)
RELEVANT_ONLY = {"success", "ndcg", "ndcg_cut", "recall", "P", "recip_rank", "recip_rank_cut", "map", "map_cut",
                 "Rprec"}
# a pl.Schema, not a dict: DataFrame.cast types its mapping's key invariantly (name | selector |
# dtype) and takes a Schema as it is
SATURATION_SCHEMA = pl.Schema({
    "dataset": pl.Utf8, "statistic": pl.Utf8, "systems_added": pl.Int32, "retriever": pl.Utf8,
    "measure": pl.Utf8, "value": pl.Float64, "std": pl.Float64, "orders": pl.Int32,
})


def system_orders(systems: Sequence[str], orders: int, seed: int) -> list[list[str]]:
    """`orders` random permutations of `systems`, reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return [[systems[i] for i in rng.permutation(len(systems))] for _ in range(orders)]


def holes_found_curve(hole_systems: Sequence[Sequence[str]], order: Sequence[str]) -> np.ndarray:
    """|H(C_m)| for m = 1..len(order): how many holes the first m systems' pools contain.
    `hole_systems` lists, per hole, the systems that surfaced it."""
    position = {system: i + 1 for i, system in enumerate(order)}
    first = np.array([min((position[s] for s in systems if s in position), default=len(order) + 1)
                      for systems in hole_systems], dtype=int)
    return np.array([(first <= m).sum() for m in range(1, len(order) + 1)], dtype=float)


def growth_rates(found: np.ndarray) -> np.ndarray:
    """GR(m) for m = 2..len(found); NaN where |H(C_{m-1})| = 0."""
    previous, current = found[:-1], found[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(previous > 0, (current - previous) / np.where(previous > 0, previous, 1), np.nan)


def saturation_curves(hole_systems: Sequence[Sequence[str]], systems: Sequence[str], orders: int,
                      seed: int) -> pl.DataFrame:
    """Rows 'holes_found' (m = 1..n) and 'growth_rate' (m = 2..n): mean and std over orders
    (growth rates over the orders where they are defined)."""
    found = np.array([holes_found_curve(hole_systems, order)
                      for order in system_orders(systems, orders, seed)])
    rows = []
    for m in range(1, len(systems) + 1):
        rows.append({"statistic": "holes_found", "systems_added": m, "value": float(found[:, m - 1].mean()),
                     "std": float(found[:, m - 1].std()), "orders": orders})
    if len(systems) > 1:
        rates = np.array([growth_rates(curve) for curve in found])
        for m in range(2, len(systems) + 1):
            column = rates[:, m - 2]
            defined = column[~np.isnan(column)]
            rows.append({"statistic": "growth_rate", "systems_added": m,
                         "value": float(defined.mean()) if defined.size else None,
                         "std": float(defined.std()) if defined.size else None,
                         "orders": int(defined.size)})
    return pl.DataFrame(rows, schema={k: SATURATION_SCHEMA[k] for k in
                                      ("statistic", "systems_added", "value", "std", "orders")})


def marginal_contributions(con: duckdb.DuckDBPyConnection, measures: Sequence[str], k: int) -> pl.DataFrame:
    """Rows 'perf_all', 'perf_without' and 'marginal_contribution' per (system, measure).
    Reads the analysis views, which the caller has created."""
    con.execute(f"create or replace temp view saturation_qrels as ({read_sql('pool_saturation_qrels')})")
    con.execute("""create or replace temp view saturation_run as
                   select 'with' as dataset, retriever, query_id, doc_id, score from analysis_run
                   union all
                   select 'without:' || retriever, retriever, query_id, doc_id, score from analysis_run""")
    try:
        values = compute_retrieval_metrics(con, run="saturation_run", qrels="saturation_qrels",
                                           measures=list(measures), k=k, per_query=False)
    finally:
        con.execute("drop view if exists saturation_run")
        con.execute("drop view if exists saturation_qrels")
    values = values.filter(pl.col("query_id") == "all")
    with_all = values.filter(pl.col("dataset") == "with").select("retriever", "measure", pl.col("value").alias("all"))
    without = (values.filter(pl.col("dataset") == pl.lit("without:") + pl.col("retriever"))
               .select("retriever", "measure", pl.col("value").alias("without")))
    # a query whose every relevant judgment came from r alone drops out of D_without r; it is
    # then not evaluated there, like trec_eval skips queries without judgments
    both = with_all.join(without, on=["retriever", "measure"], how="left").sort("retriever", "measure")
    return pl.concat([
        both.select(pl.lit("perf_all").alias("statistic"), "retriever", "measure", pl.col("all").alias("value")),
        both.select(pl.lit("perf_without").alias("statistic"), "retriever", "measure",
                    pl.col("without").alias("value")),
        both.select(pl.lit("marginal_contribution").alias("statistic"), "retriever", "measure",
                    (pl.col("all") - pl.col("without")).abs().alias("value")),
    ])


Step = tuple[int, int, str, str, str]  # (order index, m, system added, variant before, variant after)


def prefix_evaluations(orders: Sequence[Sequence[str]]) -> tuple[dict[frozenset, str], list[Step]]:
    """The qrels variants the curve needs, one per distinct set of systems added so far
    (frozenset -> variant name), and per (order, step m): (order index, m, system added,
    variant before, variant after)."""
    variants: dict[frozenset, str] = {}

    def variant(members: frozenset) -> str:
        return variants.setdefault(members, f"prefix:{len(variants)}")

    steps = []
    for i, order in enumerate(orders):
        for m in range(1, len(order) + 1):
            steps.append((i, m, order[m - 1], variant(frozenset(order[:m - 1])), variant(frozenset(order[:m]))))
    return variants, steps


def prefix_scores(con: duckdb.DuckDBPyConnection, variants: dict[frozenset, str],
                  evaluations: set[tuple[str, str]], measures: Sequence[str], k: int) -> dict[tuple, float]:
    """(variant, system, measure) -> the system's score (mean over the queries evaluated) on
    the qrels D(C) of each variant's systems C, for the (variant, system) `evaluations`.

    D(C) differs from D(no system) only on the queries where a system of C surfaced a judgment
    that varies (sql/pool_saturation_prefix_qrels.sql), and on each such query only by which of
    them it includes. So every system is scored once per query on D(no system), and once per
    distinct (query, included judgments) it needs; a variant's mean is D(no system)'s sum and
    count corrected on its queries. The average is the arithmetic mean over the evaluated
    queries (trec_eval's for every measure but gm_map and the num_ counts)."""
    selection = resolve_measures(measures, cutoffs=(k,))
    relevant_only = all(family.name in RELEVANT_ONLY for family in selection.family_of.values())
    judgments = con.execute(read_sql("pool_saturation_prefix_qrels"), {"relevant_only": relevant_only}).pl()
    always = judgments.filter(pl.col("systems").is_null()).drop("systems")
    varying = judgments.filter(pl.col("systems").is_not_null()).with_row_index("pair")
    systems = sorted({r for _, r in evaluations} | {s for found in varying["systems"] for s in found}
                     | {s for members in variants for s in members})
    column = {name: i for i, name in enumerate(systems)}
    surfaced = np.zeros((varying.height, len(systems)), dtype=bool)
    for i, found in enumerate(varying["systems"].to_list()):
        surfaced[i, [column[s] for s in found]] = True
    # per variant and query with included judgments: which (the combination's key)
    included = []
    for members, name in variants.items():
        if not members:  # the empty pool surfaces no pair
            continue
        pairs = np.flatnonzero(surfaced[:, [column[s] for s in members]].any(axis=1))
        if len(pairs):
            included.append(pl.DataFrame({"variant": name, "pair": np.asarray(pairs, dtype=np.uint32)}))
    schema = {"variant": pl.Utf8, "query_id": pl.Utf8, "combo": pl.Utf8}
    if included:
        keyed = (pl.concat(included).join(varying.select("pair", "query_id"), on="pair")
                 .group_by("variant", "query_id").agg(pl.col("pair").sort())
                 .with_columns(pl.col("pair").cast(pl.List(pl.Utf8)).list.join(",").alias("key")))
        combos = keyed.select("query_id", "key").unique().sort("query_id", "key").with_row_index("id")
        combos = combos.with_columns(("combo:" + pl.col("id").cast(pl.Utf8)).alias("combo"))
        affected = keyed.join(combos, on=["query_id", "key"]).select(list(schema))
    else:
        combos = pl.DataFrame(schema={"id": pl.UInt32, "query_id": pl.Utf8, "key": pl.Utf8, "combo": pl.Utf8})
        affected = pl.DataFrame(schema=schema)
    needed = pl.DataFrame(sorted(evaluations), schema={"variant": pl.Utf8, "retriever": pl.Utf8}, orient="row")
    combo_needed = affected.join(needed, on="variant").select("combo", "query_id", "retriever").unique()
    combo_pairs = (combos.select("combo", pl.col("key").str.split(",").alias("pair")).explode("pair")
                   .with_columns(pl.col("pair").cast(pl.UInt32)))
    frames = {"saturation_always": always, "saturation_varying": varying.drop("systems"),
              "saturation_combo_pairs": combo_pairs, "saturation_combos": combos.select("combo", "query_id"),
              "saturation_combo_needed": combo_needed,
              "saturation_base_needed": needed.select("retriever").unique()}
    values = _scored_per_query(con, selection, frames)
    return _variant_means(values, affected, needed)


def _scored_per_query(con: duckdb.DuckDBPyConnection, selection: MeasureSelection,
                      frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Each needed system's per-query values on D(no system) (dataset 'base') and on each
    combination of included judgments (dataset: the combination's name), from the saturation_*
    `frames` (registered while it runs)."""
    cut = "" if selection.depth is None else (
        "qualify row_number() over (partition by retriever, query_id order by score desc, doc_id desc) "
        f"<= {selection.depth}")
    for name, frame in frames.items():
        con.register(name, frame.to_arrow())
    try:
        # each ranking cut once to the depth the measures read, in trec_eval's order (as partial.py)
        con.execute(f"""create or replace temp table saturation_cut_run as
                        select retriever, query_id, doc_id, score from analysis_run {cut}""")
        con.execute("""create or replace temp table saturation_prefix_qrels as
                       select 'base' as dataset, query_id, doc_id, relevance from saturation_always
                       union all
                       select c.combo, a.query_id, a.doc_id, a.relevance
                       from saturation_combos c join saturation_always a on a.query_id = c.query_id
                       union all
                       select p.combo, v.query_id, v.doc_id, v.relevance
                       from saturation_combo_pairs p join saturation_varying v on v.pair = p.pair""")
        con.execute("""create or replace temp view saturation_prefix_run as
                       select 'base' as dataset, r.retriever, r.query_id, r.doc_id, r.score
                       from saturation_base_needed n join saturation_cut_run r on r.retriever = n.retriever
                       union all
                       select n.combo, r.retriever, r.query_id, r.doc_id, r.score
                       from saturation_combo_needed n
                       join saturation_cut_run r on r.retriever = n.retriever and r.query_id = n.query_id""")
        values = compute_measures(con, selection, run="saturation_prefix_run", qrels="saturation_prefix_qrels",
                                  per_query=True, max_docs=selection.depth)
    finally:
        con.execute("drop view if exists saturation_prefix_run")
        con.execute("drop table if exists saturation_prefix_qrels")
        con.execute("drop table if exists saturation_cut_run")
        for name in frames:
            con.unregister(name)
    return values


def _variant_means(values: pl.DataFrame, affected: pl.DataFrame, needed: pl.DataFrame) -> dict[tuple, float]:
    """(variant, system, measure) -> mean: D(no system)'s sum and count per system, corrected
    on the queries where the variant's systems included judgments (`affected`)."""
    values = values.filter(pl.col("query_id") != "all").select("dataset", "retriever", "query_id", "measure", "value")
    base = values.filter(pl.col("dataset") == "base").drop("dataset")
    totals = base.group_by("retriever", "measure").agg(pl.col("value").sum().alias("sum"),
                                                        pl.len().alias("count"))
    names = values.select("measure").unique()
    corrections = (affected.join(needed, on="variant").join(names, how="cross")
                   .join(values.rename({"dataset": "combo", "value": "new"}), on=["combo", "retriever", "query_id",
                                                                                   "measure"], how="left")
                   .join(base.rename({"value": "old"}), on=["retriever", "query_id", "measure"], how="left")
                   .group_by("variant", "retriever", "measure")
                   .agg((pl.col("new").fill_null(0).sum() - pl.col("old").fill_null(0).sum()).alias("delta_sum"),
                        (pl.col("new").is_not_null().sum().cast(pl.Int64)
                         - pl.col("old").is_not_null().sum().cast(pl.Int64)).alias("delta_count")))
    scores = (needed.join(names, how="cross").join(totals, on=["retriever", "measure"], how="left")
              .join(corrections, on=["variant", "retriever", "measure"], how="left")
              .with_columns((pl.col("sum").fill_null(0) + pl.col("delta_sum").fill_null(0)).alias("sum"),
                            (pl.col("count").fill_null(0) + pl.col("delta_count").fill_null(0)).alias("count")))
    return {(row["variant"], row["retriever"], row["measure"]): row["sum"] / row["count"]
            for row in scores.iter_rows(named=True) if row["count"] > 0}


def contribution_curve(con: duckdb.DuckDBPyConnection, orders: Sequence[Sequence[str]], measures: Sequence[str],
                       k: int) -> pl.DataFrame:
    """Rows 'marginal_contribution_curve', 'mean_contribution' and 'contribution_rank' (module
    doc) over `orders` (prefix_scores gives the scores). Reads the analysis views, which the
    caller created."""
    variants, steps = prefix_evaluations(orders)
    scores = prefix_scores(con, variants, {(v, r) for _, _, r, before, after in steps for v in (before, after)},
                           measures, k)
    rows = []
    systems = sorted({r for _, _, r, _, _ in steps})
    for measure in dict.fromkeys(key[2] for key in scores):
        # contribution[i, m - 1] of order i's m-th system; NaN where a score is undefined
        contribution = np.full((len(orders), max(len(o) for o in orders)), np.nan)
        by_system: dict[str, list[float]] = {r: [] for r in systems}
        for i, m, system, before, after in steps:
            a, b = scores.get((after, system, measure)), scores.get((before, system, measure))
            if a is not None and b is not None:
                contribution[i, m - 1] = abs(a - b)
                by_system[system].append(abs(a - b))
        for m in range(1, contribution.shape[1] + 1):
            defined = contribution[:, m - 1][~np.isnan(contribution[:, m - 1])]
            rows.append({"statistic": "marginal_contribution_curve", "systems_added": m, "measure": measure,
                         "value": float(defined.mean()) if defined.size else None,
                         "std": float(defined.std()) if defined.size else None, "orders": int(defined.size)})
        means = {r: float(np.mean(v)) if v else None for r, v in by_system.items()}
        for r in systems:
            rows.append({"statistic": "mean_contribution", "retriever": r, "measure": measure, "value": means[r],
                         "std": float(np.std(by_system[r])) if by_system[r] else None,
                         "orders": len(by_system[r])})
        # competition ranks, largest mean first, at 12 decimals (as ranking_shift)
        ranked = {r: round(v, 12) for r, v in means.items() if v is not None}
        for r, v in ranked.items():
            rows.append({"statistic": "contribution_rank", "retriever": r, "measure": measure,
                         "value": float(1 + sum(1 for other in ranked.values() if other > v))})
    return pl.DataFrame(rows, schema={k: SATURATION_SCHEMA[k] for k in
                                      ("statistic", "systems_added", "retriever", "measure", "value", "std",
                                       "orders")})


def compute_pool_saturation(con: duckdb.DuckDBPyConnection, dataset: str, *, orders: int = 10,
                            seed: int = 0, measures: Sequence[str] = DEFAULT_MEASURES, k: int = 10,
                            scope: Scope = "pooled") -> tuple[pl.DataFrame, ScopeInfo, int]:
    """Rows of the pool_saturation table for `dataset`, the scope, and the number of holes."""
    if orders < 1:
        raise ValueError(f"pool_saturation needs at least one order, got {orders}")
    require_rows(con, "candidate_pool", dataset, "pool_saturation")
    with analysis_views(con, dataset, scope, asset="pool_saturation") as info:
        holes = con.execute(read_sql("pool_saturation")).pl()
        pooled_systems = sorted({s for systems in holes["systems"] for s in systems} | set(info.retrievers))
        curves = saturation_curves(holes["systems"].to_list(), pooled_systems, orders, seed)
        contributions = marginal_contributions(con, measures, k)
        curve = contribution_curve(con, system_orders(pooled_systems, orders, seed), measures, k)
    frame = pl.concat([curves, contributions.with_columns(pl.lit(None, pl.Int32).alias("orders")), curve],
                      how="diagonal_relaxed")
    frame = frame.with_columns(pl.lit(dataset).alias("dataset")).select(list(SATURATION_SCHEMA))
    return frame.cast(SATURATION_SCHEMA), info, holes.height
