"""The labelers with the real offline model (Qwen2.5-Coder-0.5B, in-process llama.cpp) on
pairs of the demo dataset. Few, short calls: this machine has two shared cores."""

from __future__ import annotations

import dagster as dg
import pytest

from bridge_assets.ingest import assets as ingest_assets
from bridge_assets.labeling import assets as labeling_assets
from bridge_assets.labeling import checks as labeling_checks
from bridge_assets.labeling.debate import run_debate
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.labeling.pairs import load_pairs
from bridge_assets.lake import store
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import LLMClient, get_profile, weights
from bridge_assets.llm.ledger import read_calls
from bridge_assets.llm.resource import LLMResource
from fixtures.labeling import metadata, write_run
from fixtures.paths import lake_resources, location

pytest.importorskip("llama_cpp")

PROFILE = "qwen-0.5b"


@pytest.fixture
def provisioned_demo_lake(data_lake):
    weights.provision(get_profile(PROFILE))
    store = DuckDBStore(data_lake=str(data_lake))
    assert dg.materialize([ingest_assets.ingest_dataset], partition_key="demo",
                          resources={"store": store}).success
    return data_lake


# slow: the default run's real debate is tests/test_automation_daemon.py's `bridge run`; the ledger's
# reruns: tests/test_labeling_assets.py::test_pipeline_labels_pairs_then_reruns_from_the_ledger_and_labels_only_new_pairs
@pytest.mark.slow
def test_real_debate_records_its_calls_and_a_rerun_makes_none(provisioned_demo_lake):
    with store.connect(location(provisioned_demo_lake)) as con:
        pairs = load_pairs(con, "demo", "select 'q02' as query_id, 'pydoc-return-1' as doc_id")
    client = LLMClient(PROFILE)
    outcome = run_debate(pairs, debate_agents([PROFILE]), lambda p, r: client.generate(r),
                         rounds=1, reason_words=15)
    turns = outcome.turns
    assert len(turns) == 2 and all(t.error is None for t in turns), [t.error for t in turns]
    assert {t.response for t in turns} <= {"yes", "no"} and all(t.reason for t in turns)
    assert outcome.labels[0].outcome in ("consensus", "escalated")
    ledger = read_calls(location())
    assert sorted(ledger["key"]) == sorted(t.call_key for t in turns)
    assert set(ledger["purpose"]) == {"debate"}

    again = LLMClient(PROFILE)
    rerun = run_debate(pairs, debate_agents([PROFILE]), lambda p, r: again.generate(r),
                       rounds=1, reason_words=15)
    assert again.stats.calls == 0 and again.stats.cache_hits == 2
    assert rerun.labels == outcome.labels and read_calls(location()).height == 2


@pytest.mark.slow
def test_real_pipeline_reruns_for_free_and_pays_only_for_a_new_pair(provisioned_demo_lake):
    write_run(provisioned_demo_lake, "bm25", {"q01": ["pydoc-function-7"], "q02": ["pydoc-return-1"]})
    resources = lake_resources(provisioned_demo_lake, llm=LLMResource(store=DuckDBStore(data_lake=str(provisioned_demo_lake))))
    run_config = {"ops": {"candidate_pool": {"config": {"depth": 1}},
                          "filter_pool": {"config": {"models": [PROFILE]}},
                          "debate": {"config": {"models": [PROFILE], "reason_words": 15}}}}
    checks = [labeling_checks.candidate_pool_is_valid, labeling_checks.debate_labels_are_valid,
              labeling_checks.escalated_pairs_have_full_history]
    assets = [labeling_assets.candidate_pool, labeling_assets.filter_pool, labeling_assets.debate]

    def materialize():
        result = dg.materialize([*assets, *checks], partition_key="demo", resources=resources,
                                run_config=run_config)
        assert all(e.passed for e in result.get_asset_check_evaluations())
        return result

    first = materialize()
    made = read_calls(location(provisioned_demo_lake)).height
    filtered, debated = metadata(first, "filtered_pool"), metadata(first, "debate_labels")
    assert filtered["pairs"] == 2 and filtered["calls"] == 2
    assert made == filtered["calls"] + debated["calls"] > 2
    assert debated["call_failures"] == 0

    second = materialize()
    assert metadata(second, "filtered_pool")["calls"] == 0
    assert metadata(second, "debate_labels")["calls"] == 0
    assert read_calls(location(provisioned_demo_lake)).height == made

    write_run(provisioned_demo_lake, "dense", {"q01": ["pydoc-function-7"], "q03": ["pydoc-with-1"]})
    third = materialize()
    assert metadata(third, "candidate_pool")["new_pairs"] == 1
    new_filter, new_debate = metadata(third, "filtered_pool"), metadata(third, "debate_labels")
    assert new_filter["calls"] == 1 and new_filter["cache_hits"] == 2
    calls = read_calls(location(provisioned_demo_lake))
    assert calls.height == made + new_filter["calls"] + new_debate["calls"]
    new_prompts = calls["request_json"].to_list()[made:]
    assert all("__enter__" in prompt for prompt in new_prompts)  # all about the new pair (q03)
