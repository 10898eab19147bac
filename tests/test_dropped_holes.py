"""The audit of the filter's drops: the estimate of the holes they hide (checked against a
hand computation of the Wilson interval), and the dataset setting that lets the metrics'
upper bound count that estimate (relevance.drops_in_bounds, off by default)."""

from __future__ import annotations

import math

import duckdb
import pytest

from bridge_assets.analysis.views import analysis_views
from bridge_assets.labeling.review import AUDIT
from bridge_assets.qrels.merge import build_bridge_qrels
from bridge_assets.qrels.trust import DroppedHoles, Proportion, dropped_holes
from bridge_assets.registry.relevance import RelevanceSettings

DATASET = "toy"
DROPS = 40          # d00..d39, the filter's P(yes) falling with the number
AUDITED = 10        # d30..d39 in the audit sample, labelled by people; d30 and d31 are holes
HOLES = 2


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval, written out (Wilson 1927)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.fixture
def lake() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    docs = [f"d{i:02d}" for i in range(DROPS)]
    con.execute("create table original_qrels as select 'toy' as dataset, 'q1' as query_id, "
                "'gold' as doc_id, 1 as relevance")
    con.execute("create table filtered_pool (dataset varchar, query_id varchar, doc_id varchar, kept boolean)")
    con.execute("create table filter_votes (dataset varchar, query_id varchar, doc_id varchar, pair_key varchar, "
                "model varchar, call_key varchar, is_supported boolean, p_yes double)")
    con.execute("create table review_sample (dataset varchar, query_id varchar, doc_id varchar, kind varchar)")
    con.execute("create table human_labels (dataset varchar, query_id varchar, doc_id varchar, label integer)")
    for i, doc in enumerate(docs):
        con.execute("insert into filtered_pool values ('toy', 'q1', ?, false)", [doc])
        con.execute("insert into filter_votes values ('toy', 'q1', ?, ?, 'm', ?, false, ?)",
                    [doc, f"key-{doc}", f"call-{doc}", 0.19 - i * 0.001])
    con.execute("insert into filtered_pool values ('toy', 'q1', 'kept', true)")
    # the audit: ten labelled (two holes), two drawn but not labelled yet, one calibration pair
    for i in range(30, 40):
        con.execute("insert into review_sample values ('toy', 'q1', ?, ?)", [docs[i], AUDIT])
        con.execute("insert into human_labels values ('toy', 'q1', ?, ?)", [docs[i], int(i < 30 + HOLES)])
    for i in (28, 29):
        con.execute("insert into review_sample values ('toy', 'q1', ?, ?)", [docs[i], AUDIT])
    con.execute("insert into review_sample values ('toy', 'q1', 'kept', 'calibration')")
    yield con
    con.close()


def test_the_estimate_is_the_audited_share_scaled_to_the_drops(lake):
    estimate = dropped_holes(lake, DATASET)
    assert (estimate.drops, estimate.sampled, estimate.audited) == (DROPS, 12, Proportion(HOLES, AUDITED))
    low, high = wilson(HOLES, AUDITED)
    holes, got_low, got_high = estimate.estimate
    assert holes == pytest.approx(HOLES / AUDITED * DROPS)                      # 8.0
    assert (got_low, got_high) == pytest.approx((low * DROPS, high * DROPS))   # [2.3, 22.2]
    line = estimate.describe()
    assert f"about 8.0 holes among the drops [95% CI {low * DROPS:.1f}, {high * DROPS:.1f}]" in line
    assert "2 of them holes" in line and "audit sample 12" in line
    # the upper bound's count: the high end over the 30 drops nobody labelled, rounded up
    assert estimate.at_upper == math.ceil(high * (DROPS - AUDITED))
    assert "upper bound counts" not in line
    assert f"counts {estimate.at_upper} of the 30 unlabelled drops" in estimate.describe(in_bounds=True)


def test_no_estimate_before_people_label_the_audit():
    unlabelled = DroppedHoles(DROPS, Proportion(0, 0), 12)
    assert unlabelled.estimate is None and unlabelled.at_upper == 0
    assert "not estimated" in unlabelled.describe(in_bounds=True)
    assert DroppedHoles(0, Proportion(0, 0), 0).describe() == "the filter dropped no pair"


def test_the_bound_counts_the_drops_most_likely_relevant_only_when_asked(lake):
    assert RelevanceSettings().drops_in_bounds is False  # off by default, until measured
    plain = build_bridge_qrels(lake, DATASET)
    assert not plain.qrels["estimated_hole"].any() and plain.counts()["estimated_holes"] == 0

    bounded = build_bridge_qrels(lake, DATASET, drops_in_bounds=True)
    expected = dropped_holes(lake, DATASET).at_upper
    assert 0 < expected < DROPS - AUDITED
    marked = bounded.qrels.filter("estimated_hole")
    # the drops with the highest P(yes), among those people have not labelled; still relevance 0
    assert marked["doc_id"].to_list() == [f"d{i:02d}" for i in range(expected)]
    assert set(marked["source"]) == {"filter"} and set(marked["relevance"]) == {0}
    # found holes: only the audit's, which people labelled
    assert not marked["verified"].any() and bounded.counts()["holes_found"] == HOLES
    assert bounded.counts()["estimated_holes"] == expected and bounded.dropped.at_upper == expected

    # the metrics' bounds: lower as before, upper counts the marked drops relevant
    frame = bounded.qrels  # noqa: F841 (read by DuckDB's replacement scan below)
    lake.execute("create table bridge_qrels as select * from frame")
    lake.execute("create table retrieval_run as select 'toy' as dataset, 'bm25' as retriever, 'q1' as query_id, "
                 "'gold' as doc_id, 1 as rank, 1.0 as score")
    with analysis_views(lake, DATASET, "all", asset="test"):
        lower = dict(lake.execute("select doc_id, relevance from analysis_refined_qrels").fetchall())
        upper = dict(lake.execute("select doc_id, relevance from analysis_refined_upper_qrels").fetchall())
    counted = {doc for doc, relevance in upper.items() if relevance > 0} - {"gold", "d30", "d31"}
    assert counted == set(marked["doc_id"])
    assert {doc for doc, relevance in lower.items() if relevance > 0} == {"gold", "d30", "d31"}
