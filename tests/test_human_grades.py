"""People's grades on a graded dataset: the page shows the scale (and a TREC topic's description
and narrative when the query has no answers), votes store the grade, human_labels takes the
median, agreement is Fleiss' kappa on the grades and the quadratic-weighted kappa of every two
annotators; a binary dataset still takes 0/1 only, and a lake from before grades keeps its votes."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import fleiss_kappa as statsmodels_fleiss_kappa

from bridge_assets.human.agreement import category_counts, fleiss_kappa, weighted_kappas
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.labels import compute_human_labels
from bridge_assets.human.tables import SCHEMA, ensure_schema
from bridge_assets.human.transfer import ImportFailed, import_votes
from bridge_assets.lake import store
from fixtures.escalated_set import DATASET, ESCALATED, vote
from fixtures.human_app import expected_of, login, make_client, post_answer, served_pair, votes
from fixtures.paths import annotations, location

DESCRIPTION = "Find what len() gives back for a sized container."
NARRATIVE = "Relevant passages state the returned value; passages on other builtins are not relevant."


@pytest.fixture
def trec_topic_lake(escalated_lake):
    """The escalated set, its first query as a TREC topic: no answers, a description and a narrative."""
    with store.connect(location()) as con:
        con.execute("alter table queries add column description varchar")
        con.execute("alter table queries add column narrative varchar")
        con.execute("update queries set answers = [], description = ?, narrative = ? "
                    "where query_id = 'q1'", [DESCRIPTION, NARRATIVE])
    return escalated_lake


@pytest.fixture
def tokens(trec_topic_lake) -> dict[str, str]:
    with annotations() as con:
        return {name: add_annotator(con, name) for name in ("ann", "bob", "cat")}


@pytest.mark.parametrize("grades, label, decided", [
    ([1, 2, 3], 2, True),            # the middle grade
    ([0, 0, 3], 0, True),            # one outlying vote does not move it
    ([3, 1, 3], 3, True),
    ([1, 2], None, False),           # short of votes
    ([1, 1, 2, 2], None, False),     # the two middle grades differ: one more vote
    ([1, 2, 2, 3], 2, True),
])
def test_human_label_is_the_median_grade(trec_topic_lake, grades, label, decided):
    pair = ESCALATED[0]
    with annotations() as con:
        for n, value in enumerate(grades):
            vote(con, pair, f"a{n}", value)
        rows = {(r["query_id"], r["doc_id"]): r
                for r in compute_human_labels(con, DATASET).labels.iter_rows(named=True)}
    assert (pair in rows) == decided
    if decided:
        assert rows[pair]["label"] == label
        assert rows[pair]["votes_relevant"] == sum(g >= 1 for g in grades)
        assert rows[pair]["agreement"] == pytest.approx(max(grades.count(g) for g in grades) / len(grades))


def test_fleiss_kappa_on_grades_and_weighted_kappa_per_annotator_pair_equal_the_libraries(trec_topic_lake):
    grades = {"ann": [3, 2, 0, 1], "bob": [2, 2, 0, 0], "cat": [3, 1, 1, 1]}
    with annotations() as con:
        for annotator, values in grades.items():
            for pair, value in zip(ESCALATED, values, strict=True):
                vote(con, pair, annotator, value)
        result = compute_human_labels(con, DATASET)
    per_pair = [[grades[a][i] for a in grades] for i in range(len(ESCALATED))]
    table = np.array([[row.count(g) for g in range(4)] for row in per_pair])
    assert result.kappa == pytest.approx(statsmodels_fleiss_kappa(table, method="fleiss"))
    expected = {(a, b): cohen_kappa_score(grades[a], grades[b], labels=[0, 1, 2, 3], weights="quadratic")
                for a, b in (("ann", "bob"), ("ann", "cat"), ("bob", "cat"))}
    assert {(k.first, k.second): k.kappa for k in result.annotator_kappas} == pytest.approx(expected)
    assert all(k.items == 4 for k in result.annotator_kappas)
    assert result.weighted_kappa == pytest.approx(sum(expected.values()) / 3)
    # on 0/1 votes the kappas are those of before: an unused grade changes nothing
    binary = [[1, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1]]
    assert fleiss_kappa(category_counts(binary, (0, 1, 2, 3))) == pytest.approx(fleiss_kappa(category_counts(binary)))
    two = weighted_kappas({"x": {1: 1, 2: 0, 3: 1}, "y": {1: 1, 2: 1, 3: 1}, "z": {1: 0}})
    assert [(k.first, k.second, k.items) for k in two] == [("x", "y", 3)]  # z shares one pair only
    assert two[0].kappa == pytest.approx(cohen_kappa_score([1, 0, 1], [1, 1, 1]))


def test_the_page_of_a_graded_topic_shows_the_narrative_and_the_scale_and_takes_a_grade(trec_topic_lake, tokens):
    client = make_client(trec_topic_lake, graded=(DATASET,))
    login(client, tokens["ann"])
    page = client.get("/annotate").text
    assert served_pair(trec_topic_lake, page)[:2] == ESCALATED[0]  # q1 x d5: the topic
    assert f'<p id="narrative">{NARRATIVE}</p>' in page and f'<p id="description">{DESCRIPTION}</p>' in page
    assert 'id="answers"' not in page and 'id="scale"' in page
    assert [f'name="label" value="{g}"' in page for g in range(4)] == [True] * 4
    assert "says: relevant" in page  # this set's stored debate is yes/no: shown as it was
    assert post_answer(client, page, 2).status_code == 303
    assert votes(trec_topic_lake)[-1][:4] == ("ann", *ESCALATED[0], 2)
    later = client.get("/annotate").text  # q2 has answers: shown, and graded too
    assert 'id="answers"' in later and 'id="narrative"' not in later and 'value="3"' in later


def test_a_binary_dataset_refuses_a_grade(trec_topic_lake, tokens):
    client = make_client(trec_topic_lake)
    login(client, tokens["ann"])
    page = client.get("/annotate").text
    assert 'value="2"' not in page and "Yes, relevant" in page
    refused = post_answer(client, page, 2)
    assert refused.status_code == 400 and "from 0 to 1" in refused.text
    assert votes(trec_topic_lake) == []
    assert post_answer(client, page, 4).status_code == 400  # not a vote on any scale


def test_an_attention_check_on_a_graded_dataset_asks_only_relevant_or_not(trec_topic_lake, tokens):
    checks = make_client(trec_topic_lake, graded=(DATASET,), attention_rate=1.0, seed=11)
    login(checks, tokens["bob"])
    for _ in range(6):
        page = checks.get("/annotate").text
        assert served_pair(trec_topic_lake, page)[2]
        expected = expected_of(trec_topic_lake, page)
        assert post_answer(checks, page, 3 if expected else 0).status_code == 303  # any grade >= 1 passes
    assert {v[5] for v in votes(trec_topic_lake)} == {"accepted"}
    page = checks.get("/annotate").text
    assert post_answer(checks, page, 0 if expected_of(trec_topic_lake, page) else 1).status_code == 303
    assert 'id="flagged"' in checks.get("/annotate").text


def test_imported_grades_are_taken_for_graded_datasets_only(trec_topic_lake):
    rows = [{"dataset": DATASET, "query_id": q, "doc_id": d, "annotator_id": "ext", "label": "2"}
            for q, d in ESCALATED[:2]]
    content = json.dumps(rows).encode()
    with annotations() as con:
        with pytest.raises(ImportFailed, match="label 2 is a grade, and dataset 'demo' is not graded"):
            import_votes(con, content, "grades.json")
        assert import_votes(con, content, "grades.json", graded=[DATASET]) == 2
    assert {v[3] for v in votes(trec_topic_lake)} == {2}


def test_a_lake_from_before_grades_keeps_its_votes_and_takes_grades(tmp_path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(SCHEMA.replace("check (label between 0 and 3)", "check (label in (0, 1))"))
        con.execute("insert into human_votes (dataset, query_id, doc_id, annotator_id, label, "
                    "with_history, is_attention_check, status, created_at, source) values "
                    "('demo', 'q1', 'd5', 'ann', 1, true, false, 'accepted', now(), 'app')")
        with pytest.raises(duckdb.ConstraintException):
            con.execute("update human_votes set label = 2")
        ensure_schema(con)
        ensure_schema(con)  # once rebuilt, nothing more to do
        con.execute("insert into human_votes (dataset, query_id, doc_id, annotator_id, label, "
                    "with_history, is_attention_check, status, created_at, source) values "
                    "('demo', 'q1', 'd5', 'bob', 3, true, false, 'accepted', now(), 'app')")
        assert con.execute("select vote_id, annotator_id, label from human_votes order by 1").fetchall() == \
            [(1, "ann", 1), (2, "bob", 3)]
        with pytest.raises(duckdb.ConstraintException):
            con.execute("update human_votes set label = 4")
