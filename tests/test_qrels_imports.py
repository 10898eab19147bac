"""Qrels that round-trip (issue 14, item 5): judgments from elsewhere as named label sources of
bridge_qrels, ranked among the built-in ones; corrections of the original judgments as an
explicit source, shown in the audit and the report; found holes from verified sources only;
export, then import into a fresh lake, gives the same qrels.

Builds on the labeled lake of fixtures.labeled_lake (its EXPECTED qrels)."""

from __future__ import annotations

import re

import dagster as dg
import pytest
from typer.testing import CliRunner

from bridge_assets.cli.audit import audit_pair, format_story
from bridge_assets.cli.qrels import app as qrels_app
from bridge_assets.cli.summary import _labels
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.lake import store
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.qrels.imports import ImportFormat, QrelsImportError, import_qrels
from bridge_assets.qrels.merge import build_bridge_qrels
from bridge_assets.qrels.sources import BUILTIN_PRECEDENCE, SourceError, place
from bridge_assets.reports.label_sections import qrels_section
from fixtures.labeled_lake import DATASET, EXPECTED, EXPECTED_LABELS, materialize_qrels, read
from fixtures.paths import lake_resources, location


def qrels_of(lake) -> dict[tuple[str, str], tuple[int | None, str]]:
    return {(q, d): (r, s) for q, d, r, s in read(lake, "select query_id, doc_id, relevance, source "
                                                       "from bridge_qrels").rows()}


def row(lake, query_id: str, doc_id: str) -> dict:
    return read(lake, f"select * from bridge_qrels where query_id = '{query_id}' and doc_id = '{doc_id}'"
                ).row(0, named=True)


def write(path, lines: list[str]):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def imported(lake, path, source: str, **options):
    with store.connect(location(lake)) as con:
        return import_qrels(con, DATASET, path, source, **options)


def fresh_lake_like(lake, fresh):
    """A new data lake with `lake`'s corpus, queries and original qrels only (nothing labelled)."""
    fresh.mkdir()
    with store.connect(location(lake)) as con:
        tables = {t: con.execute(f"select * from {t}").pl() for t in ("corpus", "queries", "original_qrels")}
    store.write_partitions(tables, {"dataset": DATASET}, location(fresh))
    return fresh


def counts(lake) -> dict:
    with store.connect(location(lake)) as con:
        return build_bridge_qrels(con, DATASET).counts()


# --- the built-in sources keep their place --------------------------------------------------------

def test_built_in_sources_carry_their_precedence_verification_and_original_relevance(labeled_lake):
    materialize_qrels(labeled_lake)
    table = read(labeled_lake, "select source, precedence, verified, original_relevance, import_file "
                               "from bridge_qrels")
    assert qrels_of(labeled_lake) == EXPECTED
    for source, precedence, verified, _, import_file in table.rows():
        assert precedence == BUILTIN_PRECEDENCE[source] and import_file is None
        assert verified == (source not in ("pending", "filter"))  # a drop is a model's unverified "no"
    assert row(labeled_lake, "q1", "d9")["original_relevance"] == 0  # the original outranks the debate
    assert row(labeled_lake, "q1", "d5")["original_relevance"] is None


# --- export, then import into a fresh lake ---------------------------------------------------------

@pytest.mark.parametrize("fmt, exported, as_format", [("trec", "refined.qrels", "trec"),
                                                       ("beir", "beir", "beir-tsv"),
                                                       ("bridge", "bridge", "bridge")])
def test_export_then_import_into_a_fresh_lake_gives_the_same_qrels(labeled_lake, tmp_path, monkeypatch,
                                                                   fmt, exported, as_format):
    materialize_qrels(labeled_lake)
    runner = CliRunner()
    out = tmp_path / exported
    result = runner.invoke(qrels_app, ["export", "-d", DATASET, "-f", fmt, "-o", str(out)])
    assert result.exit_code == 0, result.output
    file = {"trec": out, "beir": out / "qrels" / "test.tsv", "bridge": out}[fmt]
    # the pending pair is not a label: absent from the export
    assert qrels_of(labeled_lake)[("q2", "d10")] == (None, "pending")
    assert "d10" not in (file if file.is_file() else file / "queries.jsonl").read_text()

    fresh = fresh_lake_like(labeled_lake, tmp_path / "fresh")
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(fresh))
    result = runner.invoke(qrels_app, ["import", str(file), "-d", DATASET, "--source", "earlier", "-f", as_format,
                                       "--verified", "--no-run"])
    assert result.exit_code == 0, result.output
    materialize_qrels(fresh)
    got = qrels_of(fresh)
    # the BRIDGE release lists relevant documents only; TREC and BEIR keep every label
    want = EXPECTED_LABELS if fmt != "bridge" else \
        {p: v for p, v in EXPECTED_LABELS.items() if v[0] > 0 or v[1] == "original"}
    assert {p: r for p, (r, _) in got.items()} == {p: r for p, (r, _) in want.items()}
    assert ("q2", "d10") not in got
    # sources differ by name, not by relevance: the gold stays 'original'
    assert {p: s for p, (_, s) in got.items()} == {p: s if s == "original" else "earlier" for p, (_, s) in want.items()}
    assert counts(fresh)["holes_found"] == counts(labeled_lake)["holes_found"] == 3


def test_import_command_rebuilds_bridge_qrels_and_lists_and_removes_sources(labeled_lake, tmp_path, monkeypatch):
    materialize_qrels(labeled_lake)
    export = tmp_path / "refined.qrels"
    assert CliRunner().invoke(qrels_app, ["export", "-d", DATASET, "-o", str(export)]).exit_code == 0
    fresh = fresh_lake_like(labeled_lake, tmp_path / "fresh")
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(fresh))
    home = fresh / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    result = CliRunner().invoke(qrels_app, ["import", str(export), "-d", DATASET, "-s", "earlier"])
    assert result.exit_code == 0, result.output
    assert f"12 of 12 judgments from {export} -> 'earlier' (unverified source, precedence 15) on demo" in result.output
    assert "precedence: original > earlier > human > debate > pending > filter" in result.output
    # unverified: labels, but no found hole
    assert "bridge_qrels (demo): 12 pairs, 7 relevant, 0 found holes (verified), 0 corrections" in result.output
    # a line for its one step (cli.console) and no line of Dagster's log, which said nothing at
    # INFO: no log file is kept under the lake, none is named; -v (below): Dagster's log, live
    assert re.search(r"^\[1/1\] bridge_qrels \(demo\) \.\.\. done in \d+ s$", result.stderr, re.MULTILINE), \
        result.output
    assert " - dagster - " not in result.output and "Dagster's log of this command" not in result.output
    assert list((fresh / "logs").iterdir()) == []
    assert {p: r for p, (r, _) in qrels_of(fresh).items()} == {p: r for p, (r, _) in EXPECTED_LABELS.items()}
    again = CliRunner().invoke(qrels_app, ["import", str(export), "-d", DATASET, "-s", "earlier"])
    assert again.exit_code == 2 and "source 'earlier' is already imported" in again.output
    listed = CliRunner().invoke(qrels_app, ["sources", "-d", DATASET])
    assert listed.exit_code == 0
    assert [line.split()[:3] for line in listed.output.splitlines()[1:]] == [
        ["10", "original", "built-in"], ["15", "earlier", "unverified"], ["20", "human", "built-in"],
        ["30", "debate", "built-in"], ["40", "pending", "built-in"], ["50", "filter", "built-in"]]
    removed = CliRunner().invoke(qrels_app, ["remove", "-d", DATASET, "-s", "earlier", "-v"])
    assert removed.exit_code == 0, removed.output
    assert "removed 'earlier' (12 judgments)" in removed.output and "5 pairs" in removed.output
    # -v: Dagster's log (nothing at INFO here) between the lines, so the step also says when it starts
    assert re.fullmatch(r"\[1/1\] bridge_qrels \(demo\)\n\[1/1\] bridge_qrels \(demo\) \.\.\. done in \d+ s\n",
                        removed.stderr), removed.output
    assert re.search(r"^\[1/1\] bridge_qrels \(demo\) \.\.\. done in \d+ s$", removed.stderr, re.MULTILINE)
    assert set(qrels_of(fresh).values()) <= {(1, "original"), (0, "original")}


# --- bad input ------------------------------------------------------------------------------------

def test_unknown_ids_are_skipped_and_counted_or_an_error(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    file = write(tmp_path / "umbrela.qrels", ["q4 0 d1 2", "q9 0 d1 1", "q4 0 ghost 1", "q9 0 d2 0", "q2 0 d3 1"])
    report = imported(labeled_lake, file, "umbrela")
    assert (report.lines, report.stored, report.unknown_query_lines, report.unknown_document_lines) == (5, 2, 2, 1)
    assert report.examples == ['line 2: unknown query "q9"', 'line 4: unknown query "q9"',
                               'line 3: unknown document "ghost"']
    with store.connect(location()) as con:
        sources = con.execute("select source, lines, stored, unknown_query_lines, unknown_document_lines "
                              "from qrels_sources").fetchall()
    assert sources == [("umbrela", 5, 2, 2, 1)]
    with pytest.raises(DatasetError, match=r"umbrela.qrels, line 2, field \"qid\": unknown query \"q9\""):
        imported(labeled_lake, file, "umbrela", replace=True, unknown_ids="error")
    # nothing written by the failed import: the first one stands
    assert read(labeled_lake, "select count(*) from imported_qrels").item() == 2


def test_malformed_lines_name_the_file_and_line_and_nothing_is_written(labeled_lake, tmp_path):
    cases = [(["q1 0 d5 1", "q1 0 d6"], ImportFormat.trec, r"bad.qrels, line 2: expected 4 columns"),
             (["q1 0 d5 1", "q1 0 d6 x"], ImportFormat.trec, r"bad.qrels, line 2, field \"rel\": relevance \"x\""),
             (["q1 0 d5 1", "q1 0 d5 0"], ImportFormat.trec, r"bad.qrels, line 2: duplicate judgment"),
             (["q1 0 d5 1", "q1 0 d6 -1"], ImportFormat.trec, r"bad.qrels, line 2, field \"rel\": relevance -1 "
                                                              r"is negative"),
             (["query-id\tcorpus-id\tscore", "q1\td5"], ImportFormat.beir_tsv, r"bad.qrels, line 2: expected 3"),
             (['{"q_id": "q1", "doc_id": ["d5"]}', '{"q_id": "q1", "doc_id": []}'], ImportFormat.bridge,
              r"bad.qrels, line 2, field \"q_id\": duplicate id"),
             (['{"q_id": "q1", "doc_id": "d5"}'], ImportFormat.bridge,
              r"bad.qrels, line 1, field \"doc_id\": expected a list")]
    for lines, fmt, message in cases:
        with pytest.raises(DatasetError, match=message):
            imported(labeled_lake, write(tmp_path / "bad.qrels", lines), "assessor2", fmt=fmt)
    with store.connect(location()) as con:
        assert not store.table_exists(con, "imported_qrels")
    result = CliRunner().invoke(qrels_app, ["import", str(tmp_path / "bad.qrels"), "-d", DATASET, "-s", "x",
                                            "-f", "bridge"])
    assert result.exit_code == 2 and "bad.qrels, line 1" in result.output


def test_a_dataset_not_ingested_is_refused(data_lake, tmp_path):
    file = write(tmp_path / "a.qrels", ["q1 0 d1 1"])
    with store.connect(location()) as con, pytest.raises(QrelsImportError, match="no corpus rows for dataset 'demo'"):
        import_qrels(con, DATASET, file, "assessor2")


# --- precedence --------------------------------------------------------------------------------------

def test_places_among_the_sources_and_what_is_refused():
    ranks = dict(BUILTIN_PRECEDENCE)
    assert place(ranks) == 15 and place(ranks, corrects_original=True) == 5
    assert place(ranks, before="pending") == 35 and place(ranks, after="filter") == 60
    assert place({**ranks, "a": 15.0}, after="original") == 12.5
    assert place({**ranks, "fix": 5.0}, before="original", corrects_original=True) == 7.5
    assert place(ranks, precedence=25) == 25
    refused = [({"precedence": 5}, "only a correction source"), ({"before": "original"}, "only a correction"),
               ({"after": "human", "corrects_original": True}, "must rank above 'original'"),
               ({"precedence": 20}, "precedence 20 is taken by 'human'"),
               ({"before": "umbrela"}, "unknown source 'umbrela'"),
               ({"before": "human", "after": "debate"}, "at most one")]
    for options, message in refused:
        with pytest.raises(SourceError, match=message):
            place(ranks, **options)


def test_source_names_are_checked(labeled_lake, tmp_path):
    file = write(tmp_path / "a.qrels", ["q1 0 d1 1"])
    for name, message in (("human", "reserved"), ("Adjudicator", "reserved"), ("my source", "invalid"),
                          ("../x", "invalid")):
        with pytest.raises(SourceError, match=message):
            imported(labeled_lake, file, name)


# --- verified and unverified sources, precedence in the merge ------------------------------------------

def test_only_verified_imports_count_as_found_holes_and_precedence_decides(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    before = counts(labeled_lake)
    assessor = write(tmp_path / "assessor2.qrels", ["q2 0 d3 1", "q1 0 d1 0"])
    report = imported(labeled_lake, assessor, "assessor2", verified=True)
    assert report.disagreeing_original == 1 and report.precedence == 15  # just after original
    umbrela = write(tmp_path / "umbrela.qrels", ["q4 0 d1 3", "q4 0 d2 0", "q1 0 d12 1", "q2 0 d10 1"])
    assert imported(labeled_lake, umbrela, "umbrela", after="filter").precedence == 60
    materialize_qrels(labeled_lake)
    got = qrels_of(labeled_lake)
    assert got[("q2", "d3")] == (1, "assessor2") and got[("q1", "d1")] == (1, "original")
    assert got[("q4", "d1")] == (3, "umbrela") and got[("q4", "d2")] == (0, "umbrela")
    # below filter and pending: the pipeline's judgments stand
    assert got[("q1", "d12")] == (0, "filter") and got[("q2", "d10")] == (None, "pending")
    assert {p: v for p, v in got.items() if p in EXPECTED} == EXPECTED
    after = counts(labeled_lake)
    assert after["holes_found"] == before["holes_found"] + 1  # the person's, not the model's
    assert (after["unverified_imported_relevant"], after["unverified_imported_irrelevant"]) == (1, 1)
    assert (after["pairs_umbrela"], after["relevant_umbrela"], after["pairs_assessor2"]) == (2, 1, 1)
    assert row(labeled_lake, "q4", "d1")["import_line"] == 1 and not row(labeled_lake, "q4", "d1")["verified"]
    with store.connect(location()) as con:
        text = format_story(audit_pair(con, DATASET, "q4", "d1"))
        outranked = format_story(audit_pair(con, DATASET, "q1", "d12"))
    assert "relevance 3  source umbrela" in text
    assert f"{'imported from':<22}{umbrela}, line 1  (unverified: not counted as a found hole)" in text
    assert f"{'import umbrela':<22}relevance 1  {umbrela}, line 3  (unverified, precedence 60; outranked by filter)" \
        in outranked

    # placed before pending (and filter), the model's labels settle the escalated pair and
    # overrule the filter (still no hole)
    imported(labeled_lake, umbrela, "umbrela", before="pending", replace=True)
    result = materialize_qrels(labeled_lake)
    metadata = result.asset_materializations_for_node("bridge_qrels")[0].metadata
    assert metadata["precedence"].value == "original > assessor2 > human > debate > umbrela > pending > filter"
    assert "| umbrela | 35 | False | False | 4 / 4 |" in metadata["imported_sources"].value
    assert qrels_of(labeled_lake)[("q2", "d10")] == (1, "umbrela") and metadata["pending"].value == 0
    assert qrels_of(labeled_lake)[("q1", "d12")] == (1, "umbrela")
    assert metadata["holes_found"].value == before["holes_found"] + 1
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()}["bridge_qrels_is_valid"]

    with store.connect(location()) as con:
        lines = _labels(con, DATASET)
    assert lines[0].endswith(f"verified imported judgments): {before['holes_found'] + 1}")
    assert "assessor2 1 relevant / 0 not" in lines[1] and "umbrela (unverified) 3 relevant / 1 not" in lines[1]
    section = qrels_section(read(labeled_lake, "select * from bridge_qrels"), DATASET)
    found = {r[0]: r[1] for r in next(t for t in section.tables if t.title == "Found and pending").rows}
    assert found["holes found (verified)"] == "4"
    assert found["new labels from unverified imported sources (not holes): relevant / not"] == "3 / 1"
    sources = next(t for t in section.tables if t.title.startswith("Imported sources"))
    assert [r[:5] for r in sources.rows] == [["assessor2", "15", "yes", "1", "1"], ["umbrela", "35", "no", "4", "3"]]


# --- corrections ------------------------------------------------------------------------------------

def test_a_correction_changes_original_judgments_and_says_so_everywhere(labeled_lake, tmp_path):
    materialize_qrels(labeled_lake)
    fix = write(tmp_path / "fix.qrels", ["q1 0 d9 1", "q1 0 d1 1", "q2 0 d6 1"])
    report = imported(labeled_lake, fix, "fix", corrects_original=True, verified=True)
    assert report.precedence == 5 and (report.corrections, report.not_original_lines, report.stored) == (1, 1, 2)
    assert report.examples == ['line 3: query "q2", document "d6" is not an original judgment']
    result = materialize_qrels(labeled_lake)
    got = qrels_of(labeled_lake)
    # only the change applies; where the correction agrees, the gold stays 'original'; a
    # correction never adds a pair (q2/d6 stays the debate's)
    assert got[("q1", "d9")] == (1, "fix") and got[("q1", "d1")] == (1, "original")
    assert got[("q2", "d6")] == (0, "debate")
    assert {**got, ("q1", "d9"): EXPECTED[("q1", "d9")]} == EXPECTED
    fixed = row(labeled_lake, "q1", "d9")
    assert (fixed["original_relevance"], fixed["import_file"], fixed["import_line"]) == (0, str(fix), 1)
    metadata = result.asset_materializations_for_node("bridge_qrels")[0].metadata
    assert metadata["corrections"].value == 1 and metadata["holes_found"].value == 3  # a correction is no hole
    assert f"| q1 | d9 | 0 | 1 | fix | {fix}:1 |" in metadata["corrections_of_original"].value
    assert metadata["precedence"].value.startswith("fix > original > human")
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()}["bridge_qrels_is_valid"]

    with store.connect(location()) as con:
        story = audit_pair(con, DATASET, "q1", "d9")
    assert story["final"]["source"] == "fix" and story["final"]["original_relevance"] == 0
    text = format_story(story)
    assert f"the original relevance 0 -> 1 (fix: {fix}, line 1)" in text
    assert f"{'import fix':<22}relevance 1  {fix}, line 1  (correction, precedence 5; the final label)" in text
    with store.connect(location()) as con:
        same = format_story(audit_pair(con, DATASET, "q1", "d1"))
    assert "source original" in same and "(correction, precedence 5; same as the original: no change)" in same

    section = qrels_section(read(labeled_lake, "select * from bridge_qrels"), DATASET)
    table = next(t for t in section.tables if t.title == "Corrections of original judgments")
    assert table.columns == ["query", "doc", "original relevance", "corrected relevance", "source", "file", "line"]
    assert table.rows == [["q1", "d9", "0", "1", "fix", str(fix), "1"]]
    assert any("1 original judgment(s) were changed by correction sources (fix)" in n for n in section.notes)


def test_validity_check_catches_a_silent_overwrite_and_an_unknown_source(labeled_lake):
    materialize_qrels(labeled_lake)
    with store.connect(location()) as con:
        con.execute("update bridge_qrels set relevance = 0, source = 'debate' where query_id = 'q1' and doc_id = 'd1'")
        con.execute("update bridge_qrels set source = 'nobody' where query_id = 'q1' and doc_id = 'd5'")
    result = dg.materialize([qrels_assets.bridge_qrels_is_valid], resources=lake_resources(),
                            selection=dg.AssetSelection.checks(qrels_assets.bridge_qrels_is_valid))
    evaluation = result.get_asset_check_evaluations()[0]
    assert not evaluation.passed
    failed = " ".join(evaluation.metadata)
    assert "original_changed_only_by_correction" in failed and "source_known" in failed


def test_a_lake_written_before_the_new_columns_gets_them(labeled_lake):
    materialize_qrels(labeled_lake)
    with store.connect(location()) as con:
        for column in ("original_relevance", "verified", "precedence", "import_file", "import_line"):
            con.execute(f"alter table bridge_qrels drop column {column}")
        # another dataset's rows, built before
        con.execute("insert into bridge_qrels select * replace ('older' as dataset) from bridge_qrels")
    result = materialize_qrels(labeled_lake)
    frame = read(labeled_lake, "select * from bridge_qrels where dataset = 'demo'")
    pairs = frame.select("query_id", "doc_id", "relevance", "source").rows()
    assert {(q, d): (r, s) for q, d, r, s in pairs} == EXPECTED
    assert frame["verified"].null_count() == 0 and frame["precedence"].null_count() == 0
    older = read(labeled_lake, "select count(*) from bridge_qrels where dataset = 'older' and verified is null")
    assert older.item() == 13
    # the older rows are not held to the new columns' rules
    failures = " ".join(next(e for e in result.get_asset_check_evaluations()
                             if e.check_name == "bridge_qrels_is_valid").metadata)
    assert "original_changed_only_by_correction" not in failures
