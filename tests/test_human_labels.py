"""human_labels: majority vote, Fleiss' kappa, data version, the asset, its sensor, and the
`bridge annotate` commands, over the escalated set of tests/fixtures/escalated_set.py."""

from __future__ import annotations

import hashlib
import json

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest
from statsmodels.stats.inter_rater import fleiss_kappa as statsmodels_fleiss_kappa
from typer.testing import CliRunner

from bridge_assets.cli import annotate as cli
from bridge_assets.human.agreement import category_counts, fleiss_kappa
from bridge_assets.human.assets import READS, human_labels, human_labels_sensor
from bridge_assets.human.items import highlight
from bridge_assets.human.labels import compute_human_labels
from bridge_assets.lake import snapshots, store
from fixtures.escalated_set import DATASET, ESCALATED, vote
from fixtures.paths import annotations, lake_resources, location, votes_db

# --- Fleiss' kappa --------------------------------------------------------------------------

# Fleiss (1971) as worked on Wikipedia ("Fleiss' kappa", worked example): 10 subjects,
# 14 raters each, 5 categories; kappa = 0.210.
FLEISS_EXAMPLE = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
                  [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
                  [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]


def test_fleiss_kappa_matches_the_worked_literature_example_computed_by_hand():
    n, N = 14, len(FLEISS_EXAMPLE)
    p_j = [sum(row[j] for row in FLEISS_EXAMPLE) / (N * n) for j in range(5)]
    assert [round(p, 3) for p in p_j] == [0.143, 0.200, 0.279, 0.150, 0.229]
    P_i = [(sum(c * c for c in row) - n) / (n * (n - 1)) for row in FLEISS_EXAMPLE]
    assert round(P_i[1], 3) == 0.253 and P_i[0] == 1.0
    P_bar, P_e = sum(P_i) / N, sum(p * p for p in p_j)
    assert round(P_bar, 3) == 0.378 and round(P_e, 3) == 0.213
    by_hand = (P_bar - P_e) / (1 - P_e)
    assert round(by_hand, 3) == 0.210
    assert fleiss_kappa(FLEISS_EXAMPLE) == pytest.approx(by_hand, abs=1e-12)


def test_fleiss_kappa_agrees_with_statsmodels_on_binary_votes_and_handles_edge_cases():
    rng = np.random.default_rng(7)
    votes = rng.integers(0, 2, size=(40, 3)).tolist()
    table = category_counts(votes)
    assert table.shape == (40, 2) and table.sum() == 120
    assert fleiss_kappa(table) == pytest.approx(statsmodels_fleiss_kappa(table))
    assert fleiss_kappa(category_counts([[1, 1, 1], [0, 0, 0]])) == pytest.approx(1.0)
    assert fleiss_kappa(category_counts([[1, 1, 1], [1, 1, 1]])) is None  # one category only
    assert fleiss_kappa(category_counts([])) is None
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa([[2, 1], [1, 0]])
    with pytest.raises(ValueError, match="subject 0"):
        category_counts([[2]])


def test_highlight_marks_each_agents_quotes_despite_whitespace_and_case():
    text = "Alpha beta.  Gamma\ndelta. Epsilon."
    segments = highlight(text, {"A": ["alpha BETA.", "gamma delta."], "B": ["Gamma delta. Epsilon"]})
    assert "".join(s.text for s in segments) == text
    marked = [(s.text, s.agents) for s in segments if s.agents]
    assert marked == [("Alpha beta.", ("A",)), ("Gamma\ndelta.", ("A", "B")), (" Epsilon", ("B",))]
    assert highlight("no quotes here", {"A": ["missing", "  "]})[0].agents == ()


# --- the plain function -----------------------------------------------------------------------

def test_majority_over_accepted_votes_with_coverage_kappa_and_open_pairs(escalated_lake):
    p1, p2, p3, p4 = ESCALATED
    with annotations() as con:
        for pair, labels in ((p1, [1, 1, 0]), (p2, [0, 0, 0]), (p3, [1, 0])):
            for who, label in zip(("ann", "bob", "cat"), labels):
                vote(con, pair, who, label)
        vote(con, p3, "dan", 1, status="excluded")          # excluded votes never count
        vote(con, p4, "ann", 0, check=True)                 # nor attention checks
        before = compute_human_labels(con, DATASET)
        counted = [r[0] for r in con.execute("select vote_id from human_votes where query_id = 'q1' "
                                             "and doc_id = 'd5' order by vote_id").fetchall()]
    assert before.escalated_pairs == 4 and before.open_pairs == 2 and before.decided_pairs == 2
    assert before.coverage == 0.5 and before.accepted_votes == 8 and before.excluded_votes == 1
    rows = {(r["query_id"], r["doc_id"]): r for r in before.labels.to_dicts()}
    assert rows[p1] == {"dataset": DATASET, "query_id": "q1", "doc_id": "d5", "review": None, "label": 1, "votes": 3,
                        "votes_relevant": 2, "agreement": pytest.approx(2 / 3), "vote_ids": counted}
    assert rows[p2]["label"] == 0 and rows[p2]["agreement"] == 1.0 and set(rows) == {p1, p2}
    assert before.kappa == pytest.approx(statsmodels_fleiss_kappa(np.array([[1, 2], [3, 0]])))

    with annotations() as con:
        vote(con, p3, "eve", 1)
        vote(con, p4, "ann", 1)
        vote(con, p4, "bob", 0)
        same = compute_human_labels(con, DATASET).data_version
        vote(con, p4, "cat", 1)
        after = compute_human_labels(con, DATASET)
    assert same != before.data_version  # a new vote changes the data version ...
    assert after.data_version != same and after.open_pairs == 0 and after.coverage == 1.0
    with annotations() as con:  # ... and nothing else does
        assert compute_human_labels(con, DATASET).data_version == after.data_version
    assert dict(zip(after.labels["doc_id"], after.labels["label"])) == {"d5": 1, "d6": 0, "d7": 1, "d8": 1}


def test_a_tie_keeps_the_pair_open_until_a_tie_breaking_vote(escalated_lake):
    pair = ESCALATED[0]
    with annotations() as con:
        for who, label in (("ann", 1), ("bob", 0), ("cat", 1), ("dan", 0)):
            vote(con, pair, who, label)
        tied = compute_human_labels(con, DATASET)
        vote(con, pair, "eve", 0)
        broken = compute_human_labels(con, DATASET)
    assert pair not in set(tied.labels.select("query_id", "doc_id").iter_rows())
    assert broken.labels.filter(pl.col("doc_id") == pair[1])["label"].to_list() == [0]


# --- the asset and its sensor -----------------------------------------------------------------

def materialize(lake, allow_partial=False):
    return dg.materialize([human_labels], partition_key=DATASET, raise_on_error=False,
                          resources=lake_resources(lake),
                          run_config={"ops": {"human_labels": {"config": {"allow_partial": allow_partial}}}})


def test_asset_refuses_open_pairs_unless_partial_is_asked_and_then_says_how_many(escalated_lake):
    with annotations() as con:
        for who, label in (("ann", 1), ("bob", 1), ("cat", 0)):
            vote(con, ESCALATED[0], who, label)
    refused = materialize(escalated_lake)
    assert not refused.success
    failure = refused.get_step_failure_events()[0].step_failure_data.error.message
    assert "human_labels for dataset 'demo': 3 of 4 escalated pairs still need votes" in failure
    assert "allow_partial" in failure
    with store.connect(location(escalated_lake)) as con:
        assert not store.table_exists(con, "human_labels")

    partial = materialize(escalated_lake, allow_partial=True)
    assert partial.success
    meta = partial.asset_materializations_for_node("human_labels")[0].metadata
    assert meta["open_pairs"].value == 3 and meta["coverage"].value == 0.25
    with store.connect(location(escalated_lake)) as con:
        assert con.execute("select query_id, doc_id, label, votes from human_labels").fetchall() == \
            [("q1", "d5", 1, 3)]


def test_sensor_requests_a_run_whenever_the_votes_differ_from_human_labels_and_only_then(escalated_lake, tmp_path):
    resources = lake_resources(escalated_lake)
    lake_store, votes = resources["store"], resources["votes"]
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        def tick():
            with dg.build_sensor_context(instance=instance, resources=resources) as context:
                return human_labels_sensor(context)

        with annotations() as con:  # three of the four escalated pairs get their votes
            for pair in ESCALATED[:3]:
                for who in ("ann", "bob", "cat"):
                    vote(con, pair, who, 1)
        # no waiting for the fourth pair: what is decided goes into the benchmark now
        [request] = tick().run_requests
        assert request.partition_key == DATASET and request.run_key.startswith("human_labels:demo:")
        assert tick().run_requests[0].run_key == request.run_key  # the same state, the same key

        result = dg.materialize([human_labels], partition_key=DATASET, instance=instance,
                                resources=resources)
        assert result.success  # partial by default: the open pair stays pending
        event = result.asset_materializations_for_node("human_labels")[0]
        assert event.metadata["votes_version"].value == request.run_key.rsplit(":", 1)[1]
        assert event.metadata["open_pairs"].value == 1
        skipped = tick()  # human_labels holds these votes: nothing to run
        assert isinstance(skipped, dg.SkipReason) and "every dataset" in skipped.skip_message

        # a run changed the escalated set (the consensus pair now escalated), no vote arrived: the
        # sensor stays quiet (that run rebuilds human_labels itself), though the table's inputs moved
        def now():
            with snapshots.inputs(lake_store, DATASET, READS, votes=votes) as con:
                return compute_human_labels(con, DATASET)

        before = now()
        with store.connect(location(escalated_lake)) as con:
            con.execute("update debate_labels set outcome = 'escalated', label = null where pair_key = 'consensus'")
        after = now()
        assert after.escalated_pairs == before.escalated_pairs + 1
        assert after.data_version != before.data_version and after.votes_version == before.votes_version
        assert isinstance(tick(), dg.SkipReason)

        with annotations() as con:
            vote(con, ESCALATED[3], "dan", 0)  # one more vote: a new state, a new run key
        again = tick()
        assert again.run_requests[0].run_key != request.run_key


# --- the `bridge annotate` commands -------------------------------------------------------------

def test_add_annotator_prints_a_token_stored_only_as_a_hash(data_lake):
    runner = CliRunner()
    result = runner.invoke(cli.app, ["add-annotator", "alice", "--admin"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert len(token) >= 40
    with duckdb.connect(str(votes_db(data_lake))) as con:
        rows = con.execute("select annotator_id, token_hash, is_admin from annotators").fetchall()
        dump = json.dumps(con.execute("select * from annotators").fetchall(), default=str)
    assert rows == [("alice", hashlib.sha256(token.encode()).hexdigest(), True)]
    assert token not in dump
    again = runner.invoke(cli.app, ["add-annotator", "alice"])
    assert again.exit_code == 2 and "exists" in again.output
    assert runner.invoke(cli.app, ["add-annotator", "bad name!"]).exit_code == 2
    rotated = runner.invoke(cli.app, ["add-annotator", "alice", "--rotate"])
    assert rotated.exit_code == 0 and rotated.stdout.strip().splitlines()[-1] != token


def test_import_and_export_commands_round_trip_and_reject_bad_files(escalated_lake, tmp_path):
    runner = CliRunner()
    good = tmp_path / "votes.csv"
    good.write_text("dataset,query_id,doc_id,annotator_id,label,comment,with_history\n"
                    "demo,q1,d5,ext1,yes,looks right,true\n"
                    "demo,q1,d5,ext2,0,,false\n")
    result = runner.invoke(cli.app, ["import", str(good)])
    assert result.exit_code == 0, result.output
    assert "imported 2 votes" in result.stdout
    again = runner.invoke(cli.app, ["import", str(good)])
    assert again.exit_code == 2 and "line 2: this annotator already has a vote" in again.output

    bad = tmp_path / "bad.csv"
    bad.write_text("dataset,query_id,doc_id,annotator_id,label\n"
                   "demo,q1,d5,ext3,maybe\n"
                   "demo,q9,d5,ext3,1\n"
                   "demo,q2,d6,ext3,1\n")
    rejected = runner.invoke(cli.app, ["import", str(bad)])
    assert rejected.exit_code == 2
    assert "bad.csv: 2 problem(s), nothing imported" in rejected.output
    assert "bad.csv, line 2: label: Value error, label 'maybe'" in rejected.output
    assert "bad.csv, line 3: not a pair sent to people" in rejected.output

    out = tmp_path / "out.json"
    exported = runner.invoke(cli.app, ["export", "--format", "json", "--output", str(out)])
    assert exported.exit_code == 0, exported.output
    votes = json.loads(out.read_text())
    assert [(v["annotator_id"], v["label"], v["with_history"], v["comment"]) for v in votes] == \
        [("ext1", 1, True, "looks right"), ("ext2", 0, False, None)]
    csv_out = runner.invoke(cli.app, ["export"]).stdout
    assert csv_out.splitlines()[0].startswith("vote_id,dataset,query_id,doc_id,annotator_id,label")


def test_parse_votes_names_the_file_and_record_of_every_problem():
    from bridge_assets.human.transfer import ImportFailed, parse_votes

    records, errors = parse_votes(json.dumps([
        {"dataset": "demo", "query_id": 1, "doc_id": "d5", "annotator_id": "x", "label": True},
        {"dataset": "demo", "query_id": "q1", "doc_id": "d5", "annotator_id": "x", "label": 4},
        {"dataset": "demo", "query_id": "q1", "doc_id": "d1", "annotator_id": "x", "label": 1,
         "is_attention_check": True},
        "not a record"]).encode(), "votes.json")
    assert [(w, r.query_id, r.label) for w, r in records] == [("record 1", "1", 1)]
    assert errors[0].startswith("votes.json, record 2: label: ")
    assert errors[1].startswith("votes.json, record 3: ") and "expected_label is required" in errors[1]
    assert errors[2].startswith("votes.json, record 4: ")
    _, studio_errors = parse_votes(json.dumps([
        {"id": 9, "data": {"dataset": "demo", "query_id": "q1", "doc_id": "d5"},
         "annotations": [{"completed_by": 1, "result": [
             {"type": "choices", "from_name": "a", "value": {"choices": ["yes"]}},
             {"type": "choices", "from_name": "b", "value": {"choices": ["no"]}}]}]},
        {"id": 10, "data": "oops", "annotations": []}]).encode(), "ls.json")
    assert studio_errors == [
        "ls.json, task 1 (id 9), annotation 1: needs exactly one 'choices' result (or one whose "
        "from_name is 'relevance')",
        "ls.json, task 2: data: Input should be a valid dictionary"]
    for content, name, message in ((b"[1, {]", "bad.json", "bad.json, line 1: malformed JSON"),
                                   (b'{"x": 1}', "bad.json", "expected a list of votes"),
                                   (b"dataset,label\n", "bad.csv", r"bad.csv, line 1: missing column\(s\)"),
                                   (b"\xff\xfe", "bad.csv", "not UTF-8")):
        with pytest.raises(ImportFailed, match=message):
            parse_votes(content, name)
