"""`bridge eval` and the metrics against trec_eval's own test suite (expected outputs out.test*),
plus the TREC readers and the measure names."""

from __future__ import annotations

import gzip

import pytest
import pytrec_eval
import typer
from typer.testing import CliRunner

from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.eval import eval_command
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.metrics import (
    FAMILIES,
    MeasureError,
    evaluate_trec_files,
    read_trec_run,
    resolve_measures,
    trec_eval_lines,
)
from bridge_assets.metrics.judged_rows import DEFINITIONS
from bridge_assets.metrics.measure_names import _split_spec
from fixtures.paths import shared_data

# trec_eval's test commands (EXPECTED_COMMANDS.txt) whose files we have: expected output ->
# (qrels, run, options). out.test.meas_params has no command listed; its values are those of
# qrels.test/results.test with -q (its 'all' lines agree with out.test.a).
CASES = {
    "out.test": ("qrels.test", "results.test", {}),
    "out.test.a": ("qrels.test", "results.test", {}),
    "out.test.aq": ("qrels.test", "results.test", {"per_query": True}),
    "out.test.aqc": ("qrels.test", "results.trunc", {"per_query": True, "complete": True}),
    "out.test.aqcM": ("qrels.test", "results.trunc",
                      {"per_query": True, "complete": True, "max_docs": 100}),
    "out.test.aql": ("qrels.rel_level", "results.test", {"per_query": True, "relevance_level": 2}),
    "out.test.meas_params": ("qrels.test", "results.test", {"per_query": True}),
}


def offered(name: str) -> bool:
    try:
        _split_spec(name)
    except MeasureError:
        return False
    return True


def expected_lines(output: str) -> list[str]:
    """trec_eval's lines for the measures we offer, in its order (measure names as printed)."""
    lines = shared_data(f"trec_eval_tests/{output}").read_text().splitlines()
    return [line for line in lines if offered(line.split("\t")[0].strip())]


@pytest.mark.parametrize("output", sorted(CASES))
def test_equal_to_trec_eval_expected_output(output):
    qrels, run, options = CASES[output]
    expected = expected_lines(output)
    names = list(dict.fromkeys(line.split("\t")[0].strip() for line in expected))
    selection = resolve_measures(names)
    folder = shared_data("trec_eval_tests")
    frame, run_id = evaluate_trec_files(folder / qrels, folder / run, selection, **options)
    got = trec_eval_lines(frame, selection, run_id, per_query=options.get("per_query", False))
    assert got == expected  # byte for byte: names padded to 22, '%6.4f', counts as integers
    assert len(expected) >= 30


def test_every_trec_eval_measure_we_offer_is_checked_against_its_expected_output():
    """Each trec_eval family we offer occurs in some out.test* file (so is tested above)."""
    printed = {line.split("\t")[0].strip() for output in CASES for line in expected_lines(output)}
    families = {_split_spec(name)[0].name for name in printed}
    ours_only = {"recip_rank_cut", "judged", "hole"}
    assert families == set(FAMILIES) - ours_only


def test_default_report_is_trec_eval_default_byte_for_byte():
    folder = shared_data("trec_eval_tests")
    selection = resolve_measures(["official"])
    frame, run_id = evaluate_trec_files(folder / "qrels.test", folder / "results.test", selection)
    report = "\n".join(trec_eval_lines(frame, selection, run_id)) + "\n"
    assert report == (folder / "out.test").read_text()


def cli() -> typer.Typer:
    app = BridgeTyper()  # as `bridge eval`: its errors stop through the one handler
    app.command()(eval_command)
    return app


def test_cli_prints_trec_eval_lines():
    folder = shared_data("trec_eval_tests")
    result = CliRunner().invoke(cli(), ["--qrels", str(folder / "qrels.test"),
                                        "--run", str(folder / "results.test")])
    assert result.exit_code == 0, result.output
    assert result.output == (folder / "out.test").read_text()

    options = ["-q", "-c", "-M100", "-m", "map", "-m", "P.5,10", "-m", "ndcg_cut_10",
               "-m", "num_rel_ret", "-m", "recip_rank"]
    result = CliRunner().invoke(cli(), ["--qrels", str(folder / "qrels.test"),
                                        "--run", str(folder / "results.trunc"), *options])
    assert result.exit_code == 0, result.output
    wanted = {"map", "P_5", "P_10", "ndcg_cut_10", "num_rel_ret", "recip_rank"}
    expected = [line for line in (folder / "out.test.aqcM").read_text().splitlines()
                if line.split("\t")[0].strip() in wanted]
    assert result.output.splitlines() == expected


def test_cli_rejects_unknown_measure_and_bad_files(tmp_path):
    folder = shared_data("trec_eval_tests")
    base = ["--qrels", str(folder / "qrels.test"), "--run", str(folder / "results.test")]
    result = CliRunner().invoke(cli(), [*base, "-m", "utility"])
    assert result.exit_code == 2
    assert "unknown measure 'utility'" in result.output

    result = CliRunner().invoke(cli(), [*base, "-m", "hole_10"])
    assert result.exit_code == 2
    assert "original qrels" in result.output

    run = tmp_path / "run.txt"
    run.write_text("301 Q0 FR940202-2-00150 1 2.5 x\n301 Q0 FR940202-2-00150 2 2.4 x\n")
    result = CliRunner().invoke(cli(), ["--qrels", str(folder / "qrels.test"), "--run", str(run)])
    assert result.exit_code == 2
    assert "line 2" in result.output and "twice" in result.output

    run.write_text("999 Q0 D1 1 2.5 x\n")
    result = CliRunner().invoke(cli(), ["--qrels", str(folder / "qrels.test"), "--run", str(run)])
    assert result.exit_code == 2
    assert "no query has both results" in result.output


def test_cli_hole_and_judged_with_original_qrels(tmp_path):
    original = tmp_path / "original.qrels"
    original.write_text("q1 0 d1 1\nq1 0 d2 0\n")
    refined = tmp_path / "refined.qrels"
    refined.write_text("q1 0 d1 1\nq1 0 d2 0\nq1 0 d3 1\n")
    run = tmp_path / "run.txt"
    run.write_text("q1 Q0 d3 1 0.9 sys\nq1 Q0 d1 2 0.8 sys\nq1 Q0 d4 3 0.7 sys\n")
    result = CliRunner().invoke(cli(), ["--qrels", str(refined), "--run", str(run),
                                        "--original-qrels", str(original),
                                        "-m", "hole_2", "-m", "judged.2,4", "-m", "runid"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "runid                 \tall\tsys",
        "judged_2              \tall\t1.0000",   # d3, d1 judged in the refined qrels
        "judged_4              \tall\t0.5000",   # d4 unjudged, 4th slot empty: 2/4
        "hole_2                \tall\t0.5000",   # d3: relevant now, not judged originally
    ]


@pytest.mark.parametrize("lines", [(0, 1), (1, 0)])
def test_scores_equal_as_c_floats_tie_as_in_trec_eval(tmp_path, lines):
    """trec_eval keeps a score as a C float: these two doubles (s19/q582 of
    `bench_metrics.py --queries 1000`) are one float, so the tie goes to the doc id, descending:
    b first. Read as doubles, a came first (ndcg_cut_10 0.6309 where trec_eval prints 1). In
    either stored order; a score past float's range is refused, as an infinite one is."""
    scores = {"a": 1.3981799888155353, "b": 1.3981799678568678}
    run = tmp_path / "run.txt"
    rows = [f"q1 Q0 {doc} {rank} {score!r} t\n" for rank, (doc, score) in enumerate(scores.items(), 1)]
    run.write_text("".join(rows[i] for i in lines))
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 b 1\n")
    names = ["ndcg_cut_10", "recip_rank", "P_1"]
    frame, _ = evaluate_trec_files(qrels, run, resolve_measures(names), per_query=True)
    got = {m: v for q, m, v in frame.select("query_id", "measure", "value").iter_rows() if q == "q1"}
    reference = pytrec_eval.RelevanceEvaluator({"q1": {"b": 1}}, {"ndcg_cut.10", "recip_rank", "P.1"})
    expected = reference.evaluate({"q1": scores})["q1"]
    assert expected == {"ndcg_cut_10": 1.0, "recip_rank": 1.0, "P_1": 1.0}
    assert got == pytest.approx(expected, abs=1e-9)

    run.write_text("q1 Q0 a 1 1e39 t\n")  # a finite double, an infinite float
    with pytest.raises(DatasetError, match="no finite score"):
        evaluate_trec_files(qrels, run, resolve_measures(names))


def test_read_trec_run_as_trec_eval(tmp_path):
    path = tmp_path / "run.txt"
    path.write_text("# a comment\n\nq1 Q0 d1 7 1.5 first extra junk\n  q1\tQ0 d2 3 -2e-1 last\n")
    run = read_trec_run(path)
    assert run.frame.rows() == [("q1", "d1", 1.5), ("q1", "d2", -0.2)]
    assert run.run_id == "last"  # trec_eval keeps the tag of the last line


@pytest.mark.parametrize(("content", "message"), [
    ("q1 Q0 d1 1 1.5\n", "line 1: expected 6 columns"),
    ("q1 Q0 d1 1 high tag\n", 'line 1, field "score": score "high" is not a number'),
    ("q1 Q0 d1 1 nan tag\n", "not finite"),
    ("q1 Q0 d1 1 1 t\nq2 Q0 d1 1 1 t\nq1 Q0 d1 2 0.5 t\n", "line 3: document \"d1\" retrieved twice"),
    ("# only a comment\n", "no results"),
])
def test_read_trec_run_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "run.txt"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(")):
        read_trec_run(path)


def test_measure_names():
    selection = resolve_measures(["ndcg_cut_10", "P", "map", "P.5,7", "iprec_at_recall_0.25"])
    assert selection.names == ("map", "iprec_at_recall_0.25", "P_5", "P_7", "P_10", "P_15", "P_20",
                               "P_30", "P_100", "P_200", "P_500", "P_1000", "ndcg_cut_10")
    assert selection.cutoffs == (5, 7, 10, 15, 20, 30, 100, 200, 500, 1000)
    assert selection.levels == (0.25,)
    # the pipeline's k replaces the default cutoffs of a bare family
    assert resolve_measures(["P", "success", "recip_rank_cut"], cutoffs=(10,)).names == (
        "P_10", "success_10", "recip_rank_cut_10")
    for bad, message in (("P_0", "positive"), ("P.5,5", "duplicate"), ("P_x", "not an integer"),
                         ("iprec_at_recall_1.5", "between 0 and 1"), ("bpref_5", "unknown"),
                         ("Map", "unknown")):
        with pytest.raises(MeasureError, match=message):
            resolve_measures([bad])


@pytest.mark.parametrize("lines, bad", [(3, 2), (20_000, 15_001)])
def test_a_byte_that_is_not_utf8_is_named_on_its_own_line(tmp_path, lines, bad):
    """Also past the block a text decoder reads at once (the error used to name a line before)."""
    rows = [f"q{n} Q0 d{n} 1 1.0 run\n".encode() for n in range(1, lines + 1)]
    rows[bad - 1] = f"q{bad} Q0 d\xe9{bad} 1 1.0 run\n".encode("latin-1")
    for name, write in (("run.trec", lambda p, b: p.write_bytes(b)),
                        ("run.trec.gz", lambda p, b: p.write_bytes(gzip.compress(b)))):
        path = tmp_path / name
        write(path, b"".join(rows))
        with pytest.raises(DatasetError, match=rf"{name}, line {bad}: not UTF-8 text"):
            read_trec_run(path)


def test_every_measure_family_has_one_definition():
    """ir_measures' way: each family (trec_eval's and BRIDGE's own) is one registered function;
    runid and num_q are summaries only."""
    assert set(FAMILIES) - set(DEFINITIONS) == {"runid", "num_q"}
    assert set(DEFINITIONS) <= set(FAMILIES)
