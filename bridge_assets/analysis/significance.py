"""`significance`: which differences between systems are significant, on the original and on the
refined qrels.

For every pair of systems, per measure and qrels version, two two-sided paired tests over the
per-query values of retrieval_metrics (the queries where both systems have a value;
sql/significance.sql): Student's paired t-test (scipy.stats.ttest_rel) and a randomization
test that swaps the two systems' values query by query (scipy.stats.permutation_test,
permutation_type='samples', statistic: the mean difference a - b; exact when 2^queries is at
most the number of resamples). p-values are Holm-Bonferroni corrected
(statsmodels' multipletests) over all system pairs of one (measure, qrels version, test).

The anchor is ranx's `compare` (same two tests, two-sided, every unordered pair once); unlike
it, p-values are corrected for the number of pairs, alpha is 0.05 rather than 0.01, and the
randomization p-value is scipy's (the observed arrangement counted among the resamples, two
sides as twice the smaller one-sided p-value) rather than the share of permutations with an
absolute difference at least the observed one. docs/metrics.md, "Significance".
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl
from scipy import stats
from statsmodels.stats.multitest import multipletests

from bridge_assets.analysis.retrieval import QRELS_VERSIONS
from bridge_assets.analysis.views import MissingInput, require_rows
from bridge_assets.paths import read_sql

DEFAULT_MEASURES = ("ndcg_cut_10", "success_10", "recall_10", "recip_rank_cut_10")
TESTS = ("paired_t", "randomization")
ALPHA = 0.05
RESAMPLES = 10_000
# Values held at once by one vectorized batch of resamples (resamples x queries): bounds the
# memory of a randomization test at a few hundred MB whatever the number of queries.
BATCH_VALUES = 10_000_000
FAMILY = ("measure", "qrels_version", "test")  # Holm corrects over the system pairs of each
SIGNIFICANCE_SCHEMA = {
    "dataset": pl.Utf8, "measure": pl.Utf8, "qrels_version": pl.Utf8, "system_a": pl.Utf8,
    "system_b": pl.Utf8, "queries": pl.Int32, "mean_a": pl.Float64, "mean_b": pl.Float64,
    "test": pl.Utf8, "statistic": pl.Float64, "p_value": pl.Float64, "p_holm": pl.Float64,
    "significant": pl.Boolean,
}


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    """The randomization test's statistic: mean of a - b over the queries."""
    return np.mean(x - y, axis=axis)


def paired_tests(a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES,
                 seed: int = 0) -> dict[str, tuple[float, float]]:
    """Two-sided paired tests of `a` against `b` (one value per query, same order): test name ->
    (statistic, p-value). The t-test is undefined (NaN) with one query or identical values."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with warnings.catch_warnings():  # scipy warns on (near-)constant differences; its answer stands
        warnings.simplefilter("ignore", RuntimeWarning)
        t_test = stats.ttest_rel(a, b)
    randomization = stats.permutation_test(
        (a, b), mean_difference, permutation_type="samples", vectorized=True, n_resamples=resamples,
        batch=max(1, BATCH_VALUES // max(len(a), 1)), alternative="two-sided", rng=seed)
    return {"paired_t": (float(t_test.statistic), float(t_test.pvalue)),
            "randomization": (float(randomization.statistic), float(randomization.pvalue))}


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values. An undefined p-value (NaN) stays undefined but counts
    in the family as 1, so the family is every system pair whatever the data."""
    p = np.asarray(p_values, dtype=float)
    undefined = np.isnan(p)
    adjusted = multipletests(np.where(undefined, 1.0, p), method="holm")[1]
    return np.where(undefined, np.nan, adjusted)


def _require_values(con: duckdb.DuckDBPyConnection, dataset: str, measures: Sequence[str],
                    qrels_versions: Sequence[str]) -> None:
    """Fail naming the measures or qrels versions retrieval_metrics does not hold (another k?)."""
    stored = con.execute("select list(distinct measure), list(distinct qrels_version) from retrieval_metrics "
                         "where dataset = ?", [dataset]).fetchone()
    for kind, asked, present in (("measures", measures, stored[0]), ("qrels versions", qrels_versions, stored[1])):
        absent = sorted(set(asked) - set(present))
        if absent:
            raise MissingInput(f"significance for dataset '{dataset}': retrieval_metrics holds no {kind} "
                               f"{absent} (it holds {sorted(present)}); set significance's {kind} or "
                               f"rematerialize retrieval_metrics")


def compute_significance(con: duckdb.DuckDBPyConnection, dataset: str, *,
                         measures: Sequence[str] = DEFAULT_MEASURES,
                         qrels_versions: Sequence[str] = QRELS_VERSIONS, resamples: int = RESAMPLES,
                         seed: int = 0, alpha: float = ALPHA) -> pl.DataFrame:
    """Rows of the significance table: one per (measure, qrels version, system pair, test)."""
    require_rows(con, "retrieval_metrics", dataset, "significance")
    _require_values(con, dataset, measures, qrels_versions)
    pairs = con.execute(read_sql("significance"), {"dataset": dataset, "measures": list(measures),
                                                   "versions": list(qrels_versions)}).pl()
    rows = []
    for pair in pairs.iter_rows(named=True):
        a, b = pair["values_a"], pair["values_b"]
        for test, (statistic, p_value) in paired_tests(a, b, resamples=resamples, seed=seed).items():
            rows.append({"measure": pair["measure"], "qrels_version": pair["qrels_version"],
                         "system_a": pair["system_a"], "system_b": pair["system_b"], "queries": len(a),
                         "mean_a": float(np.mean(a)), "mean_b": float(np.mean(b)), "test": test,
                         "statistic": statistic, "p_value": p_value})
    frame = pl.DataFrame(rows, schema={k: v for k, v in SIGNIFICANCE_SCHEMA.items()
                                       if k not in ("dataset", "p_holm", "significant")})
    families = [family.with_columns(p_holm=pl.Series(holm(family["p_value"].to_numpy()), dtype=pl.Float64))
                for family in frame.partition_by(list(FAMILY), maintain_order=True)]
    frame = pl.concat(families) if families else frame.with_columns(p_holm=pl.lit(None, pl.Float64))
    frame = frame.with_columns(pl.lit(dataset).alias("dataset"),
                               pl.col("statistic", "p_value", "p_holm").fill_nan(None))
    return frame.with_columns((pl.col("p_holm") <= alpha).fill_null(False).alias("significant")) \
        .select(list(SIGNIFICANCE_SCHEMA)).cast(SIGNIFICANCE_SCHEMA).sort(*FAMILY, "system_a", "system_b")
