"""retrieval_metrics (original vs refined qrels, both bounds over pending pairs, Hole@k) and
ranking_shift (ranks, robust rank changes, Kendall tau) on the small labeled lake of
fixtures.labeled_lake, values worked out by hand. Its pending pair (q2/d10) counts as irrelevant
in `refined` and as relevant in `refined_upper`."""

from __future__ import annotations

import math

import dagster as dg
import numpy as np
import pytest
from scipy import stats

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.retrieval import measure_label
from bridge_assets.analysis.shift import kendall_tau_a, kendall_tau_b
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources

NDCG_SECOND = 1 / math.log2(3)  # a relevant document at rank 2


def materialize(lake, *assets, run_config=None) -> dg.ExecuteInProcessResult:
    result = dg.materialize([qrels_assets.bridge_qrels, *assets], partition_key=DATASET,
                            resources=lake_resources(lake), run_config=run_config)
    assert result.success
    return result


def means(lake, version: str) -> dict[tuple[str, str], float]:
    frame = read(lake, f"select retriever, measure, value from retrieval_metrics "
                       f"where qrels_version = '{version}' and query_id = 'all'")
    return {(r, m): v for r, m, v in frame.rows()}


def test_measure_labels_use_the_papers_names():
    assert [measure_label(m) for m in ("success_10", "ndcg_cut_10", "recip_rank_cut_5", "map", "hole_10")] == \
        ["Hit@10", "nDCG@10", "MRR@5", "MAP", "Hole@10"]


def test_retrieval_metrics_on_original_and_refined_qrels(labeled_lake):
    result = materialize(labeled_lake, analysis_assets.retrieval_metrics)
    metadata = result.asset_materializations_for_node("retrieval_metrics")[0].metadata
    assert metadata["scope"].value == "pooled" and metadata["queries"].value == 4
    assert metadata["system_names"].value == "bm25, dense, splade"
    assert "Hole@10 refined" in metadata["summary"].value

    frame = read(labeled_lake, "select * from retrieval_metrics")
    assert set(frame.columns) == {"dataset", "retriever", "qrels_version", "query_id", "measure", "value"}
    measures = set(frame["measure"])
    assert {"success_10", "recall_10", "P_10", "recip_rank_cut_10", "ndcg_cut_10", "map", "judged_10",
            "hole_10"} <= measures
    original, refined = means(labeled_lake, "original"), means(labeled_lake, "refined")
    upper = means(labeled_lake, "refined_upper")
    # every system retrieves each query's one original gold document
    assert {s: original[(s, "recall_10")] for s in ("bm25", "dense", "splade")} == \
        {"bm25": 1.0, "dense": 1.0, "splade": 1.0}
    # refined (pending irrelevant): q1 {d1,d5}, q2 {d2}, q3 {d3,d7}, q4 {d4,d8}
    assert refined[("bm25", "recall_10")] == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert refined[("dense", "recall_10")] == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert refined[("splade", "recall_10")] == pytest.approx((0.5 + 1 + 0.5 + 0.5) / 4)
    # refined_upper (pending relevant): q2 {d2,d10}
    assert upper[("bm25", "recall_10")] == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert upper[("dense", "recall_10")] == pytest.approx((1 + 0.5 + 1 + 0.5) / 4)
    assert upper[("splade", "recall_10")] == pytest.approx((0.5 + 0.5 + 0.5 + 0.5) / 4)
    # Hole@10: newly found relevant chunks in the top-10 (bm25: d5 for q1, d8 for q4; at the
    # upper bound also the pending d10 for q2)
    assert refined[("bm25", "hole_10")] == pytest.approx((0.1 + 0 + 0 + 0.1) / 4)
    assert upper[("bm25", "hole_10")] == pytest.approx((0.1 + 0.1 + 0 + 0.1) / 4)
    assert refined[("dense", "hole_10")] == pytest.approx((0.1 + 0 + 0.1 + 0) / 4)
    assert refined[("splade", "hole_10")] == 0.0 and upper[("splade", "hole_10")] == 0.0
    assert all(original[(s, "hole_10")] == 0.0 for s in ("bm25", "dense", "splade"))
    # nDCG@10, bm25 q4: d8 (new) at 1, d4 at 2 -> perfect on refined; d4 at 2 alone on original
    per_query = read(labeled_lake, "select qrels_version, value from retrieval_metrics where retriever = 'bm25' "
                                   "and query_id = 'q4' and measure = 'ndcg_cut_10'")
    assert dict(per_query.rows()) == pytest.approx({"original": NDCG_SECOND, "refined": 1.0, "refined_upper": 1.0})
    # bm25 q2: d2 at 2, the pending d10 at 3 -> only the upper bound counts d10
    per_query = read(labeled_lake, "select qrels_version, value from retrieval_metrics where retriever = 'bm25' "
                                   "and query_id = 'q2' and measure = 'ndcg_cut_10'")
    both = (NDCG_SECOND + 0.5) / (1 + NDCG_SECOND)
    assert dict(per_query.rows()) == pytest.approx({"original": NDCG_SECOND, "refined": NDCG_SECOND,
                                                    "refined_upper": both})
    # Judged@10 grows: bm25 q1 top-5 d1 d5 d9 d12 d6 -> original judges d1, d9; refined all but d6
    judged = read(labeled_lake, "select qrels_version, value from retrieval_metrics where retriever = 'bm25' "
                                "and query_id = 'q1' and measure = 'judged_10'")
    assert dict(judged.rows()) == pytest.approx({"original": 0.2, "refined": 0.4, "refined_upper": 0.4})


def test_scope_all_takes_every_query_and_rematerializing_replaces_the_partition(labeled_lake):
    config = {"ops": {"retrieval_metrics": {"config": {"scope": "all", "k": 5}}}}
    materialize(labeled_lake, analysis_assets.retrieval_metrics, run_config=config)
    materialize(labeled_lake, analysis_assets.retrieval_metrics, run_config=config)
    frame = read(labeled_lake, "select * from retrieval_metrics")
    assert "hole_5" in set(frame["measure"]) and "hole_10" not in set(frame["measure"])
    assert frame.filter(frame["query_id"] == "all").height == 3 * 3 * frame["measure"].n_unique()


def test_kendall_tau_matches_scipy():
    rng = np.random.default_rng(7)
    for _ in range(20):
        x, y = rng.normal(size=8), rng.normal(size=8)
        assert kendall_tau_a(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)  # no ties: a == b
        tau_b, p = kendall_tau_b(x, y)
        assert (tau_b, p) == pytest.approx(tuple(stats.kendalltau(x, y, variant="b")))
    # with ties tau-a and tau-b differ: concordant 2, discordant 0, one tie, of 3 pairs
    assert kendall_tau_a([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 3)
    assert kendall_tau_b([1, 1, 2], [1, 2, 3])[0] == pytest.approx(stats.kendalltau([1, 1, 2], [1, 2, 3]).statistic)
    assert kendall_tau_b([1, 1, 2], [1, 2, 3])[0] == pytest.approx(2 / math.sqrt(2 * 3))


def test_systems_equal_but_for_the_last_bits_of_a_sum_share_their_place():
    import duckdb
    import polars as pl

    from bridge_assets.analysis.shift import compute_ranking_shift

    # the demo's e5_small and e5_hnsw: the same run, means 0.555972671991146 and ...1459
    values = {"a": (0.555972671991146, 0.7), "b": (0.5559726719911459, 0.7), "c": (0.6, 0.5)}
    rows = [(DATASET, system, "all", "ndcg_cut_10", version, value)
            for system, pair in values.items() for version, value in zip(("original", "refined"), pair)]
    con = duckdb.connect()
    con.register("metrics", pl.DataFrame(rows, orient="row", schema=[
        "dataset", "retriever", "query_id", "measure", "qrels_version", "value"]).to_arrow())
    con.execute("create table retrieval_metrics as select * from metrics")
    shift = compute_ranking_shift(con, DATASET, ["ndcg_cut_10"])
    ranks = {r["retriever"]: (r["rank_original"], r["rank_refined"]) for r in shift.iter_rows(named=True)}
    assert ranks == {"c": (1, 3), "a": (2, 1), "b": (2, 1)}
    assert shift["kendall_tau_b"][0] == pytest.approx(stats.kendalltau([0.556, 0.556, 0.6], [0.7, 0.7, 0.5]).statistic)


def test_ranking_shift_places_tau_and_robust_changes(labeled_lake):
    result = materialize(labeled_lake, analysis_assets.retrieval_metrics, analysis_assets.ranking_shift)
    shift = read(labeled_lake, "select * from ranking_shift where measure = 'recall_10' order by retriever")
    rows = {r["retriever"]: r for r in shift.iter_rows(named=True)}
    systems = ("bm25", "dense", "splade")
    # original recall ties all three (1.0); refined lower bound: bm25 = dense = 0.875 >
    # splade 0.625; upper bound: bm25 0.875 > dense 0.75 > splade 0.5
    assert [rows[s]["rank_original"] for s in systems] == [1, 1, 1]
    assert [rows[s]["rank_refined"] for s in systems] == [1, 1, 3]
    assert [rows[s]["rank_refined_upper"] for s in systems] == [1, 2, 3]
    assert [rows[s]["rank_change"] for s in systems] == [0, 0, -2]
    assert [rows[s]["rank_change_upper"] for s in systems] == [0, -1, -2]
    # splade's fall holds whichever way the pending pair goes; dense moves at one bound only
    assert [rows[s]["robust_rank_change"] for s in systems] == [0, 0, -2]
    assert rows["splade"]["value_change"] == pytest.approx(-0.375)
    assert rows["dense"]["value_refined_upper"] == pytest.approx(0.75)
    # tau with a constant side: tau-a 0 (no pair ordered), tau-b undefined
    assert rows["bm25"]["kendall_tau"] == 0.0 and rows["bm25"]["kendall_tau_b"] is None
    ndcg = read(labeled_lake, "select retriever, value_original, value_refined, kendall_tau, kendall_tau_b, "
                              "kendall_tau_b_p_value from ranking_shift where measure = 'ndcg_cut_10' "
                              "order by retriever")
    before, after = ndcg["value_original"].to_list(), ndcg["value_refined"].to_list()
    expected = stats.kendalltau(before, after, variant="b")
    assert ndcg["kendall_tau_b"][0] == pytest.approx(expected.statistic)
    assert ndcg["kendall_tau_b_p_value"][0] == pytest.approx(expected.pvalue)
    assert ndcg["kendall_tau"][0] == pytest.approx(kendall_tau_a(before, after))
    metadata = result.asset_materializations_for_node("ranking_shift")[0].metadata
    assert metadata["systems"].value == 3 and metadata["moved_systems"].value >= 1
    assert metadata["robustly_moved_systems"].value >= 1
