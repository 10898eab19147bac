"""Faults of the annotation app (issue 13): sessions that outlive a logout, an item that errors,
plain HTTP off the loopback, oversized bodies, imports under a token holder's name, formulas in
the CSV export."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging

import duckdb
import pytest
import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from bridge_assets.cli import annotate as cli
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import AppSettings, annotation_app
from bridge_assets.human.security import SESSION_COOKIE
from bridge_assets.human.transfer import ImportFailed, import_votes
from bridge_assets.lake import store
from fixtures.human_app import SECRET, answer, csrf_of, login, make_client, served_pair, votes
from fixtures.paths import annotations, location, votes_db


@pytest.fixture
def tokens(escalated_lake) -> dict[str, str]:
    with annotations() as con:
        made = {name: add_annotator(con, name) for name in ("ann", "bob")}
        made["root"] = add_annotator(con, "root", admin=True)
    return made


# --- 4: a session ends at logout, at token rotation, and after its absolute lifetime ----------

def replay(lake, cookie: str, **settings) -> int:
    """The status of GET /annotate for a fresh client holding only `cookie`."""
    client = make_client(lake, **settings)
    client.cookies.set(SESSION_COOKIE, cookie)
    return client.get("/annotate").status_code


def test_a_cookie_copied_before_logout_is_refused_afterwards(escalated_lake, tokens):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    page = client.get("/annotate")
    stolen = client.cookies[SESSION_COOKIE]
    assert replay(escalated_lake, stolen) == 200
    assert client.post("/logout", data={"csrf_token": csrf_of(page.text)}).status_code == 303
    assert replay(escalated_lake, stolen) == 303
    # logging in again opens a new session; the old cookie stays dead
    login(client, tokens["ann"])
    assert client.get("/annotate").status_code == 200 and replay(escalated_lake, stolen) == 303


def test_a_rotated_token_ends_sessions_even_if_the_new_token_hashes_alike(escalated_lake, tokens):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    cookie = client.cookies[SESSION_COOKIE]
    with annotations() as con:
        epoch = con.execute("select session_epoch from annotators where annotator_id = 'ann'").fetchone()[0]
        add_annotator(con, "ann", rotate=True)
        # same fingerprint as before: only the epoch can tell the old session from a new one
        con.execute("update annotators set token_hash = ? where annotator_id = 'ann'",
                    [hashlib.sha256(tokens["ann"].encode()).hexdigest()])
        assert con.execute("select session_epoch from annotators where annotator_id = 'ann'"
                           ).fetchone()[0] == epoch + 1
    assert replay(escalated_lake, cookie) == 303


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_after_its_absolute_lifetime_however_active(escalated_lake, tokens):
    clock = Clock()
    app = annotation_app(AppSettings(lake=location(escalated_lake), secret=SECRET, attention_rate=0.0,
                                     session_hours=12), clock=clock)
    client = TestClient(app, follow_redirects=False)
    login(client, tokens["ann"])
    for _ in range(11):  # active every hour: the cookie is re-signed each time ...
        clock.now += 3600
        assert client.get("/annotate").status_code == 200
    clock.now += 3600 + 1  # ... but 12 h after the login it is refused all the same
    response = client.get("/annotate")
    assert response.status_code == 303 and response.headers["location"] == "/login"
    login(client, tokens["ann"])
    assert client.get("/annotate").status_code == 200


def test_the_session_lifetime_is_a_setting(escalated_lake, tokens):
    clock = Clock()
    app = annotation_app(AppSettings(lake=location(escalated_lake), secret=SECRET, attention_rate=0.0,
                                     session_hours=1), clock=clock)
    client = TestClient(app, follow_redirects=False)
    login(client, tokens["ann"])
    clock.now += 3000
    assert client.get("/annotate").status_code == 200
    clock.now += 601
    assert client.get("/annotate").status_code == 303


# --- 5: an item that errors does not trap its annotator -----------------------------------------

def test_an_item_whose_chunk_is_gone_is_dropped_and_the_next_one_served(escalated_lake, tokens, caplog):
    with store.connect(location()) as con:
        con.execute("delete from corpus where doc_id = 'd5'")  # the first pair's chunk
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    with caplog.at_level(logging.WARNING, logger="bridge_assets.human.app"):
        page = client.get("/annotate")
    assert page.status_code == 200 and served_pair(escalated_lake, page.text)[:2] == ("q2", "d6")
    with duckdb.connect(str(votes_db(escalated_lake))) as con:
        dropped = con.execute("select doc_id, state from annotation_assignments "
                              "where doc_id = 'd5'").fetchall()
    assert dropped == [("d5", "dropped")]
    assert "chunk 'd5' is missing" in caplog.text
    _, voted = answer(client, "1")
    assert voted.status_code == 303 and client.get("/annotate").status_code == 200


def test_when_every_item_errors_the_annotator_sees_the_done_page(escalated_lake, tokens):
    with store.connect(location()) as con:
        con.execute("delete from corpus")
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    for _ in range(2):
        page = client.get("/annotate")
        assert page.status_code == 200 and 'id="done"' in page.text


# --- 6: no plain-HTTP cookies off the loopback without saying so ------------------------------

@pytest.fixture
def served_with(monkeypatch, data_lake):
    """`bridge annotate serve` with uvicorn.run replaced: the hosts it would have served on."""
    calls: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **_: calls.append(host))
    return calls


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_serve_on_the_loopback_needs_no_flag(served_with, host):
    result = CliRunner().invoke(cli.app, ["serve", "--host", host])
    assert result.exit_code == 0, result.output
    assert served_with == [host]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "annotate.example.org"])
def test_serve_off_the_loopback_refuses_plain_http_unless_told(served_with, host):
    refused = CliRunner().invoke(cli.app, ["serve", "--host", host])
    assert refused.exit_code == 2 and served_with == []
    assert "--secure-cookies" in refused.output and "--insecure-http-ok" in refused.output
    for flag in ("--secure-cookies", "--insecure-http-ok"):
        assert CliRunner().invoke(cli.app, ["serve", "--host", host, flag]).exit_code == 0
    assert served_with == [host, host]


# --- 7: bodies are limited before anything parses them ------------------------------------------

def test_an_oversized_login_form_is_refused_before_parsing(escalated_lake, tokens):
    client = make_client(escalated_lake)
    csrf = csrf_of(client.get("/login").text)
    big = client.post("/login", data={"csrf_token": csrf, "token": "x" * (256 * 2**10)})
    assert big.status_code == 413 and "larger than" in big.text
    # refused by its size alone: no CSRF token checked, no field parsed
    assert make_client(escalated_lake).post("/login", content=b"a" * (2**20)).status_code == 413
    assert login(client, tokens["ann"]).status_code == 303


def test_a_body_without_content_length_is_counted_as_it_arrives(escalated_lake, tokens):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])

    def chunks():
        for _ in range(64):
            yield b"comment=" + b"x" * 4096 + b"&"
    response = client.post("/annotate", content=chunks(),
                           headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 413 and votes(escalated_lake) == []


def test_only_the_import_route_takes_upload_sized_bodies(escalated_lake, tokens):
    admin = make_client(escalated_lake, max_upload_bytes=2**20)
    login(admin, tokens["root"])
    csrf = csrf_of(admin.get("/admin").text)
    record = {"dataset": "demo", "query_id": "q1", "doc_id": "d5", "annotator_id": "ext", "label": 1,
              "comment": "y" * 1900}
    padded = json.dumps([record] + [{"pad": "z" * 1000}] * 300).encode()  # ~300 KB
    parsed = admin.post("/admin/import", data={"csrf_token": csrf},
                          files={"file": ("votes.json", padded)})
    assert parsed.status_code == 400 and "record 2" in parsed.text  # past the limit: parsed, validated
    too_big = admin.post("/admin/import", data={"csrf_token": "not-checked"},
                         files={"file": ("votes.json", b"[" + b" " * (2**20 + 2**17) + b"]")})
    assert too_big.status_code == 413
    assert admin.post("/annotate", data={"csrf_token": csrf, "comment": "c" * 300_000}).status_code == 413


# --- 8: imports cannot speak for people who log in ----------------------------------------------

def vote_file(annotator: str, **extra) -> bytes:
    return json.dumps([{"dataset": "demo", "query_id": "q1", "doc_id": "d5",
                        "annotator_id": annotator, "label": 1, **extra}]).encode()


def test_an_import_under_a_token_holders_name_is_refused(escalated_lake, tokens):
    with annotations() as con:
        with pytest.raises(ImportFailed, match="record 1: annotator 'ann' logs in to the app"):
            import_votes(con, vote_file("ann"), "forged.json")
        with pytest.raises(ImportFailed, match="annotator 'bob' logs in"):
            import_votes(con, vote_file("bob", query_id="q1", doc_id="d1", is_attention_check=True,
                                        expected_label=1), "checks.json")
        assert import_votes(con, vote_file("ext"), "external.json") == 1
    assert [v[0] for v in votes(escalated_lake)] == ["ext"]


def test_an_override_imports_them_and_says_so_in_the_source(escalated_lake, tokens):
    with annotations() as con:
        assert import_votes(con, vote_file("ann"), "paper.json", override=True) == 1
        assert import_votes(con, vote_file("ext"), "other.json", override=True) == 1
        sources = con.execute("select annotator_id, source from human_votes order by vote_id").fetchall()
    assert sources == [("ann", "import:override:paper.json"), ("ext", "import:other.json")]


def test_the_admin_page_and_the_command_refuse_them_too(escalated_lake, tokens, tmp_path):
    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    csrf = csrf_of(admin.get("/admin").text)
    page = admin.post("/admin/import", data={"csrf_token": csrf},
                      files={"file": ("forged.json", vote_file("ann"))})
    assert page.status_code == 400 and "logs in to the app" in page.text
    overridden = admin.post("/admin/import", data={"csrf_token": csrf, "override": "on"},
                            files={"file": ("forged.json", vote_file("ann"))})
    assert overridden.status_code == 200 and "Imported 1 vote" in overridden.text
    path = tmp_path / "votes.json"
    path.write_bytes(vote_file("bob"))
    refused = CliRunner().invoke(cli.app, ["import", str(path)])
    assert refused.exit_code == 2 and "annotator 'bob' logs in to the app" in refused.output
    assert "--override-app-annotators" in refused.output
    forced = CliRunner().invoke(cli.app, ["import", str(path), "--override-app-annotators"])
    assert forced.exit_code == 0, forced.output
    assert [v[0] for v in votes(escalated_lake)] == ["ann", "bob"]


def test_deeply_nested_json_is_a_named_error_not_a_crash(escalated_lake):
    nested = b'[{"dataset": "demo",\n "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]"
    with annotations() as con, pytest.raises(ImportFailed, match=r"deep\.json, line 2: JSON nested"):
        import_votes(con, nested, "deep.json")


# --- 9: the CSV export never holds a spreadsheet formula -------------------------------------

@pytest.mark.parametrize("comment", ["=HYPERLINK(\"http://evil\",\"x\")", "+1+2", "-2+3", "@SUM(A1)",
                                     "\tx", "\rx"])
def test_csv_export_cells_cannot_start_a_formula(escalated_lake, tokens, comment):
    client = make_client(escalated_lake)
    login(client, tokens["ann"])
    answer(client, "1", comment="placeholder")
    with annotations() as con:  # as an import could have stored it
        con.execute("update human_votes set comment = ?", [comment])
    admin = make_client(escalated_lake)
    login(admin, tokens["root"])
    rows = list(csv.DictReader(io.StringIO(admin.get("/admin/export.csv").text, newline="")))
    assert rows[0]["comment"] == "'" + comment and rows[0]["annotator_id"] == "ann"
    assert json.loads(admin.get("/admin/export.json").text)[0]["comment"] == comment
