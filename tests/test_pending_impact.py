"""pending_impact (issue 26, item 1 and 3): which rank changes each pending pair's label can
decide, on a hand-made example and against brute force (the metrics recomputed for every
answer the pending pairs may get)."""

from __future__ import annotations

import itertools
import random

import duckdb
import polars as pl
import pytest

from bridge_assets.analysis.impact import UnsupportedMeasure, compute_pending_impact, explain, stopping_point
from fixtures.impact_case import DATASET, HAND_MADE, MEASURE, lake, random_case


def ranking_at_bounds(con: duckdb.DuckDBPyConnection) -> tuple[list, list]:
    """Each bound's order of every two systems (-1, 0, 1), means at 12 decimals."""
    means = con.execute("""select retriever, qrels_version, round(value, 12) from retrieval_metrics
                           where query_id = 'all' and measure = ? and qrels_version like 'refined%'""",
                        [MEASURE]).fetchall()
    by = {(s, v): x for s, v, x in means}
    systems = sorted({s for s, _, _ in means})
    def order(version):
        return [(by[a, version] > by[b, version]) - (by[a, version] < by[b, version])
                for a, b in itertools.combinations(systems, 2)]
    return order("refined"), order("refined_upper")


def settled(case: dict, labels: dict) -> bool:
    low, high = ranking_at_bounds(lake(**case, labels=labels))
    return low == high


def brute_force_stopping_point(case: dict, order: list) -> int:
    """The fewest pairs, in `order`, whose labels (whatever they are: every combination) leave
    the same system order at both bounds: every rank change robust."""
    for m in range(len(order) + 1):
        if all(settled(case, dict(zip(order[:m], answers, strict=True)))
               for answers in itertools.product((0, 1), repeat=m)):
            return m
    raise AssertionError("never settled")


def test_an_evaluation_only_run_counts_in_the_metrics_and_the_impact_as_a_pooled_one():
    """B's run in student_rerank_run (a student re-ranker's: evaluated, never pooled) gives the
    same metrics and the same pending-pair impacts as B's run in retrieval_run."""
    pooled, evaluated = lake(**HAND_MADE), lake(**HAND_MADE, evaluation_only=("B",))
    assert evaluated.execute("select count(*) from retrieval_run where retriever = 'B'").fetchone()[0] == 0
    metrics = "select * from retrieval_metrics order by all"
    assert evaluated.execute(metrics).fetchall() == pooled.execute(metrics).fetchall()
    assert {"A", "B", "C"} == {r for (r,) in evaluated.execute("select distinct retriever from retrieval_metrics").fetchall()}
    assert compute_pending_impact(evaluated, DATASET).equals(compute_pending_impact(pooled, DATASET))
    assert "B" in str(compute_pending_impact(evaluated, DATASET)["system_pairs"].to_list())


def test_the_pair_that_decides_a_rank_change_comes_first_and_says_why():
    frame = compute_pending_impact(lake(**HAND_MADE), DATASET)
    assert frame["doc_id"].to_list() == ["d9", "d8"]           # impact order
    first, second = frame.row(0, named=True), frame.row(1, named=True)
    assert first["impact_rank"] == 1 and first["impact"] > 0 and first["decides"] == 1
    assert first["reason"].startswith("decides A vs B on nDCG@10: not in A's top 10, rank 1 in B")
    assert [(p["system_a"], p["system_b"], p["rank_a"], p["rank_b"]) for p in first["system_pairs"]] == \
        [("A", "B", None, 1)]
    assert second["impact"] == 0 and second["decides"] == 0 and second["system_pairs"] == []
    assert second["reason"].startswith("changes no conclusion")
    assert first["pairs_in_doubt"] == 1


def test_the_stopping_point_equals_brute_force_on_the_hand_made_case():
    frame = compute_pending_impact(lake(**HAND_MADE), DATASET)
    order = list(zip(frame["query_id"], frame["doc_id"], strict=True))
    assert stopping_point(frame) == brute_force_stopping_point(HAND_MADE, order) == 1


@pytest.mark.parametrize("seed", range(8))
def test_each_pair_moves_exactly_the_system_gaps_brute_force_finds(seed):
    """Impact > 0 exactly for the pending pairs whose label, the others held at either bound,
    changes the gap of a system pair in doubt that ranks its chunk (metrics recomputed)."""
    case = random_case(seed)
    frame = compute_pending_impact(lake(**case), DATASET)
    low, high = ranking_at_bounds(lake(**case))
    systems = ["A", "B", "C"]
    doubtful = [pair for pair, lo, hi in zip(itertools.combinations(systems, 2), low, high, strict=True) if lo != hi]
    expected = set()
    for q, d in case["pending"]:
        for bound in (0, 1):
            others = {p: bound for p in case["pending"] if p != (q, d)}
            means = {}
            for answer in (0, 1):
                con = lake(**case, labels={**others, (q, d): answer})
                means[answer] = dict(con.execute(
                    "select retriever, value from retrieval_metrics where query_id = 'all' and measure = ? "
                    "and qrels_version = 'refined'", [MEASURE]).fetchall())
            for a, b in doubtful:
                ranks = {s: case["runs"][s][q] for s in (a, b)}
                if d not in ranks[a] and d not in ranks[b]:
                    continue
                if abs((means[1][a] - means[1][b]) - (means[0][a] - means[0][b])) > 1e-9:
                    expected.add((q, d))
    found = set(zip(*frame.filter(pl.col("impact") > 0).select("query_id", "doc_id").to_dict(as_series=False).values(),
                    strict=True))
    assert found == expected


def test_only_ndcg_is_supported():
    with pytest.raises(UnsupportedMeasure, match="nDCG@k"):
        compute_pending_impact(lake(**HAND_MADE), DATASET, measure="success_10")


def test_the_reason_names_both_ranks_and_more_pairs():
    pairs = [{"system_a": "bm25", "system_b": "minilm_bpr", "rank_a": 2, "rank_b": 2, "share": 0.5},
             {"system_a": "bm25", "system_b": "e5", "rank_a": 2, "rank_b": None, "share": 0.25},
             {"system_a": "e5", "system_b": "splade", "rank_a": None, "rank_b": 7, "share": 0.1}]
    assert explain(pairs, MEASURE, 3) == (
        "decides bm25 vs minilm_bpr on nDCG@10: rank 2 in both (50% of the swing); "
        "bm25 vs e5 on nDCG@10: rank 2 in bm25, not in e5's top 10 (25% of the swing); "
        "and 1 more system pair(s)")


def test_the_queue_serves_the_deciding_pair_first_and_finishes_started_pairs_first():
    """The hand-made lake as the queue sees it: both pending pairs escalated; the pair that
    decides A vs B is served first (the plain order would serve q1/d8), a pair with votes
    before either."""
    from bridge_assets.human.annotators import add_annotator
    from bridge_assets.human.queue import QueueSettings, next_assignment, pairs_open_to, progress
    from bridge_assets.human.tables import ensure_schema, utc_now
    from bridge_assets.human.votes import insert_vote

    con = lake(**HAND_MADE)
    frame = compute_pending_impact(con, DATASET)
    con.register("impact_frame", frame)
    con.execute("create table pending_impact as select * from impact_frame")
    con.execute("create table debate_labels as select 'toy' as dataset, query_id, doc_id, 'escalated' as outcome "
                "from bridge_qrels where relevance is null")
    ensure_schema(con)
    for name in ("ann", "other"):
        add_annotator(con, name)
    settings = QueueSettings(attention_rate=0.0)
    first = next_assignment(con, "ann", settings, random.Random(0))
    assert (first.query_id, first.doc_id) == ("q2", "d9")
    assert progress(con, "ann", settings).stopping_point == 1
    # a vote on the other pair puts it first for everyone else
    insert_vote(con, dataset="toy", query_id="q1", doc_id="d8", annotator_id="ann", label=0, comment=None,
                with_history=True, is_attention_check=False, expected_label=None, status="accepted",
                source="app", created_at=utc_now())
    assert pairs_open_to(con, "other", settings, utc_now())["doc_id"].to_list() == ["d8", "d9"]


def test_the_simulation_script_counts_labels_until_every_rank_change_is_robust():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "simulate_annotation_order.py"
    spec = importlib.util.spec_from_file_location("simulate_annotation_order", path)
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    con = lake(**HAND_MADE)
    pending = sim.pending_pairs(con, DATASET)
    assert sorted(pending) == sorted(HAND_MADE["pending"])
    answers = {("q2", "d9"): 1, ("q1", "d8"): 0}
    assert sim.impact_order(con, DATASET, pending, {}) == [("q2", "d9"), ("q1", "d8")]
    assert sim.labels_needed(con, DATASET, pending, answers, [("q2", "d9"), ("q1", "d8")]) == 1
    assert sim.labels_needed(con, DATASET, pending, answers, [("q1", "d8"), ("q2", "d9")]) == 2
    assert sim.dynamic_labels_needed(con, DATASET, pending, answers) == 1
