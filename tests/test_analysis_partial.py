"""partial_annotation_study (D-MERIT) on the labeled lake of fixtures.labeled_lake.

Full (refined) relevant sets: q1 {d1, d5}, q2 {d2}, q3 {d3, d7}, q4 {d4, d8}; d5, d7, d8 are the
long documents and the ones few systems retrieved. Recall@10 on the full qrels: bm25 0.875,
dense 0.875, splade 0.625 (per query: bm25 1 1 .5 1, dense 1 1 1 .5, splade .5 1 .5 .5).
"""

from __future__ import annotations

import dagster as dg
import numpy as np
import polars as pl
import pytest
from scipy import stats

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.partial import bucket_of, compare_rankings, pair_p_values
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources, location


def statistic(frame: pl.DataFrame, setting: str, name: str, *, base: str | None = None,
              fraction: float | None = None, bucket: str = "all", measure: str = "recall_10") -> dict:
    rows = frame.filter((pl.col("setting") == setting) & (pl.col("statistic") == name)
                        & (pl.col("p_bucket") == bucket) & (pl.col("measure") == measure))
    rows = rows.filter(pl.col("base_system").is_null() if base is None else pl.col("base_system") == base)
    rows = rows.filter(pl.col("fraction").is_null() if fraction is None else pl.col("fraction") == fraction)
    assert rows.height == 1, (setting, name, base, fraction, bucket, rows)
    return rows.row(0, named=True)


def test_compare_rankings_counts_flips_and_ties_against_the_full_order():
    full = np.array([3.0, 2.0, 1.0])
    partial = np.array([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [2.0, 2.0, 1.0]])
    rows = {(r["p_bucket"], r["statistic"]): r for r in compare_rankings(full, partial, np.array([0.001, 0.5, 0.02]))}
    # draw 1 agrees, draw 2 reverses all three pairs, draw 3 ties the first pair
    assert rows[("all", "error_rate")]["mean"] == pytest.approx(np.mean([0, 1, 1 / 3]))
    taus = [1.0, -1.0, stats.kendalltau(full, partial[2], variant="b").statistic]
    assert rows[("all", "kendall_tau_b")]["mean"] == pytest.approx(np.mean(taus))
    assert rows[("all", "kendall_tau_b")]["std"] == pytest.approx(np.std(taus))
    assert rows[("p<0.01", "error_rate")]["mean"] == pytest.approx(np.mean([0, 1, 1]))  # pair (0, 1)
    assert rows[("p<0.01", "kendall_tau")]["mean"] == pytest.approx(np.mean([1, -1, 0]))
    assert rows[("0.01<=p<0.05", "error_rate")]["pairs"] == 1 and ("p>=0.1", "error_rate") in rows


def test_pair_p_values_are_paired_t_tests_and_identical_systems_have_none():
    full = np.array([[1.0, 1.0, 0.5, 1.0], [1.0, 1.0, 1.0, 0.5], [0.5, 1.0, 0.5, 0.5], [0.5, 1.0, 0.5, 0.5]])
    p = pair_p_values(full)
    assert p[0] == pytest.approx(stats.ttest_rel(full[0], full[1]).pvalue)
    assert p[1] == pytest.approx(stats.ttest_rel(full[0], full[2]).pvalue)
    assert np.isnan(p[-1])  # systems 2 and 3 score the same on every query
    assert bucket_of(p).tolist()[-1] == "undefined" and bucket_of(np.array([0.049]))[0] == "0.01<=p<0.05"


def test_vectorised_statistics_equal_scipys_on_random_scores_with_ties():
    rng = np.random.default_rng(3)
    full = rng.integers(0, 4, size=(7, 30)) / 4  # few distinct values: many ties, some identical rows
    full[5] = full[4]
    full[6] = full[3] + 0.25  # a constant difference: p = 0
    first, second = np.triu_indices(7, k=1)
    p = pair_p_values(full)
    for k, (i, j) in enumerate(zip(first, second)):
        if (i, j) == (4, 5):
            assert np.isnan(p[k])
        elif (i, j) == (3, 6):
            assert p[k] == 0.0
        else:
            assert p[k] == pytest.approx(stats.ttest_rel(full[i], full[j]).pvalue, rel=1e-12)
    means = full.mean(axis=1)
    draws = rng.integers(0, 3, size=(50, 7)).astype(float)
    draws[0] = 1.0  # every system tied: tau-b undefined
    rows = {(r["p_bucket"], r["statistic"]): r for r in compare_rankings(means, draws, p)}
    expected = np.array([stats.kendalltau(means, row, variant="b").statistic for row in draws])
    assert np.isnan(expected[0])
    assert rows[("all", "kendall_tau_b")]["mean"] == pytest.approx(np.nanmean(expected), rel=1e-12)
    assert rows[("all", "kendall_tau_b")]["std"] == pytest.approx(np.nanstd(expected), rel=1e-12)


def test_partial_annotation_study_matches_the_hand_computed_settings(labeled_lake):
    config = {"samples": 200, "fractions": [0.5, 1.0], "sweep_samples": 5, "seed": 1,
              "measures": ["recall_10", "ndcg_cut_10"]}
    result = dg.materialize([qrels_assets.bridge_qrels, analysis_assets.partial_annotation_study],
                            partition_key=DATASET, resources=lake_resources(labeled_lake),
                            run_config={"ops": {"partial_annotation_study": {"config": config}}})
    assert result.success
    metadata = result.asset_materializations_for_node("partial_annotation_study")[0].metadata
    assert metadata["study_queries"].value == 4 and metadata["queries_with_several_relevant"].value == 3
    assert metadata["base_system_found_relevant"].value == {"bm25": 4, "dense": 4, "splade": 4}
    frame = read(labeled_lake, "select * from partial_annotation_study")

    # most popular = shortest = the original gold (retrieved by all): every system scores 1.0,
    # so the pairs with bm25/dense above splade become ties: 2 of 3 pairs wrong, tau-b undefined
    for setting in ("most_popular_single", "shortest_single"):
        assert statistic(frame, setting, "error_rate")["mean"] == pytest.approx(2 / 3)
        assert statistic(frame, setting, "kendall_tau_b")["mean"] is None
    # longest = the new documents d5, d7, d8: bm25 .75, dense .75, splade .25, same order as full
    assert statistic(frame, "longest_single", "error_rate")["mean"] == 0.0
    assert statistic(frame, "longest_single", "kendall_tau_b")["mean"] == pytest.approx(1.0)
    # all three system pairs fall in p >= 0.1 (p = 1.0 for bm25/dense, ~0.18 for the others)
    bucket = statistic(frame, "longest_single", "error_rate", bucket="p>=0.1")
    assert bucket["pairs"] == 3 and bucket["mean"] == 0.0

    # system-based, base left out: bm25 annotates d1, d2, d3, d8 -> dense .75 = splade .75 (a tie
    # where full says dense > splade); dense annotates d5, d2, d7, d4 -> bm25 .75 > splade .5
    assert statistic(frame, "system_single", "error_rate", base="bm25")["mean"] == 1.0
    assert statistic(frame, "system_single", "error_rate", base="dense")["mean"] == 0.0
    assert statistic(frame, "system_single", "kendall_tau_b", base="dense")["mean"] == pytest.approx(1.0)
    assert statistic(frame, "system_single", "error_rate", base="splade")["mean"] == 0.0
    across = statistic(frame, "system_single", "error_rate")
    assert across["mean"] == pytest.approx(1 / 3) and across["samples"] == 3 and across["systems"] == 2

    # knowing every relevant item is the full qrels; the random draws are draws
    assert statistic(frame, "fraction", "kendall_tau_b", fraction=1.0)["mean"] == pytest.approx(1.0)
    assert statistic(frame, "fraction", "error_rate", fraction=1.0)["mean"] == 0.0
    random = statistic(frame, "random_single", "error_rate")
    assert random["samples"] == 200 and 0.0 < random["mean"] < 1.0 and random["std"] > 0.0
    half = statistic(frame, "fraction", "error_rate", fraction=0.5)
    assert half["samples"] == 5 and 0.0 <= half["mean"] <= 1.0
    assert set(frame["measure"]) == {"recall_10", "ndcg_cut_10"}


def test_random_single_draws_follow_the_seed(labeled_lake):
    def run(seed: int) -> pl.DataFrame:
        config = {"samples": 50, "fractions": [0.5], "sweep_samples": 3, "seed": seed, "measures": ["ndcg_cut_10"]}
        assert dg.materialize([qrels_assets.bridge_qrels, analysis_assets.partial_annotation_study],
                              partition_key=DATASET, resources=lake_resources(labeled_lake),
                              run_config={"ops": {"partial_annotation_study": {"config": config}}}).success
        return read(labeled_lake, "select * from partial_annotation_study order by all")

    first, again = run(2), run(2)
    assert first.equals(again)


def test_settings_are_checked_before_any_work(labeled_lake):
    from bridge_assets.analysis.partial import compute_partial_annotation_study
    from bridge_assets.lake import store

    with store.connect(location()) as con:
        with pytest.raises(ValueError, match="name each measure with its cutoff"):
            compute_partial_annotation_study(con, DATASET, measures=["ndcg_cut"])
        with pytest.raises(ValueError, match=r"fractions must lie in \(0, 1\]"):
            compute_partial_annotation_study(con, DATASET, fractions=[0.0, 0.5])
        with pytest.raises(LookupError, match="no bridge_qrels rows; materialize bridge_qrels"):
            compute_partial_annotation_study(con, DATASET)


def test_fraction_draws_score_as_evaluating_each_drawn_qrels_on_the_whole_rankings():
    """The fraction setting scores each distinct (query, kept documents) subset once, on rankings
    cut to the measures' depth; every draw's system means must equal evaluating that draw's own
    qrels with the metrics core on the uncut rankings (deep runs with tied scores)."""
    import duckdb

    from bridge_assets.analysis.partial import _fraction_means, _study_run, draw_fraction_subsets, load_study_data
    from bridge_assets.metrics import compute_measures, resolve_measures

    rng = np.random.default_rng(7)
    systems, n_queries, depth = ["s1", "s2", "s3", "s4"], 6, 30
    docs = [f"d{j:02d}" for j in range(40)]
    run = [(s, f"q{q}", d, float(rng.integers(0, 12)))  # few distinct scores: ties by doc id
           for s in systems for q in range(n_queries) for d in rng.choice(docs, depth, replace=False)]
    relevant = [(f"q{q}", d) for q in range(n_queries) for d in rng.choice(docs, q + 1, replace=False)]
    con = duckdb.connect()
    con.execute("create table analysis_run (dataset varchar, retriever varchar, query_id varchar, doc_id varchar, "
                "rank integer, score double)")
    con.executemany("insert into analysis_run values ('x', ?, ?, ?, 0, ?)", run)
    con.execute("create table analysis_refined_qrels (dataset varchar, query_id varchar, doc_id varchar, relevance integer)")
    con.executemany("insert into analysis_refined_qrels values ('x', ?, ?, 1)", relevant)
    con.execute("create table corpus (dataset varchar, doc_id varchar, title varchar, text varchar)")
    measures, fractions, draws = ["ndcg_cut_10", "recall_10", "success_5"], [0.3, 0.5, 1.0], 4
    with _study_run(con, measures):
        assert con.execute("select max(c) from (select count(*) c from study_run group by retriever, query_id)").fetchone()[0] <= 10
        data = load_study_data(con, "x", measures)
        means = _fraction_means(con, data, measures, fractions, draws, np.random.default_rng(11))
    _, subset_docs, chosen = draw_fraction_subsets(data.candidates, fractions, draws, np.random.default_rng(11))
    assert len(subset_docs) < chosen[:, :, [q for q, c in enumerate(data.candidates) if len(c) > 1]].size
    for f, fraction in enumerate(fractions):
        for d in range(draws):
            qrels = pl.DataFrame([("x", data.queries[q], doc, 1) for q in range(n_queries)
                                  for doc in subset_docs[chosen[f, d, q]]],
                                 schema=["dataset", "query_id", "doc_id", "relevance"], orient="row")
            kept = [len(subset_docs[chosen[f, d, q]]) for q in range(n_queries)]
            assert kept == [max(1, int(np.ceil(fraction * len(c)))) for c in data.candidates]
            con.register("draw_qrels", qrels.to_arrow())
            values = compute_measures(con, resolve_measures(measures), run="analysis_run", qrels="draw_qrels",
                                      complete=True, per_query=False)
            con.unregister("draw_qrels")
            for measure in measures:
                expected = [values.filter((pl.col("retriever") == s) & (pl.col("measure") == measure))["value"][0]
                            for s in data.systems]
                assert means[(fraction, measure)][d] == pytest.approx(expected, abs=1e-12), (fraction, d, measure)
