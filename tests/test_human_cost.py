"""People's time in the cost view (issue 26, item 4): minutes x BRIDGE_ANNOTATOR_RATE, per
labelled pair, beside the LLM cost, on hand-made votes of known seconds."""

from __future__ import annotations

import duckdb
import pytest

from bridge_assets.human.cost import Rate, describe, people_cost
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote
from bridge_assets.lake.location import lake_location
from bridge_assets.orchestration import costs
from bridge_assets.settings import env
from fixtures.escalated_set import DATASET, ESCALATED
from fixtures.paths import annotations

RATE = Rate(30.0, "USD")


def _vote(con, pair, annotator, seconds, *, check=False, dataset=DATASET):
    insert_vote(con, dataset=dataset, query_id=pair[0], doc_id=pair[1], annotator_id=annotator, label=1,
                comment=None, with_history=True, is_attention_check=check,
                expected_label=1 if check else None, status="accepted", source="test", seconds=seconds)


def _hand_made(con) -> None:
    """Three escalated pairs and a consensus; pair A decided by three votes of 30, 60 and 90 s,
    pair B one vote of 45 s, pair C none; an attention check of 15 s, an imported vote without a
    time; another dataset's vote (not counted)."""
    ensure_schema(con)
    con.execute("create table debate_labels (dataset varchar, query_id varchar, doc_id varchar, outcome varchar)")
    con.execute("insert into debate_labels values ('demo', 'q1', 'A', 'escalated'), ('demo', 'q1', 'B', 'failed'), "
                "('demo', 'q2', 'C', 'escalated'), ('demo', 'q2', 'D', 'consensus')")
    for annotator, seconds in (("a", 30), ("b", 60), ("c", 90)):
        _vote(con, ("q1", "A"), annotator, seconds)
    _vote(con, ("q1", "B"), "a", 45)
    _vote(con, ("q9", "gold"), "a", 15, check=True)
    _vote(con, ("q2", "D"), "x", None, check=True)  # imported: no time
    _vote(con, ("q1", "A"), "a", 999, dataset="other")


def test_people_cost_on_votes_of_known_seconds():
    with duckdb.connect() as con:
        _hand_made(con)
        people = people_cost(con, DATASET, RATE)
    assert (people.votes, people.timed_votes, people.timed_seconds) == (6, 5, 240.0)
    assert people.median_seconds == 45.0
    assert people.minutes == pytest.approx((240 + 45) / 60)      # the untimed vote at the median
    assert people.cost == pytest.approx(4.75 / 60 * 30)          # 2.375 USD
    assert (people.labelled_pairs, people.open_pairs, people.votes_needed) == (1, 2, 5)
    assert people.cost_per_labelled_pair == pytest.approx(2.375)
    assert people.minutes_to_finish == pytest.approx(5 * 45 / 60)
    assert people.cost_to_finish == pytest.approx(1.875)
    lines = describe(people, "0.0100 USD typical for the calls still to make on the 4 pair(s) to label: "
                             "0.0025 USD per pair")
    assert lines[0] == "People (votes store; BRIDGE_ANNOTATOR_RATE = 30 USD/hour):"
    assert "4.8 min, 2.38 USD; 1 pair(s) labelled by people: 2.38 USD per labelled pair" in lines[1]
    assert "2 escalated pair(s) need at least 5 more vote(s): about 3.8 min, 1.88 USD at the median" in lines[2]
    assert lines[3].startswith("  beside the LLM: 0.0100 USD")


def test_without_a_rate_minutes_only_and_without_votes_no_forecast():
    with duckdb.connect() as con:
        ensure_schema(con)
        con.execute("create table debate_labels (dataset varchar, query_id varchar, doc_id varchar, outcome varchar)")
        con.execute("insert into debate_labels values ('demo', 'q1', 'A', 'escalated')")
        people = people_cost(con, DATASET)
    assert people.cost is None and people.minutes == 0 and people.votes_needed == 3
    lines = describe(people)
    assert "set BRIDGE_ANNOTATOR_RATE" in lines[0]
    assert "no timed vote yet to forecast from" in lines[2]


def test_the_rate_setting(monkeypatch):
    monkeypatch.delenv("BRIDGE_ANNOTATOR_RATE", raising=False)
    assert env.annotator_rate is None
    monkeypatch.setenv("BRIDGE_ANNOTATOR_RATE", "30")
    assert env.annotator_rate == (30.0, "USD")
    monkeypatch.setenv("BRIDGE_ANNOTATOR_RATE", " 22.5 eur ")
    assert env.annotator_rate == (22.5, "EUR")
    for bad in ("thirty", "-4", "30 E1"):
        monkeypatch.setenv("BRIDGE_ANNOTATOR_RATE", bad)
        with pytest.raises(ValueError, match="BRIDGE_ANNOTATOR_RATE"):
            env.annotator_rate


def test_the_dry_run_reads_the_open_pairs_without_creating_a_votes_store(escalated_lake):
    people = costs._people(lake_location(), DATASET)
    assert (people.votes, people.open_pairs, people.votes_needed) == (0, 4, 12)
    assert not lake_location().votes_db.exists()


def test_the_dry_run_prints_people_beside_the_llm(escalated_lake, monkeypatch):
    monkeypatch.setenv("BRIDGE_ANNOTATOR_RATE", "60")
    with annotations(escalated_lake) as con:
        for annotator, seconds in (("a", 10), ("b", 20), ("c", 30)):
            _vote(con, ESCALATED[0], annotator, seconds)
        _vote(con, ESCALATED[1], "a", 40)
    people = costs._people(lake_location(), DATASET)
    assert (people.votes, people.labelled_pairs, people.open_pairs, people.votes_needed) == (4, 1, 3, 2 + 3 + 3)
    assert people.cost == pytest.approx(100 / 3600 * 60)
    estimate = costs.RunEstimate(DATASET, pool=costs.PoolInfo(10, 2, 1, 8, ("bm25",), 10, 0), people=people)
    text = costs.render(estimate)
    assert "People (votes store; BRIDGE_ANNOTATOR_RATE = 60 USD/hour):" in text
    assert "1 pair(s) labelled by people: 1.67 USD per labelled pair" in text
    # the median of 10, 20, 30 and 40 s is 25 s: 8 x 25 s = 3.3 min
    assert "3 escalated pair(s) need at least 8 more vote(s): about 3.3 min, 3.33 USD at the median" in text
