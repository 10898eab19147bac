"""`pool_coverage`: how many relevant chunks the pool holds as systems are added, and how many
more systems like these would still find (TREC-style pool coverage, D-MERIT's appendix).

From the stored labels only (no LLM call), at both bounds over pending pairs (qrels_version
refined: pending irrelevant; refined_upper: pending relevant):

- relevant_found(m): the relevant (query, chunk) pairs in the pool of the first m systems of
  an order (sql/pool_coverage.sql), over `orders` seeded random orders of adding the systems
  (as pool_saturation): mean, std and a band (the 5% and 95% quantiles over the orders).
- The extrapolation. Model: the Michaelis-Menten (Clench) accumulation curve
  R(m) = total * m / (half + m), fitted with scipy.optimize.curve_fit (least squares) to the
  expected curve E[R(m)], the mean over every order of the systems, computed exactly (a chunk
  that s of the n systems surfaced is in a random m of them with probability
  1 - C(n - s, m) / C(n, m)); the mean over the sampled orders estimates the same curve.
  `total` is the number of relevant chunks systems like these would find in the end, `half` the
  number of systems that finds half of them; outside_pool = total - relevant in the pool.
  It is exactly the curve of a pool whose chunks each have a detection hazard drawn from an
  exponential distribution (a system finds a chunk of hazard h with probability 1 - exp(-h)):
  easy and hard chunks mixed, which is why it saturates slower than a single exponential.
- Its interval (95%): a parametric bootstrap of the estimate's error. `resamples` pools are
  drawn from the fitted model (round(total) chunks, hazards exponential with mean 1 / half,
  each surfaced by Binomial(n, 1 - exp(-h)) of n systems), the model is refitted on each, and
  the error (estimated - true number outside) is measured; the interval is the estimate minus
  the error's 97.5% and 2.5% quantiles (never below 0). On pools drawn from the model it held
  the truth in about 92% (12 systems) to 98% (6 systems) of trials; where chunks are equally
  easy to find (a single exponential curve) the model over-estimates what remains. A drawn pool
  with no surfaced chunk or a refit that does not converge adds no error; the row's
  `resamples` says how many pools the interval rests on, and with fewer than
  MIN_FITTED_SHARE of them there is no interval (the note says so).
- Shown only when meaningful: at least `min_systems` systems (MIN_SYSTEMS = 6: with fewer,
  the handful of points cannot tell a levelling curve from a straight line), at least one
  relevant chunk in the pool, a fit that converged, and a curve that levels off (the upper end
  of the interval at most SATURATION_FACTOR times what the pool holds; beyond that the
  asymptote is not identified). Otherwise the outside_pool_estimate row carries no value and
  its `note` says why.

Rows (statistic): relevant_found (per m), fitted (per m up to EXTRAPOLATE_TO x n, when
meaningful), in_pool, known_outside_pool (relevant judgments no system surfaced: outside the
pool for certain, beyond the extrapolation's reach), outside_pool_estimate (value, low, high,
note, resamples), total_estimate and half_saturation (when meaningful).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from bridge_assets.analysis.saturation import holes_found_curve, system_orders
from bridge_assets.analysis.views import REFINED_BOUNDS, Scope, ScopeInfo, analysis_views, require_rows
from bridge_assets.paths import read_sql

MIN_SYSTEMS = 6
RESAMPLES = 200
LEVEL = 0.95
BAND = (0.05, 0.95)          # quantiles over the orders drawn around the mean curve
SATURATION_FACTOR = 10.0     # interval's upper end beyond this x the pool: not levelling off
EXTRAPOLATE_TO = 3           # the fitted curve is drawn up to this x the systems
MIN_FITTED_SHARE = 0.5       # of the bootstrap pools that must refit for an interval
MODEL = "michaelis_menten"
COVERAGE_SCHEMA = {
    "dataset": pl.Utf8, "qrels_version": pl.Utf8, "statistic": pl.Utf8, "systems_added": pl.Int32,
    "value": pl.Float64, "std": pl.Float64, "low": pl.Float64, "high": pl.Float64,
    "orders": pl.Int32, "resamples": pl.Int32, "note": pl.Utf8,
}


def michaelis_menten(m: float | np.ndarray, total: float, half: float) -> float | np.ndarray:
    """R(m) = total * m / (half + m)."""
    return total * m / (half + m)


def expected_curve(counts: Sequence[int] | np.ndarray, systems: int) -> np.ndarray:
    """E[R(m)] for m = 1..systems over every order: `counts` holds, per relevant chunk of the
    pool, how many of the `systems` surfaced it (1..systems)."""
    from scipy.special import gammaln

    n = systems
    per_count = np.bincount(np.asarray(counts, dtype=np.int64), minlength=n + 1)[: n + 1]
    m = np.arange(1, n + 1)[:, None]
    s = np.arange(n + 1)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        # log C(n - s, m) - log C(n, m); C(n - s, m) = 0 where n - s < m
        log_missed = np.where(n - s >= m, gammaln(n - s + 1) - gammaln(np.maximum(n - s - m, 0) + 1)
                              - gammaln(n + 1) + gammaln(n - m + 1), -np.inf)
    return ((1.0 - np.exp(log_missed)) * per_count).sum(axis=1)


def fit_saturation(counts: Sequence[int] | np.ndarray, systems: int) -> tuple[float, float]:
    """(total, half) of the Michaelis-Menten curve fitted to the expected curve; raises
    RuntimeError (scipy's) when the fit does not converge."""
    from scipy.optimize import OptimizeWarning, curve_fit

    curve = expected_curve(counts, systems)
    m = np.arange(1, systems + 1, dtype=float)
    if curve[-1] <= 0:
        raise RuntimeError("no relevant chunk to fit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        (total, half), _ = curve_fit(michaelis_menten, m, curve, p0=[2.0 * curve[-1], float(systems)],
                                     bounds=([0.0, 0.0], [np.inf, np.inf]), maxfev=20_000)
    return float(total), float(half)


def simulate_counts(rng: np.random.Generator, total: float, half: float, systems: int) -> tuple[np.ndarray, int]:
    """A pool drawn from the model: round(total) chunks, hazard ~ exponential(mean 1 / half),
    each surfaced by Binomial(systems, 1 - exp(-hazard)) systems. Returns the counts of the
    surfaced chunks and how many no system surfaced."""
    chunks = int(round(total))
    hazard = rng.exponential(1.0 / max(half, 1e-12), chunks)
    counts = rng.binomial(systems, -np.expm1(-hazard))
    return counts[counts > 0], int((counts == 0).sum())


@dataclass(frozen=True)
class Extrapolation:
    in_pool: int
    systems: int
    outside: float | None = None   # the estimate of relevant chunks outside the pool
    low: float | None = None
    high: float | None = None
    total: float | None = None
    half: float | None = None
    resamples: int | None = None   # bootstrap pools refitted: the interval rests on these
    note: str | None = None        # why there is no estimate (None: meaningful)

    @property
    def meaningful(self) -> bool:
        return self.note is None


def extrapolate(counts: Sequence[int], systems: int, *, resamples: int = RESAMPLES, seed: int = 0,
                level: float = LEVEL, min_systems: int = MIN_SYSTEMS) -> Extrapolation:
    """The fitted extrapolation of the relevant chunks outside the pool with its interval, or
    a note saying why it is not meaningful (module doc)."""
    pool_counts = np.asarray(counts, dtype=np.int64)
    in_pool = int(pool_counts.size)
    if systems < min_systems:
        return Extrapolation(in_pool, systems, note=f"{systems} system(s): the extrapolation needs at least "
                                                    f"{min_systems} to tell a levelling curve from a straight line")
    if in_pool == 0:
        return Extrapolation(in_pool, systems, note="no relevant chunk in the pool")
    try:
        total, half = fit_saturation(pool_counts, systems)
    except (RuntimeError, ValueError) as error:
        return Extrapolation(in_pool, systems, note=f"the saturation curve did not fit ({error})")
    outside = max(total - in_pool, 0.0)
    if outside > SATURATION_FACTOR * in_pool:  # before drawing pools of that size
        return _not_levelling(in_pool, systems, outside, None, None, total, half)
    rng = np.random.default_rng(seed)
    errors = []
    for _ in range(resamples):
        drawn, truly_outside = simulate_counts(rng, total, half, systems)
        if drawn.size == 0:
            continue
        try:
            drawn_total, _ = fit_saturation(drawn, systems)
        except (RuntimeError, ValueError):
            continue
        errors.append(max(drawn_total - drawn.size, 0.0) - truly_outside)
    if len(errors) < MIN_FITTED_SHARE * resamples:
        return Extrapolation(in_pool, systems, total=total, half=half, resamples=len(errors),
                             note=f"the saturation curve refitted only {len(errors)} of {resamples} pools drawn "
                                  f"from it: no reliable interval")
    tail = (1.0 - level) / 2
    low = max(outside - float(np.quantile(errors, 1.0 - tail)), 0.0)
    high = max(outside - float(np.quantile(errors, tail)), 0.0)
    if high > SATURATION_FACTOR * in_pool:
        return _not_levelling(in_pool, systems, outside, low, high, total, half)
    return Extrapolation(in_pool, systems, outside, low, high, total, half, resamples=len(errors))


def _not_levelling(in_pool: int, systems: int, outside: float, low: float | None, high: float | None,
                   total: float, half: float) -> Extrapolation:
    return Extrapolation(in_pool, systems, outside, low, high, total, half,
                         note=f"the curve does not level off yet (up to {max(high or 0.0, outside):.0f} more "
                              f"relevant chunks, over {SATURATION_FACTOR:g}x the {in_pool} in the pool): more "
                              f"systems are needed before an estimate means anything")


def coverage_rows(found_by: Sequence[Sequence[str]], systems: Sequence[str], *, known_outside: int, orders: int,
                  seed: int, resamples: int = RESAMPLES, min_systems: int = MIN_SYSTEMS) -> pl.DataFrame:
    """The rows of one qrels version: `found_by` lists, per relevant chunk of the pool, the
    systems that surfaced it (of `systems`); `known_outside`: relevant judgments no system
    surfaced."""
    n = len(systems)
    curves = np.array([holes_found_curve(found_by, order) for order in system_orders(systems, orders, seed)])
    rows = []
    for m in range(1, n + 1):
        column = curves[:, m - 1]
        low, high = np.quantile(column, BAND)
        rows.append({"statistic": "relevant_found", "systems_added": m, "value": float(column.mean()),
                     "std": float(column.std()), "low": float(low), "high": float(high), "orders": orders})
    known = set(systems)
    counts = [len(set(chunk) & known) for chunk in found_by]
    result = extrapolate([c for c in counts if c > 0], n, resamples=resamples, seed=seed, min_systems=min_systems)
    rows.append({"statistic": "in_pool", "value": float(result.in_pool)})
    rows.append({"statistic": "known_outside_pool", "value": float(known_outside)})
    rows.append({"statistic": "outside_pool_estimate", "value": result.outside if result.meaningful else None,
                 "low": result.low if result.meaningful else None,
                 "high": result.high if result.meaningful else None, "resamples": result.resamples,
                 "note": result.note})
    if result.meaningful:
        total, half, low, high = result.total, result.half, result.low, result.high
        assert total is not None and half is not None and low is not None and high is not None  # meaningful
        rows.append({"statistic": "total_estimate", "value": total, "low": result.in_pool + low,
                     "high": result.in_pool + high})
        rows.append({"statistic": "half_saturation", "value": half})
        for m in range(1, EXTRAPOLATE_TO * n + 1):
            rows.append({"statistic": "fitted", "systems_added": m, "value": float(michaelis_menten(m, total, half))})
    schema = {k: v for k, v in COVERAGE_SCHEMA.items() if k not in ("dataset", "qrels_version")}
    return pl.DataFrame([{k: row.get(k) for k in schema} for row in rows], schema=schema)


def compute_pool_coverage(con: duckdb.DuckDBPyConnection, dataset: str, *, orders: int = 20, seed: int = 0,
                          resamples: int = RESAMPLES, min_systems: int = MIN_SYSTEMS,
                          scope: Scope = "pooled") -> tuple[pl.DataFrame, ScopeInfo]:
    """Rows of the pool_coverage table for `dataset` (both bounds over pending pairs) and the scope."""
    if orders < 1:
        raise ValueError(f"pool_coverage needs at least one order, got {orders}")
    require_rows(con, "candidate_pool", dataset, "pool_coverage")
    with analysis_views(con, dataset, scope, asset="pool_coverage") as info:
        relevant = con.execute(read_sql("pool_coverage")).pl()
    pooled = relevant.filter(pl.col("systems").is_not_null())
    systems = sorted({s for found in pooled["systems"] for s in found} | set(info.retrievers))
    frames = []
    for version in REFINED_BOUNDS:
        rows = relevant.filter(pl.col("qrels_version") == version)
        in_pool = rows.filter(pl.col("systems").is_not_null())
        frames.append(coverage_rows(in_pool["systems"].to_list(), systems,
                                    known_outside=rows.height - in_pool.height, orders=orders, seed=seed,
                                    resamples=resamples, min_systems=min_systems)
                      .with_columns(pl.lit(version).alias("qrels_version")))
    frame = pl.concat(frames).with_columns(pl.lit(dataset).alias("dataset"))
    return frame.select(list(COVERAGE_SCHEMA)).cast(COVERAGE_SCHEMA), info  # type: ignore[arg-type]  # see qrels/merge.py
