"""`bridge audit`: the story of a debate-labelled pair, a human-labelled pair and an original
pair of the labeled lake of fixtures.labeled_lake, as text and as JSON, with the Dagster run that
built bridge_qrels; and a lake where the labeling stages never ran."""

from __future__ import annotations

import hashlib
import json

import dagster as dg
import pytest
import typer
from typer.testing import CliRunner

from bridge_assets.cli.audit import audit_command, audit_pair, format_story
from bridge_assets.labeling.prompts import Prompts
from bridge_assets.lake import ducklake, store
from bridge_assets.llm.parsing import canonical_json
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.settings import env
from fixtures.labeled_lake import DATASET, MODEL, QUERIES, turn_call
from fixtures.paths import lake_resources, location

app = typer.Typer()
app.command()(audit_command)


@pytest.fixture
def audited_lake(labeled_lake, monkeypatch):
    """The lake with bridge_qrels materialized on its own Dagster instance (as `bridge` runs it)."""
    home = labeled_lake / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    result = dg.materialize([qrels_assets.bridge_qrels], partition_key=DATASET, instance=orchestration.instance(),
                            resources=lake_resources(labeled_lake))
    assert result.success
    return labeled_lake, result.run_id


def audit(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--dataset", DATASET, *args])
    return result.exit_code, result.output


def test_debate_pair_text_tells_the_whole_story(audited_lake):
    _, run_id = audited_lake
    code, text = audit("--query", "q1", "--doc", "d5")
    assert code == 0, text
    assert "What does len() return?" in text and "the number of items" in text
    assert "d5 A long passage" in text
    assert "bm25" in text and "rank 2" in text and "rank 1" in text  # bm25 ranked it 2nd, dense 1st
    assert "kept (1/1 supported)" in text and "qwen-0.5b" in text and "call filter-q1-d5" in text
    assert "consensus  label 1  rounds 1  config debate-cfg" in text
    assert "round 1 agent A (relevant, qwen-0.5b): yes" in text and "round 1 agent B (irrelevant, qwen-0.5b): yes" in text
    assert 'quote: "quote from d5"' in text and "reason: agent B on q1/d5 round 1" in text
    assert "relevance 1  source debate" in text
    prompt = hashlib.sha256(canonical_json([list(m) for m in turn_call("q1", "d5", 1, "A").messages])
                            .encode()).hexdigest()[:16]
    assert f"prompt {prompt}" in text and "run run-debate-1" in text and MODEL in text
    assert f"{'template debate_turn':<22}{Prompts().hash('debate_turn')} (current)" in text
    assert f"{'bridge_qrels':<22}{run_id}" in text
    # every stage but the student ran on this lake
    assert text.count("not materialized") == 1 and "not materialized: student_scores" in text


def test_debate_pair_json_for_machines(audited_lake):
    _, run_id = audited_lake
    code, output = audit("--query", "q1", "--doc", "d5", "--json")
    assert code == 0, output
    story = json.loads(output)
    assert story["query"] == {"text": QUERIES["q1"][0], "answers": QUERIES["q1"][1]}
    assert [(r["retriever"], r["rank"]) for r in story["retrieval"]] == [("dense", 1), ("bm25", 2)]
    assert story["candidate_pool"]["systems"] == ["bm25", "dense"] and story["candidate_pool"]["ranks"] == [2, 1]
    assert story["filter"]["votes"][0]["is_supported"] is True
    assert story["debate"]["outcome"] == "consensus" and len(story["debate"]["turns"]) == 2
    assert story["final"]["source"] == "debate" and story["final"]["relevance"] == 1
    keys = [t["call_key"] for t in story["debate"]["turns"]]
    assert story["final"]["call_keys"] == keys
    assert {c["key"] for c in story["llm_calls"]} == set(keys)  # the filter call keys are not in the ledger
    assert all(c["model"] == MODEL and c["run_id"] == "run-debate-1" for c in story["llm_calls"])
    qrels_run = next(r for r in story["dagster_runs"] if r["asset"] == "bridge_qrels")
    assert {"asset": "bridge_qrels", "partition": DATASET, "run_id": run_id} == \
        {k: v for k, v in qrels_run.items() if k not in ("materialized_at", "snapshot")}
    if env.storage == "ducklake":  # the snapshot its write committed
        with store.connect_read_only(location()) as con:
            assert isinstance(qrels_run["snapshot"], int)
            assert qrels_run["snapshot"] == ducklake.snapshot_of_run(con, run_id)
    else:
        assert qrels_run["snapshot"] == "n/a"  # a DuckDB file keeps no snapshots
    assert story["not_materialized"] == ["student_scores"]  # the one stage this lake never ran
    assert story["student"] is None


def test_human_pair_lists_annotators_history_and_attention_checks(audited_lake):
    code, text = audit("--query", "q3", "--doc", "d7")
    assert code == 0, text
    assert "escalated  label None  rounds 2" in text
    assert f"{'majority':<22}label 1  (2/3 relevant, agreement 0.67)" in text
    assert "alice" in text and "carol" in text and "without history" in text
    assert "dave" in text and "attention check" in text and "excluded" in text
    assert "relevance 1  source human" in text
    code, output = audit("--query", "q3", "--doc", "d7", "--json")
    story = json.loads(output)
    annotators = {(v["annotator_id"], v["status"], v["is_attention_check"]) for v in story["human"]["votes"]}
    assert annotators == {("alice", "accepted", False), ("bob", "accepted", False), ("carol", "accepted", False),
                          ("dave", "excluded", True), ("erin", "excluded", False)}
    accepted = [v["vote_id"] for v in story["human"]["votes"] if v["status"] == "accepted"]
    assert story["final"]["vote_ids"] == accepted


def test_original_pair_has_no_labeling_steps(audited_lake):
    code, text = audit("--query", "q2", "--doc", "d2")
    assert code == 0, text
    assert "relevance 1" in text and "source original" in text
    assert "not filtered" in text and "not debated" in text and "no human votes" in text
    assert "no LLM call behind this label" in text
    story = json.loads(audit("--query", "q2", "--doc", "d2", "--json")[1])
    assert story["original_judgment"] == 1 and story["debate"] is None and story["llm_calls"] == []
    assert [r["retriever"] for r in story["retrieval"]] == ["dense", "splade", "bm25"]


def test_pending_pair_and_unknown_pair(audited_lake):
    code, text = audit("--query", "q2", "--doc", "d10")
    assert code == 0 and "pending: escalated, awaiting people (not a label)" in text
    assert "unverified guess      0 by the adjudicator (not counted)" in text
    # the agents quoted words that are not in the chunk: the story says so
    assert 'quote: "quote from d10"  [NOT IN THE CHUNK]' in text
    story = json.loads(audit("--query", "q2", "--doc", "d10", "--json")[1])
    assert story["final"]["relevance"] is None and story["final"]["source"] == "pending"
    assert story["debate"]["turns"][0]["quotes_in_chunk"] == [False]
    code, text = audit("--query", "nope", "--doc", "ghost")
    assert code == 2 and "knows neither query 'nope' nor document 'ghost'" in text


def test_stages_never_run_are_reported_not_materialized(labeled_lake):
    with store.connect(location()) as con:
        # (the votes are in the votes store: a plain lake connection never sees human_votes)
        for table in ("retrieval_run", "candidate_pool", "filter_votes", "filtered_pool", "debate_labels",
                      "debate_turns", "human_labels", "llm_calls"):
            con.execute(f"drop table {table}")
        story = audit_pair(con, DATASET, "q1", "d1")
    assert set(story["not_materialized"]) == {"retrieval_run", "candidate_pool", "filter_votes", "filtered_pool",
                                              "debate_labels", "debate_turns", "human_labels", "human_votes",
                                              "bridge_qrels", "student_scores"}
    assert story["dagster_runs"] is None and story["final"] is None and story["original_judgment"] == 1
    text = format_story(story)
    assert "not materialized: retrieval_run, candidate_pool" in text
    assert "not materialized: bridge_qrels" in text
