"""External runs as systems: the run_file kind, `bridge runs import`, the run-files sensor.

The end-to-end proof: a built-in system's stored run, exported as a TREC file and imported as a
run_file system, gives the same ranking, the same metrics and the same candidate pool (demo
always; scifact with bm25 and bm25_rm3 when ../shared/data is there).
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from bridge_assets.cli.main import app
from bridge_assets.cli.retrievers import materialize_run
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.labeling.pooling import candidate_pool
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.metrics import compute_retrieval_metrics
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.retrieval.errors import RegistryError
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.run_files import read_run_file, register_run_file, template_for
from bridge_assets.retrieval.sensors import run_files_sensor
from bridge_assets.retrieval.systems import run_retriever
from fixtures.paths import location, shared_data

CORPUS = pl.DataFrame({"doc_id": ["a", "b", "c", "d"], "title": [""] * 4, "text": ["x"] * 4})
QUERIES = pl.DataFrame({"query_id": ["q1", "q2"], "text": ["x", "y"]})


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A registry folder, a Dagster home and a profile of their own (nothing shipped is written)."""
    folder = tmp_path / "registry"
    folder.mkdir()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(folder))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("BRIDGE_RETRIEVER_PROFILE", "offline_fast")
    return folder


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# ---- reading a run file -------------------------------------------------------------------

def test_unknown_ids_are_skipped_counted_and_named_by_line(tmp_path):
    path = _write(tmp_path / "run.trec", "q1 Q0 a 1 3.0 t\nq1 Q0 zz 2 2.0 t\nq9 Q0 a 1 5.0 t\n"
                                         "q9 Q0 b 2 4.0 t\nq2 Q0 b 1 1.0 t\nq2 Q0 yy 2 0.5 t\n")
    rows, report = read_run_file(path, "tiny", {"q1", "q2"}, {"a", "b"})
    assert sorted(rows.rows()) == [("q1", "a", 3.0), ("q2", "b", 1.0)]
    assert (report.lines, report.kept) == (6, 2)
    assert (report.unknown_query_lines, report.unknown_query_ids) == (2, 1)
    assert (report.unknown_document_lines, report.unknown_document_ids) == (2, 2)
    assert report.examples == [
        "line 2: document \"zz\" is not in the corpus of dataset 'tiny'",
        "line 3: query \"q9\" is not a query of dataset 'tiny'",
        "line 4: query \"q9\" is not a query of dataset 'tiny'",
        "line 6: document \"yy\" is not in the corpus of dataset 'tiny'"]
    assert report.tag == "t" and len(report.sha256) == 64
    with pytest.raises(DatasetError, match=r"run.trec, line 2, field \"docid\": document \"zz\" is not in the corpus"):
        read_run_file(path, "tiny", {"q1", "q2"}, {"a", "b"}, unknown_ids="error")


@pytest.mark.parametrize("content, message", [
    ("q1 Q0 a 1 1.0\n", r"run.trec, line 1: expected 6 columns"),
    ("q1 Q0 a 1 1.0 t\nq1 Q0 b 2 high t\n", r'run.trec, line 2, field "score": score "high" is not a number'),
    ("q1 Q0 a 1 2 t\nq2 Q0 b 1 1 t\nq2 Q0 b 2 1 t\nq1 Q0 a 2 1 t\n",
     r'run.trec, line 3: document "b" retrieved twice for query "q2" \(first on line 2\)'),
    ("q7 Q0 a 1 1 t\nq1 Q0 nope 1 1 t\n", r"run.trec, line 1, field \"qid\": query \"q7\" is not a query of "
                                          r"dataset 'tiny' \(and no line names a known query and document\)"),
])
def test_bad_run_files_fail_naming_file_and_line(tmp_path, content, message):
    path = _write(tmp_path / "run.trec", content)
    with pytest.raises(DatasetError, match=message):
        read_run_file(path, "tiny", {"q1", "q2"}, {"a", "b"})


def _registry_with(tmp_path, monkeypatch, entry: str):
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(tmp_path))
    (tmp_path / "retrievers.yaml").write_text("systems:\n" + entry)
    return load_registry()


def test_run_file_ranks_by_score_as_every_system_and_keeps_k(tmp_path, monkeypatch):
    registry = _registry_with(tmp_path, monkeypatch, "  ext:\n    kind: run_file\n    path: runs/{dataset}/ext.trec.gz\n"
                                                     "    parameters: {k: 2}\n")
    # the rank column is ignored (trec_eval's rule); ties go by doc id as in top_k
    _write(tmp_path / "runs" / "tiny" / "ext.trec.gz",
           "q1 Q0 a 1 1.0 t\nq1 Q0 c 2 2.0 t\nq1 Q0 b 3 2.0 t\nq2 Q0 d 1 0.1 t\n")
    result = run_retriever("tiny", "ext", CORPUS, QUERIES, registry=registry, lake=tmp_path)
    assert result.run.select("query_id", "doc_id", "rank").rows() == [("q1", "b", 1), ("q1", "c", 2), ("q2", "d", 1)]
    assert result.metadata["k"] == 2 and result.metadata["run_files"]["ext"]["kept"] == 4
    assert result.config_hash == registry.config_hash("ext", 2)
    wider = run_retriever("tiny", "ext", CORPUS, QUERIES, k=5, registry=registry, lake=tmp_path)
    assert wider.run.height == 4  # an explicit k (the asset's config) wins over the system's
    missing = run_retriever("other", "ext", CORPUS, QUERIES, registry=registry, lake=tmp_path)
    assert missing.run.is_empty()  # one file per dataset: no file, no run on that dataset
    assert missing.metadata["run_files"]["ext"] == {"path": str(tmp_path / "runs/other/ext.trec.gz"), "missing": True}


@pytest.mark.parametrize("entry, message", [
    ("  ext:\n    kind: run_file\n    path: /runs/ext.trec\n", r"needs \{dataset\}"),
    ("  ext:\n    kind: run_file\n", "kind run_file needs path"),
    ("  ext:\n    kind: bm25\n    path: /runs/{dataset}/x.trec\n", "only a run_file system has a path"),
    ("  ext:\n    kind: run_file\n    path: /r/{dataset}.trec\n    parameters: {unknown_ids: drop}\n", "unknown_ids"),
])
def test_invalid_run_file_entries_name_the_file_and_line(tmp_path, monkeypatch, entry, message):
    with pytest.raises(RegistryError, match=f"retrievers.yaml, line 2: invalid system 'ext': (?s:.*){message}"):
        _registry_with(tmp_path, monkeypatch, entry)


def test_register_keeps_a_system_that_already_reads_the_file_and_refuses_others(user_dir):
    path = user_dir / "runs" / "demo" / "ext.trec"
    assert template_for(path, "demo") == "runs/{dataset}/ext.trec"  # relative to the registry folder
    registry, written = register_run_file("ext", "demo", path)
    assert written and registry.run_file("ext", "scifact") == user_dir / "runs" / "scifact" / "ext.trec"
    assert register_run_file("ext", "scifact", user_dir / "runs" / "scifact" / "ext.trec")[1] is False
    with pytest.raises(RegistryError, match="'bm25' already exists and is a bm25 system"):
        register_run_file("bm25", "demo", user_dir / "runs" / "demo" / "bm25.trec")
    with pytest.raises(RegistryError, match="invalid system name"):
        register_run_file("a b", "demo", user_dir / "runs" / "demo" / "a b.trec")


# ---- bridge runs import, end to end -------------------------------------------------------

def _import(path, dataset: str, name: str, *extra: str):
    result = CliRunner().invoke(app, ["runs", "import", str(path), "--dataset", dataset, "--name", name, *extra])
    return result


def _pool_rows(runs: pl.DataFrame, qrels: pl.DataFrame, dataset: str, depth: int) -> set[tuple]:
    """The candidate pool over `runs` alone: (query, doc, ranks, best rank, systems, judged)."""
    with duckdb.connect() as con:
        con.execute("create table retrieval_run as select * from runs")
        con.execute("create table original_qrels as select * from qrels")
        pool = candidate_pool(con, dataset, depth)
    return set(pool.select("query_id", "doc_id", pl.col("ranks").cast(pl.List(pl.String)).list.join(","), "best_rank", "n_systems",
                           "in_original_qrels").rows())


def _imported_equals_builtin(dataset: str, systems: list[str], tmp_path) -> None:
    for system in systems:
        materialize_run(dataset, system)
    for system in systems:
        exported = tmp_path / f"{dataset}.{system}.trec"
        result = CliRunner().invoke(app, ["retrievers", "export", "-d", dataset, "-r", system, "-o", str(exported)])
        assert result.exit_code == 0, result.output
        result = _import(exported, dataset, f"imported_{system}")
        assert result.exit_code == 0, result.output
        assert f"registered 'imported_{system}' (run_file)" in result.output
    with store.connect(location()) as con:
        runs = con.execute("select * from retrieval_run where dataset = ?", [dataset]).pl()
        qrels = con.execute("select * from original_qrels where dataset = ?", [dataset]).pl()
        metrics = compute_retrieval_metrics(con, run=f"(select * from retrieval_run where dataset = '{dataset}')",
                                            qrels=f"(select * from original_qrels where dataset = '{dataset}')")
    imported = [f"imported_{s}" for s in systems]
    assert sorted(runs["retriever"].unique()) == sorted(systems + imported)

    def of(frame: pl.DataFrame, system: str, columns: list[str]) -> pl.DataFrame:
        return frame.filter(pl.col("retriever") == system).select(columns).sort(columns[:2])

    for system in systems:
        ranking = ["query_id", "doc_id", "rank"]
        assert of(runs, system, ranking).equals(of(runs, f"imported_{system}", ranking))
        scores = of(runs, system, ["query_id", "doc_id", "score"])["score"]
        assert (scores - of(runs, f"imported_{system}", ["query_id", "doc_id", "score"])["score"]).abs().max() < 1e-6
        values = ["query_id", "measure", "value"]
        builtin, copy = of(metrics, system, values), of(metrics, f"imported_{system}", values)
        assert builtin.height > 0 and builtin.select("query_id", "measure").equals(copy.select("query_id", "measure"))
        per_query = pl.col("query_id") != "all"
        assert builtin.filter(per_query).equals(copy.filter(per_query))
        # the means over queries sum in another order: equal up to rounding
        assert (builtin.filter(~per_query)["value"] - copy.filter(~per_query)["value"]).abs().max() < 1e-12
    depth = get_dataset(dataset).pipeline.get("candidate_pool", {}).get("depth", 10)
    builtin = runs.filter(pl.col("retriever").is_in(systems))
    copies = runs.filter(pl.col("retriever").is_in(imported))
    assert _pool_rows(builtin, qrels, dataset, depth) == _pool_rows(copies, qrels, dataset, depth)
    with_both = {row[:2] for row in _pool_rows(runs, qrels, dataset, depth)}
    assert with_both == {row[:2] for row in _pool_rows(builtin, qrels, dataset, depth)}  # the pool is unchanged


def test_an_exported_demo_run_imported_back_has_the_same_ranking_metrics_and_pool(user_dir, data_lake, tmp_path):
    _imported_equals_builtin("demo", ["bm25"], tmp_path)
    entry = yaml.safe_load((user_dir / "retrievers.yaml").read_text())["systems"]["imported_bm25"]
    assert entry == {"kind": "run_file", "description": "External run imported from TREC run files.",
                     "path": "runs/{dataset}/imported_bm25.trec", "profiles": ["offline_fast"]}
    assert (user_dir / "runs" / "demo" / "imported_bm25.trec").exists()


def test_scifact_runs_imported_back_have_the_same_metrics_and_pool(user_dir, data_lake, tmp_path):
    shared_data("scifact")
    _imported_equals_builtin("scifact", ["bm25", "bm25_rm3"], tmp_path)


def test_import_reports_unknown_ids_and_refuses_bad_input_before_writing(user_dir, data_lake, tmp_path):
    run = _write(tmp_path / "mine.trec.gz",
                 "q01 Q0 pydoc-lambda-1 1 2.0 mine\nq01 Q0 no-such-doc 2 1.5 mine\nq99 Q0 pydoc-lambda-1 1 1 mine\n"
                 "q02 Q0 pydoc-types-21 1 0.5 mine\n")
    result = _import(run, "demo", "mine", "--k", "5")
    assert result.exit_code == 0, result.output
    assert "retrieval_run (demo, mine): 2 rows, 2 of 4 lines kept" in result.output
    # a line per step (cli.console: the dataset ingested first), Dagster's log in a file under the lake
    assert re.findall(r"^\[(\d/\d)\] (.+) \.\.\. done in \d+ s$", result.stderr, re.MULTILINE) == [
        ("1/2", "corpus, original_qrels, queries (demo)"), ("2/2", "retrieval_run (demo|mine)")], result.output
    assert " - dagster - " not in result.output
    log_file = Path(re.search(r"^Dagster's log of this command: (\S+) ", result.stderr, re.MULTILINE)[1])
    assert log_file.parent == data_lake / "logs"
    assert re.search(r" - dagster - INFO - __ASSET_JOB - [0-9a-f-]{36} - retrieval_run - mine: 12 queries, top-5",
                     log_file.read_text())
    assert "skipped 1 lines with unknown query ids (1 ids) and 1 with unknown document ids (1 ids)" in result.output
    assert "line 2: document \"no-such-doc\" is not in the corpus of dataset 'demo'" in result.output
    assert "line 3: query \"q99\" is not a query of dataset 'demo'" in result.output
    assert (user_dir / "runs" / "demo" / "mine.trec.gz").read_bytes() == run.read_bytes()
    assert load_registry().system("mine").params().k == 5
    with store.connect(location()) as con:
        stored = con.execute("select query_id, doc_id, rank from retrieval_run where retriever = 'mine' "
                             "order by query_id").fetchall()
    assert stored == [("q01", "pydoc-lambda-1", 1), ("q02", "pydoc-types-21", 1)]

    before = (user_dir / "retrievers.yaml").read_text()
    broken = _write(tmp_path / "broken.trec", "q01 Q0 pydoc-lambda-1 1 2.0 t\nq01 Q0 pydoc-lambda-2 2 x t\n")
    result = _import(broken, "demo", "broken")
    assert result.exit_code == 2 and f"{broken}, line 2, field \"score\"" in result.output
    taken = _import(run, "demo", "bm25")
    assert taken.exit_code == 2 and "'bm25' already exists and is a bm25 system" in taken.output
    again = _import(run, "demo", "mine")
    assert again.exit_code == 2 and "exists (replace it with --replace)" in again.output
    assert (user_dir / "retrievers.yaml").read_text() == before
    assert sorted(p.name for p in (user_dir / "runs" / "demo").iterdir()) == ["mine.trec.gz"]


def _listed(*args: str) -> str:
    result = CliRunner().invoke(app, ["runs", "list", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_runs_list_marks_a_failed_system_with_its_file_line_and_field(user_dir, data_lake, tmp_path):
    """Issue 59: a run file that fails validation marks its system failed in `bridge runs list`,
    with the error naming the file, line and field; once fixed and run, it is stored again."""
    assert "no run files" in _listed("-d", "demo")
    good = "q01 Q0 pydoc-lambda-1 1 2.0 t\nq01 Q0 pydoc-types-21 2 1.0 t\n"
    assert _import(_write(tmp_path / "ext.trec", good), "demo", "ext").exit_code == 0
    path = user_dir / "runs" / "demo" / "ext.trec"
    assert re.search(rf"demo +ext +stored +2  {re.escape(str(path))}", _listed())

    _write(path, good.replace("1.0", "x"))
    with pytest.raises(DatasetError):
        materialize_run("demo", "ext")
    listed = _listed("--dataset", "demo")
    assert re.search(r"demo +ext +failed", listed)
    assert f'{path}, line 2, field "score": score "x" is not a number' in listed
    assert "`bridge run -d demo` brings the system back in" in listed

    _write(path, good)
    materialize_run("demo", "ext")
    assert re.search(r"demo +ext +stored +2 ", _listed()) and "line 2" not in _listed()

    # a file edited in place under the same entry: its run is out of date (`bridge run` runs it again)
    from bridge_assets.definitions import defs
    from bridge_assets.orchestration import runs as orchestration
    from bridge_assets.pipeline.staleness import out_of_date

    key = dg.MultiPartitionKey({"dataset": "demo", "retriever": "ext"})
    graph = defs.resolve_asset_graph()
    assert out_of_date(graph, orchestration.instance(), dg.AssetKey("retrieval_run"), key) is None
    _write(path, good.replace("1.0", "1.5"))
    assert out_of_date(graph, orchestration.instance(), dg.AssetKey("retrieval_run"), key) == "ext's run file changed"


# ---- the run-files sensor -----------------------------------------------------------------

def _evaluate(instance, cursor=None) -> dg.SensorResult:
    result = run_files_sensor(dg.build_sensor_context(instance=instance, cursor=cursor,
                                                     resources={"store": DuckDBStore()}))
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def _requested(result: dg.SensorResult) -> list[tuple[str, str]]:
    return sorted((r.partition_key.keys_by_dimension["dataset"], r.partition_key.keys_by_dimension["retriever"])
                  for r in result.run_requests)


def test_sensor_turns_new_run_files_into_systems_and_requests_their_runs(user_dir):
    assert {"demo"} <= set(dataset_partitions.get_partition_keys())
    line = "q01 Q0 pydoc-lambda-1 1 1.0 t\n"
    with dg.instance_for_test() as instance:
        assert _evaluate(instance).run_requests == []  # an empty folder: nothing to do
        ext = _write(user_dir / "runs" / "demo" / "ext.trec.gz", line)
        _write(user_dir / "runs" / "demo" / "bm25.trec", line)          # a built-in's name: not taken
        _write(user_dir / "runs" / "nowhere" / "other.trec", line)      # no such dataset
        _write(user_dir / "runs" / "demo" / "notes.txt", "not a run")   # not a run file
        first = _evaluate(instance)
        assert _requested(first) == [("demo", "ext")]
        assert "ext" in instance.get_dynamic_partitions("retriever")
        spec = load_registry().system("ext")
        assert (spec.kind, spec.path, spec.profiles) == ("run_file", "runs/{dataset}/ext.trec.gz", ("offline_fast",))
        assert load_registry().system("bm25").kind == "bm25"

        assert _evaluate(instance, first.cursor).run_requests == []     # nothing changed
        _write(ext, line + "q02 Q0 pydoc-types-21 1 0.5 t\n")
        os.utime(ext, ns=(ext.stat().st_atime_ns, ext.stat().st_mtime_ns + 10**9))
        changed = _evaluate(instance, first.cursor)
        assert _requested(changed) == [("demo", "ext")]                # a changed file is run again
        assert changed.run_requests[0].run_key != first.run_requests[0].run_key


def test_sensor_skips_without_a_registry_folder(monkeypatch):
    monkeypatch.delenv("BRIDGE_REGISTRY_DIR", raising=False)
    with dg.instance_for_test() as instance:
        result = run_files_sensor(dg.build_sensor_context(instance=instance, resources={"store": DuckDBStore()}))
    assert isinstance(result, dg.SkipReason) and "BRIDGE_REGISTRY_DIR" in result.skip_message


def test_retrievers_add_registers_files_that_stay_where_they_are(user_dir, tmp_path):
    _write(tmp_path / "elsewhere" / "scifact" / "ext.trec", "q1 Q0 a 1 1 t\n")
    template = str(tmp_path / "elsewhere" / "{dataset}" / "ext.trec")
    result = CliRunner().invoke(app, ["retrievers", "add", "ext", "--kind", "run_file", "--path", template])
    assert result.exit_code == 0, result.output
    assert load_registry().run_file("ext", "scifact") == tmp_path / "elsewhere" / "scifact" / "ext.trec"
    listed = CliRunner().invoke(app, ["retrievers", "list", "--all"])
    assert f"{template}" in listed.output and "run files for scifact" in listed.output
