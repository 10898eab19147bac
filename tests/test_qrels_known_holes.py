"""Scoring the refined qrels against a dataset's known holes (the demo's holes.jsonl kind of
answer key), on the labeled lake of fixtures.labeled_lake, counted by hand."""

from __future__ import annotations

import json

import pytest

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.lake import store
from bridge_assets.qrels.known_holes import read_known_holes, score_known_holes
from fixtures.labeled_lake import DATASET, materialize_qrels
from fixtures.paths import location


def write_key(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_found_missed_pending_and_false_holes_are_counted(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    key_file = tmp_path / "holes.jsonl"
    # q1: d5 (debate said relevant) and d6 (pooled, never labelled) are holes; q2: the pending
    # d10 is one; q3: d7 (people said relevant) is only a partial answer; q4: d8 (people said
    # relevant) is not in the key, so it is a false hole. q1/d11 (people said no) is a hole missed.
    write_key(key_file, [{"query_id": "q1", "doc_ids": ["d5", "d6", "d11"]},
                         {"query_id": "q2", "doc_ids": ["d10"]},
                         {"query_id": "q3", "doc_ids": [], "partial": ["d7"]},
                         {"query_id": "q4", "doc_ids": []}])
    with store.connect(location()) as con:
        score = score_known_holes(con, DATASET, read_known_holes(key_file))
    assert (score.queries, score.pooled_holes, score.found, score.missed, score.pending) == (4, 4, 1, 2, 1)
    assert (score.reported, score.reported_true, score.reported_partial, score.reported_false) == (3, 1, 1, 1)
    assert score.false_pairs == [("q4", "d8", "human")]
    assert sorted(score.missed_pairs) == [("q1", "d11", "human"), ("q1", "d6", "unlabelled")]
    assert score.precision == pytest.approx(1 / 3) and score.recall == pytest.approx(1 / 4)
    assert "4 verified holes in the pool: 1 found, 2 missed, 1 pending" in score.summary_line()


def test_a_broken_key_names_file_and_line(tmp_path):
    key_file = tmp_path / "holes.jsonl"
    key_file.write_text('{"query_id": "q1", "doc_ids": []}\n{"doc_ids": ["d1"]}\n')
    with pytest.raises(DatasetError, match=r"holes.jsonl, line 2"):
        read_known_holes(key_file)
