"""The pipeline's SQL on a DuckLake, and time travel for lineage (issue 15, items 1 and 2).

The labeled lake of fixtures.labeled_lake is written as a DuckDB file, copied, and the copy moved
into a DuckLake with `bridge lake migrate`'s function. The qrels and analysis assets then run on
both: their SQL files and views run unchanged against the attached lake and give the same
tables. On the DuckLake each materialization names the snapshot it wrote (metadata
`lake_snapshot`, shown by `bridge audit`), and `bridge qrels export --as-of RUN_ID|SNAPSHOT`
writes the qrels as that run left them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.cli.audit import audit_command
from bridge_assets.cli.lake import migrate
from bridge_assets.cli.qrels import app as qrels_app
from bridge_assets.lake import ducklake, store
from bridge_assets.lake.snapshots import METADATA_KEY
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.qrels import assets as qrels_assets
from fixtures.labeled_lake import DATASET, write_labeled_lake
from fixtures.paths import lake_resources, location

FAST = [qrels_assets.bridge_qrels, analysis_assets.retrieval_metrics, analysis_assets.ranking_shift]
SLOW = [analysis_assets.significance, analysis_assets.pool_saturation, analysis_assets.partial_annotation_study]
# columns that differ from one run to the next whatever the storage
VOLATILE = {"computed_at", "created_at", "materialized_at", "seconds"}


@pytest.fixture
def two_lakes(tmp_path, monkeypatch):
    """(plain, lake): the labeled lake as a DuckDB file, and the same moved into a DuckLake."""
    plain, lake = tmp_path / "plain", tmp_path / "lake"
    plain.mkdir()
    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(plain))
    monkeypatch.delenv("BRIDGE_VOTES_DB", raising=False)
    write_labeled_lake(plain)
    shutil.copytree(plain, lake)
    counts = migrate(lake / "bridge.duckdb", ducklake.DuckLakeConfig.for_folder(lake),
                     votes_db=lake / "annotations" / "votes.duckdb")
    assert counts["human_labels"] > 0 and counts["llm_calls"] > 0
    yield plain, lake
    ducklake.forget_instances()


def use(monkeypatch, lake: Path, storage: str) -> None:
    monkeypatch.setenv("BRIDGE_STORAGE", storage)
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(lake))


def materialize(lake: Path, assets, instance=None) -> dg.ExecuteInProcessResult:
    result = dg.materialize(assets, partition_key=DATASET, instance=instance,
                            resources=lake_resources(lake))
    assert result.success
    return result


def tables(names) -> dict[str, list[tuple]]:
    out = {}
    with store.connect(location()) as con:
        for name in names:
            columns = [c for c, *_ in con.execute(f"describe {name}").fetchall() if c not in VOLATILE]
            rows = con.execute(f"select {', '.join(columns)} from {name} order by all").fetchall()
            # Sums of doubles may add up in another order on another storage: equal to 1e-12.
            out[name] = [tuple(round(v, 12) if isinstance(v, float) else v for v in row) for row in rows]
    return out


def run_on_both(two_lakes, monkeypatch, assets) -> None:
    plain, lake = two_lakes
    names = [a.key.to_user_string() for a in assets]
    use(monkeypatch, plain, "duckdb")
    plain_result = materialize(plain, assets)
    expected = tables(names)
    use(monkeypatch, lake, "ducklake")
    lake_result = materialize(lake, assets)
    assert tables(names) == expected
    assert not (lake / "bridge.duckdb").exists()
    for name in names:  # each materialization names the snapshot it wrote
        plain_meta = plain_result.asset_materializations_for_node(name)[0].metadata
        lake_meta = lake_result.asset_materializations_for_node(name)[0].metadata
        assert plain_meta[METADATA_KEY].value == "n/a"
        assert isinstance(lake_meta[METADATA_KEY].value, int)


def test_qrels_and_metrics_sql_give_the_same_tables_on_ducklake(two_lakes, monkeypatch):
    run_on_both(two_lakes, monkeypatch, FAST)


@pytest.mark.slow
def test_every_analysis_sql_gives_the_same_tables_on_ducklake(two_lakes, monkeypatch):
    run_on_both(two_lakes, monkeypatch, [*FAST, *SLOW])


def export(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(qrels_app, ["export", "-d", DATASET, *args])
    return result.exit_code, result.output


def test_as_of_export_and_the_audit_name_the_snapshot_of_each_run(two_lakes, monkeypatch, tmp_path):
    _, lake = two_lakes
    use(monkeypatch, lake, "ducklake")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = orchestration.instance()

    first = materialize(lake, [qrels_assets.bridge_qrels], instance)
    first_snapshot = first.asset_materializations_for_node("bridge_qrels")[0].metadata[METADATA_KEY].value
    code, out = export("-f", "trec", "-o", str(tmp_path / "first.qrels"))
    assert code == 0, out

    # people change their minds: q3/d7 becomes irrelevant, and the qrels are rebuilt
    with store.connect(location()) as con:
        labels = con.execute("select * from human_labels where dataset = ?", [DATASET]).pl()
    flipped = labels.with_columns(pl.when((pl.col("query_id") == "q3") & (pl.col("doc_id") == "d7"))
                                  .then(0).otherwise(pl.col("label")).cast(labels["label"].dtype).alias("label"))
    assert not flipped.equals(labels)
    store.write_partitions({"human_labels": flipped}, {"dataset": DATASET}, location())
    second = materialize(lake, [qrels_assets.bridge_qrels], instance)
    assert second.asset_materializations_for_node("bridge_qrels")[0].metadata[METADATA_KEY].value > first_snapshot
    code, out = export("-f", "trec", "-o", str(tmp_path / "now.qrels"))
    assert code == 0, out
    first_text = (tmp_path / "first.qrels").read_text()
    assert (tmp_path / "now.qrels").read_text() != first_text
    assert "q3 0 d7 1" in first_text

    for as_of in (first.run_id, first.run_id[:8], str(first_snapshot)):
        target = tmp_path / f"as-of-{as_of}.qrels"
        code, out = export("-f", "trec", "-o", str(target), "--as-of", as_of)
        assert code == 0, out
        assert target.read_text() == first_text  # the qrels as the first run left them
    code, out = export("-f", "trec", "-o", str(tmp_path / "x.qrels"), "--as-of", "no-such-run")
    assert code == 2 and "no lake snapshot was written by a run 'no-such-run'" in out
    code, out = export("-f", "trec", "-o", str(tmp_path / "x.qrels"), "--as-of", "999999")
    assert code == 2 and "no snapshot 999999" in out

    # bridge audit: the run and the snapshot behind each part of the story
    app = typer.Typer()
    app.command()(audit_command)
    result = CliRunner().invoke(app, ["--dataset", DATASET, "--query", "q3", "--doc", "d7", "--json"])
    assert result.exit_code == 0, result.output
    story = json.loads(result.stdout)
    qrels_run = next(r for r in story["dagster_runs"] if r["asset"] == "bridge_qrels")
    assert qrels_run["run_id"] == second.run_id
    assert qrels_run["snapshot"] == second.asset_materializations_for_node("bridge_qrels")[0] \
        .metadata[METADATA_KEY].value
    text = CliRunner().invoke(app, ["--dataset", DATASET, "--query", "q3", "--doc", "d7"]).output
    assert f"{second.run_id}" in text and f"snapshot {qrels_run['snapshot']}" in text


def test_as_of_needs_the_ducklake(tmp_path, data_lake, monkeypatch):
    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")
    write_labeled_lake(data_lake)
    code, out = export("-f", "trec", "-o", str(tmp_path / "x.qrels"), "--as-of", "3")
    assert code == 2 and "needs the DuckLake storage" in out


def test_as_of_takes_a_run_id_that_starts_with_digits(ducklake_lake):
    """A run id's first eight characters are all digits one time in 43 (97828695-...): such a
    prefix names that run, unless the lake has a snapshot of that number (that one wins)."""
    from bridge_assets.lake.snapshots import AsOfError, resolve_as_of

    def commit(run_id: str, value: int) -> int:
        return store.run_transaction(
            lambda con: con.execute(f"create or replace table t as select {value} as v"), location(),
            message=f"run {run_id}", info={"run_id": run_id})[1]

    digits_run, other_run = "97828695-b2f1-4bfa-8f50-5e20f52541fc", "3e0a1c2d-0000-4000-8000-000000000000"
    first, second = commit(digits_run, 1), commit(other_run, 2)
    with store.connect(location()) as con:
        known = {s["snapshot"] for s in ducklake.snapshots(con)}
    assert first < second and 97828695 not in known
    assert resolve_as_of("97828695", location()) == first          # a run id prefix, all digits
    assert resolve_as_of(digits_run, location()) == first
    assert resolve_as_of("3e0a", location()) == second
    assert resolve_as_of(str(second), location()) == second        # a snapshot number stays a snapshot
    with pytest.raises(AsOfError, match="no snapshot 12345 in the lake .* no run id starting with '12345'"):
        resolve_as_of("12345", location())
