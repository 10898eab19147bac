"""Dataset names: checked in the registry and wherever a name becomes a file path or reaches SQL."""

from __future__ import annotations

import duckdb
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from bridge_assets.cli.qrels import app as qrels_app
from bridge_assets.human.transfer import parse_votes
from bridge_assets.ingest.errors import DatasetError
from bridge_assets.lake import store
from bridge_assets.qrels.exports import ExportFormat, export_qrels
from bridge_assets.registry.datasets import DatasetSpec, load_registry, validate_dataset_name
from bridge_assets.reports.build import build_report
from fixtures.paths import location

BAD_NAMES = ["../etc", "a/b", "a b", "x';drop table corpus;--", ".", "..", "", "naïve", "demo\n"]


@pytest.mark.parametrize("name", ["demo", "nq_open_mini", "BEIR-scifact.v2", "a", "..x", "1"])
def test_valid_names_pass_unchanged(name):
    assert validate_dataset_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_names_are_refused_saying_what_is_allowed(name):
    with pytest.raises(DatasetError, match=r"invalid dataset name .*letters, digits, '_', '\.' and '-'"):
        validate_dataset_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_registry_entry_with_an_invalid_name_names_the_file_and_the_entry(tmp_path, name):
    registry = tmp_path / "datasets.yaml"
    registry.write_text(yaml.safe_dump({"datasets": {"ok": {"kind": "beir", "path": "x"},
                                                     name: {"kind": "beir", "path": "x"}}}))
    with pytest.raises(DatasetError) as error:
        load_registry(registry)
    assert str(error.value).startswith(str(registry))
    assert f"invalid entry {name!r}" in str(error.value)
    assert "invalid dataset name" in str(error.value)


def test_spec_refuses_an_invalid_name_built_in_code():
    with pytest.raises(ValidationError, match="invalid dataset name"):
        DatasetSpec(name="../x", kind="beir", path="x")


def test_export_refuses_an_invalid_name_before_writing(tmp_path):
    with duckdb.connect() as con, pytest.raises(DatasetError, match="invalid dataset name '../x'"):
        export_qrels(con, "../x", ExportFormat.trec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_command_reports_an_invalid_name(data_lake, tmp_path):
    with store.connect(location(data_lake)):
        pass  # an empty store: the command gets as far as the name
    result = CliRunner().invoke(qrels_app, ["export", "-d", "../x", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "invalid dataset name '../x'" in result.output
    assert not (tmp_path / "out").exists()


def test_report_refuses_an_invalid_name_before_writing(tmp_path):
    with duckdb.connect() as con, pytest.raises(DatasetError, match="invalid dataset name"):
        build_report(con, "../x", tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_imported_votes_with_an_invalid_dataset_name_are_named():
    records, errors = parse_votes(
        b"dataset,query_id,doc_id,annotator_id,label\ndemo,q1,d1,ann,1\n../x,q1,d1,ann,1\n",
        "votes.csv")
    assert len(records) == 1
    assert len(errors) == 1 and errors[0].startswith("votes.csv, line 3: dataset:")
    assert "invalid dataset name '../x'" in errors[0]
