"""pool_saturation on the labeled lake of fixtures.labeled_lake, against values worked out by hand.

Filled holes (relevant in the refined qrels, unjudged in the original ones) and who surfaced
them: q1/d5 {bm25, dense}, q3/d7 {dense}, q4/d8 {bm25}. Holes found after each system of every
order of the three systems are in FOUND_BY_HAND.
"""

from __future__ import annotations

import itertools
import math

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis.saturation import growth_rates, holes_found_curve, prefix_scores, system_orders
from bridge_assets.metrics import compute_retrieval_metrics
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, read
from fixtures.paths import lake_resources

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
        resources=lake_resources(labeled_lake),
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


def brute_force_contributions(lake, orders: list[list[str]], measures: list[str]) -> dict:
    """(order index, m, measure) -> |Perf_D(C_m)(r_m) - Perf_D(C_m-1)(r_m)|, each qrels built in
    Python from the lake's tables and each score computed alone by the metrics core on the
    system's whole run: another path than the asset's (variants in SQL, rankings cut to 10)."""
    refined = read(lake, "select query_id, doc_id, coalesce(relevance, 0) as relevance from bridge_qrels")
    original = {(q, d) for q, d in read(lake, "select query_id, doc_id from original_qrels").iter_rows()}
    pool = {(q, d): set(s) for q, d, s in
            read(lake, "select query_id, doc_id, systems from candidate_pool").iter_rows()}
    runs = read(lake, "select retriever, query_id, doc_id, score from retrieval_run")

    def score(system: str, members: set[str], measure: str) -> float:
        qrels = pl.DataFrame([(q, d, r) for q, d, r in refined.iter_rows()
                              if (q, d) in original or (q, d) not in pool or pool[(q, d)] & members],
                             schema=["query_id", "doc_id", "relevance"], orient="row")
        con = duckdb.connect()
        con.register("qrels_frame", qrels.to_arrow())
        con.register("run_frame", runs.filter(pl.col("retriever") == system).to_arrow())
        values = compute_retrieval_metrics(con, run="run_frame", qrels="qrels_frame",
                                           measures=[measure], k=10, per_query=False)
        return values.filter((pl.col("query_id") == "all") & (pl.col("measure") == measure))["value"][0]

    return {(i, m, measure): abs(score(order[m - 1], set(order[:m]), measure)
                                 - score(order[m - 1], set(order[:m - 1]), measure))
            for i, order in enumerate(orders) for m in range(1, len(order) + 1) for measure in measures}


def test_marginal_contribution_curve_is_the_mean_over_orders_of_a_brute_force_computation(labeled_lake):
    orders, seed = 6, 11
    result = dg.materialize(
        [qrels_assets.bridge_qrels, analysis_assets.pool_saturation], partition_key=DATASET,
        resources=lake_resources(labeled_lake),
        run_config={"ops": {"pool_saturation": {"config": {"orders": orders, "seed": seed}}}})
    assert result.success
    frame = read(labeled_lake, "select * from pool_saturation")
    drawn = system_orders(["bm25", "dense", "splade"], orders, seed)
    measures = ["ndcg_cut_10", "success_10", "recall_10"]
    brute = brute_force_contributions(labeled_lake, drawn, measures)
    # by hand, for one step: dense added first brings q1/d5 and q3/d7, both relevant, which it
    # ranks first, ahead of the gold it ranked second: nDCG@10 on q1 and q3 1/log2(3) -> 1
    first_dense = [i for i, order in enumerate(drawn) if order[0] == "dense"]
    assert first_dense and all(brute[(i, 1, "ndcg_cut_10")] == pytest.approx((1 - NDCG_SECOND) / 2)
                               for i in first_dense)
    curve = frame.filter(pl.col("statistic") == "marginal_contribution_curve")
    for measure in measures:
        rows = curve.filter(pl.col("measure") == measure).sort("systems_added")
        assert rows["systems_added"].to_list() == [1, 2, 3] and rows["orders"].to_list() == [orders] * 3
        for m in (1, 2, 3):
            expected = [brute[(i, m, measure)] for i in range(orders)]
            row = rows.row(m - 1, named=True)
            assert row["value"] == pytest.approx(np.mean(expected), abs=1e-12)
            assert row["std"] == pytest.approx(np.std(expected), abs=1e-12)
    # the last step of an order is its last system's leave-one-out MC
    loo = {(r["retriever"], r["measure"]): r["value"]
           for r in frame.filter(pl.col("statistic") == "marginal_contribution").iter_rows(named=True)}
    for i, order in enumerate(drawn):
        for measure in measures:
            assert brute[(i, 3, measure)] == pytest.approx(loo[(order[-1], measure)], abs=1e-12)
    # each system's mean contribution over the orders, whenever it was added, and their order
    mean = {(r["retriever"], r["measure"]): r for r in
            frame.filter(pl.col("statistic") == "mean_contribution").iter_rows(named=True)}
    rank = {(r["retriever"], r["measure"]): r["value"] for r in
            frame.filter(pl.col("statistic") == "contribution_rank").iter_rows(named=True)}
    for measure in measures:
        by_hand = {s: np.mean([brute[(i, order.index(s) + 1, measure)] for i, order in enumerate(drawn)])
                   for s in ("bm25", "dense", "splade")}
        for s, value in by_hand.items():
            assert mean[(s, measure)]["value"] == pytest.approx(value, abs=1e-12)
            assert mean[(s, measure)]["orders"] == orders
            assert rank[(s, measure)] == 1 + sum(1 for v in by_hand.values() if round(v, 12) > round(value, 12))
    # splade surfaced no hole: it never contributes and comes last on nDCG@10
    assert mean[("splade", "ndcg_cut_10")]["value"] == 0.0 and rank[("splade", "ndcg_cut_10")] == 3.0


def test_prefix_scores_equal_each_qrels_scored_alone_when_queries_gain_or_lose_judgments():
    """Queries judged only through the pool: q2's judgments are all new (a relevant one only s2
    surfaced, an irrelevant one only s1 did) and q3 has one new irrelevant judgment only s3
    surfaced, so which queries are evaluated depends on the systems; q1 keeps its original gold
    and a new irrelevant judgment (left out: it changes no score)."""
    con = duckdb.connect()
    runs = {"s1": {"q1": ["d2", "d1"], "q2": ["d5", "d4"], "q3": ["d7"]},
            "s2": {"q1": ["d1", "d3"], "q2": ["d4", "d5"], "q3": ["d8"]},
            "s3": {"q1": ["d3", "d2"], "q2": ["d6"], "q3": ["d9", "d7"]}}
    run = pl.DataFrame([("toy", s, q, d, r + 1, float(10 - r)) for s, per in runs.items() for q, docs in per.items()
                        for r, d in enumerate(docs)],
                       schema=["dataset", "retriever", "query_id", "doc_id", "rank", "score"], orient="row")
    pool = (run.filter(pl.col("rank") <= 1).group_by("dataset", "query_id", "doc_id")
            .agg(pl.col("retriever").sort().alias("systems")))
    original = pl.DataFrame([("toy", "q1", "d1", 1)], schema=["dataset", "query_id", "doc_id", "relevance"],
                            orient="row")
    refined = pl.concat([original, pl.DataFrame([("toy", "q1", "d3", 0), ("toy", "q2", "d4", 1),
                                                 ("toy", "q2", "d5", 0), ("toy", "q3", "d9", 0)],
                                                schema=original.columns, orient="row")])
    for name, frame in {"analysis_run": run, "candidate_pool": pool, "analysis_original_qrels": original,
                        "analysis_refined_qrels": refined}.items():
        con.register("frame", frame.to_arrow())
        con.execute(f"create temp table {name} as select * from frame")
        con.unregister("frame")
    systems = ["s1", "s2", "s3"]
    subsets = [frozenset(c) for n in range(4) for c in itertools.combinations(systems, n)]
    variants = {members: f"v{i}" for i, members in enumerate(subsets)}
    measures = ["ndcg_cut_10", "success_10", "recall_10"]
    scores = prefix_scores(con, variants, {(v, s) for v in variants.values() for s in systems}, measures, 10)
    pooled = {(q, d): set(found) for _, q, d, found in pool.iter_rows()}
    for members, name in variants.items():
        # D(members), as the module doc defines it: the original gold, and pool pairs a member surfaced
        kept = [(q, d) == ("q1", "d1") or (q, d) not in pooled or bool(pooled[(q, d)] & members)
                for _, q, d, _ in refined.iter_rows()]
        qrels = refined.filter(pl.Series(kept))
        for system in systems:
            alone = duckdb.connect()
            alone.register("qrels_frame", qrels.to_arrow())
            alone.register("run_frame", run.filter(pl.col("retriever") == system).to_arrow())
            values = compute_retrieval_metrics(alone, run="run_frame", qrels="qrels_frame", measures=measures, k=10,
                                               per_query=False).filter(pl.col("query_id") == "all")
            expected = dict(zip(values["measure"], values["value"]))
            for measure in measures:
                assert scores.get((name, system, measure)) == pytest.approx(expected.get(measure), abs=1e-12), \
                    (sorted(members), system, measure)
    # by hand, s1's Hit@10 (it finds q1's gold d1 second, q2's d4 second, nothing on q3): with no
    # system's pool only q1 is judged (1); s1's pool judges q2 by d5, irrelevant (1 + 0) / 2;
    # with s2's too, q2's d4 is relevant (1 + 1) / 2; s3's pool alone judges q3 (1 + 0) / 2
    hit = {tuple(sorted(members)): scores[(name, "s1", "success_10")] for members, name in variants.items()}
    assert (hit[()], hit[("s1",)], hit[("s1", "s2")], hit[("s3",)]) == (1.0, 0.5, 1.0, 0.5)
    assert hit[("s1", "s2", "s3")] == pytest.approx(2 / 3)
