"""Votes apart from the pipeline (issue 15, item 3): annotators, assignments and votes live in the
votes store, never in bridge.duckdb; a vote never waits on a pipeline write; under contention
the app answers 503 and keeps the vote's form; an old lake's votes move on first use; and
`make clean` never removes them."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import textwrap

import dagster as dg
import duckdb
import pytest
from typer.testing import CliRunner

from bridge_assets.cli import annotate as cli
from bridge_assets.human import votes_store
from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import annotation as app_module
from bridge_assets.human.assets import human_labels
from bridge_assets.human.tables import ensure_schema
from bridge_assets.human.votes import insert_vote
from bridge_assets.lake import ducklake, store
from fixtures.escalated_set import DATASET, ESCALATED, write_escalated_set
from fixtures.human_app import assignment_of, csrf_of, login, make_client
from fixtures.paths import PROJECT_ROOT, annotations, lake_resources, location, votes_db

HUMAN_TABLES = {"annotators", "annotation_assignments", "human_votes"}
# Holds a DuckDB file's write lock from another process until a line arrives on its stdin.
HOLD = textwrap.dedent("""
    import sys, duckdb
    con = duckdb.connect(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.readline()
    con.close()
""")


class Held:
    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        self.proc.communicate("\n", timeout=30)
        assert self.proc.returncode == 0


def tables(path) -> set[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return {row[0] for row in con.execute("select table_name from duckdb_tables()").fetchall()}


def stored_votes(lake) -> list[tuple]:
    with duckdb.connect(str(votes_db(lake)), read_only=True) as con:
        return con.execute("select vote_id, annotator_id, query_id, doc_id, label, comment "
                           "from human_votes order by vote_id").fetchall()


@pytest.fixture
def token(escalated_lake) -> str:
    with annotations() as con:
        return add_annotator(con, "ann")


def test_a_vote_never_waits_on_a_pipeline_write_and_lands_in_the_votes_store(duckdb_storage, escalated_lake, token):
    """On a DuckDB file, the one storage whose writer locks readers out."""
    client = make_client(escalated_lake, busy_seconds=0.5)
    login(client, token)
    page = client.get("/annotate")
    assert page.status_code == 200
    pipeline = Held(escalated_lake / "bridge.duckdb")  # a pipeline step writing its partition
    try:
        voted = client.post("/annotate", data={"csrf_token": csrf_of(page.text), "label": "1",
                                               "assignment_id": assignment_of(page.text),
                                               "comment": "while the pipeline writes"})
        # 303, not 503: the vote never needed the pipeline's file, held all along (the next
        # page, which does need it, is refused after busy_seconds). No wall-clock bound.
        assert voted.status_code == 303
        # the next page shows the pipeline's tables: busy, said so, nothing lost
        busy = client.get("/annotate")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert "busy" in busy.text
    finally:
        pipeline.release()
    assert client.get("/annotate").status_code == 200
    assert [v[1:] for v in stored_votes(escalated_lake)] == \
        [("ann", *ESCALATED[0], 1, "while the pipeline writes")]
    assert not tables(escalated_lake / "bridge.duckdb") & HUMAN_TABLES
    assert HUMAN_TABLES <= tables(votes_db(escalated_lake))


# Writes a DuckLake partition from another process and keeps its transaction open (the rows
# written, nothing committed) until a line arrives on its stdin; then commits.
WRITING = textwrap.dedent("""
    import sys
    import polars as pl
    from bridge_assets import settings
    from bridge_assets.lake import location
    from bridge_assets.lake import store
    with store.connect(location.lake_location()) as con:
        con.execute("begin transaction")
        store.replace_partition(con, "corpus", pl.DataFrame({"dataset": ["other"], "doc_id": ["x"],
                                                             "title": [""], "text": ["x"]}), {"dataset": "other"})
        print("writing", flush=True)
        sys.stdin.readline()
        con.execute("commit")
""")


def test_on_ducklake_a_page_and_a_vote_are_served_while_a_pipeline_write_is_open(escalated_lake, token, monkeypatch):
    """The default storage has no lock for the app to wait on: a page and a vote while another
    process holds a write transaction open on the lake."""
    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    client = make_client(escalated_lake, busy_seconds=0.5)
    login(client, token)
    writer = subprocess.Popen([sys.executable, "-c", WRITING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "BRIDGE_DATA_LAKE": str(escalated_lake)})
    try:
        assert writer.stdout.readline().strip() == "writing"
        page = client.get("/annotate")
        assert page.status_code == 200
        voted = client.post("/annotate", data={"csrf_token": csrf_of(page.text), "label": "1",
                                               "assignment_id": assignment_of(page.text),
                                               "comment": "while the lake is written"})
        assert voted.status_code == 303 and client.get("/annotate").status_code == 200
    finally:
        writer.communicate("\n", timeout=60)
    assert writer.returncode == 0
    assert [v[1:] for v in stored_votes(escalated_lake)] == [("ann", *ESCALATED[0], 1, "while the lake is written")]
    with store.connect(location()) as con:  # the writer's commit went through after the app's reads
        assert con.execute("select count(*) from corpus where dataset = 'other'").fetchone()[0] == 1


def kept_form(page: str) -> dict[str, str]:
    comment = re.search(r'<textarea name="comment"[^>]*>(.*?)</textarea>', page, re.S).group(1)
    chosen = re.findall(r'<button type="submit" name="label" value="(\d)"\s+class="[^"]*"\s+'
                        r'aria-pressed="true"', page)
    return {"csrf_token": csrf_of(page), "assignment_id": assignment_of(page),
            "comment": html.unescape(comment), "label": chosen[0] if len(chosen) == 1 else ""}


def test_a_vote_on_a_locked_votes_store_gets_503_with_its_choice_and_comment_kept(escalated_lake, token,
                                                                                  monkeypatch):
    client = make_client(escalated_lake, busy_seconds=0.5)
    login(client, token)
    page = client.get("/annotate").text
    comment = 'Close call: the <chunk> says "len" & nothing more.'
    posted = {"csrf_token": csrf_of(page), "label": "0", "assignment_id": assignment_of(page),
              "comment": comment}
    votes = Held(votes_db(escalated_lake))  # e.g. `bridge annotate import` writing, or a long reader
    try:
        refused = client.post("/annotate", data=posted)
    finally:
        votes.release()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "not recorded yet" in refused.text
    assert kept_form(refused.text) == posted  # the same item, the choice and the comment
    assert "Close call: the &lt;chunk&gt; says &#34;len&#34; &amp; nothing more." in refused.text
    assert stored_votes(escalated_lake) == []

    # the lock comes while recording the vote (after the login was checked): the same
    real = app_module.record_vote

    def locked(*args, **kwargs):
        raise store.StoreBusy("votes.duckdb is locked by another process")

    monkeypatch.setattr(app_module, "record_vote", locked)
    again = client.post("/annotate", data=kept_form(refused.text))
    assert again.status_code == 503 and kept_form(again.text) == posted
    monkeypatch.setattr(app_module, "record_vote", real)

    submitted = client.post("/annotate", data=kept_form(again.text))  # submit again: recorded
    assert submitted.status_code == 303
    assert [v[1:] for v in stored_votes(escalated_lake)] == [("ann", *ESCALATED[0], 0, comment)]


# --- an old lake: its votes move on first use ------------------------------------------------------

def write_old_lake(lake) -> str:
    """The human tables where they were before the votes store: in bridge.duckdb (a DuckDB-file
    lake: DuckLake came after the votes store; the tests using it ask for duckdb_storage)."""
    write_escalated_set(lake)
    with store.connect(location(lake)) as con:
        ensure_schema(con)
        token = add_annotator(con, "ann")
        for annotator, label in (("bob", 1), ("cat", 1)):
            insert_vote(con, dataset=DATASET, query_id=ESCALATED[0][0], doc_id=ESCALATED[0][1],
                        annotator_id=annotator, label=label, comment=f"{annotator} before",
                        with_history=True, is_attention_check=False, expected_label=None,
                        status="accepted", source="app")
    return token


def test_an_old_lakes_votes_move_to_the_votes_store_when_the_app_starts(duckdb_storage, data_lake):
    token = write_old_lake(data_lake)
    client = make_client(data_lake)  # first use
    assert not tables(data_lake / "bridge.duckdb") & HUMAN_TABLES
    assert [v[:3] for v in stored_votes(data_lake)] == [(1, "bob", "q1"), (2, "cat", "q1")]
    login(client, token)  # the token still works: its hash moved along
    page = client.get("/annotate").text
    assert client.post("/annotate", data={"csrf_token": csrf_of(page), "label": "1",
                                          "assignment_id": assignment_of(page)}).status_code == 303
    assert [v[:2] for v in stored_votes(data_lake)][-1] == (3, "ann")  # ids go on after the moved ones
    done = CliRunner().invoke(cli.app, ["migrate"])
    assert done.exit_code == 0 and "nothing to move" in done.output


def test_the_pipeline_moves_them_too_and_human_labels_counts_them(duckdb_storage, data_lake):
    write_old_lake(data_lake)
    with store.connect(location()) as con:  # a third vote completes the first pair
        insert_vote(con, dataset=DATASET, query_id=ESCALATED[0][0], doc_id=ESCALATED[0][1],
                    annotator_id="dan", label=0, comment=None, with_history=True,
                    is_attention_check=False, expected_label=None, status="accepted", source="app")
    result = dg.materialize([human_labels], partition_key=DATASET,
                            resources=lake_resources(data_lake),
                            run_config={"ops": {"human_labels": {"config": {"allow_partial": True}}}})
    assert result.success
    assert result.asset_materializations_for_node("human_labels")[0].metadata["accepted_votes"].value == 3
    assert not tables(data_lake / "bridge.duckdb") & HUMAN_TABLES
    assert len(stored_votes(data_lake)) == 3


def test_a_move_cut_short_finishes_without_doubling_and_different_votes_are_refused(duckdb_storage, data_lake):
    write_old_lake(data_lake)
    assert CliRunner().invoke(cli.app, ["migrate"]).output.startswith("moved 2 votes")
    # as if the process died after copying and before dropping the lake's tables
    with store.connect(location(data_lake)) as con:
        store.attach_file(con, votes_db(data_lake), "moved")
        for table in ("annotators", "human_votes"):
            con.execute(f"create table {table} as select * from moved.{table}")
    assert votes_store.migrate(location(data_lake)) == 2
    assert not tables(data_lake / "bridge.duckdb") & HUMAN_TABLES
    assert len(stored_votes(data_lake)) == 2

    # a lake holding votes the store lacks: refused, and nothing is dropped
    with store.connect(location(data_lake)) as con:
        ensure_schema(con)
        insert_vote(con, dataset=DATASET, query_id="q2", doc_id="d6", annotator_id="eve", label=1,
                    comment=None, with_history=True, is_attention_check=False, expected_label=None,
                    status="accepted", source="app")
    refused = CliRunner().invoke(cli.app, ["migrate"])
    assert refused.exit_code == 2 and "both the data lake" in refused.output
    assert "human_votes" in tables(data_lake / "bridge.duckdb") and len(stored_votes(data_lake)) == 2


# --- make clean ----------------------------------------------------------------------------------------

def make_clean(project) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BRIDGE_DATA_LAKE", "BRIDGE_VOTES_DB")}
    return subprocess.run(["make", "--no-print-directory", "clean"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def test_make_clean_never_removes_the_votes(tmp_path, duckdb_storage, monkeypatch):
    """The Makefile's own clean target, run in a copy of the project (its .venv linked): on an
    old DuckDB-file lake, then on the DuckLake the pipeline writes now."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(PROJECT_ROOT / "Makefile", project / "Makefile")
    (project / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    lake = project / "data_lake"
    lake.mkdir()
    write_old_lake(lake)  # a lake from before the votes store: its votes are in bridge.duckdb
    (lake / "reports" / DATASET).mkdir(parents=True)
    (lake / "reports" / DATASET / "report.html").write_text("<html></html>")

    first = make_clean(project)
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (lake / "bridge.duckdb").exists() and not (lake / "reports").exists()
    kept = stored_votes(lake)
    assert [v[1] for v in kept] == ["bob", "cat"]

    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    write_escalated_set(lake)  # the pipeline runs again; people vote in the votes store
    assert (lake / "ducklake.sqlite").exists() and (lake / "ducklake").is_dir()
    with annotations(lake) as con:
        insert_vote(con, dataset=DATASET, query_id="q2", doc_id="d6", annotator_id="dan", label=0,
                    comment="after", with_history=True, is_attention_check=False, expected_label=None,
                    status="accepted", source="app")
    second = make_clean(project)
    assert second.returncode == 0, second.stdout + second.stderr
    assert not (lake / "ducklake.sqlite").exists() and not (lake / "ducklake").exists()
    assert not store.exists(location(lake))
    assert stored_votes(lake) == [*kept, (3, "dan", "q2", "d6", 0, "after")]
    with duckdb.connect(str(votes_db(lake)), read_only=True) as con:
        assert con.execute("select annotator_id from annotators").fetchall() == [("ann",)]


def test_on_ducklake_the_votes_store_is_attached_beside_the_lake_for_one_call_only(escalated_lake, monkeypatch):
    """The app's every page opens the votes store with the pipeline's tables: on DuckLake that
    is the process's lake instance (extensions loaded once) with the votes file attached for the
    call, and detached after it, whatever happened inside."""
    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    votes_store.prepare(location(escalated_lake))
    with store.connect(location()) as con:
        debated = con.execute("select count(*) from debate_labels").fetchone()[0]

    def attached() -> set[str]:
        with store.connect(location()) as con:
            return {row[0] for row in con.execute("select database_name from duckdb_databases()").fetchall()}

    for name in ("eve", "fay"):
        with votes_store.connect(location(escalated_lake)) as con:
            assert con.execute("select count(*) from debate_labels").fetchone()[0] == debated > 0
            in_use = {row[0] for row in con.execute("select database_name from duckdb_databases()").fetchall()}
            assert {ducklake.ALIAS, votes_store.VOTES} <= in_use  # the lake's own instance
            add_annotator(con, name)  # written to the votes store, not the lake
        assert votes_store.VOTES not in attached()
    with pytest.raises(duckdb.Error):
        with votes_store.connect(location(escalated_lake)) as con:
            con.execute("begin transaction")
            con.execute("select * from no_such_table")
    assert votes_store.VOTES not in attached()
    with store.connect(location()) as con:
        in_lake = {row[0] for row in con.execute(
            "select table_name from duckdb_tables() where database_name = current_database()").fetchall()}
    assert "debate_labels" in in_lake and not in_lake & HUMAN_TABLES
    with duckdb.connect(str(votes_db(escalated_lake)), read_only=True) as con:
        assert con.execute("select annotator_id from annotators order by 1").fetchall() == [("eve",), ("fay",)]


def test_an_old_duckdb_lake_under_the_ducklake_default_is_refused_with_what_to_do(data_lake, monkeypatch):
    """Its votes are in bridge.duckdb, which the DuckLake default does not read: `bridge annotate`
    says to run `bridge lake migrate` (it moves the votes first) instead of starting empty."""
    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")
    write_old_lake(data_lake)
    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    refused = CliRunner().invoke(cli.app, ["migrate"])
    assert refused.exit_code == 2 and "bridge lake migrate" in refused.output
    assert not votes_db(data_lake).exists() and HUMAN_TABLES <= tables(data_lake / "bridge.duckdb")


def test_the_votes_version_is_read_in_place_and_moves_only_with_a_counted_vote(escalated_lake):
    """votes_store.votes_version (what the sensor and the staleness check compare with the one
    human_labels was built from): a store file nobody has opened reads as no votes; an excluded
    vote and an attention check change nothing; an accepted vote does."""
    from bridge_assets.human.tables import votes_version
    from fixtures.escalated_set import vote

    where = location()
    where.votes_db.unlink(missing_ok=True)
    where.votes_db.parent.mkdir(parents=True, exist_ok=True)
    duckdb.connect(str(where.votes_db)).close()  # a file without the tables
    with duckdb.connect() as con:
        con.execute("create table human_votes (vote_id bigint, dataset varchar, query_id varchar, doc_id varchar, "
                    "annotator_id varchar, label integer, status varchar, is_attention_check boolean)")
        none = votes_version(con, DATASET)
    assert votes_store.votes_version(where, DATASET) == none
    assert tables(where.votes_db) == set()  # read, not written
    with annotations() as con:
        vote(con, ESCALATED[0], "ann", 1, status="excluded")
        vote(con, ESCALATED[0], "bob", 1, check=True)
    assert votes_store.votes_version(where, DATASET) == none
    with annotations() as con:
        vote(con, ESCALATED[0], "cat", 1)
        counted = votes_version(con, DATASET)
    assert votes_store.votes_version(where, DATASET) == counted != none
