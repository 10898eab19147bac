"""The annotation app over HTTP: every access rule, the queue, attention checks, admin pages."""

from __future__ import annotations

import inspect
import json
import re

import duckdb
import pytest
from fastapi.testclient import TestClient

from bridge_assets.cli import annotate as cli
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import AppSettings, admin, annotation, annotation_app, import_export
from bridge_assets.human.labels import compute_human_labels
from bridge_assets.human.security import SESSION_COOKIE
from fixtures.escalated_set import CORPUS, DATASET, ESCALATED, QUERIES, reason
from fixtures.human_app import (
    answer,
    assignment_of,
    csrf_of,
    expected_of,
    login,
    make_client,
    post_answer,
    served_pair,
    votes,
)
from fixtures.paths import annotations, location, votes_db


@pytest.fixture
def tokens(escalated_lake) -> dict[str, str]:
    with annotations() as con:
        made = {name: add_annotator(con, name) for name in ("ann", "bob", "cat", "dan")}
        made["root"] = add_annotator(con, "root", admin=True)
    return made


def test_serve_binds_localhost_by_default():
    assert inspect.signature(cli.serve).parameters["host"].default.default == "127.0.0.1"


# --- tokens and sessions ----------------------------------------------------------------------

def test_without_a_token_every_page_sends_to_the_login_and_every_post_is_refused(escalated_lake, tokens):
    client = make_client(escalated_lake)
    for path in ("/", "/annotate", "/admin", "/admin/export.csv", "/admin/export.json"):
        response = client.get(path)
        assert response.status_code == 303 and response.headers["location"] == "/login", path
    for path in ("/annotate", "/logout", "/admin/import", "/admin/annotators/ann/unflag"):
        assert client.post(path, data={"label": "1"}).status_code == 401, path
    assert votes(escalated_lake) == []


def test_a_wrong_or_forged_token_gets_no_session(escalated_lake, tokens):
    client = make_client(escalated_lake)
    refused = login(client, "not-a-token")
    assert refused.status_code == 401 and "Unknown token" in refused.text
    assert client.get("/annotate").status_code == 303
    assert login(client, tokens["ann"][:-1] + "x").status_code == 401
    # a cookie signed with another secret is ignored
    other = annotation_app(AppSettings(lake=location(escalated_lake), secret="another-secret-0123456789"))
    forger = TestClient(other, follow_redirects=False)
    assert login(forger, tokens["ann"]).status_code == 303
    client.cookies.set(SESSION_COOKIE, forger.cookies[SESSION_COOKIE])
    assert client.get("/annotate").status_code == 303


def test_login_sets_an_httponly_strict_cookie_and_a_rotated_token_ends_the_session(escalated_lake, tokens):
    client = make_client(escalated_lake)
    response = login(client, tokens["ann"])
    assert response.status_code == 303 and response.headers["location"] == "/annotate"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/annotate")
    assert page.status_code == 200
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    with annotations() as con:
        add_annotator(con, "ann", rotate=True)
    assert client.get("/annotate").status_code == 303


# --- the annotation page and the queue ----------------------------------------------------------

def test_the_page_shows_query_answers_chunk_highlights_and_both_agents_round_by_round(escalated_lake, tokens):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    page = client.get("/annotate")
    query_id, doc_id, is_check = served_pair(escalated_lake, page.text)
    assert (query_id, doc_id, is_check) == ("q1", "d5", False)
    text = page.text
    assert QUERIES["q1"][0] in text and QUERIES["q1"][1][0] in text
    assert '<mark class="agent-0" title="quoted by agent A">Calling len on them asks the object for its size.</mark>' in text
    assert '<mark class="agent-1" title="quoted by agent B">Objects without __len__ raise TypeError.</mark>' in text
    order = [text.index(reason(agent, "q1", "d5", r)) for r in (1, 2) for agent in ("A", "B")]
    assert order == sorted(order) and "Round 1" in text and "Round 2" in text
    assert "attention" not in text.lower()
    assert 'data-key="y"' in text and 'data-key="n"' in text  # keyboard shortcuts
    assert "0 / 4 pairs complete" in text


def test_each_pair_gets_three_distinct_annotators_and_nobody_sees_a_pair_twice(escalated_lake, tokens):
    served: dict[str, list[tuple[str, str]]] = {}
    for name in ("ann", "bob", "cat"):
        client = make_client(escalated_lake)
        login(client, tokens[name])
        for _ in ESCALATED:
            page, response = answer(client, "1")
            assert response.status_code == 303
            served.setdefault(name, []).append(served_pair(escalated_lake, page.text)[:2])
        done = client.get("/annotate")
        assert 'id="done"' in done.text and "labelled 4 items" in done.text
    assert all(sorted(pairs) == ESCALATED for pairs in served.values())
    late = make_client(escalated_lake)
    login(late, tokens["dan"])  # every pair has its three votes: nothing for a fourth person
    assert 'id="done"' in late.get("/annotate").text
    with annotations() as con:
        result = compute_human_labels(con, DATASET)
    assert result.open_pairs == 0 and result.accepted_votes == 12


def test_an_open_item_reserves_its_slot(escalated_lake, tokens):
    first, second, third = (make_client(escalated_lake) for _ in range(3))
    for client, name in ((first, "ann"), (second, "bob")):
        login(client, tokens[name])
        for _ in ESCALATED:
            answer(client, "0")
    login(third, tokens["cat"])
    page = third.get("/annotate")  # cat now holds the last slot of the first pair
    assert served_pair(escalated_lake, page.text)[:2] == ESCALATED[0]
    fourth = make_client(escalated_lake)
    login(fourth, tokens["dan"])
    assert served_pair(escalated_lake, fourth.get("/annotate").text)[:2] == ESCALATED[1]
    assert third.get("/annotate").text.count(assignment_of(page.text)) == 1  # same item on reload


def test_a_page_that_fails_half_way_serves_nothing(escalated_lake, tokens, monkeypatch):
    """A page's work is one transaction (Database.page): when loading the item fails after the
    item was chosen, its assignment is rolled back instead of holding a vote slot unseen."""
    def broken(*args, **kwargs):
        raise RuntimeError("the chunk could not be read")

    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    monkeypatch.setattr(annotation, "load_item", broken)
    with pytest.raises(RuntimeError, match="could not be read"):
        client.get("/annotate")
    with duckdb.connect(str(votes_db(escalated_lake))) as con:
        assert con.execute("select count(*) from annotation_assignments").fetchone()[0] == 0
    monkeypatch.undo()
    page = client.get("/annotate")
    assert page.status_code == 200 and served_pair(escalated_lake, page.text)[:2] == ESCALATED[0]


def test_a_double_vote_is_refused(escalated_lake, tokens):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    page, first = answer(client, "1")
    assert first.status_code == 303
    again = client.post("/annotate", data={"csrf_token": csrf_of(page.text), "label": "0",
                                           "assignment_id": assignment_of(page.text)})
    assert again.status_code == 409 and "already answered" in again.text
    assert votes(escalated_lake) == [("ann", "q1", "d5", 1, False, "accepted", True)]


def test_nobody_reads_or_answers_for_someone_elses_vote(escalated_lake, tokens):
    ann, bob = make_client(escalated_lake), make_client(escalated_lake)
    login(ann, tokens["ann"])
    login(bob, tokens["bob"])
    ann_page = ann.get("/annotate")
    bob_page = bob.get("/annotate")
    assert served_pair(escalated_lake, ann_page.text)[:2] == served_pair(escalated_lake, bob_page.text)[:2]
    ann.post("/annotate", data={"csrf_token": csrf_of(ann_page.text), "label": "1",
                                "assignment_id": assignment_of(ann_page.text),
                                "comment": "ann-secret-comment"})
    # bob answering ann's item: refused as if it did not exist
    stolen = bob.post("/annotate", data={"csrf_token": csrf_of(bob_page.text), "label": "0",
                                         "assignment_id": assignment_of(ann_page.text)})
    assert stolen.status_code == 404
    page = bob.get("/annotate").text
    assert "ann-secret-comment" not in page and "ann" not in re.sub(r"<[^>]+>", " ", page).split()
    for path in ("/admin", "/admin/export.json", "/admin/export.csv"):
        response = bob.get(path)
        assert response.status_code == 403 and "ann-secret-comment" not in response.text, path
    assert votes(escalated_lake) == [("ann", "q1", "d5", 1, False, "accepted", True)]



def test_every_route_of_the_admin_routers_refuses_an_annotator_and_a_stranger(escalated_lake, tokens):
    """The admin routers guard every route they hold, a route added later included."""
    ann, stranger = make_client(escalated_lake), make_client(escalated_lake)
    login(ann, tokens["ann"])
    csrf = csrf_of(ann.get("/annotate").text)
    routes = [(method, route.path.replace("{annotator_id}", "ann"))
              for router in (admin.router, import_export.router) for route in router.routes
              for method in route.methods]
    assert len(routes) == 5
    for method, path in routes:
        refused = ann.request(method, path, data={"csrf_token": csrf} if method == "POST" else None)
        assert refused.status_code == 403 and "needs an admin token" in refused.text, (method, path)
        unknown = stranger.request(method, path)
        assert unknown.status_code == (303 if method == "GET" else 401), (method, path)
    assert votes(escalated_lake) == []

# --- forged and malformed posts -------------------------------------------------------------------

def test_forged_form_posts_without_the_sessions_csrf_token_are_refused(escalated_lake, tokens):
    ann, bob = make_client(escalated_lake), make_client(escalated_lake)
    login(ann, tokens["ann"])
    login(bob, tokens["bob"])
    page = ann.get("/annotate").text
    item = assignment_of(page)
    for csrf in (None, "", "wrong-token", csrf_of(bob.get("/annotate").text)):
        data = {"label": "1", "assignment_id": item}
        if csrf is not None:
            data["csrf_token"] = csrf
        response = ann.post("/annotate", data=data)
        assert response.status_code == 403 and "CSRF" in response.text, csrf
    assert ann.post("/logout", data={}).status_code == 403
    # a login form posted from elsewhere (no session cookie, no token of ours)
    stranger = make_client(escalated_lake)
    assert stranger.post("/login", data={"token": tokens["ann"]}).status_code == 403
    assert stranger.post("/login", data={"token": tokens["ann"], "csrf_token": "x"}).status_code == 403
    assert votes(escalated_lake) == []
    # the genuine post still works, and logging out ends the session
    assert ann.post("/annotate", data={"label": "1", "assignment_id": item,
                                       "csrf_token": csrf_of(page)}).status_code == 303
    assert ann.post("/logout", data={"csrf_token": csrf_of(page)}).status_code == 303
    assert ann.get("/annotate").status_code == 303


@pytest.mark.parametrize("change", [
    {"label": "maybe"}, {"label": ""}, {"label": None}, {"assignment_id": "../../etc/passwd"},
    {"assignment_id": "1 or 1=1"}, {"comment": "x" * 2001}, {"assignment_id": None},
])
def test_malformed_input_is_refused_and_stores_nothing(escalated_lake, tokens, change):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    page = client.get("/annotate").text
    data = {"csrf_token": csrf_of(page), "label": "1", "assignment_id": assignment_of(page),
            "comment": "", **change}
    response = client.post("/annotate", data={k: v for k, v in data.items() if v is not None})
    assert response.status_code == 400
    assert votes(escalated_lake) == []


def test_malformed_admin_input_is_refused(escalated_lake, tokens):
    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    csrf = csrf_of(admin.get("/admin").text)
    assert admin.get("/admin/export.csv", params={"dataset": "demo'; drop table human_votes; --"}).status_code == 400
    assert admin.post("/admin/annotators/no such name/unflag", data={"csrf_token": csrf}).status_code == 404
    assert admin.post("/admin/annotators/nobody/unflag", data={"csrf_token": csrf}).status_code == 404
    assert admin.post("/admin/import", data={"csrf_token": csrf, "format": "xml"},
                      files={"file": ("v.csv", b"x")}).status_code == 400
    assert admin.post("/admin/import", data={"csrf_token": csrf}).status_code == 400


# --- attention checks ------------------------------------------------------------------------------

def test_failing_an_attention_check_flags_and_excludes_votes_since_the_last_passed_check(escalated_lake, tokens):
    plain = make_client(escalated_lake)                          # serves real pairs only
    checks = make_client(escalated_lake, attention_rate=1.0)     # serves an attention check every time
    for client in (plain, checks):
        login(client, tokens["ann"])
    answer(plain, "1")
    page = checks.get("/annotate").text
    query_id, doc_id, is_check = served_pair(escalated_lake, page)
    assert is_check and "attention" not in page.lower()
    # the check has a debate too (its own, never an unrelated pair's reasons)
    assert "Round 1" in page and f"about {query_id}/" not in page
    expected = expected_of(escalated_lake, page)
    assert post_answer(checks, page, expected).status_code == 303
    assert votes(escalated_lake)[-1][3:6] == (expected, True, "accepted")  # passed
    answer(plain, "0")
    answer(plain, "1")
    failing = checks.get("/annotate").text
    assert post_answer(checks, failing, 1 - expected_of(escalated_lake, failing)).status_code == 303
    recorded = votes(escalated_lake)
    assert [(v[4], v[5]) for v in recorded] == [(False, "accepted"), (True, "accepted"),
                                                 (False, "excluded"), (False, "excluded"),
                                                 (True, "excluded")]
    assert len(recorded) == 5  # nothing deleted
    paused = plain.get("/annotate")
    assert 'id="flagged"' in paused.text and 'id="vote-form"' not in paused.text

    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    overview = admin.get("/admin").text
    assert "failed attention check" in overview and ">ann<" in overview
    unflag = admin.post("/admin/annotators/ann/unflag", data={"csrf_token": csrf_of(overview)})
    assert unflag.status_code == 303
    assert 'id="vote-form"' in plain.get("/annotate").text      # may continue ...
    assert [v[5] for v in votes(escalated_lake)][2:4] == ["excluded", "excluded"]  # ... exclusions stay
    with annotations() as con:
        assert compute_human_labels(con, DATASET).accepted_votes == 1


def test_attention_checks_include_known_irrelevant_pairs(escalated_lake, tokens):
    checks = make_client(escalated_lake, attention_rate=1.0, seed=11)
    login(checks, tokens["ann"])
    expected_labels = set()
    for _ in range(8):
        page = checks.get("/annotate").text
        query_id, doc_id, _ = served_pair(escalated_lake, page)
        expected = expected_of(escalated_lake, page)
        if expected == 0:  # another query's gold chunk without this query's answers
            assert (query_id, doc_id) not in {("q1", "d1"), ("q2", "d2"), ("q3", "d3"), ("q4", "d4")}
            assert not any(a.lower() in CORPUS[doc_id].lower() for a in QUERIES[query_id][1])
        expected_labels.add(expected)
        assert post_answer(checks, page, expected).status_code == 303
    assert expected_labels == {0, 1}


# --- history on or off -----------------------------------------------------------------------------

def test_a_batch_without_history_hides_the_debate_and_records_it_per_vote(escalated_lake, tokens):
    client = make_client(escalated_lake, with_history=False)
    login(client, tokens["ann"])
    page, _ = answer(client, "0")
    assert 'id="no-history"' in page.text and "Round 1" not in page.text
    assert reason("A", "q1", "d5", 1) not in page.text and "<mark" not in page.text
    with_history = make_client(escalated_lake)
    login(with_history, tokens["bob"])
    answer(with_history, "1")
    assert [(v[0], v[6]) for v in votes(escalated_lake)] == [("ann", False), ("bob", True)]


# --- admin ---------------------------------------------------------------------------------------

def test_admin_sees_progress_and_kappa_and_exports_votes(escalated_lake, tokens):
    for name, labels in (("ann", "1100"), ("bob", "1101"), ("cat", "0100")):
        client = make_client(escalated_lake)
        login(client, tokens[name])
        for label in labels:
            answer(client, label, comment=f"{name} says {label}")
    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    page = admin.get("/admin").text
    with annotations() as con:
        result = compute_human_labels(con, DATASET)
    assert f"{result.kappa:.3f}" in page and "100%" in page
    exported = admin.get("/admin/export.json")
    assert exported.headers["content-disposition"] == 'attachment; filename="human_votes.json"'
    rows = json.loads(exported.text)
    assert len(rows) == 12 and {r["comment"] for r in rows} >= {"ann says 1", "cat says 0"}
    csv_text = admin.get("/admin/export.csv", params={"dataset": "demo"}).text
    assert csv_text.count("\n") == 13 and "ann says 1" in csv_text
    assert admin.get("/admin/export.csv", params={"dataset": "other"}).text.count("\n") == 1


LABEL_STUDIO_EXPORT = [
    {"id": 7, "data": {"dataset": "demo", "query_id": "q2", "doc_id": "d6", "text": "..."},
     "annotations": [
         {"id": 1, "completed_by": 3, "was_cancelled": False, "created_at": "2024-05-01T10:00:00.5Z",
          "result": [{"type": "choices", "from_name": "relevance", "to_name": "text",
                      "value": {"choices": ["Relevant"]}},
                     {"type": "textarea", "from_name": "comment", "to_name": "text",
                      "value": {"text": ["clear match"]}}]},
         {"id": 2, "completed_by": {"id": 4, "email": "eve@example.org"},
          "result": [{"type": "choices", "from_name": "relevance", "to_name": "text",
                      "value": {"choices": ["Irrelevant"]}}]},
         {"id": 3, "completed_by": 5, "was_cancelled": True, "result": []}]},
]


def test_admin_imports_csv_json_and_label_studio_with_validation(escalated_lake, tokens):
    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    csrf = csrf_of(admin.get("/admin").text)

    def upload(name, content, fmt="auto"):
        return admin.post("/admin/import", data={"csrf_token": csrf, "format": fmt},
                          files={"file": (name, content)})

    studio = upload("project-1.json", json.dumps(LABEL_STUDIO_EXPORT).encode())
    assert studio.status_code == 200 and "Imported 2 votes" in studio.text
    assert [(v[0], v[1], v[2], v[3]) for v in votes(escalated_lake)] == [
        ("labelstudio-3", "q2", "d6", 1), ("eve@example.org", "q2", "d6", 0)]
    plain_json = upload("more.json", json.dumps([{"dataset": "demo", "query_id": "q4", "doc_id": "d8",
                                                  "annotator_id": "x1", "label": 0}]).encode())
    assert plain_json.status_code == 200 and "Imported 1 vote" in plain_json.text

    bad = upload("bad.csv", b"dataset,query_id,doc_id,annotator_id,label\n"
                            b"demo,q1,d5,x2,1\n"
                            b"demo,q1,d5,x2,0\n"
                            b"demo,q1,d2,x3,1\n"
                            b"demo,q1,d5,<script>,1\n")
    assert bad.status_code == 400 and "Nothing imported" in bad.text
    assert "bad.csv, line 3: same annotator and pair as line 2" in bad.text
    assert "bad.csv, line 4: not a pair sent to people" in bad.text  # a consensus pair
    assert "bad.csv, line 5: annotator_id" in bad.text and "<script>" not in bad.text
    assert len(votes(escalated_lake)) == 3
    no_csrf = admin.post("/admin/import", files={"file": ("v.csv", b"x")})
    assert no_csrf.status_code == 403
    annotator = make_client(escalated_lake)
    login(annotator, tokens["ann"])
    assert annotator.post("/admin/import", data={"csrf_token": csrf_of(annotator.get("/annotate").text)},
                          files={"file": ("v.json", b"[]")}).status_code == 403


def test_serving_one_dataset_never_serves_an_open_item_of_another(escalated_lake, tokens):
    """`bridge annotate serve --dataset demo` after the annotator was served an item of another
    dataset: they get a demo item, and the other item is left open (its lease runs out)."""
    with annotations() as con:
        con.execute("insert into annotation_assignments (assignment_id, annotator_id, dataset, query_id, "
                    "doc_id, is_attention_check, expected_label, dressing_pair_key, with_history, state, "
                    "assigned_at) values ('a' || repeat('0', 31), 'ann', 'xss', 'q1', 'd5', false, null, "
                    "null, true, 'open', now())")
    client = make_client(escalated_lake, datasets=(DATASET,))
    login(client, tokens["ann"])
    page = client.get("/annotate")
    assert page.status_code == 200 and 'id="vote-form"' in page.text
    with duckdb.connect(str(votes_db(escalated_lake))) as con:
        dataset, state = con.execute("select dataset, state from annotation_assignments where assignment_id = ?",
                                     [assignment_of(page.text)]).fetchone()
        other = con.execute("select state from annotation_assignments where dataset = 'xss'").fetchone()[0]
    assert dataset == DATASET and state == "open"
    assert other == "open"
