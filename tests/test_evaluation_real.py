"""`bridge label-eval` with the real offline model (Qwen2.5-Coder-0.5B, in-process llama.cpp)
on a tiny subset of the shipped gold set. Few, short calls: this machine has two shared cores."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.label_eval import label_eval_command
from bridge_assets.llm import get_profile, weights
from bridge_assets.llm.ledger import read_calls
from fixtures.paths import PROJECT_ROOT, location

pytest.importorskip("llama_cpp")

GOLD = PROJECT_ROOT / "resources" / "goldsets" / "nq_scifact_mini" / "goldset.jsonl"


@pytest.fixture
def provisioned_lake(data_lake):
    weights.provision(get_profile("qwen-0.5b"))
    return data_lake


def app() -> BridgeTyper:
    """The command as `bridge label-eval` runs it (its errors through the one handler)."""
    typer_app = BridgeTyper()
    typer_app.command()(label_eval_command)
    return typer_app


def label_eval(*args: str) -> dict:
    outcome = CliRunner().invoke(app(), ["--gold", str(GOLD), "--profile", "qwen-0.5b", "--threads", "1",
                                         "--json", *args])
    assert outcome.exit_code == 0, outcome.output
    return json.loads(outcome.output)


# slow: lara in label-eval is tests/test_evaluation_methods.py::test_lara_escalates_at_the_ratio_and_reports_the_raw_scores_calibration,
# the real model's log-probabilities tests/test_llm_real.py (P(yes), greedy top-k)
@pytest.mark.slow
def test_label_eval_lara_with_the_real_model_and_again_from_the_cache(provisioned_lake):
    first = label_eval("--method", "lara", "--limit", "4", "--set", "escalation_ratio=0.25")
    assert (first["n"], first["calls"], first["failures"]) == (4, 4, 0)
    assert first["escalation_ratio"] == 0.25 and first["new_calls"] == 4
    assert first["tokens_in"] > 4 * 300 and first["model_seconds"] > 0
    for key in ("bacc", "recall_relevant", "recall_irrelevant"):
        assert first[key] is None or 0.0 <= first[key] <= 1.0
    assert 0.0 <= first["ece"] <= 1.0 and 0.0 <= first["brier"] <= 1.0
    calls = read_calls(location(provisioned_lake))
    assert calls.height == 4 and set(calls["purpose"]) == {"relevance_score"}
    assert calls["logprobs_json"].is_not_null().all()

    again = label_eval("--method", "lara", "--limit", "4", "--set", "escalation_ratio=0.25")
    assert again["new_calls"] == 0
    same = {k: v for k, v in first.items() if k not in ("new_calls", "wall_seconds")}
    assert {k: v for k, v in again.items() if k not in ("new_calls", "wall_seconds")} == same


@pytest.mark.slow
def test_label_eval_judge_and_dream_with_the_real_model(provisioned_lake):
    judge = label_eval("--method", "judge", "--limit", "2", "--set", "reason_words=10")
    assert judge["n"] == 2 and judge["calls"] == 2 and judge["escalation_ratio"] <= 0.5
    dream = label_eval("--method", "dream", "--limit", "2", "--set", "rounds=1", "--set", "reason_words=10")
    assert dream["calls"] == 4 and len(dream["stability"]) == 1
    assert dream["stability"][0]["debating"] == 2
    # the pipeline's order: the filter first, the debate on what it keeps
    piped = label_eval("--method", "dream", "--limit", "2", "--set", "rounds=1", "--set", "reason_words=10",
                       "--prefilter", "qwen-0.5b")
    assert piped["models"] == "qwen-0.5b,prefilter:qwen-0.5b"
    kept = piped["stability"][0]["debating"]
    assert piped["calls"] == 2 + 2 * kept and piped["new_calls"] == 2  # the debate turns are cached


def test_label_eval_rejects_an_unknown_method():
    outcome = CliRunner().invoke(app(), ["--gold", str(GOLD), "--method", "vote"])
    assert outcome.exit_code == 2 and "unknown labeler 'vote'" in outcome.output
