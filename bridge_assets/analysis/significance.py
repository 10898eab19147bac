"""`significance`: which differences between systems are significant, on the original and on the
refined qrels.

For every pair of systems, per measure and qrels version, two two-sided paired tests over the
per-query values of retrieval_metrics (the queries where both systems have a value;
sql/significance.sql): Student's paired t-test (scipy.stats.ttest_rel) and a randomization
test that swaps the two systems' values query by query (statistic: the mean difference a - b).
p-values are Holm-Bonferroni corrected over all system pairs of one (measure, qrels version,
test): the step-down written out in numpy (`holm`), equal to statsmodels' multipletests(method=
'holm') (tested), whose holm branch runs a full gc.collect() on every call: 0.3-0.5 s each in a
pipeline process holding Dagster and torch, 24 calls and 11-15 s of the asset on the demo.

The randomization test is computed here, not by scipy.stats.permutation_test, for scale: at the
paper's shape (25 systems, so 300 pairs, x 4 measures x 3 qrels versions: 3,600 tests over 3,657
queries) scipy's 10,000 resamples took about 2 s per pair, hours for the asset (now well under a
minute: docs/scale.md). Swapping a and b on a query flips
the sign of its difference d = a - b, so the test is a sign-flip test on the mean of d: all
pairs with the same number of queries n share ONE matrix of signs S (resamples x n, +-1), drawn
from np.random.default_rng(seed) (one uniform per sign, so the draws do not depend on how they
are chunked) or, when 2^n is at most the number of resamples, all 2^n sign vectors (exact); their
null distributions are S @ D / n, one BLAS product per chunk of S (D: n x pairs), and only the
counts are kept. Every convention is scipy's permutation_test(permutation_type='samples'): the
observed statistic np.mean(a - b); ties within |100 eps * observed|; exact: share of the 2^n
arrangements, random: the observed arrangement counted among the resamples (count + 1) /
(resamples + 1); two-sided = min(2 * min(p_less, p_greater), 1). A pair's p-value depends only
on its values (in query order), the seed and `resamples`, not on the other pairs; unlike scipy,
one query is allowed (p = 1). tests/test_analysis_significance.py checks it against scipy: equal
when exact, within Monte-Carlo error otherwise.

The anchor is ranx's `compare` (same two tests, two-sided, every unordered pair once); unlike
it, p-values are corrected for the number of pairs, alpha is 0.05 rather than 0.01, and the
randomization p-value follows scipy (the observed arrangement counted among the resamples, two
sides as twice the smaller one-sided p-value) rather than the share of permutations with an
absolute difference at least the observed one. docs/metrics.md, "Significance".

Concordance (D-MERIT: do two qrels lead to the same conclusions?): each pair's conclusion on a
qrels version is 'a' or 'b' (significantly better, at alpha after Holm) or 'none' (no
significant difference; ties and undefined p-values included), and each refined row (both
bounds over pending pairs: refined, refined_upper) says whether it agrees with the original
qrels' conclusion. `concordance` is the share of the system pairs of a (measure, qrels version,
test) that agree, pairs significant on neither side counting as agreeing; `concordance_significant`
the same share over the pairs significant on at least one side. sql/significance_concordance.sql
defines them; docs/metrics.md, "Concordance".
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import duckdb
import numpy as np
import polars as pl

from bridge_assets.analysis.retrieval import QRELS_VERSIONS
from bridge_assets.analysis.views import MissingInput, require_rows
from bridge_assets.lake.store import one_row
from bridge_assets.paths import read_sql

DEFAULT_MEASURES = ("ndcg_cut_10", "success_10", "recall_10", "recip_rank_cut_10")
TESTS = ("paired_t", "randomization")
ALPHA = 0.05
RESAMPLES = 10_000
# Values held at once by one chunk of the randomization test (signs: resamples x queries, null
# values: resamples x pairs): bounds its memory at a few hundred MB whatever the shape.
BATCH_VALUES = 10_000_000
FAMILY = ("measure", "qrels_version", "test")  # Holm corrects over the system pairs of each
SIGNIFICANCE_SCHEMA = {
    "dataset": pl.Utf8, "measure": pl.Utf8, "qrels_version": pl.Utf8, "system_a": pl.Utf8,
    "system_b": pl.Utf8, "queries": pl.Int32, "mean_a": pl.Float64, "mean_b": pl.Float64,
    "test": pl.Utf8, "statistic": pl.Float64, "p_value": pl.Float64, "p_holm": pl.Float64,
    "significant": pl.Boolean, "conclusion": pl.Utf8, "agrees_with_original": pl.Boolean,
    "concordance": pl.Float64, "concordance_significant": pl.Float64,
}
CONCORDANCE_COLUMNS = ("conclusion", "agrees_with_original", "concordance", "concordance_significant")
CONCLUSIONS = ("a", "b", "none")  # system_a / system_b significantly better, or no significant difference
# scipy.stats.permutation_test's relative tolerance for null values equal to the observed one
_TIES = np.finfo(np.float64).eps * 100


def _sign_chunks(n: int, resamples: int, seed: int, rows: int) -> tuple[bool, int, Iterator[np.ndarray]]:
    """(exact, count, chunks of the sign matrix): all 2^n sign vectors when 2^n <= resamples
    (scipy's exact case), else `resamples` random ones from default_rng(seed), one uniform draw
    per sign so that the signs do not depend on `rows` (the chunk height)."""
    if 2 ** n <= resamples:
        total = 2 ** n
        bits = np.arange(n, dtype=np.int64)

        def every_sign_vector() -> Iterator[np.ndarray]:
            for start in range(0, total, rows):
                index = np.arange(start, min(start + rows, total), dtype=np.int64)
                yield 1.0 - 2.0 * ((index[:, None] >> bits) & 1)
        return True, total, every_sign_vector()

    rng = np.random.default_rng(seed)

    def drawn_sign_vectors() -> Iterator[np.ndarray]:
        for start in range(0, resamples, rows):
            signs = rng.random((min(rows, resamples - start), n))
            signs *= 2  # in place throughout: one array of the chunk's size
            np.floor(signs, out=signs)  # uniform < 0.5 -> 0, else 1
            signs *= -2
            signs += 1  # 0 -> +1, 1 -> -1
            yield signs
    return False, resamples, drawn_sign_vectors()


def randomization_tests(differences: np.ndarray, *, resamples: int = RESAMPLES, seed: int = 0,
                        batch_values: int = BATCH_VALUES) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided paired randomization (sign-flip) tests of the mean difference, for many pairs
    with the same number of queries at once: `differences` is pairs x queries (a - b per query).
    Returns (observed mean differences, p-values), one per pair, as scipy.stats.permutation_test(
    (a, b), mean(a - b), permutation_type='samples', n_resamples=resamples) defines them; every
    pair is tested against the same signs, so its p-value is the one it gets alone."""
    d = np.ascontiguousarray(differences, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"differences must be pairs x queries, got shape {d.shape}")
    pairs, n = d.shape
    observed = np.mean(d, axis=1)  # scipy's statistic, summed as np.mean sums one pair's values
    if pairs == 0 or n == 0:
        return observed, np.full(pairs, np.nan)
    gamma = np.abs(_TIES * observed)
    rows = max(1, batch_values // max(n, pairs))
    exact, total, chunks = _sign_chunks(n, resamples, seed, rows)
    upper, lower = observed + gamma, observed - gamma
    at_most = np.zeros(pairs, dtype=np.int64)  # null values <= observed (+ ties)
    at_least = np.zeros(pairs, dtype=np.int64)  # null values >= observed (- ties)
    for signs in chunks:
        null = signs @ d.T
        null /= n
        at_most += np.count_nonzero(null <= upper, axis=0)
        at_least += np.count_nonzero(null >= lower, axis=0)
    adjustment = 0 if exact else 1
    p_less = (at_most + adjustment) / (total + adjustment)
    p_greater = (at_least + adjustment) / (total + adjustment)
    return observed, np.clip(2 * np.minimum(p_less, p_greater), 0.0, 1.0)


def paired_tests_many(a: np.ndarray, b: np.ndarray, *, resamples: int = RESAMPLES, seed: int = 0,
                      batch_values: int = BATCH_VALUES) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Both two-sided paired tests for many pairs with the same number of queries: `a` and `b`
    are pairs x queries. Test name -> (statistics, p-values), one per pair."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with warnings.catch_warnings():  # scipy warns on (near-)constant differences; its answer stands
        warnings.simplefilter("ignore", RuntimeWarning)
        t_test = stats.ttest_rel(a, b, axis=1)
    randomization = randomization_tests(a - b, resamples=resamples, seed=seed, batch_values=batch_values)
    return {"paired_t": (np.atleast_1d(np.asarray(t_test.statistic, dtype=np.float64)),
                         np.atleast_1d(np.asarray(t_test.pvalue, dtype=np.float64))),
            "randomization": randomization}


def paired_tests(a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES,
                 seed: int = 0) -> dict[str, tuple[float, float]]:
    """Two-sided paired tests of `a` against `b` (one value per query, same order): test name ->
    (statistic, p-value). The t-test is undefined (NaN) with one query or identical values."""
    tests = paired_tests_many(np.asarray(a, dtype=np.float64)[None, :], np.asarray(b, dtype=np.float64)[None, :],
                              resamples=resamples, seed=seed)
    return {test: (float(statistics[0]), float(p_values[0])) for test, (statistics, p_values) in tests.items()}


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values. An undefined p-value (NaN) stays undefined but counts
    in the family as 1, so the family is every system pair whatever the data."""
    p = np.asarray(p_values, dtype=float)
    undefined = np.isnan(p)
    p = np.where(undefined, 1.0, p)
    # the i-th smallest times (m - i), then the running maximum (step-down), capped at 1; tied
    # p-values get the same value whatever their order
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1)), 1.0)
    return np.where(undefined, np.nan, adjusted)


def _require_values(con: duckdb.DuckDBPyConnection, dataset: str, measures: Sequence[str],
                    qrels_versions: Sequence[str]) -> None:
    """Fail naming the measures or qrels versions retrieval_metrics does not hold (another k?)."""
    stored = one_row(con, "select list(distinct measure), list(distinct qrels_version) from retrieval_metrics "
                     "where dataset = ?", [dataset])
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
    """Rows of the significance table: one per (measure, qrels version, system pair, test). The
    pairs with the same number of shared queries, over all measures and qrels versions, are
    tested together (paired_tests_many)."""
    require_rows(con, "retrieval_metrics", dataset, "significance")
    _require_values(con, dataset, measures, qrels_versions)
    pairs = con.execute(read_sql("significance"), {"dataset": dataset, "measures": list(measures),
                                                   "versions": list(qrels_versions)}).pl()
    queries = pairs["values_a"].list.len().to_numpy().astype(np.int64)
    means = {side: np.full(pairs.height, np.nan) for side in ("a", "b")}
    results = {test: (np.full(pairs.height, np.nan), np.full(pairs.height, np.nan)) for test in TESTS}
    for n in map(int, np.unique(queries)):
        index = np.flatnonzero(queries == n)
        group = pairs[index]
        values = {side: np.ascontiguousarray(group[f"values_{side}"].list.to_array(n).to_numpy(), dtype=np.float64)
                  for side in ("a", "b")}
        for side, block in values.items():
            means[side][index] = np.mean(block, axis=1)
        for test, (statistics, p_values) in paired_tests_many(values["a"], values["b"], resamples=resamples,
                                                              seed=seed).items():
            results[test][0][index], results[test][1][index] = statistics, p_values
    keys = pairs.select("measure", "qrels_version", "system_a", "system_b").with_columns(
        queries=pl.Series(queries, dtype=pl.Int32), mean_a=pl.Series(means["a"]), mean_b=pl.Series(means["b"]))
    frame = pl.concat([keys.with_columns(test=pl.lit(test), statistic=pl.Series(results[test][0]),
                                         p_value=pl.Series(results[test][1]))
                       for test in TESTS]).select(
        [k for k in SIGNIFICANCE_SCHEMA if k not in ("dataset", "p_holm", "significant", *CONCORDANCE_COLUMNS)])
    families = [family.with_columns(p_holm=pl.Series(holm(family["p_value"].to_numpy()), dtype=pl.Float64))
                for family in frame.partition_by(list(FAMILY), maintain_order=True)]
    frame = pl.concat(families) if families else frame.with_columns(p_holm=pl.lit(None, pl.Float64))
    frame = frame.with_columns(pl.lit(dataset).alias("dataset"),
                               pl.col("statistic", "p_value", "p_holm").fill_nan(None))
    frame = frame.with_columns((pl.col("p_holm") <= alpha).fill_null(False).alias("significant"))
    return with_concordance(frame).sort(*FAMILY, "system_a", "system_b")


def with_concordance(tested: pl.DataFrame) -> pl.DataFrame:
    """`tested` (significance rows up to `significant`) with each pair's conclusion and its
    concordance with the original qrels (sql/significance_concordance.sql)."""
    con = duckdb.connect()
    try:
        con.register("tested_pairs", tested.to_arrow())
        frame = con.execute(read_sql("significance_concordance")).pl()
    finally:
        con.close()
    return frame.select(list(SIGNIFICANCE_SCHEMA)).cast(SIGNIFICANCE_SCHEMA)  # type: ignore[arg-type]  # see qrels/merge.py


def concordance_summary(significance: pl.DataFrame) -> pl.DataFrame:
    """Per (measure, refined qrels version, test): the system pairs compared with the original
    qrels, how many agree, how many are significant on at least one side, and the two
    concordances (one row per family of the significance table; original rows left out)."""
    compared = significance.filter(pl.col("agrees_with_original").is_not_null())
    return (compared.group_by("measure", "qrels_version", "test", maintain_order=True)
            .agg(pl.len().alias("pairs"), pl.col("agrees_with_original").sum().alias("agree"),
                 # a conclusion on the refined side, or a disagreement: one on the original side
                 ((pl.col("conclusion") != "none") | ~pl.col("agrees_with_original")).sum()
                 .alias("significant_either"),
                 pl.col("concordance").first(), pl.col("concordance_significant").first())
            .sort("measure", "qrels_version", "test"))
