"""pool_coverage: relevant chunks in the pool as systems are added, and the fitted extrapolation
of how many remain outside it.

The curve against brute force over every order of a hand-made pool; the extrapolation on
synthetic pools drawn with a known number of relevant chunks no system found (its interval
holds the truth); when it is not shown (too few systems, a curve that does not level off);
the asset on the labeled lake of fixtures.labeled_lake (three systems: the note says why
nothing is extrapolated), the report section and the summary line."""

from __future__ import annotations

import itertools

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.coverage import (
    COVERAGE_SCHEMA,
    EXTRAPOLATE_TO,
    MIN_SYSTEMS,
    coverage_rows,
    expected_curve,
    extrapolate,
    michaelis_menten,
)
from bridge_assets.analysis.saturation import holes_found_curve, system_orders
from bridge_assets.cli.summary import _pool_coverage
from bridge_assets.lake import store
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports.system_sections import coverage_section
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources, location

# per relevant chunk, the systems that surfaced it
FOUND_BY = [["a"], ["a", "b"], ["c"], ["a", "b", "c", "d"], ["d"], ["b", "d"], ["b"]]
SYSTEMS = ["a", "b", "c", "d"]


def synthetic_pool(seed: int, chunks: int = 800, systems: int = 10, mean_hazard: float = 0.15):
    """`systems` x `chunks` incidence: chunk j found by each system with probability
    1 - exp(-h_j), h_j exponential (the model's pool). Returns the surfaced chunks' systems and
    how many relevant chunks no system found (the truth the extrapolation estimates)."""
    rng = np.random.default_rng(seed)
    hazard = rng.exponential(mean_hazard, chunks)
    found = rng.random((systems, chunks)) < -np.expm1(-hazard)
    names = [f"s{i:02d}" for i in range(systems)]
    found_by = [[names[i] for i in np.flatnonzero(found[:, j])] for j in range(chunks) if found[:, j].any()]
    return found_by, names, int((~found.any(axis=0)).sum())


def test_expected_curve_is_the_mean_over_every_order():
    brute = np.mean([holes_found_curve(FOUND_BY, order) for order in itertools.permutations(SYSTEMS)], axis=0)
    # by hand for m = 1: each chunk is in a random system's pool with probability s/4
    assert brute[0] == pytest.approx(sum(len(s) for s in FOUND_BY) / 4)
    assert expected_curve([len(s) for s in FOUND_BY], 4) == pytest.approx(brute)
    assert expected_curve([len(s) for s in FOUND_BY], 4)[-1] == len(FOUND_BY)


def test_curve_rows_are_the_mean_and_band_over_the_drawn_orders():
    orders, seed = 7, 3
    frame = coverage_rows(FOUND_BY, SYSTEMS, known_outside=2, orders=orders, seed=seed, min_systems=4,
                          resamples=50)
    curves = np.array([holes_found_curve(FOUND_BY, o) for o in system_orders(SYSTEMS, orders, seed)])
    found = frame.filter(pl.col("statistic") == "relevant_found").sort("systems_added")
    assert found["systems_added"].to_list() == [1, 2, 3, 4] and found["orders"].to_list() == [orders] * 4
    assert found["value"].to_list() == pytest.approx(curves.mean(axis=0).tolist())
    assert found["std"].to_list() == pytest.approx(curves.std(axis=0).tolist())
    assert found["low"].to_list() == pytest.approx(np.quantile(curves, 0.05, axis=0).tolist())
    assert found["high"].to_list() == pytest.approx(np.quantile(curves, 0.95, axis=0).tolist())
    scalars = {r["statistic"]: r for r in frame.filter(pl.col("systems_added").is_null()).iter_rows(named=True)}
    assert scalars["in_pool"]["value"] == 7 and scalars["known_outside_pool"]["value"] == 2


def test_the_interval_holds_the_number_of_relevant_chunks_outside_the_pool():
    held = []
    for seed in range(8):
        found_by, systems, truth = synthetic_pool(seed)
        result = extrapolate([len(s) for s in found_by], len(systems), seed=seed, resamples=150)
        assert result.meaningful and result.in_pool == len(found_by) and result.systems == 10
        assert result.low <= result.outside <= result.high
        assert result.total == pytest.approx(result.in_pool + result.outside)
        held.append(result.low <= truth <= result.high)
        # the estimate is near the truth: within a quarter of what is outside (about 250-330)
        assert abs(result.outside - truth) < 0.25 * truth
    # a 95% interval: it may miss one of eight draws, not more
    assert sum(held) >= 7, held


def test_rows_of_a_meaningful_extrapolation():
    found_by, systems, truth = synthetic_pool(1)
    frame = coverage_rows(found_by, systems, known_outside=0, orders=5, seed=0, resamples=100)
    scalars = {r["statistic"]: r for r in frame.filter(pl.col("systems_added").is_null()).iter_rows(named=True)}
    estimate, total = scalars["outside_pool_estimate"], scalars["total_estimate"]
    assert estimate["note"] is None and estimate["low"] <= truth <= estimate["high"]
    assert estimate["resamples"] == 100  # every pool drawn from this fit refits
    assert total["value"] == pytest.approx(len(found_by) + estimate["value"])
    assert (total["low"], total["high"]) == pytest.approx((len(found_by) + estimate["low"],
                                                           len(found_by) + estimate["high"]))
    fitted = frame.filter(pl.col("statistic") == "fitted").sort("systems_added")
    assert fitted["systems_added"].to_list() == list(range(1, EXTRAPOLATE_TO * 10 + 1))
    assert fitted["value"].to_list() == pytest.approx(
        [michaelis_menten(m, total["value"], scalars["half_saturation"]["value"]) for m in fitted["systems_added"]])


@pytest.mark.parametrize("failing, shown", [(0.3, True), (0.6, False)])
def test_bootstrap_pools_that_do_not_refit_are_counted(monkeypatch, failing, shown):
    """A refit that fails adds no error to the interval: the row says how many pools it rests
    on, and with fewer than half of them there is no interval."""
    from bridge_assets.analysis import coverage
    real, calls = coverage.fit_saturation, itertools.count()

    def flaky(counts, systems):  # the first call is the estimate itself; then a share of refits fail
        call = next(calls)
        if call and (call % 10) < failing * 10:
            raise RuntimeError("Optimal parameters not found")
        return real(counts, systems)

    monkeypatch.setattr(coverage, "fit_saturation", flaky)
    found_by, systems, _ = synthetic_pool(1)
    result = extrapolate([len(s) for s in found_by], len(systems), resamples=50)
    assert result.resamples == 50 - round(failing * 50)
    assert result.meaningful is shown
    if not shown:
        assert result.outside is None and f"only {result.resamples} of 50" in result.note


def test_no_extrapolation_with_too_few_systems_or_a_curve_that_does_not_level_off():
    found_by, systems, _ = synthetic_pool(0, systems=MIN_SYSTEMS - 1)
    few = extrapolate([len(s) for s in found_by], len(systems))
    assert not few.meaningful and few.outside is None and f"at least {MIN_SYSTEMS}" in few.note
    # every chunk found by exactly one system: the curve is a straight line, no asymptote
    straight = extrapolate([1] * 300, 10)
    assert not straight.meaningful and "does not level off" in straight.note
    assert not extrapolate([], 10).meaningful
    # every chunk found by every system: saturated at once, nothing outside
    full = extrapolate([10] * 300, 10, resamples=20)
    assert full.meaningful and full.outside == pytest.approx(0.0, abs=1e-3) and full.high == pytest.approx(0, abs=1e-3)
    frame = coverage_rows([["a"]] * 5, ["a", "b", "c"], known_outside=1, orders=3, seed=0)
    assert set(frame["statistic"]) == {"relevant_found", "in_pool", "known_outside_pool", "outside_pool_estimate"}
    note = frame.filter(pl.col("statistic") == "outside_pool_estimate").row(0, named=True)
    assert note["value"] is None and "3 system(s)" in note["note"]


def test_pool_coverage_asset_on_the_labeled_lake(labeled_lake):
    result = dg.materialize(
        [qrels_assets.bridge_qrels, analysis_assets.pool_coverage], partition_key=DATASET,
        resources=lake_resources(labeled_lake),
        run_config={"ops": {"pool_coverage": {"config": {"orders": 6, "seed": 2}}}})
    assert result.success
    frame = read(labeled_lake, "select * from pool_coverage")
    assert set(frame.columns) == set(COVERAGE_SCHEMA)
    # relevant pool pairs: the four original gold (every one surfaced), the holes q1/d5
    # {bm25, dense}, q3/d7 {dense}, q4/d8 {bm25}; the pending q2/d10 {bm25} at the upper bound
    found_by = {"refined": [["bm25", "dense", "splade"]] * 4 + [["bm25", "dense"], ["dense"], ["bm25"]]}
    found_by["refined_upper"] = found_by["refined"] + [["bm25"]]
    orders = system_orders(["bm25", "dense", "splade"], 6, 2)
    for version, chunks in found_by.items():
        rows = frame.filter(pl.col("qrels_version") == version)
        curve = rows.filter(pl.col("statistic") == "relevant_found").sort("systems_added")
        assert curve["value"].to_list() == pytest.approx(
            np.mean([holes_found_curve(chunks, o) for o in orders], axis=0).tolist())
        scalars = {r["statistic"]: r for r in rows.filter(pl.col("systems_added").is_null()).iter_rows(named=True)}
        assert scalars["in_pool"]["value"] == len(chunks) and scalars["known_outside_pool"]["value"] == 0
        assert scalars["outside_pool_estimate"]["value"] is None
        assert "3 system(s)" in scalars["outside_pool_estimate"]["note"]
    section = coverage_section(frame, labeled_lake)
    assert not section.missing and (labeled_lake / "coverage.png").exists()
    assert "Verified labels: no extrapolation shown: 3 system(s)" in section.intro and not section.notes
    outside = next(t for t in section.tables if t.title == "Outside the pool")
    assert outside.rows == [["verified labels", "7", "0", "not shown"],
                            ["pending pairs relevant", "8", "0", "not shown"]]
    with store.connect(location(labeled_lake)) as con:
        assert _pool_coverage(con, DATASET) == []  # not meaningful: nothing in the summary


def test_report_and_summary_show_a_meaningful_extrapolation(tmp_path):
    found_by, systems, _ = synthetic_pool(4)
    rows = coverage_rows(found_by, systems, known_outside=3, orders=5, seed=0, resamples=100)
    frame = pl.concat([rows.with_columns(pl.lit(version).alias("qrels_version"))
                       for version in ("refined", "refined_upper")]
                      ).with_columns(pl.lit("toy").alias("dataset")).select(list(COVERAGE_SCHEMA))
    estimate = frame.filter((pl.col("statistic") == "outside_pool_estimate")
                            & (pl.col("qrels_version") == "refined")).row(0, named=True)
    section = coverage_section(frame, tmp_path)
    outside = next(t for t in section.tables if t.title == "Outside the pool")
    assert outside.rows[0] == ["verified labels", str(len(found_by)), "3",
                               f"{estimate['value']:.0f} ({estimate['low']:.0f} .. {estimate['high']:.0f})"]
    assert (f"Verified labels: the pool holds {len(found_by)} relevant chunks; the fitted curve puts about "
            f"{estimate['value']:.0f} more") in section.intro
    assert (tmp_path / "coverage.png").exists()
    con = duckdb.connect()
    con.execute("create table pool_coverage as select * from frame")
    assert _pool_coverage(con, "toy") == [
        f"relevant chunks outside the pool (saturation curve fitted over 10 systems): about "
        f"{estimate['value']:.0f} (95% interval {estimate['low']:.0f}..{estimate['high']:.0f}) beyond the "
        f"{len(found_by)} in the pool"]
    assert coverage_section(None, tmp_path).missing == ["pool_coverage"]
