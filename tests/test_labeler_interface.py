"""One labeler interface (issue 24, item 1): a labeler written here, in a few lines, plugs into
the pipeline's labeling stage and into `bridge label-eval` without touching another module;
the pipeline's default labeler (DREAM) and `bridge label-eval` share its settings and config
hash; a labeler whose labels nobody verified never yields a consensus."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from typer.testing import CliRunner

from bridge_assets.cli.main import app
from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.labeling.labeler import (
    Labeler,
    LabelerError,
    LabelerRun,
    LabelerSettings,
    build_labeler,
    outcome_label,
    pipeline_labeler,
)
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm.profiles import role_profiles
from fixtures.labeling import write_run
from fixtures.paths import lake_resources, location
from fixtures.scripted_llm import ScriptedLLM, ScriptedServer, scripted_reply

PLUGIN = f"{__name__}:AnswerStringLabeler"


class AnswerStringLabeler(Labeler):
    """Relevant when a reference answer occurs in the chunk: no model, a setting of its own."""

    class Settings(LabelerSettings):
        min_chars: int = 1

    def label(self, items, generate, prompts=None):
        return LabelerRun([outcome_label(item.pair, int(any(
            len(a) >= self.settings.min_chars and a.lower() in item.chunk.lower() for a in item.answers)))
            for item in items])


BM25 = {"q01": ["pydoc-lambda-1", "pydoc-function-7", "pydoc-assert-1"],
        "q02": ["pydoc-types-21", "pydoc-return-1", "pydoc-with-1"]}


def label_demo(lake, url: str, labeling: dict) -> dg.ExecuteInProcessResult:
    assert dg.materialize([ingest_assets.ingest_dataset], partition_key="demo",
                          resources=lake_resources(lake)).success
    write_run(lake, "bm25", BM25)
    resources = lake_resources(lake, llm=ScriptedLLM(store=DuckDBStore(data_lake=str(lake)), url=url, debate="agent"))
    run_config = {"ops": {"candidate_pool": {"config": {"depth": 3}},
                          "filter_pool": {"config": {"models": ["f1"]}},
                          "debate": {"config": labeling}}}
    labeling_ops = [labeling_assets.candidate_pool, labeling_assets.filter_pool, labeling_assets.debate]
    result = dg.materialize(labeling_ops, partition_key="demo", resources=resources, run_config=run_config)
    assert result.success
    return result


def debate_metadata(result) -> dict:
    event = next(e for e in result.asset_materializations_for_node("debate")
                 if e.asset_key.to_user_string() == "debate_labels")
    return {key: value.value for key, value in event.metadata.items()}


def test_a_labeler_of_a_test_module_runs_as_the_pipelines_labeling_stage(data_lake):
    with ScriptedServer(scripted_reply) as server:
        result = label_demo(data_lake, server.url, {"labeler": PLUGIN, "min_chars": 2})
        filter_calls = server.hits
    meta = debate_metadata(result)
    assert meta["labeler"] == PLUGIN and "| min_chars | 2 | run config |" in meta["settings"]
    with store.connect_read_only(location(data_lake)) as con:
        labels = con.execute("select doc_id, label, outcome, config_hash from debate_labels").pl()
        purposes = {p for (p,) in con.execute("select distinct purpose from llm_calls").fetchall()}
    assert purposes == {"filter"} and filter_calls > 0  # the labeler itself called no model
    # its labels are its own word, unverified: votes, never a consensus (never a finding)
    assert set(labels["outcome"]) == {"vote"} and labels.height == meta["pairs"] > 0
    assert dict(zip(labels["doc_id"], labels["label"]))["pydoc-function-7"] == 1
    expected = build_labeler({"labeler": PLUGIN, "min_chars": 2}, role_profiles).config_hash(
        scale="binary", items=labels.height, model_id=lambda name: name)
    assert set(labels["config_hash"]) == {expected}


def test_the_same_labeler_runs_in_label_eval_with_its_own_setting(tmp_path, data_lake):
    gold = tmp_path / "gold.jsonl"
    gold.write_text("\n".join(json.dumps(t) for t in [
        {"id": "a", "query": "q", "answers": ["lambda"], "chunk": "a lambda expression", "label": 1},
        {"id": "b", "query": "q", "answers": ["lambda"], "chunk": "a def statement", "label": 0},
        {"id": "c", "query": "q", "answers": ["x"], "chunk": "x marks it", "label": 1}]) + "\n")
    runner = CliRunner()
    out = runner.invoke(app, ["label-eval", "--gold", str(gold), "--method", PLUGIN,
                              "--set", "min_chars=2", "--json", "--items", str(tmp_path / "items.jsonl")])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    # "x" is shorter than min_chars: the setting reached the labeler
    assert (figures["n"], figures["recall_relevant"], figures["recall_irrelevant"]) == (3, 0.5, 1.0)
    # each triplet's outcome, in the gold set's order, for analyses that join on its id
    items = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert [(i["id"], i["gold"], i["label"], i["escalated"]) for i in items] == [
        ("a", 1, 1, False), ("b", 0, 0, False), ("c", 1, 0, False)]
    assert {i["method"] for i in items} == {figures["method"]}
    assert figures["config"]["min_chars"] == 2 and figures["calls"] == 0
    # the relevance definition is the gold set's, not a labeler setting: --set takes it all the same
    defined = runner.invoke(app, ["label-eval", "--gold", str(gold), "--method", PLUGIN, "--set", "min_chars=2",
                                  "--set", "definition=useful", "--json"])
    assert defined.exit_code == 0, defined.output
    under = json.loads(defined.output)
    assert under["config"]["definition"] == "useful" and under["config_hash"] != figures["config_hash"]
    refused = runner.invoke(app, ["label-eval", "--gold", str(gold), "--method", PLUGIN, "--set", "rounds=2"])
    assert refused.exit_code == 2 and "rounds" in refused.output and "Extra inputs" in refused.output


def test_dream_is_the_default_and_its_hash_is_the_debates_hash():
    from bridge_assets.labeling.debate import debate_config_hash
    from bridge_assets.labeling.debate_turns import debate_agents, fewshot_examples
    from bridge_assets.labeling.dream import DreamLabeler
    from bridge_assets.labeling.prompts import Prompts

    labeler = build_labeler({"reason_words": 30}, role_profiles)
    assert isinstance(labeler, DreamLabeler) and labeler.settings.answer_check == "short"
    prompts = Prompts()
    agents = debate_agents(labeler.models, 2, "relevant_first")
    ids = {name: "id-" + name for name in labeler.models}
    assert labeler.config_hash(prompts, items=7, model_id=ids.get) == debate_config_hash(
        agents, rounds=2, temperature=0.0, reason_words=30, prompts=prompts, model_ids=ids,
        checks=labeler.checks(7), examples=fewshot_examples(False))


def test_a_labeler_that_learns_from_known_labels_cannot_run_in_the_pipeline():
    with pytest.raises(LabelerError, match="'lara' learns from known labels"):
        pipeline_labeler(build_labeler({"labeler": "lara"}, role_profiles).settings, role_profiles, "binary")
    with pytest.raises(LabelerError, match="graded"):
        pipeline_labeler(build_labeler({"labeler": "judge"}, role_profiles).settings, role_profiles, "graded")
    with pytest.raises(LabelerError, match="unknown labeler 'nope'"):
        build_labeler({"labeler": "nope"}, role_profiles)


def test_a_single_judges_labels_are_votes_not_consensus():
    from bridge_assets.evaluation.goldsets import GoldTriplet
    from fixtures.oracle_model import OracleModel

    items = [GoldTriplet("a", "q", ("x",), "RELEVANT x", 1).item(), GoldTriplet("b", "q", ("x",), "y", 0).item()]
    run = build_labeler({"labeler": "judge", "models": ["m"]}, role_profiles).label(items, OracleModel())
    assert [(label.label, label.outcome) for label in run.labels] == [(1, "vote"), (0, "vote")]


def test_dream_debates_pair_by_pair_only_when_its_models_run_in_process():
    # llama.cpp keeps one KV sequence in this process: pair-major order reuses a pair's own
    # round-1 prefix; a server (openai) wants each round's requests together
    local = build_labeler({"models": ["qwen-0.5b"]}, role_profiles)
    served = build_labeler({"models": ["openai-local"]}, role_profiles)
    mixed = build_labeler({"models": ["qwen-0.5b", "openai-local"]}, role_profiles)
    assert local.in_process() and not served.in_process() and not mixed.in_process()


def test_dream_debates_round_by_round_when_its_local_model_decodes_in_lanes(tmp_path, monkeypatch):
    # lanes decode several calls at once: a round's requests go together, as to a server
    import yaml

    from bridge_assets.paths import RESOURCES_DIR

    shipped = yaml.safe_load((RESOURCES_DIR / "models.yaml").read_text())["profiles"]["qwen-0.5b"]
    lanes = {**shipped, "engine_args": {"decode_lanes": 4}}
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"profiles": {"qwen-0.5b-lanes": lanes}}))
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(tmp_path))  # the user's models.yaml, merged over ours
    assert not build_labeler({"models": ["qwen-0.5b-lanes"]}, role_profiles).in_process()
    assert build_labeler({"models": ["qwen-0.5b"]}, role_profiles).in_process()
    # the shipped debate model decodes in lanes (docs/labeler-eval.md): the default debate goes
    # round by round
    assert role_profiles("debate") == ["qwen-1.5b"] and not build_labeler({}, role_profiles).in_process()


def test_dream_sends_one_pair_at_a_time_to_an_in_process_model_and_a_round_to_a_server():
    from bridge_assets.labeling.labeler import LabelItem
    from bridge_assets.labeling.pairs import Pair
    from bridge_assets.llm.types import LLMResult

    items = [LabelItem(f"i{n}", Pair(f"q{n}", f"d{n}", "what is x?", ("x",), "x is y."), None) for n in range(2)]
    for model, batches in (("qwen-0.5b", [2, 2]), ("openai-local", [4])):
        sizes = []

        def failing(profile, requests):  # every turn fails: each pair's debate ends after round 1
            sizes.append(len(requests))
            return [LLMResult(key=f"k{len(sizes)}-{n}", error="provoked") for n in range(len(requests))]

        labeler = build_labeler({"models": [model], "adjudicate": False}, role_profiles)
        outcome = labeler.debate(items, failing)
        assert sizes == batches and [label.outcome for label in outcome.labels] == ["failed", "failed"]
