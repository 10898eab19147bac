"""pool_saturation on the labeled lake of fixtures.labeled_lake, against values worked out by hand.

Filled holes (relevant in the refined qrels, unjudged in the original ones) and who surfaced
them: q1/d5 {bm25, dense}, q3/d7 {dense}, q4/d8 {bm25}. Holes found after each system of every
order of the three systems are in FOUND_BY_HAND.
"""

from __future__ import annotations

import itertools
import math

import dagster as dg
import numpy as np
import pytest

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.saturation import growth_rates, holes_found_curve, system_orders
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.resources import DuckDBStore
from fixtures.labeled_lake import DATASET, read

HOLE_SYSTEMS = [["bm25", "dense"], ["dense"], ["bm25"]]
FOUND_BY_HAND = {("bm25", "dense", "splade"): [2, 3, 3], ("bm25", "splade", "dense"): [2, 2, 3],
                 ("dense", "bm25", "splade"): [2, 3, 3], ("dense", "splade", "bm25"): [2, 2, 3],
                 ("splade", "bm25", "dense"): [0, 2, 3], ("splade", "dense", "bm25"): [0, 2, 3]}
NDCG_SECOND = 1 / math.log2(3)


def test_holes_found_and_growth_rate_of_every_order():
    for order in itertools.permutations(["bm25", "dense", "splade"]):
        assert holes_found_curve(HOLE_SYSTEMS, order).tolist() == FOUND_BY_HAND[order]
    assert growth_rates(np.array([2.0, 3.0, 3.0])).tolist() == [0.5, 0.0]
    rates = growth_rates(np.array([0.0, 2.0, 3.0]))
    assert math.isnan(rates[0]) and rates[1] == 0.5  # GR undefined while nothing was found


def test_system_orders_are_seeded_permutations():
    systems = ["a", "b", "c", "d"]
    first, again = system_orders(systems, 10, seed=3), system_orders(systems, 10, seed=3)
    assert first == again and all(sorted(order) == systems for order in first)
    assert system_orders(systems, 10, seed=4) != first


def test_pool_saturation_asset_matches_the_hand_computed_curves(labeled_lake):
    orders, seed = 10, 5
    result = dg.materialize(
        [qrels_assets.bridge_qrels, analysis_assets.pool_saturation], partition_key=DATASET,
        resources={"store": DuckDBStore(data_lake=str(labeled_lake))},
        run_config={"ops": {"pool_saturation": {"config": {"orders": orders, "seed": seed}}}})
    assert result.success
    metadata = result.asset_materializations_for_node("pool_saturation")[0].metadata
    assert metadata["holes"].value == 3 and metadata["orders"].value == orders

    curves = np.array([FOUND_BY_HAND[tuple(o)] for o in system_orders(["bm25", "dense", "splade"], orders, seed)],
                      dtype=float)
    frame = read(labeled_lake, "select * from pool_saturation")
    found = frame.filter(frame["statistic"] == "holes_found").sort("systems_added")
    assert found["systems_added"].to_list() == [1, 2, 3]
    assert found["value"].to_list() == pytest.approx(curves.mean(axis=0).tolist())
    assert found["std"].to_list() == pytest.approx(curves.std(axis=0).tolist())
    growth = frame.filter(frame["statistic"] == "growth_rate").sort("systems_added")
    for m in (2, 3):
        previous, current = curves[:, m - 2], curves[:, m - 1]
        defined = previous > 0
        row = growth.filter(growth["systems_added"] == m).row(0, named=True)
        assert row["orders"] == int(defined.sum())
        assert row["value"] == pytest.approx(((current - previous)[defined] / previous[defined]).mean())

    # MC(r): only bm25 surfaced q4/d8 and only dense q3/d7. Without bm25's pool, bm25 ranks
    # q4's remaining relevant d4 second: nDCG@10 1 -> 1/log2(3) on q4; likewise dense on q3.
    # Every system still finds each query's original gold: Hit@10 and Recall@10 do not move.
    mc = {(r["retriever"], r["measure"]): r["value"] for r in
          frame.filter(frame["statistic"] == "marginal_contribution").iter_rows(named=True)}
    assert mc[("bm25", "ndcg_cut_10")] == pytest.approx((1 - NDCG_SECOND) / 4)
    assert mc[("dense", "ndcg_cut_10")] == pytest.approx((1 - NDCG_SECOND) / 4)
    assert mc[("splade", "ndcg_cut_10")] == pytest.approx(0.0)
    assert all(mc[(s, m)] == pytest.approx(0.0) for s in ("bm25", "dense", "splade")
               for m in ("success_10", "recall_10"))
    perf_all = {(r["retriever"], r["measure"]): r["value"] for r in
                frame.filter(frame["statistic"] == "perf_all").iter_rows(named=True)}
    assert perf_all[("dense", "recall_10")] == pytest.approx(0.875)  # as retrieval_metrics, refined
    assert perf_all[("bm25", "ndcg_cut_10")] - mc[("bm25", "ndcg_cut_10")] == pytest.approx(
        frame.filter((frame["statistic"] == "perf_without") & (frame["retriever"] == "bm25")
                     & (frame["measure"] == "ndcg_cut_10"))["value"][0])
