"""significance: paired t-test and randomization test between every pair of systems, Holm-corrected
over the pairs, on the original and the refined qrels. p-values checked against scipy called
directly: equal where the randomization test is exact (and an exact enumeration of the query-wise
swaps), within Monte-Carlo error of scipy's where it draws random swaps (our own shared sign
matrix, not scipy's draws); many pairs at once, in any chunks, as one at a time; Holm against a
hand computation; the asset on the small labeled lake of fixtures.labeled_lake; the report section's
verdicts."""

from __future__ import annotations

import itertools
import math

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest
from scipy import stats

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.significance import (
    SIGNIFICANCE_SCHEMA,
    compute_significance,
    holm,
    paired_tests,
    paired_tests_many,
    randomization_tests,
)
from bridge_assets.analysis.views import MissingInput
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports.system_sections import significance_section
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources

# A hand-made per-query table: three systems, six queries, one measure.
VALUES = {"alpha": [0.9, 0.8, 0.7, 1.0, 0.6, 0.9],
          "beta": [0.5, 0.6, 0.4, 0.7, 0.2, 0.5],
          "gamma": [0.8, 0.9, 0.6, 0.9, 0.7, 0.8]}


def metrics_table(values: dict[str, list[float]], *, version: str = "original",
                  measure: str = "ndcg_cut_10") -> pl.DataFrame:
    rows = [("toy", system, version, f"q{i}", measure, value)
            for system, per_query in values.items() for i, value in enumerate(per_query)]
    rows += [("toy", system, version, "all", measure, float(np.mean(per_query)))
             for system, per_query in values.items()]
    return pl.DataFrame(rows, schema=["dataset", "retriever", "qrels_version", "query_id", "measure", "value"],
                        orient="row")


def connection(*frames: pl.DataFrame) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    metrics = pl.concat(frames)  # noqa: F841  (read by DuckDB below)
    con.execute("create table retrieval_metrics as select * from metrics")
    return con


def mean_difference(x, y, axis):
    return np.mean(x - y, axis=axis)


def scipy_randomization(a, b, resamples, rng=0):
    return stats.permutation_test((np.asarray(a, dtype=float), np.asarray(b, dtype=float)), mean_difference,
                                  vectorized=True, permutation_type="samples", n_resamples=resamples, rng=rng)


def test_p_values_equal_scipys_on_a_hand_made_example():
    con = connection(metrics_table(VALUES))
    frame = compute_significance(con, "toy", measures=["ndcg_cut_10"], qrels_versions=["original"])
    assert frame.schema == pl.Schema(SIGNIFICANCE_SCHEMA)
    assert frame.select("system_a", "system_b").unique(maintain_order=True).rows() == \
        [("alpha", "beta"), ("alpha", "gamma"), ("beta", "gamma")]
    assert frame.height == 3 * 2
    for row in frame.iter_rows(named=True):
        a, b = VALUES[row["system_a"]], VALUES[row["system_b"]]
        assert row["queries"] == 6 and row["mean_a"] == pytest.approx(np.mean(a))
        if row["test"] == "paired_t":
            expected = stats.ttest_rel(a, b)
        else:  # 2^6 swaps, fewer than 10,000 resamples: exact, scipy's draws play no part
            expected = scipy_randomization(a, b, 10_000)
        assert row["statistic"] == pytest.approx(expected.statistic, rel=1e-12)
        assert row["p_value"] == pytest.approx(expected.pvalue, rel=1e-12)
    # alpha beats beta on every query: t = mean(d) / (sd(d) / sqrt(n)), by hand
    d = np.subtract(VALUES["alpha"], VALUES["beta"])
    t = frame.filter((pl.col("system_b") == "beta") & (pl.col("system_a") == "alpha")
                     & (pl.col("test") == "paired_t"))["statistic"][0]
    assert t == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))


def test_randomization_is_exact_when_the_swaps_are_few():
    """2^6 = 64 ways to swap the two systems' values query by query, all enumerated: the share
    whose mean difference is at least as extreme as the observed one is the p-value."""
    a, b = np.array(VALUES["alpha"]), np.array(VALUES["gamma"])
    d = a - b
    observed = abs(d.mean())
    means = [abs(np.mean(d * signs)) for signs in itertools.product((1, -1), repeat=len(d))]
    exact = sum(m >= observed - 1e-12 for m in means) / len(means)
    assert paired_tests(a, b, resamples=10_000, seed=0)["randomization"][1] == pytest.approx(exact)
    assert paired_tests(a, b, resamples=10_000, seed=99)["randomization"][1] == pytest.approx(exact)


def pair(rng: np.random.Generator, n: int, effect: float, *, decimals: int | None = None):
    """Two systems' per-query values in [0, 1], b about `effect` below a; rounded: ties and zeros."""
    a = np.clip(rng.uniform(0.0, 1.0, n), 0, 1)
    b = np.clip(a - effect + rng.normal(0.0, 0.25, n), 0, 1)
    return (a, b) if decimals is None else (np.round(a, decimals), np.round(b, decimals))


def test_randomization_equals_scipys_exact_test_when_the_swaps_are_few():
    """2^n <= resamples: all 2^n sign vectors, no adjustment, scipy's tolerance for ties."""
    rng = np.random.default_rng(7)
    cases = [pair(rng, n, effect, decimals=1) for n in (2, 5, 9, 13) for effect in (0.0, 0.3)]
    cases += [(np.array(v), np.array(v)) for v in ([0.2, 0.7, 0.7], [0.0] * 8)]  # identical systems
    cases += [(np.array([1, 1, 0.5, 1, 0, 1]), np.array([0.5, 1, 0.5, 0.5, 0.5, 0]))]  # exact ties on 0
    cases += [(np.array([0.3, 0.1, 0.6, 0.9]), np.array([0.1, 0.3, 0.9, 0.6]))]  # mean difference 0
    for a, b in cases:
        expected = scipy_randomization(a, b, 10_000)
        statistic, p_value = paired_tests(a, b, resamples=10_000, seed=5)["randomization"]
        assert statistic == pytest.approx(float(expected.statistic), rel=1e-12, abs=1e-15), (a, b)
        assert p_value == pytest.approx(float(expected.pvalue), rel=1e-12), (a, b)
    same = paired_tests([0.2, 0.7, 0.7], [0.2, 0.7, 0.7])["randomization"]
    assert same == (0.0, 1.0)
    # one query (scipy refuses it): the two signs give +-d, so p = 1
    assert paired_tests([0.9], [0.2])["randomization"] == (pytest.approx(0.7), 1.0)
    # exact up to 2^n = resamples, random from one fewer (scipy's threshold): a p-value on 1/1024
    a, b = pair(rng, 10, 0.2, decimals=2)
    exact = scipy_randomization(a, b, 1024).pvalue
    assert paired_tests(a, b, resamples=1024)["randomization"][1] == pytest.approx(exact, rel=1e-12)
    assert (exact * 1024) % 1 == pytest.approx(0) and paired_tests(a, b, resamples=1023)["randomization"][1] != exact


@pytest.mark.parametrize(("n", "effect", "decimals"), [(30, 0.0, None), (80, 0.0, 1), (60, 0.2, None),
                                                     (200, 0.06, 2)])
def test_random_randomization_is_within_monte_carlo_error_of_scipys(n, effect, decimals):
    """2^n > resamples: our own random signs (200,000, in several chunks) against scipy's 100,000
    random swaps. The tolerance is 4 standard errors of the difference of the two estimates (under
    0.015 here), below what a wrong convention would move (one-sided, a wrong tie rule on the
    rounded values, a - b vs b - a on some queries)."""
    a, b = pair(np.random.default_rng(n), n, effect, decimals=decimals)
    statistic, ours = paired_tests(a, b, resamples=200_000, seed=0)["randomization"]
    expected = scipy_randomization(a, b, 100_000, rng=1)
    assert statistic == pytest.approx(float(expected.statistic), rel=1e-12)
    one_sided = min(max(float(expected.pvalue), ours) / 2, 0.5)
    tolerance = 4 * 2 * math.sqrt(one_sided * (1 - one_sided) * (1 / 200_000 + 1 / 100_000)) + 1e-4
    assert abs(ours - expected.pvalue) < tolerance, (ours, expected.pvalue, tolerance)
    if effect:  # a real effect: small p
        assert ours < 0.01 and expected.pvalue < 0.01
    else:
        assert ours > 0.05 and expected.pvalue > 0.05


def test_random_randomization_extremes_equal_scipys():
    """Where no random draw can matter the two are equal: a beats b on every query by the same
    margin (only the all-plus signs reach it: p = 2 / (resamples + 1), the observed arrangement
    counted), identical systems (every resample ties: p = 1)."""
    a = np.linspace(0.0, 0.8, 40)
    assert paired_tests(a + 0.2, a, resamples=500)["randomization"][1] == \
        scipy_randomization(a + 0.2, a, 500).pvalue == 2 / 501
    assert paired_tests(a, a, resamples=500)["randomization"] == (0.0, 1.0) == \
        (0.0, float(scipy_randomization(a, a, 500).pvalue))


def test_many_pairs_at_once_equal_one_at_a_time_in_any_chunks():
    """One shared sign matrix: a pair's p-value does not depend on the other pairs tested with it,
    nor on how the resamples are chunked."""
    rng = np.random.default_rng(11)
    for n, resamples in ((40, 2_000), (7, 10_000)):  # random, exact
        cases = [pair(rng, n, effect, decimals=2) for effect in (0.0, 0.0, 0.05, 0.1, 0.3)]
        cases.append((cases[0][0], cases[0][0]))  # identical systems
        a, b = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
        together = paired_tests_many(a, b, resamples=resamples, seed=4)
        for batch_values in (1, 3 * n + 1, 10_000_000):  # one resample per chunk, a few, all
            chunked = randomization_tests(a - b, resamples=resamples, seed=4, batch_values=batch_values)
            assert np.array_equal(chunked[1], together["randomization"][1]), (n, batch_values)
        for i, (x, y) in enumerate(cases):
            alone = paired_tests(x, y, resamples=resamples, seed=4)
            assert alone["randomization"] == (together["randomization"][0][i], together["randomization"][1][i])
            t_test = stats.ttest_rel(x, y) if i < len(cases) - 1 else None
            if t_test is not None:
                assert together["paired_t"][0][i] == pytest.approx(t_test.statistic, rel=1e-12)
                assert together["paired_t"][1][i] == pytest.approx(t_test.pvalue, rel=1e-12)
                assert alone["paired_t"][1] == pytest.approx(t_test.pvalue, rel=1e-12)
        assert math.isnan(together["paired_t"][1][-1]) and together["randomization"][1][-1] == 1.0
    # through the table: every pair of four systems on 40 queries, as paired_tests gives it alone
    values = {f"s{i}": list(np.round(rng.uniform(0, 1, 40), 2)) for i in range(4)}
    frame = compute_significance(connection(metrics_table(values)), "toy", measures=["ndcg_cut_10"],
                                 qrels_versions=["original"], resamples=2_000, seed=4)
    assert frame.height == 6 * 2
    order = sorted(range(40), key=lambda i: f"q{i}")  # the queries in query_id order, as paired
    for row in frame.iter_rows(named=True):
        a, b = (np.array(values[row[side]])[order] for side in ("system_a", "system_b"))
        alone = paired_tests(a, b, resamples=2_000, seed=4)
        assert (row["statistic"], row["p_value"]) == pytest.approx(alone[row["test"]], rel=1e-12)
        if row["test"] == "randomization":
            assert row["p_value"] == alone["randomization"][1]


def test_random_randomization_is_reproducible_from_the_seed():
    a, b = pair(np.random.default_rng(3), 50, 0.03)
    once = paired_tests(a, b, resamples=2_000, seed=3)["randomization"][1]
    assert once == paired_tests(a, b, resamples=2_000, seed=3)["randomization"][1]
    other = paired_tests(a, b, resamples=2_000, seed=4)["randomization"][1]
    assert other != once and abs(other - once) < 0.05  # another draw, the same test
    assert 0.05 < once < 0.95


def test_t_test_p_value_is_ranx_compares():
    """ranx's compare runs this same two-sided ttest_rel ("student", its default)."""
    ranx_t_test = pytest.importorskip("ranx.statistical_tests.paired_student_t_test")
    a, b = VALUES["beta"], VALUES["gamma"]
    p_ranx, _ = ranx_t_test.paired_student_t_test(np.array(a), np.array(b), max_p=0.05)
    assert paired_tests(a, b)["paired_t"][1] == pytest.approx(p_ranx, rel=1e-12)


def test_holm_equals_a_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; then running max
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.4, 0.5]) == pytest.approx([0.8, 0.8])
    assert holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])  # capped by the running max, never above 1
    # an undefined p-value stays undefined and counts as 1 in the family (m = 3)
    corrected = holm([0.01, float("nan"), 0.02])
    assert corrected[0] == pytest.approx(0.03) and math.isnan(corrected[1]) and corrected[2] == pytest.approx(0.04)


def test_holm_equals_statsmodels_multipletests():
    """The reference: statsmodels' Holm (not used by the asset: it runs gc.collect() per call)."""
    from statsmodels.stats.multitest import multipletests
    rng = np.random.default_rng(0)
    for m in (1, 3, 300):
        for p in (rng.uniform(size=m), rng.uniform(0, 0.01, size=m), rng.choice([0.001, 0.02, 0.5, 1.0], size=m)):
            assert holm(p) == pytest.approx(multipletests(p, method="holm")[1], rel=1e-12, abs=0)
    assert holm([]).size == 0


def test_holm_corrects_within_measure_version_and_test():
    con = connection(metrics_table(VALUES), metrics_table(VALUES, version="refined"),
                     metrics_table({s: v[::-1] for s, v in VALUES.items()}, measure="recall_10"))
    frame = compute_significance(con, "toy", measures=["ndcg_cut_10", "recall_10"],
                                 qrels_versions=["original", "refined"])
    assert frame.height == 3 * 2 * 3  # (nDCG, original), (nDCG, refined), (Recall, original); 2 tests; 3 pairs
    for (measure, version, test), family in frame.group_by("measure", "qrels_version", "test"):
        assert family.height == 3, (measure, version, test)
        p = sorted(family["p_value"])
        hand = np.maximum.accumulate([min(1.0, (3 - i) * value) for i, value in enumerate(p)])
        by_p = family.sort("p_value")
        assert by_p["p_holm"].to_list() == pytest.approx(list(hand))
        assert by_p["significant"].to_list() == [value <= 0.05 for value in hand]
    stricter = compute_significance(con, "toy", measures=["ndcg_cut_10"], qrels_versions=["original"],
                                    alpha=0.001)
    assert stricter["significant"].to_list() == (stricter["p_holm"] <= 0.001).to_list()


def test_pairs_use_the_queries_both_systems_have_and_identical_systems_are_undefined():
    values = {"one": [0.1, 0.4, 0.3, 0.9], "two": [0.1, 0.4, 0.3], "same": [0.1, 0.4, 0.3, 0.9]}
    frame = compute_significance(connection(metrics_table(values)), "toy", measures=["ndcg_cut_10"],
                                 qrels_versions=["original"])
    one_two = frame.filter((pl.col("system_a") == "one") & (pl.col("system_b") == "two"))
    assert set(one_two["queries"]) == {3} and one_two["mean_a"][0] == pytest.approx(0.8 / 3)
    # no query differs: the t-test is undefined (kept NULL, never significant), swapping changes nothing
    same = frame.filter((pl.col("system_a") == "one") & (pl.col("system_b") == "same")).sort("test")
    assert same["p_value"].to_list() == [None, 1.0] and same["p_holm"].to_list() == [None, 1.0]
    assert same["significant"].to_list() == [False, False]
    alone = compute_significance(connection(metrics_table({"one": values["one"]})), "toy",
                                 measures=["ndcg_cut_10"], qrels_versions=["original"])
    assert alone.height == 0 and alone.schema == pl.Schema(SIGNIFICANCE_SCHEMA)  # no pair to test


def test_a_measure_retrieval_metrics_lacks_is_named():
    with pytest.raises(MissingInput, match=r"no measures \['ndcg_cut_5'\]"):
        compute_significance(connection(metrics_table(VALUES)), "toy", measures=["ndcg_cut_5"],
                             qrels_versions=["original"])
    with pytest.raises(MissingInput, match="no retrieval_metrics rows"):
        compute_significance(connection(metrics_table(VALUES)), "other")


def test_significance_asset_on_the_labeled_lake(labeled_lake):
    result = dg.materialize([qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics,
                             analysis_assets.significance], partition_key=DATASET,
                            resources=lake_resources(labeled_lake))
    assert result.success
    metadata = result.asset_materializations_for_node("significance")[0].metadata
    assert metadata["systems"].value == 3 and metadata["resamples"].value == 10_000
    frame = read(labeled_lake, "select * from significance")
    assert set(frame.columns) == set(SIGNIFICANCE_SCHEMA)
    # 3 pairs x 4 measures x 3 qrels versions x 2 tests
    assert frame.height == 3 * 4 * 3 * 2 and set(frame["qrels_version"]) == {"original", "refined", "refined_upper"}
    assert set(frame["measure"]) == {"ndcg_cut_10", "success_10", "recall_10", "recip_rank_cut_10"}
    recall = frame.filter((pl.col("measure") == "recall_10") & (pl.col("system_a") == "bm25")
                          & (pl.col("system_b") == "splade"))
    rows = {(r["qrels_version"], r["test"]): r for r in recall.iter_rows(named=True)}
    # original recall is 1 for every system on every query: nothing to test
    assert rows[("original", "paired_t")]["p_value"] is None and rows[("original", "randomization")]["p_value"] == 1.0
    # refined (test_analysis_metrics): bm25 1, 1, .5, 1 against splade .5, 1, .5, .5 on q1..q4
    bm25, splade = [1, 1, 0.5, 1], [0.5, 1, 0.5, 0.5]
    assert rows[("refined", "paired_t")]["p_value"] == pytest.approx(stats.ttest_rel(bm25, splade).pvalue)
    assert rows[("refined", "randomization")]["p_value"] == pytest.approx(  # 2^4 swaps: exact
        scipy_randomization(bm25, splade, 10_000).pvalue, rel=1e-12)
    assert rows[("refined", "randomization")]["mean_a"] == pytest.approx(0.875)
    # four queries cannot make anything significant after Holm: the smallest exact p is 2/16
    assert not frame["significant"].any()
    # so every pair concludes 'no significant difference' on every qrels: all agree (D-MERIT's
    # concordance 1), and no pair is significant on either side
    refined = frame.filter(pl.col("qrels_version") != "original")
    assert set(frame["conclusion"]) == {"none"} and refined["agrees_with_original"].all()
    assert set(refined["concordance"]) == {1.0} and refined["concordance_significant"].is_null().all()
    assert frame.filter(pl.col("qrels_version") == "original")["concordance"].is_null().all()
    again = dg.materialize([analysis_assets.significance], partition_key=DATASET,
                           resources=lake_resources(labeled_lake))
    assert again.success and read(labeled_lake, "select count(*) as n from significance")["n"][0] == frame.height


def significance_rows(version: str, p_holm: list[float | None], differences: list[float]) -> list[dict]:
    pairs = [("a", "b"), ("a", "c"), ("b", "c"), ("c", "d")]
    return [{"dataset": "toy", "measure": "ndcg_cut_10", "qrels_version": version, "system_a": x, "system_b": y,
             "queries": 20, "mean_a": 0.5 + diff, "mean_b": 0.5, "test": "paired_t", "statistic": 1.0,
             "p_value": p, "p_holm": p, "significant": p is not None and p <= 0.05}
            for (x, y), p, diff in zip(pairs, p_holm, differences, strict=True)]


def test_report_section_marks_gained_lost_both_and_reversed():
    frame = pl.DataFrame(
        significance_rows("original", [0.01, 0.30, 0.02, 0.00001], [0.1, 0.1, 0.1, 0.1])
        + significance_rows("refined", [0.04, 0.01, 0.20, 0.001], [0.1, 0.1, 0.1, -0.1])
        + significance_rows("refined_upper", [0.06, 0.01, 0.20, 0.001], [0.1, 0.1, 0.1, -0.1]),
        schema=SIGNIFICANCE_SCHEMA)
    section = significance_section(frame, 10)
    assert section.title == "Significance before and after refinement" and not section.missing
    summary, pairs = section.tables
    assert summary.columns == ["measure", "test", "significant both", "reversed", "gained", "lost", "neither"]
    assert summary.rows == [["nDCG@10", "paired t-test", "1", "1", "1", "1", "0"]]
    assert pairs.title == "nDCG@10: system pairs"
    verdicts = {row[0]: (row[3], row[5], row[6], row[7], row[8]) for row in pairs.rows}
    assert verdicts == {
        "a vs b": ("0.0100", "0.0400", "0.0600", "significant both", "depends on pending"),
        "a vs c": ("0.3000", "0.0100", "0.0100", "gained", "significant"),
        "b vs c": ("0.0200", "0.2000", "0.2000", "lost", "not significant"),
        "c vs d": ("< 0.0001", "0.0010", "0.0010", "reversed", "significant")}
    assert significance_section(None, 10).missing == ["significance"]


def test_report_section_lists_only_pairs_significant_somewhere():
    # a vs c is significant on no qrels: counted among 'neither', left out of the pairs' table
    frame = pl.DataFrame(
        significance_rows("original", [0.01, 0.30, 0.02, 0.00001], [0.1, 0.1, 0.1, 0.1])
        + significance_rows("refined", [0.04, 0.30, 0.20, 0.001], [0.1, 0.1, 0.1, -0.1])
        + significance_rows("refined_upper", [0.06, 0.40, 0.20, 0.001], [0.1, 0.1, 0.1, -0.1]),
        schema=SIGNIFICANCE_SCHEMA)
    summary, pairs = significance_section(frame, 10).tables
    assert summary.rows == [["nDCG@10", "paired t-test", "1", "1", "0", "1", "1"]]
    assert [row[0] for row in pairs.rows] == ["a vs b", "b vs c", "c vs d"]
    # nothing significant anywhere: the verdict counts, no table of pairs
    nowhere = frame.with_columns(pl.lit(0.5).alias("p_holm"), pl.lit(False).alias("significant"))
    tables = significance_section(nowhere, 10).tables
    assert [t.title for t in tables] == ["System pairs by verdict"]
    assert tables[0].rows == [["nDCG@10", "paired t-test", "0", "0", "0", "0", "4"]]
