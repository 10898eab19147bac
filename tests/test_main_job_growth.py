"""Growth, as users meet it: a retriever is added to the registry, the registry sensor adds its
partition, the main job runs again, and the debate pays only for the pairs the new system
surfaced, while the metrics and the report now include it. Tiny sizes; the models are a
scripted OpenAI-compatible server (deterministic replies, the production client and ledger), and
the same growth with the real model (qwen-0.5b) is marked slow: the default run's one end-to-end
real-model run is tests/test_automation_daemon.py's `bridge run`."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from bridge_assets.definitions import defs, main_selection
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import get_profile, weights
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.paths import RESOURCES_DIR
from bridge_assets.retrieval.registry import append_system
from bridge_assets.retrieval.sensors import retriever_registry_sensor, sync_partitions
from fixtures.scripted_llm import ScriptedServer, any_stage_reply

REAL_MODEL = "qwen-0.5b"
SCRIPTED = "scripted"


def config(model: str) -> dict:
    """The main job's settings, shrunk: 2 sampled queries, each system's top-2, one debate round."""
    return {
        "candidate_pool": {"depth": 2, "query_limit": 2},
        "filtered_pool": {"models": [model], "max_tokens": 32},
        "debate_labels": {"models": [model], "rounds": 1, "reason_words": 15, "adjudicate": True,
                          "adjudicator_model": model},
        # every system (the demo's own entry names two): explicit run config wins over it
        "rag_answers": {"model": model, "query_limit": 1, "max_tokens": 16, "systems": []},
        "rag_judgments": {"model": model},
        # the student retrains when the verified labels grow: one short epoch (what it learns is
        # tests/test_student.py's)
        "student_annotator": {"epochs": 1, "max_length": 64},
    }


@pytest.fixture(params=[SCRIPTED, pytest.param(REAL_MODEL, marks=pytest.mark.slow)])
def model(request, tmp_path, monkeypatch):
    """The profile the labelling and RAG stages call: the scripted server (a models.yaml in a
    registry folder of the test's own), or the real offline model."""
    if request.param == REAL_MODEL:
        pytest.importorskip("llama_cpp")
        weights.provision(get_profile(REAL_MODEL))
        yield REAL_MODEL
        return
    folder = tmp_path / "models_registry"
    folder.mkdir()
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(folder))
    with ScriptedServer(any_stage_reply) as server:
        (folder / "models.yaml").write_text(yaml.safe_dump({"profiles": {SCRIPTED: {
            "backend": "openai", "model": "scripted-model", "base_urls": [server.url], "timeout_s": 30,
            "retries": 0, "structured_output": "json_object_schema"}}}))
        yield SCRIPTED


@pytest.fixture
def growth_lake(data_lake, tmp_path, monkeypatch):
    """A data lake, a Dagster instance and a registry whose profile holds BM25 only."""
    registry = yaml.safe_load((RESOURCES_DIR / "retrievers.yaml").read_text())
    bm25 = {**registry["systems"]["bm25"], "profiles": ["growth"]}
    registry = {"profile": "growth", "defaults": registry["defaults"], "models": registry["models"],
                "systems": {"bm25": bm25}}
    path = tmp_path / "retrievers.yaml"
    path.write_text(yaml.safe_dump(registry, sort_keys=False))
    monkeypatch.setenv("BRIDGE_RETRIEVERS", str(path))
    monkeypatch.delenv("BRIDGE_RETRIEVER_PROFILE", raising=False)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return data_lake, path


def run_main_job(instance: dg.DagsterInstance, model: str) -> None:
    names = [key.to_user_string() for key in main_selection.resolve(defs.resolve_asset_graph())]
    steps = orchestration.plan(defs, names, "demo", instance)
    orchestration.execute(defs, steps, instance, config(model))


def test_an_added_retriever_is_benchmarked_and_debated_only_where_it_is_new(model, growth_lake):
    lake, registry_file = growth_lake
    instance = orchestration.instance()
    store = DuckDBStore(data_lake=str(lake))
    assert sync_partitions(instance, store).add == ["bm25"]
    run_main_job(instance, model)
    with store.connect() as con:
        pool_before = set(con.execute("select query_id, doc_id from candidate_pool").fetchall())
        calls_before = {key for (key,) in con.execute("select key from llm_calls").fetchall()}
        assert con.execute("select distinct retriever from retrieval_metrics").fetchall() == [("bm25",)]
    assert calls_before, "the first run labels its pool with the model"

    # `bridge retrievers add` writes this entry; the sensor adds its partition and asks for
    # its runs on every dataset.
    append_system("minilm", {"kind": "dense", "model": "all-minilm-l6-v2", "profiles": ["growth"],
                             "parameters": {"index": "flat"}}, registry_file)
    context = dg.build_sensor_context(instance=instance, resources={"store": store})
    result = retriever_registry_sensor(context)
    added = [key for request in result.dynamic_partitions_requests for key in request.partition_keys]
    assert added == ["minilm"]
    assert {r.partition_key.keys_by_dimension["retriever"] for r in result.run_requests} == {"minilm"}
    instance.add_dynamic_partitions("retriever", added)  # what the daemon does with the request

    run_main_job(instance, model)
    with store.connect() as con:
        pool_after = set(con.execute("select query_id, doc_id from candidate_pool").fetchall())
        new_pairs = pool_after - pool_before
        assert new_pairs, "MiniLM's top-2 differs from BM25's on the sampled queries"
        surfaced = set(con.execute("""select query_id, doc_id from candidate_pool
                                      where list_contains(systems, 'minilm')""").fetchall())
        assert new_pairs <= surfaced
        new_calls = con.execute("select key, purpose, request_json from llm_calls").fetchall()
        new_calls = [(key, purpose, request) for key, purpose, request in new_calls if key not in calls_before]
        # every new labelling call is about a pair MiniLM newly brought in
        turns = {key: (q, d) for key, q, d in con.execute(
            "select call_key, query_id, doc_id from debate_turns").fetchall()}
        votes = {key: (q, d) for key, q, d in con.execute(
            "select call_key, query_id, doc_id from filter_votes").fetchall()}
        adjudications = {key: (q, d) for key, q, d in con.execute(
            "select adjudicator_call_key, query_id, doc_id from debate_labels "
            "where adjudicator_call_key is not null").fetchall()}
        labelling = [(key, purpose) for key, purpose, _ in new_calls
                     if purpose in ("filter", "debate", "adjudicator")]
        assert labelling, "the new pairs were filtered and debated"
        for key, purpose in labelling:
            pair = {"filter": votes, "debate": turns, "adjudicator": adjudications}[purpose].get(key)
            assert pair in new_pairs, (purpose, pair)
        # the benchmark now covers the new system, on original and refined qrels
        measured = con.execute("""select distinct retriever, qrels_version from retrieval_metrics
                                  where retriever = 'minilm'""").fetchall()
        assert {version for _, version in measured} >= {"original", "refined"}
        shift = con.execute("select retriever from ranking_shift where retriever = 'minilm' limit 1").fetchall()
        assert shift
    report = (lake / "reports" / "demo" / "report.md").read_text()
    assert "minilm" in report and "bm25" in report
