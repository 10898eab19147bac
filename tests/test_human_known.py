"""People's accuracy against known answers per arm (issue 26, item 4): a dataset's known holes and
a gold set loaded as annotation items, served like attention checks (never a pause), and every
vote whose answer is known scored per source and arm, on the admin page and by the CLI."""

from __future__ import annotations

import json
import random
import time

import polars as pl
from typer.testing import CliRunner

from bridge_assets.cli import annotate as cli
from bridge_assets.human.annotators import add_annotator, get_annotator
from bridge_assets.human.app import AppSettings
from bridge_assets.human.app.annotation import annotation_page
from bridge_assets.human.app.state import AppState
from bridge_assets.human.items import load_item
from bridge_assets.human.known import known_accuracy, load_holes
from bridge_assets.human.queue import QueueSettings, next_assignment, progress
from bridge_assets.human.votes import Verdict, record_vote
from bridge_assets.lake import store
from bridge_assets.qrels.known_holes import KnownHoles
from fixtures.escalated_set import DATASET, ESCALATED, vote
from fixtures.human_app import csrf_of, login, make_client
from fixtures.paths import annotations, location

# q1/d5 is escalated (its queue votes are scored), q3/d1 a hole the debate never saw; q1/d3 and
# q3/d4 are no hole by the key, q3/d8 a partial answer (never loaded)
KEY = KnownHoles({"q1": frozenset({"d5"}), "q3": frozenset({"d1"})}, {"q1": frozenset(), "q3": frozenset({"d8"})})
POOL = [("q1", "d5", False), ("q1", "d3", False), ("q3", "d1", False), ("q3", "d8", False),
        ("q3", "d4", False), ("q3", "d3", True), ("q2", "d1", False)]
KNOWN_ONLY = QueueSettings(attention_rate=0.0, known_rate=1.0)


def _pool(lake) -> None:
    store.write_partitions({"candidate_pool": pl.DataFrame(
        {"dataset": DATASET, "query_id": [q for q, _, _ in POOL], "doc_id": [d for _, d, _ in POOL],
         "in_original_qrels": [j for _, _, j in POOL]})}, {"dataset": DATASET}, location(lake))


def _gold(tmp_path):
    path = tmp_path / "team.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (
        {"id": "g1", "query": "Who wrote Hamlet?", "answers": ["Shakespeare"],
         "chunk": "Hamlet is a tragedy written by William Shakespeare. It is set in Denmark.", "label": 1},
        {"id": "g2", "query": "Who wrote Hamlet?", "answers": ["Shakespeare"],
         "chunk": "Macbeth is set in Scotland. Its witches foretell the future.", "label": 0})) + "\n")
    return path


def test_known_holes_load_both_classes_and_skip_partial_answers(escalated_lake):
    _pool(escalated_lake)
    with annotations(escalated_lake) as con:
        assert load_holes(con, DATASET, KEY) == (2, 2)
        rows = con.execute("select query_id, doc_id, expected_label, source from known_answers order by all").fetchall()
        assert load_holes(con, DATASET, KEY, irrelevant=1) == (2, 1)  # loaded again: replaced
    assert {(q, d): e for q, d, e, _ in rows} == {("q1", "d5"): 1, ("q3", "d1"): 1, ("q1", "d3"): 0, ("q3", "d4"): 0}
    assert {s for *_, s in rows} == {"holes:demo"}


def test_known_items_are_served_like_checks_never_pause_and_are_scored_per_arm(escalated_lake):
    _pool(escalated_lake)
    with annotations(escalated_lake) as con:
        load_holes(con, DATASET, KEY)
        add_annotator(con, "ann")
        served, verdicts = [], []
        while (item := next_assignment(con, "ann", KNOWN_ONLY, random.Random(0))).known_source:
            assert item.is_attention_check and item.expected_label is not None
            view = load_item(con, item)
            assert view.rounds  # an undebated pair wears an unrelated debate's shape
            served.append((item.query_id, item.doc_id))
            receipt = record_vote(con, assignment_id=item.assignment_id, annotator_id="ann",
                                  label=0, comment=None)  # "no" to everything: the holes are wrong
            verdicts.append(receipt.verdict)
        # the escalated hole is never a known item: it comes as a queue item, scored against the key
        assert sorted(served) == [("q1", "d3"), ("q3", "d1"), ("q3", "d4")]
        assert set(verdicts) == {Verdict.KNOWN_ANSWER}
        assert not get_annotator(con, "ann").flagged
        assert (item.query_id, item.doc_id) in ESCALATED and not item.is_attention_check
        vote(con, ("q1", "d5"), "bob", 1, with_history=False)  # a queue vote on the escalated hole
        vote(con, ("q1", "d1"), "bob", 1, check=True, with_history=False)  # an attention check, right
        rows = {(r["source"], r["with_history"]): r for r in known_accuracy(con).to_dicts()}
    shown = rows[("holes:demo", True)]
    assert (shown["votes"], shown["accuracy"], shown["relevant"], shown["recall_relevant"],
            shown["irrelevant"], shown["recall_irrelevant"], shown["balanced_accuracy"]) == (3, 2 / 3, 1, 0.0, 2, 1.0, 0.5)
    hidden = rows[("holes:demo", False)]
    assert (hidden["votes"], hidden["accuracy"], hidden["recall_irrelevant"]) == (1, 1.0, None)
    assert rows[("attention checks", False)]["accuracy"] == 1.0
    assert set(rows) == {("holes:demo", True), ("holes:demo", False), ("attention checks", False)}


def test_a_gold_set_loaded_as_annotation_items_shows_its_own_texts(escalated_lake, tmp_path):
    loaded = CliRunner().invoke(cli.app, ["load-known", "--gold", str(_gold(tmp_path))])
    assert loaded.exit_code == 0, loaded.output
    assert "loaded goldset:team: 2 triplet(s), 1 relevant and 1 irrelevant" in loaded.output
    with annotations(escalated_lake) as con:
        add_annotator(con, "ann")
        answers = {}
        for _ in range(2):
            item = next_assignment(con, "ann", KNOWN_ONLY, random.Random(1))
            assert item.dataset == "goldset:team" and item.known_source == "goldset:team"
            view = load_item(con, item)
            assert view.query == "Who wrote Hamlet?" and view.answers == ("Shakespeare",)
            assert view.rounds  # dressed in the shape of the lake's debates
            text = "".join(segment.text for segment in view.segments)
            answers[item.doc_id] = text
            record_vote(con, assignment_id=item.assignment_id, annotator_id="ann", label=1, comment=None)
        assert answers["g1"].startswith("Hamlet is a tragedy")
        assert next_assignment(con, "ann", KNOWN_ONLY, random.Random(1)).known_source is None
    printed = CliRunner().invoke(cli.app, ["accuracy"])
    assert printed.exit_code == 0, printed.output
    line = next(line for line in printed.output.splitlines() if line.startswith("goldset:team"))
    assert line.split()[1:] == ["with", "history", "2", "50%", "100%", "of", "1", "0%", "of", "1", "50%"]
    only = CliRunner().invoke(cli.app, ["accuracy", "--dataset", "other"])
    assert only.output.strip() == "no vote on a known answer yet"


def test_load_known_needs_one_source_and_a_key(escalated_lake):
    assert CliRunner().invoke(cli.app, ["load-known"]).exit_code == 2
    assert "give one of" in CliRunner().invoke(cli.app, ["load-known"]).output


def test_the_admin_page_shows_accuracy_per_arm(escalated_lake):
    with annotations(escalated_lake) as con:
        token = add_annotator(con, "root", admin=True)
        vote(con, ("q1", "d1"), "ann", 1, check=True)
        vote(con, ("q2", "d2"), "ann", 0, check=True, with_history=False)
    admin = make_client(escalated_lake)
    login(admin, token)
    page = admin.get("/admin").text
    assert csrf_of(page)
    table = page[page.index('id="accuracy"'):]
    table = table[:table.index("</table>")]
    assert "attention checks" in table and "100%" in table and "0%" in table
    assert table.count("<tr>") == 3  # the header, one row per arm


def test_a_page_counts_the_pairs_left_for_the_annotator_as_a_fresh_count_does(escalated_lake, tmp_path):
    """A page reads the open pairs once (to choose its item) and derives what is left after it;
    with checks and known items mixed in, the unanswered item shown again and the last page,
    every page's progress equals progress read afresh."""
    _pool(escalated_lake)
    with annotations(escalated_lake) as con:
        load_holes(con, DATASET, KEY)
        people = [name for name in ("ann", "bob") if add_annotator(con, name)]
    state = AppState(AppSettings(lake=location(escalated_lake), secret="page-progress-secret-0123",
                                 attention_rate=0.3, known_rate=0.3, seed=7), time.time)
    served, lefts = {"check": 0, "pair": 0}, set()
    while people:
        for who in list(people):
            item, shown = state.db._call(True, annotation_page, state, who)
            assert shown == state.db._call(True, progress, who, state.queue)
            if item is None:
                people.remove(who)
                continue
            again, shown_again = state.db._call(True, annotation_page, state, who)  # not answered yet
            assert again.assignment_id == item.assignment_id and shown_again == shown
            expected = state.db._call(False, lambda con, a: con.execute(
                "select expected_label from annotation_assignments where assignment_id = ?", [a]).fetchone()[0],
                item.assignment_id)
            served["pair" if expected is None else "check"] += 1
            lefts.add(shown.remaining_for_you)
            state.db._call(False, record_vote, assignment_id=item.assignment_id, annotator_id=who,
                           label=1 if expected is None else expected, comment=None)
    assert served["pair"] == 2 * len(ESCALATED) and served["check"] > 0 and len(lefts) > 1
