"""Lineage declared once (issue 15, item 6; issue 24, item 3): every asset of the pipeline
declares the tables it reads in one tuple (READS), and its Dagster deps (the edges of the UI's
lineage graph and of `bridge audit`) equal the tables it really reads.

Each asset is materialized through a store that records the tables the asset asks the
snapshot for, gives it every table of the lake, and records the tables its SQL then reads,
on the snapshot or on a live connection (`connect`, `read`): a table read either way and not
declared fails. An asset may read its own table (its earlier rows) without declaring it: that
is no dep. An asset whose options change what it reads (the pooled or every-query scope, a
dataset with known holes) runs under each. The downstream stages run on the labeled lake of
tests/fixtures/labeled_lake.py; ingest, retrieval and labeling on the demo dataset from its files."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import dagster as dg
import duckdb
import pytest

from bridge_assets.analysis import assets as analysis_assets
from bridge_assets.analysis import impact_asset
from bridge_assets.definitions import defs
from bridge_assets.human import assets as human_assets
from bridge_assets.human.votes_resource import VotesStore
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.qrels import assets as qrels_assets
from bridge_assets.reports import assets as report_assets
from bridge_assets.retrieval import assets as retrieval_assets
from bridge_assets.student import assets as student_assets
from fixtures.labeled_lake import DATASET
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, scripted_reply, scripted_server_reply

GRAPH = defs.resolve_asset_graph()
ASSET_TABLES = {key.to_user_string() for key in GRAPH.get_all_asset_keys()}
# What some assets read besides asset tables: the votes store's human_votes (copied into
# human_labels' snapshot, the run's one copy: bridge_qrels takes the vote ids from human_labels)
# and what `bridge qrels import` stored. Not assets, so never deps.
EXTERNAL = {"human_labels": {"human_votes"},
            "bridge_qrels": {"imported_qrels", "qrels_sources"}}
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
    declared (a missing table would otherwise go unnoticed: the scope falls back). What it
    reads on a live connection is noted too: that bypasses the declaration."""

    def snapshot(self, dataset: str, tables, *, votes=None):
        SEEN["asked"] |= set(tables) | ({"human_votes"} if votes is not None else set())
        with store.connect(self.lake) as con:
            every = [row[0] for row in con.execute(
                "select distinct table_name from information_schema.columns where column_name = 'dataset'"
            ).fetchall()]
        return Recorded(super().snapshot(dataset, every, votes=votes))

    @contextlib.contextmanager
    def connect(self) -> Iterator[Recorded]:
        with super().connect() as con:
            yield Recorded(con)

    def read(self, sql: str, params=None):
        SEEN["read"] |= tables_in(sql)
        return super().read(sql, params)


# asset -> the configurations to run it under (each changes what it may read)
RUNS: dict[str, tuple[dg.AssetsDefinition, list[dict]]] = {
    "human_labels": (human_assets.human_labels, [{"allow_partial": True}]),
    "bridge_qrels": (qrels_assets.bridge_qrels, [{}]),
    # the shipped profile's student_rerank_bm25 (students of one short epoch), before the
    # metrics that read its run
    "student_rerank_run": (student_assets.student_rerank_run,
                           [{"epochs": 1, "max_length": 32, "batch_size": 8, "calibration_share": 0.34,
                             "teacher_weight": 0.5}]),
    "retrieval_metrics": (analysis_assets.retrieval_metrics, [{"scope": "pooled"}, {"scope": "all"}]),
    "ranking_shift": (analysis_assets.ranking_shift, [{}]),
    "significance": (analysis_assets.significance, [{"resamples": 20}]),
    "pending_impact": (impact_asset.pending_impact, [{}]),
    "pool_saturation": (analysis_assets.pool_saturation,
                        [{"orders": 2, "scope": "pooled"}, {"orders": 2, "scope": "all"}]),
    "pool_coverage": (analysis_assets.pool_coverage,
                      [{"orders": 2, "resamples": 5, "scope": scope} for scope in ("pooled", "all")]),
    "partial_annotation_study": (analysis_assets.partial_annotation_study,
                                 [{"samples": 3, "sweep_samples": 2, "scope": scope} for scope in ("pooled", "all")]),
    "rag_answers": (analysis_assets.rag_answers,
                    [{"model": "m", "query_limit": 0, "systems": [], "scope": scope}
                     for scope in ("pooled", "all")]),
    "rag_judgments": (analysis_assets.rag_judgments, [{"model": "m"}]),
    "rag_alignment": (analysis_assets.rag_alignment, [{}]),
    "student_annotator": (student_assets.student_annotator,
                          [{"epochs": 1, "max_length": 32, "batch_size": 8, "calibration_share": 0.34,
                            "teacher_weight": 0.5}]),   # distilling: it reads debate_labels
    "student_scores": (student_assets.student_scores, [{}]),
    "report": (report_assets.report, [{}, KNOWN_HOLES]),
}


# The upstream stages, in dependency order, on the demo dataset: each asset definition (a
# multi-asset writes several tables) by one of its assets, with its configurations.
UPSTREAM: dict[str, tuple[dg.AssetsDefinition, list[dict]]] = {
    "corpus": (ingest_assets.ingest_dataset, [{}]),
    "retrieval_run": (retrieval_assets.retrieval_run, [{}]),
}
# The labeling assets' definitions are looked up by asset: labeling/assets.py is being rewritten.
LABELING: dict[str, list[dict]] = {
    "candidate_pool": [{"depth": 2, "query_limit": 3}],
    "filtered_pool": [{"models": ["f1", "f2"]}],
    "debate_labels": [{"reason_words": 20}],
}
RETRIEVER = "bm25"


def labeling_runs() -> dict[str, tuple[dg.AssetsDefinition, list[dict]]]:
    return {name: (defs.get_assets_def(name), configs) for name, configs in LABELING.items()}


def own_tables(asset: str) -> set[str]:
    """The tables `asset`'s definition writes (every asset of a multi-asset)."""
    return {key.to_user_string() for key in defs.get_assets_def(asset).keys}


def deps_of(asset: str) -> set[str]:
    """The deps of `asset`'s definition: those of each asset it writes, less its own tables."""
    keys = defs.get_assets_def(asset).keys
    return {parent.to_user_string() for key in keys for parent in GRAPH.get(key).parent_keys} - own_tables(asset)


def test_every_asset_is_covered():
    """Every asset of the pipeline's stages (all but the labeler evaluation) is checked below."""
    stages = {"ingest", "retrieval", "labeling", "human", "qrels", "analysis", "student", "reports"}
    runs = {**UPSTREAM, **labeling_runs(), **RUNS}
    assert {key.to_user_string() for key in GRAPH.get_all_asset_keys()
            if GRAPH.get(key).group_name in stages} == {table for name in runs for table in own_tables(name)}


def materialize_recording(runs: dict, resources: dict, partition_key, known_holes=None,
                          **kwargs) -> dict[str, tuple[set, set]]:
    """Materialize each of `runs` in order under each of its configurations (KNOWN_HOLES: after
    calling `known_holes`); per asset, the tables it asked the snapshot for and those it read."""
    found = {}
    for name, (asset, configs) in runs.items():
        SEEN.update(asked=set(), read=set())
        for config in configs:
            if config is KNOWN_HOLES:
                known_holes()
                config = {}
            result = dg.materialize([asset], partition_key=partition_key, resources=resources,
                                    run_config={"ops": {asset.op.name: {"config": config}}}, **kwargs)
            assert result.success, name
        found[name] = (SEEN["asked"], SEEN["read"])
    return found


def assert_declared(found: dict[str, tuple[set, set]]) -> None:
    for name, (asked, read) in found.items():
        external = EXTERNAL.get(name, set())
        assert asked - external == deps_of(name), f"{name}: snapshot of {sorted(asked)}"
        read = read - own_tables(name)
        assert read - external == deps_of(name), f"{name}: read {sorted(read)}, deps {sorted(deps_of(name))}"
        assert read & external == external, name


def with_known_holes(tmp_path, monkeypatch) -> None:
    """The report reads the candidate pool only for a dataset with known holes: give demo some."""
    holes = tmp_path / "holes.jsonl"
    holes.write_text(json.dumps({"query_id": "q1", "doc_ids": ["d5"], "partial": []}) + "\n")
    spec = report_assets.dataset_spec(DATASET).model_copy(update={"known_holes": str(holes)})
    monkeypatch.setattr(report_assets, "dataset_spec", lambda dataset: spec)


def test_the_declared_deps_equal_the_tables_each_asset_reads(labeled_lake, tmp_path, monkeypatch):  # noqa: F811
    with ScriptedServer(scripted_server_reply) as server:
        recording = RecordingStore(data_lake=str(labeled_lake))
        resources = {"store": recording, "votes": VotesStore(store=recording),
                     "llm": ScriptedLLM(store=DuckDBStore(data_lake=str(labeled_lake)), url=server.url)}
        # in dependency order: each reads the last
        found = materialize_recording(RUNS, resources, DATASET,
                                      known_holes=lambda: with_known_holes(tmp_path, monkeypatch))
    assert_declared(found)


def test_ingest_retrieval_and_labeling_read_what_they_declare(data_lake):
    with ScriptedServer(scripted_reply) as server, dg.instance_for_test() as instance:
        resources = {"store": RecordingStore(data_lake=str(data_lake)),
                     "llm": ScriptedLLM(store=DuckDBStore(data_lake=str(data_lake)), url=server.url,
                                            debate="agent")}
        instance.add_dynamic_partitions("retriever", [RETRIEVER])
        found = materialize_recording({"corpus": UPSTREAM["corpus"]}, resources, DATASET, instance=instance)
        found |= materialize_recording({"retrieval_run": UPSTREAM["retrieval_run"]}, resources,
                                       dg.MultiPartitionKey({"dataset": DATASET, "retriever": RETRIEVER}),
                                       instance=instance)
        labeling = materialize_recording(labeling_runs(), resources, DATASET, instance=instance)
    assert_declared(found)
    assert_declared(labeling)


@pytest.mark.parametrize("asset, new", [("retrieval_metrics", "queries"), ("pool_saturation", "queries"),
                                        ("partial_annotation_study", "queries")])
def test_the_edges_the_graph_used_to_miss_are_there(asset, new):
    assert new in deps_of(asset)
