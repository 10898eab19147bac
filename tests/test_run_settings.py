"""run_settings: an asset's settings are its defaults < the dataset's `pipeline:` entry <
explicit run config, whoever launched the run; and the dataset's automation cap."""

from __future__ import annotations

import pytest

from bridge_assets.errors import DatasetError
from bridge_assets.labeling.assets import CandidatePoolConfig, FilterConfig, LabelingConfig
from bridge_assets.pipeline import asset_config


def test_explicit_run_config_beats_the_dataset_entry_which_beats_the_defaults():
    pipeline = {"candidate_pool": {"depth": 1, "query_limit": 5}}
    resolved = asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {"query_limit": 2},
                                    pipeline=pipeline)
    assert (resolved.config.depth, resolved.config.query_limit) == (1, 2)
    assert resolved.sources == {"depth": "dataset", "query_limit": "run config"}
    plain = asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {}, pipeline={})
    assert (plain.config.depth, plain.sources["depth"]) == (10, "default")
    # the table the UI shows names each setting's source; the hash follows the values only
    assert "| depth | 1 | dataset |" in resolved.table()
    same = asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {"depth": 1, "query_limit": 2},
                                pipeline={})
    assert same.hash == resolved.hash and plain.hash != resolved.hash


def test_a_multi_asset_takes_the_entries_of_each_of_its_assets():
    pipeline = {"debate_labels": {"rounds": 1}, "debate_turns": {"reason_words": 30}}
    resolved = asset_config.resolve(LabelingConfig, "d", ["debate_labels", "debate_turns"], {},
                                    pipeline=pipeline)
    assert (resolved.config.rounds, resolved.config.reason_words) == (1, 30)


def test_the_labeling_stage_takes_its_labelers_settings_flat_and_validated_by_the_labeler():
    pipeline = {"debate_labels": {"labeler": "judge", "reason_words": 20}}
    resolved = asset_config.resolve(LabelingConfig, "d", ["debate_labels", "debate_turns"],
                                    {"temperature": 0.5}, pipeline=pipeline)
    assert type(resolved.config).__name__ == "JudgeSettings"
    assert (resolved.config.reason_words, resolved.config.temperature) == (20, 0.5)
    assert resolved.sources["labeler"] == "dataset" and resolved.sources["temperature"] == "run config"
    assert resolved.sources["fewshot"] == "default"
    # a DREAM setting the judge does not have is refused, naming the dataset and the field
    with pytest.raises(DatasetError, match=r"dataset 'd'.*labeler 'judge'.*rounds"):
        asset_config.resolve(LabelingConfig, "d", ["debate_labels"], {},
                             pipeline={"debate_labels": {"labeler": "judge", "rounds": 3}})
    # a run naming another labeler than the dataset's sets the dataset's (DREAM) settings aside
    other = asset_config.resolve(LabelingConfig, "d", ["debate_labels"], {"labeler": "judge"},
                                 pipeline={"debate_labels": {"reason_words": 30, "rounds": 3}})
    assert other.config.reason_words == 40 and other.sources["reason_words"] == "default"
    with pytest.raises(DatasetError, match=r"unknown labeler 'nope'"):
        asset_config.resolve(LabelingConfig, "d", ["debate_labels"], {},
                             pipeline={"debate_labels": {"labeler": "nope"}})


def test_a_setting_the_asset_does_not_have_names_the_dataset_and_the_field():
    with pytest.raises(DatasetError, match=r"dataset 'd'.*candidate_pool.*deepth"):
        asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {},
                             pipeline={"candidate_pool": {"deepth": 1}})
    with pytest.raises(DatasetError, match="depth"):
        asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {},
                             pipeline={"candidate_pool": {"depth": 0}})


def test_the_llm_stages_settings_hash_follows_the_prompts_and_profiles(tmp_path, monkeypatch):
    import bridge_assets.paths as prompts  # where the prompt files are (asset_config reads it)

    llm = frozenset({asset_config.LLM_FILES})
    before = asset_config.resolve(FilterConfig, "d", ["filtered_pool", "filter_votes"], {}, pipeline={}, reads=llm)
    pool = asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {}, pipeline={})
    changed = tmp_path / "prompts"
    changed.mkdir()
    for path in prompts.PROMPTS_DIR.glob("*"):
        (changed / path.name).write_bytes(path.read_bytes())
    (changed / "filter.j2").write_text((changed / "filter.j2").read_text() + "\n{# edited #}\n")
    monkeypatch.setattr(prompts, "PROMPTS_DIR", changed)
    after = asset_config.resolve(FilterConfig, "d", ["filtered_pool", "filter_votes"], {}, pipeline={}, reads=llm)
    assert after.hash != before.hash
    assert asset_config.resolve(CandidatePoolConfig, "d", ["candidate_pool"], {}, pipeline={}).hash == pool.hash


def test_the_demo_entry_resolves_for_every_asset_it_names():
    from bridge_assets.definitions import defs
    from bridge_assets.pipeline.staleness import config_class_of

    graph = defs.resolve_asset_graph()
    pipeline = asset_config.dataset_pipeline("demo")
    for name in pipeline:
        key = next(k for k in graph.get_all_asset_keys() if k.to_user_string() == name)
        assets_def = graph.get(key).assets_def
        config_class = config_class_of(assets_def)
        assert config_class is not None, name
        resolved = asset_config.resolve(config_class, "demo", [k.to_user_string() for k in assets_def.keys],
                                        reads=asset_config.declared_reads(assets_def))
        assert set(pipeline[name]) <= {n for n, s in resolved.sources.items() if s == "dataset"}


def test_the_automation_cap_is_a_dataset_setting_and_defaults_to_no_calls():
    from bridge_assets.registry.datasets import DatasetSpec

    assert DatasetSpec(name="x", kind="beir", path="p").automation.llm_calls_per_run == 0
    assert DatasetSpec(name="x", kind="beir", path="p",
                       automation={"llm_calls_per_run": 50}).automation.llm_calls_per_run == 50
    with pytest.raises(ValueError):
        DatasetSpec(name="x", kind="beir", path="p", automation={"llm_calls": 50})


def test_the_assets_declare_what_they_read_beyond_their_settings():
    """The LLM stages declare the profiles and prompts and what relevant means; the report the
    known holes; the rest nothing (issue 58: learned from the assets, not a list of names)."""
    from bridge_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    reads = {key.to_user_string(): asset_config.declared_reads(graph.get(key).assets_def)
             for key in graph.get_all_asset_keys() if graph.get(key).is_materializable}
    llm, relevance = asset_config.LLM_FILES, asset_config.RELEVANCE
    assert {name: sorted(r) for name, r in reads.items() if r} == {
        "filtered_pool": [llm, relevance], "filter_votes": [llm, relevance], "debate_labels": [llm, relevance],
        "debate_turns": [llm, relevance], "review_sample": [llm, relevance],
        "rag_answers": [llm], "rag_judgments": [llm], "report": [asset_config.KNOWN_HOLES]}
