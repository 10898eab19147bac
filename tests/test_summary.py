"""The summary `bridge run` prints, on the labeled lake of fixtures.labeled_lake: found holes are
verified labels only, pending pairs come with the command to annotate them, model guesses are
reported apart, rank changes are robust ones, and the labels are scored against known holes."""

from __future__ import annotations

import json
import time

import dagster as dg

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.cli.summary import rank_range, run_summary
from bridge_assets.lake import store
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.registry.datasets import DatasetSpec
from fixtures.labeled_lake import DATASET
from fixtures.paths import lake_resources, location


def test_the_summary_counts_verified_holes_and_bounds_the_rest(labeled_lake, tmp_path):
    result = dg.materialize([qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics,
                             analysis_assets.ranking_shift], partition_key=DATASET,
                            resources=lake_resources(labeled_lake))
    assert result.success
    key = tmp_path / "holes.jsonl"
    key.write_text("".join(json.dumps(r) + "\n" for r in (
        {"query_id": "q1", "doc_ids": ["d5"]}, {"query_id": "q3", "doc_ids": ["d7"]},
        {"query_id": "q4", "doc_ids": []})))
    spec = DatasetSpec(name=DATASET, kind="beir", path=".", known_holes=str(key))
    with store.connect(location()) as con:
        text = run_summary(con, DATASET, time.time(), spec)
    lines = text.splitlines()
    assert lines[0] == "== demo =="
    # d5 (debate), d7 and d8 (people): the adjudicator's guess on the pending q2/d10 is not one
    assert any(line.startswith("holes found (verified") and line.endswith(": 3") for line in lines)
    assert "pending (escalated, awaiting people; not labels, metrics bound them): 1" in lines
    assert "  annotate them: bridge annotate add-annotator NAME; bridge annotate serve --dataset demo" in lines
    assert "  unverified guesses by the LLM adjudicator (not counted): 0 relevant / 1 not" in lines
    # q4's d8 is not in the key: a false hole; both verified holes in the pool are found
    assert any("2 verified holes in the pool: 2 found, 0 missed, 0 pending" in line
               and "3 reported holes: 2 verified, 0 partial, 1 false" in line for line in lines)
    # nDCG@10: only changes that hold at both bounds are listed
    robust = next(line for line in lines if line.startswith("robust rank changes"))
    with store.connect(location()) as con:
        moves = con.execute("select retriever from ranking_shift where measure = 'ndcg_cut_10' "
                            "and robust_rank_change <> 0").fetchall()
    assert all(name in robust for (name,) in moves) and (moves or robust.endswith("none"))

    # the agents' vote beyond the human budget is unverified, and nobody is asked to label it
    with store.connect(location()) as con:
        con.execute("update bridge_qrels set unverified_source = 'vote', unverified_label = 1 "
                    "where source = 'pending'")
        voted = run_summary(con, DATASET, time.time(), spec).splitlines()
    assert "beyond the human budget (the agents' vote, unverified; not labels, metrics bound them): 1" in voted
    assert not any(line.startswith("pending (escalated") for line in voted)


def test_a_rank_range_reads_best_to_worst_whichever_bound_gives_which():
    # the demo printed "bm25_rm3 7->9..8": pending = 1 ranked it better than pending = 0
    assert rank_range(9, 8) == "8..9"
    assert rank_range(2, 5) == "2..5"
    assert rank_range(4, 4) == "4"
