"""The student re-ranker (`kind: student_rerank`): declared in the retriever registry, evaluated
beside the pooled systems and never pooled; each query ranked by a student that never saw its
labels; reproducible and retrained only when the labels change. Real MiniLM weights, tiny
inputs, one short epoch."""

from __future__ import annotations

import json
import time

import dagster as dg
import polars as pl
import pytest
import yaml

from bridge_assets.cli.summary import run_summary
from bridge_assets.labeling.pairs import Pair
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import budget
from bridge_assets.llm.replay import LedgerReplay
from bridge_assets.llm.resource import LLMResource
from bridge_assets.paths import RESOURCES_DIR
from bridge_assets.retrieval import cache
from bridge_assets.retrieval.errors import RegistryError, RetrievalError
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.systems import RunContext, inputs_fingerprint, retrieve
from bridge_assets.student import assets as student_assets
from bridge_assets.student.annotator import TrainingSet, student_key
from bridge_assets.student.model import StudentSettings, base_model_location, resolve_base_model
from bridge_assets.student.rerank import estimate_utility_calls, student_rerank
from bridge_assets.student.retriever_data import pool_pairs
from fixtures.labeled_lake import DATASET, materialize_qrels, read
from fixtures.paths import location
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, completion

TINY = StudentSettings(epochs=1, max_length=48, batch_size=8, calibration_share=0.0)
FACTS = [("What does len() return?", "len returns the number of items."),
         ("Which keyword defines a function?", "def defines a function."),
         ("What is the boiling point of water?", "Water boils at 100 degrees."),
         ("Who wrote Hamlet?", "Hamlet was written by Shakespeare."),
         ("What is the capital of France?", "Paris is the capital of France."),
         ("How many legs does a spider have?", "A spider has eight legs.")]


def registry_file(tmp_path, systems: dict) -> str:
    """The shipped registry with only `systems`, in a profile of their own."""
    shipped = yaml.safe_load((RESOURCES_DIR / "retrievers.yaml").read_text())
    shipped.update(profile="t", systems={name: {**body, "profiles": ["t"]} for name, body in systems.items()})
    path = tmp_path / "retrievers.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return str(path)


def resources_of(lake) -> dict:
    store = DuckDBStore(data_lake=str(lake))
    return {"store": store, "llm": LLMResource(store=store)}


STUDENT_BM25 = {"kind": "student_rerank", "first_stage": "bm25", "parameters": {"depth": 5, "folds": 2}}
BM25 = {"kind": "bm25", "parameters": {"k1": 0.9, "b": 0.4}}


def test_a_student_rerank_system_is_evaluated_never_pooled(tmp_path):
    registry = load_registry(registry_file(tmp_path, {"bm25": BM25, "student_bm25": STUDENT_BM25}))
    # not a retriever partition of retrieval_run (nothing pools it), but a system of the profile
    assert registry.profile_systems() == ["bm25"] and registry.evaluation_systems() == ["student_bm25"]
    assert registry.config("student_bm25")["parameters"] == {"depth": 5, "folds": 2}
    with pytest.raises(RetrievalError, match="the student stage builds its run"):
        retrieve(RunContext(DATASET, pl.DataFrame(), registry, tmp_path), "student_bm25", pl.DataFrame(), 10)
    # no pooled system may build on it, and it takes no model of its own
    fused = {"kind": "fusion", "inputs": ["bm25", "student_bm25"]}
    with pytest.raises(RegistryError, match="evaluated but never pooled"):
        load_registry(registry_file(tmp_path, {"bm25": BM25, "student_bm25": STUDENT_BM25, "fused": fused}))
    with pytest.raises(RegistryError, match="not a model or llm of its own"):
        load_registry(registry_file(tmp_path, {"bm25": BM25, "student_bm25": {**STUDENT_BM25,
                                                                              "model": "all-minilm-l6-v2"}}))


TRAINED_MINILM = {"kind": "trained_retriever", "model": "all-minilm-l6-v2",
                  "parameters": {"labels": "refined", "folds": 2, "epochs": 1}}


def test_a_trained_retriever_is_evaluated_never_pooled_and_fine_tunes_a_bi_encoder(tmp_path):
    registry = load_registry(registry_file(tmp_path, {"bm25": BM25, "trained": TRAINED_MINILM}))
    assert registry.profile_systems() == ["bm25"] and registry.evaluation_systems() == ["trained"]
    assert registry.config("trained")["parameters"] == {"labels": "refined", "folds": 2, "epochs": 1,
                                                         "negatives": 4, "learning_rate": 2e-5, "seed": 0}
    changed = load_registry(registry_file(tmp_path, {"bm25": BM25, "trained": {
        **TRAINED_MINILM, "parameters": {**TRAINED_MINILM["parameters"], "labels": "original"}}}))
    assert changed.config_hash("trained") != registry.config_hash("trained")  # the sensor reruns it
    with pytest.raises(RetrievalError, match="the student stage builds its run"):
        retrieve(RunContext(DATASET, pl.DataFrame(), registry, tmp_path), "trained", pl.DataFrame(), 10)
    shipped = load_registry().system("trained_minilm")  # the README's: in no profile until one is added
    assert (shipped.kind, shipped.model, shipped.profiles, shipped.params().labels) == \
        ("trained_retriever", "all-minilm-l6-v2", (), "refined")
    for wrong, message in (({"model": None}, "needs model"),
                           ({"first_stage": "bm25"}, "no first_stage or inputs"),
                           ({"llm": {"role": "judge"}}, "an llm exactly when its labels are `utility`"),
                           ({"model": "tinybert-l6-ce"}, "backend cross_encoder"),
                           ({"model": "dpr-multiset"}, "separate query encoder"),
                           ({"parameters": {"labels": "utility"}}, "an llm exactly when")):
        with pytest.raises((RegistryError, ValueError), match=message):
            load_registry(registry_file(tmp_path, {"bm25": BM25, "trained": {**TRAINED_MINILM, **wrong}}))


def _toy() -> tuple[pl.DataFrame, dict, dict, TrainingSet]:
    """Six queries, each with the chunk that answers it (relevant) and another query's (not);
    the candidates: every query against every chunk."""
    queries = {f"q{n}": query for n, (query, _) in enumerate(FACTS)}
    docs = {f"d{n}": chunk for n, (_, chunk) in enumerate(FACTS)}
    rows = [(f"q{n}", f"d{n}", 1) for n in range(6)] + [(f"q{n}", f"d{(n + 3) % 6}", 0) for n in range(6)]
    labels = pl.DataFrame({"query_id": [q for q, _, _ in rows], "doc_id": [d for _, d, _ in rows],
                           "label": [label for _, _, label in rows], "source": ["original"] * len(rows)})
    data = TrainingSet(labels, [Pair(q, d, queries[q], (), docs[d]) for q, d, _ in rows])
    candidates = pl.DataFrame({"query_id": [q for q in queries for _ in docs], "doc_id": [d for _ in queries for d in docs]})
    return candidates, queries, docs, data


def test_each_query_is_ranked_by_a_student_that_never_saw_its_labels(tmp_path, monkeypatch):
    candidates, queries, docs, data = _toy()
    result = student_rerank(candidates, queries, docs, data, TINY, folds=2, k=3, lake_folder=tmp_path, dataset="toy")
    assert result.not_trained is None and len(result.folds) == 2
    run = result.run
    assert run.group_by("query_id").agg(pl.col("rank").sort()).sort("query_id")["rank"].to_list() == [[1, 2, 3]] * 6
    assert run["score"].is_between(0, 1).all()
    base = resolve_base_model(TINY.base_model)
    for fold in result.folds:
        scored = set(run.filter(pl.col("fold") == fold["fold"])["query_id"])
        assert len(scored) == fold["queries"] == 3
        # the fold's student is the one of the labels of every other query, and of those only
        assert fold["student_key"] == student_key(data.without_queries(scored).version, TINY, base.identity)
        assert fold["trained_on"] == 6 and fold["trained_now"]
        assert set(run.filter(pl.col("fold") == fold["fold"])["student_key"]) == {fold["student_key"]}

    # reproducible: the same labels find the same students again, and the same run
    again = student_rerank(candidates, queries, docs, data, TINY, folds=2, k=3, lake_folder=tmp_path, dataset="toy")
    assert not any(fold["trained_now"] for fold in again.folds)
    assert again.run.equals(run)

    # the same encoder elsewhere (another checkout's environment): still the same students
    import dataclasses
    import shutil

    from bridge_assets.retrieval import weights

    moved = shutil.copytree(base.location, tmp_path / "elsewhere" / "encoder")
    resolve = weights.resolve_model
    monkeypatch.setattr(weights, "resolve_model",
                        lambda spec, system=None: dataclasses.replace(resolve(spec, system), location=str(moved)))
    assert resolve_base_model(TINY.base_model).location == str(moved)
    elsewhere = student_rerank(candidates, queries, docs, data, TINY, folds=2, k=3, lake_folder=tmp_path,
                               dataset="toy")
    assert [f["student_key"] for f in elsewhere.folds] == [f["student_key"] for f in result.folds]
    assert not any(fold["trained_now"] for fold in elsewhere.folds)


def test_no_run_when_a_fold_has_nothing_to_learn_from(tmp_path):
    candidates, queries, docs, data = _toy()
    only_relevant = TrainingSet(data.labels.filter(pl.col("label") == 1),
                                [p for p, label in zip(data.pairs, data.labels["label"]) if label == 1])
    result = student_rerank(candidates, queries, docs, only_relevant, TINY, folds=2, k=3, lake_folder=tmp_path,
                            dataset="toy")
    assert result.run.is_empty() and result.not_trained.startswith("fold 1 of 2: it needs verified labels of both")
    few = student_rerank(candidates.filter(pl.col("query_id") == "q0"), queries, docs, data, TINY, folds=2, k=3,
                         lake_folder=tmp_path, dataset="toy")
    assert few.not_trained == "1 queries cannot make 2 folds"


def make_stored_bm25_current(lake) -> None:
    """The fixture's bm25 run, marked as made by the registry's bm25 from this corpus and these
    queries (its text is not searchable by BM25: the re-ranker must take the stored run)."""
    registry = load_registry()
    with store.connect(location(lake)) as con:
        corpus = con.execute("select doc_id, title, text from corpus where dataset = ? order by doc_id", [DATASET]).pl()
        queries = con.execute("select query_id, text from queries where dataset = ? order by query_id", [DATASET]).pl()
        con.execute("alter table retrieval_run add column inputs_hash varchar")
        con.execute("update retrieval_run set config_hash = ?, inputs_hash = ? where retriever = 'bm25'",
                    [registry.config_hash("bm25", registry.system_k("bm25")),
                     inputs_fingerprint(cache.corpus_fingerprint(corpus), queries)])


def test_the_asset_runs_the_registry_systems_and_the_metrics_read_them(labeled_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25, "student_bm25": STUDENT_BM25}))
    materialize_qrels(labeled_lake)
    make_stored_bm25_current(labeled_lake)
    from bridge_assets.analysis import assets as analysis_assets

    resources = resources_of(labeled_lake)
    config = dg.RunConfig(ops={"student_rerank_run": student_assets.StudentConfig(
        epochs=1, max_length=48, batch_size=8, calibration_share=0.0)})

    def materialize(*assets):
        result = dg.materialize(list(assets), partition_key=DATASET, resources=resources, run_config=config)
        assert result.success
        return result

    first = materialize(student_assets.student_rerank_run, analysis_assets.retrieval_metrics)
    metadata = first.asset_materializations_for_node("student_rerank_run")[0].metadata
    assert '"stored_run_reused": true' in metadata["details"].value
    run = read(labeled_lake, "select * from student_rerank_run")
    stored = read(labeled_lake, "select query_id, doc_id from retrieval_run where retriever = 'bm25'")
    assert set(run["retriever"]) == {"student_bm25"} and set(run["first_stage"]) == {"bm25"}
    # bm25's stored top 5, re-ordered
    assert set(zip(run["query_id"], run["doc_id"])) == set(zip(stored["query_id"], stored["doc_id"]))
    assert set(run["query_id"]) == {"q1", "q2", "q3", "q4"} and run["rank"].max() == 5
    assert set(run["fold"]) == {0, 1} and run["student_key"].n_unique() == 2
    pool = read(labeled_lake, "select * from candidate_pool")
    assert "student_bm25" not in str(pool.to_dicts())  # never pooled
    metrics = read(labeled_lake, "select * from retrieval_metrics where query_id = 'all' and measure = 'judged_10'")
    assert {"student_bm25", "bm25"} <= set(metrics["retriever"])

    second = materialize(student_assets.student_rerank_run)  # same labels: the same students, the same run
    details = [second.asset_materializations_for_node("student_rerank_run")[0].metadata["details"].value,
               first.asset_materializations_for_node("student_rerank_run")[0].metadata["details"].value]
    assert '"trained_now": false' in details[0] and '"trained_now": true' in details[1]
    assert read(labeled_lake, "select * from student_rerank_run").sort("query_id", "rank").equals(
        run.sort("query_id", "rank"))
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
    assert "student re-ranker student_bm25 (evaluated, never pooled; students of the other query fold): " \
           "nDCG@10 " in summary and "vs its first stage bm25" in summary


def test_the_asset_runs_a_trained_retriever_and_the_metrics_read_it(labeled_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25, "trained": TRAINED_MINILM}))
    materialize_qrels(labeled_lake)
    from bridge_assets.analysis import assets as analysis_assets

    result = dg.materialize([student_assets.student_rerank_run, analysis_assets.retrieval_metrics],
                            partition_key=DATASET, resources=resources_of(labeled_lake))
    assert result.success
    details = json.loads(result.asset_materializations_for_node("student_rerank_run")[0].metadata["details"].value)
    run = read(labeled_lake, "select * from student_rerank_run")
    queries = read(labeled_lake, "select query_id from queries")["query_id"]
    assert set(run["retriever"]) == {"trained"} and run["first_stage"].null_count() == run.height
    assert set(run["query_id"]) == set(queries) and run.group_by("query_id").len()["len"].max() == 10
    assert [f["weights_hash"] for f in details["trained"]["folds"]] == \
        [run.filter(pl.col("fold") == fold)["student_key"].unique().item() for fold in (0, 1)]
    metrics = read(labeled_lake, "select * from retrieval_metrics where query_id = 'all' and measure = 'ndcg_cut_10'")
    assert {"trained", "bm25"} <= set(metrics["retriever"])
    assert "trained" not in str(read(labeled_lake, "select * from candidate_pool").to_dicts())  # never pooled
    with store.connect(location(labeled_lake)) as con:
        summary = run_summary(con, DATASET, time.time())
    assert "trained retriever trained (evaluated, never pooled; fine-tuned on the labels of the other " \
           "query fold): nDCG@10 " in summary and "student re-ranker trained" not in summary
    # materialized again with the same labels: each fold's model is found in the lake, not retrained
    assert [f["trained_now"] for f in details["trained"]["folds"]] == [True, True]
    assert len(list((labeled_lake / "trained_retrievers" / DATASET).glob("*/meta.json"))) == 2
    again = dg.materialize([student_assets.student_rerank_run], partition_key=DATASET,
                           resources=resources_of(labeled_lake))
    details = json.loads(again.asset_materializations_for_node("student_rerank_run")[0].metadata["details"].value)
    assert [f["trained_now"] for f in details["trained"]["folds"]] == [False, False]
    assert read(labeled_lake, "select * from student_rerank_run").sort("query_id", "rank").equals(
        run.sort("query_id", "rank"))


def test_a_trained_retriever_learns_from_the_candidates_its_llm_selects(labeled_lake, tmp_path, monkeypatch):
    """labels: utility: one UtilSel call per query over its pool candidates (through the run's
    LLM resource and ledger); the selected ones are the positives. Under a call cap that defers
    them there is no run (not one trained on some queries' labels), and once made the calls are
    answered from the ledger."""
    utility = {**TRAINED_MINILM, "llm": {"profile": "qwen-0.5b"},
               "parameters": {**TRAINED_MINILM["parameters"], "labels": "utility"}}
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25, "trained": utility}))
    materialize_qrels(labeled_lake)
    queries = read(labeled_lake, "select distinct query_id from candidate_pool")["query_id"]

    def first_two_useful(index, body):
        assert body["response_format"]["schema"]["properties"]["selected"]["type"] == "array"
        return 200, completion('{"selected": [1, 2]}'), 0

    # the dry run counts them: one call per query of the pool, none in the ledger yet
    with store.connect(location(labeled_lake)) as con:
        pool = pool_pairs(con, DATASET)
    [estimated] = estimate_utility_calls(load_registry(), pool, LedgerReplay(None))
    assert (estimated.stage, estimated.profile, estimated.new, estimated.bound) == \
        ("student_rerank_run", "qwen-0.5b", len(queries), 0) and estimated.prompt_tokens > 0

    with ScriptedServer(first_two_useful) as server:
        store_ = DuckDBStore(data_lake=str(labeled_lake))
        resources = {"store": store_, "llm": ScriptedLLM(store=store_, url=server.url)}

        def materialize():
            result = dg.materialize([student_assets.student_rerank_run], partition_key=DATASET, resources=resources)
            assert result.success
            metadata = result.asset_materializations_for_node("student_rerank_run")[0].metadata
            return json.loads(metadata["details"].value), json.loads(metadata["not_run"].value)

        with budget.enforce(budget.Budget(calls=0)):  # an automation run's cap of 0: deferred
            details, not_run = materialize()
        assert server.hits == 0 and "trained" not in details
        assert not_run["trained"].startswith(f"{len(queries)} of {len(queries)} UtilSel calls deferred")
        assert read(labeled_lake, "select count(*) as n from student_rerank_run")["n"][0] == 0

        details, not_run = materialize()
        assert server.hits == len(queries) and not not_run   # one call per query of the pool
        selected = details["trained"]["utility"]
        assert (selected["profile"], selected["queries"], selected["selected"]) == \
            ("qwen-0.5b", len(queries), 2 * len(queries))
        assert details["trained"]["labels"] == "utility"
        # two folds: each query trains the other fold's model once, with its two selected candidates
        assert sum(f["trained_on_queries"] for f in details["trained"]["folds"]) == len(queries)
        assert sum(f["positives"] for f in details["trained"]["folds"]) == 2 * len(queries)
        run = read(labeled_lake, "select * from student_rerank_run")
        assert set(run["retriever"]) == {"trained"} and run.height > 0

        again, _ = materialize()   # the calls from the ledger, the folds found again
        assert server.hits == len(queries)
        assert [f["trained_now"] for f in again["trained"]["folds"]] == [False, False]


def test_without_evaluation_systems_the_table_is_empty(labeled_lake, tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25}))
    result = dg.materialize([student_assets.student_rerank_run], partition_key=DATASET,
                            resources=resources_of(labeled_lake))
    assert result.success
    assert read(labeled_lake, "select count(*) as n from student_rerank_run")["n"][0] == 0


def test_bridge_run_reruns_it_when_its_registry_entry_changes(tmp_path, monkeypatch):
    from bridge_assets.pipeline.staleness import external_change

    key = dg.AssetKey("student_rerank_run")
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25, "student_bm25": STUDENT_BM25}))
    recorded = {"systems": json.dumps(student_assets.evaluation_system_hashes(), sort_keys=True)}
    assert external_change(key, DATASET, recorded, None) is None
    deeper = {**STUDENT_BM25, "parameters": {"depth": 7, "folds": 2}}
    (tmp_path / "deeper").mkdir()
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path / "deeper", {"bm25": BM25, "student_bm25": deeper}))
    assert external_change(key, DATASET, recorded, None) == "the registry's evaluation-only systems changed"


def test_the_daemon_reruns_it_when_the_registry_s_evaluation_systems_change(tmp_path, monkeypatch):
    """evaluation_systems_sensor: a dataset whose student_rerank_run was built under other
    evaluation-only systems gets a run of it (and what follows); one built under these, or never
    built (the main job builds it), does not."""
    monkeypatch.setenv("BRIDGE_RETRIEVERS", registry_file(tmp_path, {"bm25": BM25, "student_bm25": STUDENT_BM25}))
    current = json.dumps(student_assets.evaluation_system_hashes(), sort_keys=True)
    key = student_assets.student_rerank_run.key

    def evaluate(instance):
        with dg.build_sensor_context(instance=instance) as context:
            result = student_assets.evaluation_systems_sensor(context)
        return [] if isinstance(result, dg.SkipReason) else [r.partition_key for r in result.run_requests]

    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        assert evaluate(instance) == []  # never built
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key, partition=DATASET, metadata={"systems": json.dumps({}, sort_keys=True)}))
        assert evaluate(instance) == [DATASET]  # built before student_bm25 was declared
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key, partition=DATASET, metadata={"systems": current}))
        assert evaluate(instance) == []


def test_training_a_student_closes_a_resident_local_llm(monkeypatch):
    """A student's training peaks at about 2.4 GiB; the in-process LLM an earlier step of the
    same `bridge run` left loaded must not stay beside it (the demo went past 4 GiB)."""
    from bridge_assets.llm import llama_backend as backends
    from bridge_assets.student.model import Example, train_encoder

    class Resident:  # stands in for a loaded llama_cpp.Llama
        closed = False

        def close(self):
            Resident.closed = True

    monkeypatch.setitem(backends._LLAMA_MODELS, ("model.gguf", 512, 2, False), Resident())
    examples = [Example("q0", FACTS[0][0], FACTS[0][1], 1.0), Example("q0", FACTS[0][0], FACTS[1][1], 0.0)]
    train_encoder(examples, TINY, base_model_location(TINY.base_model))
    assert Resident.closed and not backends._LLAMA_MODELS


def test_training_a_retriever_closes_a_resident_local_llm(monkeypatch):
    """The same for a trained retriever: with `labels: utility` its LLM (the 1.5B on the demo)
    has just selected the useful candidates in the same step; beside the training that run
    peaked at 5.1 GiB."""
    from bridge_assets.llm import llama_backend as backends
    from bridge_assets.student.retriever_data import TrainingQuery, TrainSettings
    from bridge_assets.student.retriever_training import base_location, load_encoder, train_retriever

    class Resident:  # stands in for a loaded llama_cpp.Llama
        closed = False

        def close(self):
            Resident.closed = True

    monkeypatch.setitem(backends._LLAMA_MODELS, ("model.gguf", 512, 2, False), Resident())
    model = load_encoder(base_location("all-minilm-l6-v2"), 32)
    query = TrainingQuery("q0", FACTS[0][0], positives=(FACTS[0][1],), negatives=(FACTS[1][1],))
    train_retriever(model, [query], TrainSettings(epochs=1, max_length=32))
    assert Resident.closed and not backends._LLAMA_MODELS
