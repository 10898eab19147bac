"""Lineage declared once (issue 15, item 6): every asset built on store snapshots declares the
tables it reads in one tuple, and its Dagster deps (the edges of the UI's lineage graph and of
`bridge audit`) equal the tables it really reads.

Each asset is materialized on the labeled lake of tests/test_qrels_bridge.py through a store
that records the tables the asset asks the snapshot for, gives it every table of the lake, and
records the tables its SQL then reads; an asset whose options change what it reads (the pooled
or every-query scope, a dataset with known holes) runs under each."""

from __future__ import annotations

import json
import re
from typing import Any

import dagster as dg
import duckdb
import pytest

from bridge_assets import store
from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.definitions import defs
from bridge_assets.human import assets as human_assets
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports import assets as report_assets
from bridge_assets.resources import DuckDBStore
from test_analysis_rag import scripted_server_reply
from test_labeling_assets import ScriptedLLM
from test_llm_client import ScriptedServer
from test_qrels_bridge import DATASET, labeled_lake  # noqa: F401  (fixture)

GRAPH = defs.resolve_asset_graph()
ASSET_TABLES = {key.to_user_string() for key in GRAPH.get_all_asset_keys()}
# What some assets read besides asset tables: the votes store's human_votes (copied into the
# snapshot) and what `bridge qrels import` stored. Not assets, so never deps.
EXTERNAL = {"human_labels": {"human_votes"},
            "bridge_qrels": {"human_votes", "imported_qrels", "qrels_sources"}}
KNOWN_TABLES = ASSET_TABLES | {"human_votes", "imported_qrels", "qrels_sources", "annotators",
                               "annotation_assignments", "llm_calls"}
SEEN: dict[str, Any] = {}
KNOWN_HOLES: dict = {}  # the report run on a dataset with known holes (see with_known_holes)


def tables_in(sql: str) -> set[str]:
    try:
        names = duckdb.get_table_names(sql)
    except duckdb.Error:  # a statement it cannot bind alone: the names after FROM / JOIN
        names = set(re.findall(r'(?:from|join)\s+"?(\w+)', sql, re.IGNORECASE))
    return {name.split(".")[-1] for name in names} & KNOWN_TABLES


class Recorded:
    """A snapshot connection that notes the tables every statement names."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self._con = con

    def execute(self, sql: str, *args: Any, **kwargs: Any):
        SEEN["read"] |= tables_in(sql)
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class RecordingStore(DuckDBStore):
    """Notes the tables an asset declares (asks the snapshot for), and hands it a snapshot of
    every table of the lake instead: what it then reads is what it really needs, whatever it
    declared (a missing table would otherwise go unnoticed: the scope falls back)."""

    def snapshot(self, dataset: str, tables, *, votes: bool = False):
        SEEN["asked"] |= set(tables) | ({"human_votes"} if votes else set())
        with store.connect(self.path) as con:
            every = [row[0] for row in con.execute(
                "select distinct table_name from information_schema.columns where column_name = 'dataset'"
            ).fetchall()]
        return Recorded(super().snapshot(dataset, every, votes=votes))


# asset -> the configurations to run it under (each changes what it may read)
RUNS: dict[str, tuple[dg.AssetsDefinition, list[dict]]] = {
    "human_labels": (human_assets.human_labels, [{"allow_partial": True}]),
    "bridge_qrels": (qrels_assets.bridge_qrels, [{}]),
    "retrieval_metrics": (analysis_assets.retrieval_metrics, [{"scope": "pooled"}, {"scope": "all"}]),
    "ranking_shift": (analysis_assets.ranking_shift, [{}]),
    "significance": (analysis_assets.significance, [{"resamples": 20}]),
    "pool_saturation": (analysis_assets.pool_saturation,
                        [{"orders": 2, "scope": "pooled"}, {"orders": 2, "scope": "all"}]),
    "partial_annotation_study": (analysis_assets.partial_annotation_study,
                                 [{"samples": 3, "sweep_samples": 2, "scope": scope} for scope in ("pooled", "all")]),
    "rag_answers": (analysis_assets.rag_answers,
                    [{"model": "m", "query_limit": 0, "systems": [], "scope": scope}
                     for scope in ("pooled", "all")]),
    "rag_judgments": (analysis_assets.rag_judgments, [{"model": "m"}]),
    "rag_alignment": (analysis_assets.rag_alignment, [{}]),
    "report": (report_assets.report, [{}, KNOWN_HOLES]),
}


def deps_of(asset: str) -> set[str]:
    return {key.to_user_string() for key in GRAPH.get(dg.AssetKey(asset)).parent_keys}


def test_every_snapshot_asset_is_covered():
    """Every asset of the analysis, reports, qrels and human stages is checked below."""
    stages = {"analysis", "reports", "qrels", "human"}
    assert {key.to_user_string() for key in GRAPH.get_all_asset_keys()
            if GRAPH.get(key).group_name in stages} == set(RUNS)


def with_known_holes(tmp_path, monkeypatch) -> None:
    """The report reads the candidate pool only for a dataset with known holes: give demo some."""
    holes = tmp_path / "holes.jsonl"
    holes.write_text(json.dumps({"query_id": "q1", "doc_ids": ["d5"], "partial": []}) + "\n")
    spec = report_assets.dataset_spec(DATASET).model_copy(update={"known_holes": str(holes)})
    monkeypatch.setattr(report_assets, "dataset_spec", lambda dataset: spec)


def test_the_declared_deps_equal_the_tables_each_asset_reads(labeled_lake, tmp_path, monkeypatch):  # noqa: F811
    with ScriptedServer(scripted_server_reply) as server:
        resources = {"store": RecordingStore(data_lake=str(labeled_lake)),
                     "llm": ScriptedLLM(data_lake=str(labeled_lake), url=server.url)}
        found: dict[str, tuple[set[str], set[str]]] = {}
        for name, (asset, configs) in RUNS.items():  # in dependency order: each reads the last
            SEEN.update(asked=set(), read=set())
            for config in configs:
                if config is KNOWN_HOLES:
                    with_known_holes(tmp_path, monkeypatch)
                    config = {}
                result = dg.materialize([asset], partition_key=DATASET, resources=resources,
                                        run_config={"ops": {asset.op.name: {"config": config}}})
                assert result.success, name
            found[name] = (SEEN["asked"], SEEN["read"])
    for name, (asked, read) in found.items():
        external = EXTERNAL.get(name, set())
        assert asked - external == deps_of(name), f"{name}: snapshot of {sorted(asked)}"
        assert read - external == deps_of(name), f"{name}: read {sorted(read)}, deps {sorted(deps_of(name))}"
        assert read & external == external, name


@pytest.mark.parametrize("asset, new", [("retrieval_metrics", "queries"), ("pool_saturation", "queries"),
                                        ("partial_annotation_study", "queries")])
def test_the_edges_the_graph_used_to_miss_are_there(asset, new):
    assert new in deps_of(asset)
