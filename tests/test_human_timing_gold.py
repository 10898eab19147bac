"""The human side measured (issue 26, items 4 and 5): the time per judgment recorded with every
vote (served -> answered, idle time capped), old votes stores opened with the new column, and
people's decided pairs exported as a gold set that `bridge label-eval` reads."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import duckdb
from typer.testing import CliRunner

from bridge_assets.cli import annotate as cli
from bridge_assets.cli.main import app as bridge_app
from bridge_assets.evaluation.goldsets import read_goldset
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.queue import QueueSettings, next_assignment
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import IDLE_CAP_SECONDS, judgment_seconds, judgment_times, record_vote
from bridge_assets.labeling.labeler import Labeler, LabelerRun, LabelerSettings, outcome_label
from fixtures.escalated_set import DATASET, ESCALATED, vote
from fixtures.paths import annotations

PLUGIN = f"{__name__}:PeoplesLabeler"
PEOPLE: dict[str, int] = {}  # gold id -> the label people gave (what PeoplesLabeler answers)


class PeoplesLabeler(Labeler):
    """Answers what people answered: on the exported gold set it must score perfectly."""

    class Settings(LabelerSettings):
        pass

    def label(self, items, generate, prompts=None):
        return LabelerRun([outcome_label(item.pair, PEOPLE[item.pair.query_id]) for item in items])


def test_judgment_seconds_run_from_served_to_answered_and_stop_at_the_idle_cap():
    from datetime import datetime
    served = datetime(2026, 1, 1, 12, 0, 0)
    assert judgment_seconds(served, served + timedelta(seconds=42.5)) == 42.5
    assert judgment_seconds(served, served + timedelta(hours=2)) == IDLE_CAP_SECONDS
    assert judgment_seconds(served, served + timedelta(minutes=2), idle_cap=60) == 60
    assert judgment_seconds(served, served - timedelta(seconds=1)) == 0.0  # a clock step back


def test_every_vote_keeps_its_time_and_the_idle_cap_holds(escalated_lake):
    settings = QueueSettings(attention_rate=0.0)
    with annotations(escalated_lake) as con:
        add_annotator(con, "ann")
        first = next_assignment(con, "ann", settings, random.Random(0))
        record_vote(con, assignment_id=first.assignment_id, annotator_id="ann", label=1, comment=None,
                    now=first.assigned_at + timedelta(seconds=17))
        second = next_assignment(con, "ann", settings, random.Random(0))
        record_vote(con, assignment_id=second.assignment_id, annotator_id="ann", label=0, comment=None,
                    now=second.assigned_at + timedelta(hours=3), idle_cap=120)
        seconds = con.execute("select doc_id, seconds from human_votes order by vote_id").fetchall()
        assert seconds == [(first.doc_id, 17.0), (second.doc_id, 120.0)]
        times = judgment_times(con, idle_cap=120).to_dicts()
    assert times == [{"annotator_id": "ann", "with_history": True, "timed": 2, "median_seconds": 68.5,
                      "mean_seconds": 68.5, "capped_share": 0.5, "checks": 0, "check_accuracy": None}]


def test_a_votes_store_from_before_the_timing_opens_and_keeps_its_votes(tmp_path):
    path = tmp_path / "old_votes.duckdb"
    with duckdb.connect(str(path)) as con:  # the schema as it was: no seconds column
        con.execute("create sequence human_vote_ids start 1")
        con.execute("""create table human_votes (
            vote_id bigint primary key default nextval('human_vote_ids'), dataset varchar not null,
            query_id varchar not null, doc_id varchar not null, annotator_id varchar not null,
            label integer not null check (label between 0 and 3), comment varchar,
            with_history boolean not null, is_attention_check boolean not null,
            expected_label integer check (expected_label in (0, 1)), status varchar not null,
            created_at timestamp not null, source varchar not null,
            unique (dataset, query_id, doc_id, annotator_id, is_attention_check))""")
        con.execute("insert into human_votes (dataset, query_id, doc_id, annotator_id, label, with_history, "
                    "is_attention_check, status, created_at, source) values "
                    "('demo', 'q1', 'd5', 'old', 1, true, false, 'accepted', now(), 'app')")
    with duckdb.connect(str(path)) as con:
        ensure_schema(con)
        ensure_schema(con)  # and again: a no-op
        assert con.execute("select vote_id, annotator_id, seconds from human_votes").fetchall() == [(1, "old", None)]
        vote(con, ("q1", "d5"), "new", 0)
        assert con.execute("select count(*) from human_votes").fetchone()[0] == 2


def test_export_gold_round_trips_through_label_eval(escalated_lake, tmp_path):
    # three pairs decided (one unanimous relevant, one 2-1 irrelevant, one unanimous irrelevant),
    # one short of votes: not gold
    decided = {ESCALATED[0]: (1, 1, 1), ESCALATED[1]: (0, 1, 0), ESCALATED[2]: (0, 0, 0)}
    with annotations(escalated_lake) as con:
        for pair, labels in decided.items():
            for annotator, label in zip(("a", "b", "c"), labels, strict=True):
                vote(con, pair, annotator, label)
        vote(con, ESCALATED[3], "a", 1)
    gold = tmp_path / "people.jsonl"
    out = CliRunner().invoke(cli.app, ["export-gold", "--output", str(gold)])
    assert out.exit_code == 0, out.output
    triplets = {t.id: t for t in read_goldset(gold)}
    assert {i: t.label for i, t in triplets.items()} == {
        f"{DATASET}/{q}/{d}": int(sorted(labels)[1]) for (q, d), labels in decided.items()}
    record = json.loads(gold.read_text().splitlines()[1])
    assert record["kind"] == "human_votes" and "agreement 67%" in record["note"]
    assert triplets[f"{DATASET}/{ESCALATED[0][0]}/{ESCALATED[0][1]}"].answers  # the query's answers

    unanimous = CliRunner().invoke(cli.app, ["export-gold", "--min-agreement", "1.0"])
    assert len(unanimous.output.splitlines()) == 2

    PEOPLE.clear()
    PEOPLE.update({i: t.label for i, t in triplets.items()})
    evaluated = CliRunner().invoke(bridge_app, ["label-eval", "--gold", str(gold), "--method", PLUGIN, "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    figures = json.loads(evaluated.output)
    assert figures["n"] == 3 and figures["recall_relevant"] == 1.0 and figures["recall_irrelevant"] == 1.0


def test_accuracy_on_known_answers_per_arm(escalated_lake):
    with annotations(escalated_lake) as con:
        vote(con, ESCALATED[0], "ann", 1)
        vote(con, ("q1", "d1"), "ann", 1, check=True)                       # expected 1: right
        vote(con, ("q2", "d2"), "ann", 0, check=True, status="excluded")    # expected 1: wrong
        vote(con, ("q3", "d3"), "ann", 1, check=True, with_history=False)   # right, other arm
        times = {(r["with_history"]): r for r in judgment_times(con).to_dicts()}
    assert times[True]["checks"] == 2 and times[True]["check_accuracy"] == 0.5
    assert times[False]["checks"] == 1 and times[False]["check_accuracy"] == 1.0
    assert times[True]["timed"] == 0  # votes written without a time (imports, older stores)
