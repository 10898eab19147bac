"""pending_impact's significance side (issue 26, item 1: "the significance outcomes it can flip";
item 3: the stopping point "with significance"): on a hand-made example, the pending pair whose
label may flip a significance call and one that cannot; the reason names the systems; the
stopping point with significance counts it, as brute force (every answer of the labelled pairs,
significance recomputed) finds; pairs with no significance doubt keep their impact and order;
the plan, the summary and the report say it."""

from __future__ import annotations

import itertools

import duckdb
import polars as pl
import pytest

from bridge_assets.analysis.impact import (
    SIGNIFICANCE_WEIGHT,
    compute_pending_impact,
    stopping_point,
    stopping_point_with_significance,
)
from bridge_assets.analysis.significance import compute_significance
from fixtures.impact_case import DATASET, HAND_MADE, MEASURE, lake, random_case

# Two systems on six queries, each query's gold g<i>. A ranks it first everywhere; B ranks it
# lower (rank i + 1 on q<i>, behind unjudged chunks), so A is ahead on every query and the
# randomization test (exact: 2^6 sign vectors) finds A better, p = 2/64 = 0.031. Two pending
# pairs: (q1, p1), ranked first by B only: relevant, it puts B ahead on q1, and with one query
# the other way the randomization p is 0.0625, not significant; so the call differs between the
# bounds and p1 may flip it. (q6, p2), ranked 12th by A (beyond the cutoff) and not by B: it
# stands in neither ranking and cannot flip it. A is ahead at both bounds: no rank change in doubt.
QUERIES = [f"q{i}" for i in range(1, 7)]
SIGNIFICANCE_CASE = {
    "runs": {"A": {q: [f"g{i}", *(f"x{i}_{j}" for j in range(1, 11)), *(["p2"] if q == "q6" else [])]
                   for i, q in enumerate(QUERIES, 1)},
             "B": {q: [*(["p1"] if q == "q1" else []), *(f"y{i}_{j}" for j in range(1, i + 1)), f"g{i}"]
                   for i, q in enumerate(QUERIES, 1)}},
    "original": {(q, f"g{i}"): 1 for i, q in enumerate(QUERIES, 1)},
    "pending": [("q6", "p2"), ("q1", "p1")],
}


def with_significance(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """`con` with the significance table the pipeline's significance asset would write."""
    frame = compute_significance(con, DATASET, measures=[MEASURE], qrels_versions=["refined", "refined_upper"])
    con.register("significance_frame", frame)
    con.execute("create table significance as select * from significance_frame")
    con.unregister("significance_frame")
    return con


def conclusions(con: duckdb.DuckDBPyConnection) -> dict:
    frame = compute_significance(con, DATASET, measures=[MEASURE], qrels_versions=["refined", "refined_upper"])
    return {(row["system_a"], row["system_b"], row["test"], row["qrels_version"]): row["conclusion"]
            for row in frame.iter_rows(named=True)}


def calls_settled(case: dict, labels: dict) -> bool:
    """Every significance call the same at both bounds."""
    found = conclusions(lake(**case, labels=labels))
    return all(found[a, b, test, "refined"] == found[a, b, test, "refined_upper"]
               for a, b, test, version in found if version == "refined")


def brute_force(case: dict, order: list) -> int:
    """The fewest pairs, in `order`, whose labels, whatever they are, settle every significance call."""
    for m in range(len(order) + 1):
        if all(calls_settled(case, dict(zip(order[:m], answers, strict=True)))
               for answers in itertools.product((0, 1), repeat=m)):
            return m
    raise AssertionError("never settled")


def test_the_pair_that_may_flip_a_significance_call_comes_first_and_says_why():
    frame = compute_pending_impact(with_significance(lake(**SIGNIFICANCE_CASE)), DATASET)
    assert frame["doc_id"].to_list() == ["p1", "p2"]
    first, second = frame.row(0, named=True), frame.row(1, named=True)
    assert first["decides"] == 0 and first["pairs_in_doubt"] == 0      # A ahead at both bounds
    assert first["flips"] == 1 and first["significance_in_doubt"] == 1
    assert first["impact"] == pytest.approx(SIGNIFICANCE_WEIGHT)
    [call] = first["significance_pairs"]
    assert (call["system_a"], call["system_b"], call["test"], call["rank_a"], call["rank_b"]) == \
        ("A", "B", "randomization", None, 1)
    assert (call["conclusion_low"], call["conclusion_high"]) == ("a", "none")
    assert call["p_low"] == pytest.approx(2 / 64) and call["p_high"] == pytest.approx(4 / 64)
    assert first["reason"] == ("decides no rank change on nDCG@10; may flip the significance of A vs B on "
                               "nDCG@10 (randomization p 0.031 .. 0.062)")
    assert second["flips"] == 0 and second["significance_pairs"] == [] and second["impact"] == 0
    assert second["reason"].startswith("changes no conclusion")
    assert "no system pair whose significance on nDCG@10 differs between the bounds ranks it" in second["reason"]


def test_the_stopping_point_with_significance_equals_brute_force_on_the_hand_made_case():
    frame = compute_pending_impact(with_significance(lake(**SIGNIFICANCE_CASE)), DATASET)
    order = list(zip(frame["query_id"], frame["doc_id"], strict=True))
    assert stopping_point(frame) == 0                      # every rank change robust already
    assert stopping_point_with_significance(frame) == brute_force(SIGNIFICANCE_CASE, order) == 1
    # the other order needs both labels
    assert brute_force(SIGNIFICANCE_CASE, order[::-1]) == 2


def test_without_significance_the_table_says_nothing_about_it():
    frame = compute_pending_impact(lake(**SIGNIFICANCE_CASE), DATASET)
    assert frame["significance_in_doubt"].is_null().all() and frame["flips"].to_list() == [0, 0]
    assert stopping_point_with_significance(frame) is None
    assert frame["impact"].to_list() == [0.0, 0.0]
    assert frame["doc_id"].to_list() == ["p1", "p2"]      # the plain order: by query, chunk


def test_the_three_system_example_with_significance():
    """HAND_MADE with its significance: at the lower bound A (1, 1) beats C (0, 0) by the same on
    both queries, a t-test significant at p 0 (constant differences); relevant, d8 (third in C's
    q1 ranking) gives C a value on q1 and the call is gone. So d8, which decides no rank change,
    may flip A vs C's t-test; d9 still comes first (it decides A vs B), its impact unchanged; the
    stopping point with significance counts both, as brute force does."""
    plain = compute_pending_impact(lake(**HAND_MADE), DATASET)
    tested = compute_pending_impact(with_significance(lake(**HAND_MADE)), DATASET)
    assert tested["doc_id"].to_list() == ["d9", "d8"] and tested["significance_in_doubt"].to_list() == [1, 1]
    first, second = tested.row(0, named=True), tested.row(1, named=True)
    assert first["flips"] == 0 and first["impact"] == plain["impact"][0] and first["reason"] == plain["reason"][0]
    assert second["decides"] == 0 and second["flips"] == 1 and second["impact"] == pytest.approx(SIGNIFICANCE_WEIGHT)
    assert [(c["system_a"], c["system_b"], c["test"], c["rank_a"], c["rank_b"])
            for c in second["significance_pairs"]] == [("A", "C", "paired_t", None, 3)]
    assert second["reason"].startswith("decides no rank change on nDCG@10; may flip the significance of A vs C "
                                       "on nDCG@10 (paired t-test p 0.000 .. ")
    order = list(zip(tested["query_id"], tested["doc_id"], strict=True))
    assert stopping_point(tested) == stopping_point(plain) == 1
    assert stopping_point_with_significance(tested) == brute_force(HAND_MADE, order) == 2


def fake_significance(con: duckdb.DuckDBPyConnection, calls: dict) -> duckdb.DuckDBPyConnection:
    """A significance table whose conclusions are `calls`: (system_a, system_b) -> (low, high)."""
    rows = [{"dataset": DATASET, "measure": MEASURE, "qrels_version": version, "system_a": a, "system_b": b,
             "test": "paired_t", "p_holm": 0.01 if conclusion != "none" else 0.5, "conclusion": conclusion}
            for (a, b), bounds in calls.items() for version, conclusion in zip(("refined", "refined_upper"), bounds)]
    con.register("significance_frame", pl.DataFrame(rows))
    con.execute("create table significance as select * from significance_frame")
    con.unregister("significance_frame")
    return con


@pytest.mark.parametrize("seed", range(6))
def test_pairs_with_no_significance_doubt_keep_their_impact_and_order(seed):
    """With A vs B's call in doubt (significant at the lower bound only), A vs C significant the
    same way at both bounds: the pairs that may flip it are those in A's or B's top 10; the
    others keep their impact and their order; the stopping points count up to the last pair
    that decides a rank change / that may flip the call."""
    case = random_case(seed)
    plain = compute_pending_impact(lake(**case), DATASET)
    calls = {("A", "B"): ("a", "none"), ("A", "C"): ("b", "b"), ("B", "C"): ("none", "none")}
    tested = compute_pending_impact(fake_significance(lake(**case), calls), DATASET)
    in_top = {(q, d) for q, d in case["pending"] if d in case["runs"]["A"][q] or d in case["runs"]["B"][q]}
    flipping = set(zip(*tested.filter(pl.col("flips") > 0).select("query_id", "doc_id")
                       .to_dict(as_series=False).values(), strict=True))
    assert flipping == in_top
    assert all(len(calls) == 1 and calls[0]["system_a"] == "A" and calls[0]["system_b"] == "B"
               for calls in tested.filter(pl.col("flips") > 0)["significance_pairs"].to_list())
    assert tested["significance_in_doubt"].unique().to_list() == [1]
    joined = tested.join(plain, on=["query_id", "doc_id"], suffix="_plain")
    assert (joined["impact"] - joined["impact_plain"] - SIGNIFICANCE_WEIGHT * joined["flips"]).abs().max() < 1e-12
    unmoved = [pair for pair in zip(tested["query_id"], tested["doc_id"], strict=True) if pair not in flipping]
    assert unmoved == [pair for pair in zip(plain["query_id"], plain["doc_id"], strict=True) if pair not in flipping]
    ranks = dict(zip(zip(tested["query_id"], tested["doc_id"], strict=True), tested["impact_rank"], strict=True))
    deciding = [ranks[q, d] for q, d in zip(tested["query_id"], tested["doc_id"], strict=True)
                if tested.filter((pl.col("query_id") == q) & (pl.col("doc_id") == d))["decides"][0] > 0]
    assert stopping_point(tested) == max(deciding, default=0)
    assert stopping_point_with_significance(tested) == max([*deciding, *(ranks[p] for p in flipping)], default=0)
    assert stopping_point(plain) == plain.filter(pl.col("impact") > 0).height


def test_the_plan_the_summary_and_the_report_state_the_stopping_point_with_significance():
    from bridge_assets.cli.summary import _stopping_point
    from bridge_assets.human.plan import annotation_plan, describe, plan_text
    from bridge_assets.reports.label_sections import impact_section

    con = with_significance(lake(**SIGNIFICANCE_CASE))
    frame = compute_pending_impact(con, DATASET)
    con.register("impact_frame", frame)
    con.execute("create table pending_impact as select * from impact_frame")
    text = plan_text(con, DATASET)
    assert "stopping point: 0 label(s), in impact order, make every rank change on nDCG@10 robust" in text
    assert ("with significance: 1 label(s), in impact order, also settle every significance call on nDCG@10 "
            "that differs between the bounds (1 system pair(s)); an upper figure") in text
    assert "may flip the significance of A vs B" in text
    assert describe(annotation_plan(con, DATASET)) == text
    plan = annotation_plan(con, DATASET)
    assert (plan.stopping_point, plan.stopping_point_with_significance, plan.significance_in_doubt) == (0, 1, 1)

    lines = _stopping_point(con, DATASET)
    assert lines[0].startswith("stopping point: 0 more label(s), in impact order, decide every rank change")
    assert lines[1].startswith("stopping point with significance: 1 more label(s), in impact order, also settle "
                               "every significance call on nDCG@10 that differs between the bounds (1 system "
                               "pair(s); an upper figure")

    qrels = con.execute("select * from bridge_qrels").pl().with_columns(
        pl.when(pl.col("relevance").is_null()).then(pl.lit("pending")).otherwise(pl.col("source")).alias("source"))
    section = impact_section(frame, qrels)
    assert section.notes[0].startswith("Stopping point: 0 more label(s), in impact order")
    assert section.notes[1].startswith("With significance: 1 more label(s), in impact order, also settle every "
                                       "significance call on nDCG@10")
    assert section.tables  # the pair that may flip the call is listed


def test_a_plan_on_a_table_made_before_the_significance_columns():
    """An older pending_impact (no significance columns): the plan says significance is not known."""
    from bridge_assets.cli.summary import _stopping_point
    from bridge_assets.human.plan import plan_text

    con = lake(**HAND_MADE)
    frame = compute_pending_impact(con, DATASET).drop("significance_pairs", "flips", "significance_in_doubt")
    con.register("impact_frame", frame)
    con.execute("create table pending_impact as select * from impact_frame")
    text = plan_text(con, DATASET)
    assert "stopping point: 1 label(s), in impact order" in text
    assert "with significance: not known" in text
    assert len(_stopping_point(con, DATASET)) == 1
