"""Cost before you spend, as a user meets it on the demo: `bridge run --dry-run` counts the pool
and the LLM calls each stage will make before any is made, `--budget` stops a run before the
chunk that would pass it, the next run resuming from the ledger, and a run the automation
launches makes at most the dataset's `llm_calls_per_run`, an explicit run labelling what it
deferred.

The model is a scripted OpenAI-compatible server (the production client, ledger and backend
talk to it) whose replies are deterministic, so the debate's rounds are known; the systems are
BM25 and two that call the model too (HyDE, and an LLM re-ranker of BM25's top 3), on a small
pool, from a registry folder of the test's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from typer.testing import CliRunner

from bridge_assets.cli.main import BUDGET_EXIT, app
from bridge_assets.cli.summary import run_summary
from bridge_assets.definitions import automated_selection, defs
from bridge_assets.labeling.debate import FLAG_DEFERRED
from bridge_assets.lake import store
from bridge_assets.llm import budget as llm_budget
from bridge_assets.llm.budget import Budget, BudgetError, BudgetExceeded, prompt_tokens
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.profiles import ModelConfigError, Prices, load_models_config
from bridge_assets.llm.types import LLMRequest
from bridge_assets.orchestration import runs as orchestration
from bridge_assets.orchestration.costs import RunEstimate, StageCalls, estimate_run
from bridge_assets.paths import RESOURCES_DIR
from bridge_assets.pipeline import automation
from fixtures.paths import location
from fixtures.scripted_demo import PIPELINE, scripted_demo_env
from fixtures.scripted_llm import http_profile


@pytest.fixture
def scripted_demo(data_lake, tmp_path, monkeypatch):
    """A temp lake and Dagster home, a registry folder (the demo with a small pool, BM25 and
    HyDE, the fake model with prices) and the scripted server."""
    with scripted_demo_env(tmp_path, monkeypatch) as server:
        yield data_lake, server


def bridge(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output and "Stack Trace" not in result.output, result.output
    return result


def ledger(lake, sql: str = "select purpose, count(*) from llm_calls group by 1") -> dict:
    with store.connect_read_only(location(lake)) as con:
        return dict(con.execute(sql).fetchall())


def stage(estimate: RunEstimate, name: str) -> StageCalls:
    return next(s for s in estimate.stages if s.stage == name)


def test_the_dry_run_counts_the_calls_the_run_makes(scripted_demo):
    lake, server = scripted_demo
    before = bridge("run", "-d", "demo", "--dry-run")
    assert before.exit_code == 0, before.output
    assert "must run first" in before.output and "ingest" in before.output
    to_run = re.search(r"retrieval_run: (.*)", before.output).group(1)
    assert sorted(to_run.split(", ")) == ["bm25", "hyde", "llm_rerank_bm25"]
    assert "hyde calls fake: 1 call(s) per query" in before.output
    assert "llm_rerank_bm25 calls fake: a call per query and re-ranked document (top-3)" in before.output
    assert server.hits == 0 and not (lake / "bridge.duckdb").exists()

    assert bridge("materialize", "-d", "demo", "retrieval_run").exit_code == 0
    retrieval = ledger(lake)
    assert set(retrieval) == {"hyde", "rerank"} and sum(retrieval.values()) == server.hits
    dry = bridge("run", "-d", "demo", "--dry-run", "--budget", "1000")
    assert dry.exit_code == 0, dry.output
    assert "more than the budget: the run stops before the chunk that would pass it" in dry.output
    assert re.search(r"Pool: \d+ pairs over 3 queries from 3 system", dry.output)
    assert "filter" in dry.output and "debate round 1" in dry.output and "USD" in dry.output
    assert server.hits == sum(retrieval.values())  # no model call
    with store.connect_read_only(location(lake)) as con:
        assert not con.execute("select count(*) from information_schema.tables "
                               "where table_name = 'candidate_pool'").fetchone()[0]

    estimate = estimate_run("demo", PIPELINE)
    pairs = estimate.pool.to_label
    assert pairs > 0
    # the retrieval systems' requests are rebuilt exactly: the ledger holds every one
    hyde, rerank = stage(estimate, "retrieval hyde"), stage(estimate, "retrieval llm_rerank_bm25")
    assert (hyde.answered, hyde.new, hyde.bound) == (retrieval["hyde"], 0, 0)
    assert (rerank.answered, rerank.new, rerank.bound) == (retrieval["rerank"], 0, 0)
    filtering = stage(estimate, "filter")
    assert (filtering.answered, filtering.new, filtering.bound) == (0, pairs, 0)
    first = stage(estimate, "debate round 1")
    # its keys are known (pairs x agents), each asked if the filter keeps the pair
    assert (first.answered, first.new, first.bound) == (0, 0, 2 * pairs)
    assert stage(estimate, "debate round 2").bound == stage(estimate, "debate round 3").bound == 2 * pairs
    assert stage(estimate, "adjudicator").bound == pairs
    answers = stage(estimate, "rag_answers")
    assert (answers.new, answers.bound) == (2, 0)  # bm25 on a sample of 2 queries
    assert stage(estimate, "rag_judgments").bound == 2
    assert all(s.prompt_tokens > 0 and s.reply_tokens > 0 for s in estimate.stages if s.to_make)

    run = bridge("run", "-d", "demo")
    assert run.exit_code == 0, run.output
    calls = ledger(lake)
    rounds = ledger(lake, """select t.round, count(distinct c.key) from llm_calls c
                             join debate_turns t on t.call_key = c.key group by 1""")
    assert calls["hyde"] == retrieval["hyde"] and calls["rerank"] == retrieval["rerank"]  # not asked again
    assert calls["filter"] == filtering.new
    assert rounds[1] == first.calls  # the script's filter keeps every pair
    assert set(rounds) == {1, 2, 3}  # the script ends debates in every round
    for later in (2, 3):
        assert rounds[later] <= stage(estimate, f"debate round {later}").bound
    assert 0 < calls["adjudicator"] <= stage(estimate, "adjudicator").bound
    assert calls["rag_answer"] == answers.new
    assert calls.get("rag_judgment", 0) <= stage(estimate, "rag_judgments").bound
    assert server.hits == sum(calls.values())

    # `bridge label-eval --dataset demo` evaluates the labeler the run ran: its settings (the
    # dataset's), its key, its calls, every one answered by the ledger
    evaluated = bridge("label-eval", "--dataset", "demo", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    figures = json.loads(evaluated.output)
    stored = ledger(lake, "select config_hash, count(*) from debate_labels group by 1")
    assert list(stored) == [figures["config_hash"]]
    assert figures["new_calls"] == 0 and figures["calls"] > 0 and figures["n"] > 0
    assert figures["config"]["rounds"] == 3 and figures["resolver"] == "adjudicator"
    assert server.hits == sum(calls.values())

    # afterwards every call is known and answered: exact counts, nothing to make
    again = estimate_run("demo", PIPELINE)
    assert sum(s.to_make for s in again.stages) == 0
    assert stage(again, "filter").answered == calls["filter"]
    for r in (1, 2, 3):
        assert stage(again, f"debate round {r}").answered == rounds[r]
    assert stage(again, "adjudicator").answered == calls["adjudicator"]
    assert stage(again, "rag_judgments").answered == calls.get("rag_judgment", 0)


def test_a_budget_stops_before_the_chunk_that_would_pass_it_and_the_next_run_resumes(scripted_demo):
    lake, server = scripted_demo
    assert bridge("materialize", "-d", "demo", "retrieval_run").exit_code == 0
    retrieval = ledger(lake)
    estimate = estimate_run("demo", PIPELINE)
    filtering = stage(estimate, "filter")
    filter_cost = filtering.prompt_tokens + filtering.reply_tokens

    tiny = bridge("run", "-d", "demo", "--budget", "10")
    assert tiny.exit_code == BUDGET_EXIT, tiny.output
    assert "budget reached: 0 tokens spent of 10 (10 left)" in tiny.output
    assert f"the next {filtering.new} filter calls to fake" in tiny.output
    assert "the next run resumes without asking them again" in tiny.output
    assert ledger(lake) == retrieval and server.hits == sum(retrieval.values())  # nothing new asked

    # room for the filter's chunk, not for the next one (the debate's first round or the RAG
    # answers, whichever Dagster runs first)
    stopped = bridge("run", "-d", "demo", "--budget", str(filter_cost))
    assert stopped.exit_code == BUDGET_EXIT, stopped.output
    calls, purpose = re.search(r"the next (\d+) (\w+) calls to fake", stopped.output).groups()
    following = {"debate": "debate round 1", "rag_answer": "rag_answers"}[purpose]
    assert int(calls) == stage(estimate, following).to_make
    spent = re.search(r"budget reached: ([\d,]+) tokens spent of ([\d,]+) \(([\d,]+) left\)", stopped.output)
    used, limit, left = (int(g.replace(",", "")) for g in spent.groups())
    assert limit == filter_cost and used + left == limit and 0 < used <= filter_cost
    assert ledger(lake) == {**retrieval, "filter": filtering.new}
    with store.connect_read_only(location(lake)) as con:
        tables = {t for (t,) in con.execute("select table_name from information_schema.tables").fetchall()}
    assert {"filter_votes", "filtered_pool"} <= tables
    assert not tables & {"debate_labels", "debate_turns", "rag_answers"}

    finished = bridge("run", "-d", "demo", "--budget", "10000000")
    assert finished.exit_code == 0, finished.output
    assert "LLM budget:" in finished.output
    keys = ledger(lake, "select key, count(*) from llm_calls group by 1")
    assert set(keys.values()) == {1}  # no call was asked twice
    assert server.hits == len(keys)


def test_an_automation_run_makes_at_most_its_cap_and_bridge_run_labels_what_it_deferred(scripted_demo):
    """What the daemon's automation does once a new system's run lands (tests/test_automation_daemon.py
    shows it under a real daemon, cap 0): one run of the dataset's automated assets, tagged as
    Dagster's automation tags it, makes at most `llm_calls_per_run` calls over all its steps; the
    calls past the cap are deferred, never sent, their pairs pending; `bridge run` then asks
    them, none a second time, and labels them."""
    lake, server = scripted_demo
    cap = 2
    registry = Path(os.environ["BRIDGE_REGISTRY_DIR"]) / "datasets.yaml"
    entries = yaml.safe_load(registry.read_text())
    entries["datasets"]["demo"]["automation"] = {"llm_calls_per_run": cap}
    registry.write_text(yaml.safe_dump(entries))
    assert bridge("materialize", "-d", "demo", "retrieval_run").exit_code == 0  # explicit: no cap
    before = server.hits

    instance = orchestration.instance()
    names = [key.to_user_string() for key in automated_selection.resolve(defs.resolve_asset_graph())]
    steps = orchestration.plan(defs, names, "demo", instance)
    assert [step.partition_keys for step in steps] == [["demo"]]  # one run, as the daemon launches it
    defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance, asset_selection=steps[0].keys, partition_key="demo",
        tags={automation.AUTOMATION_TAG: "true"}, raise_on_error=True)
    assert server.hits - before == cap
    # the filter's metadata counts what it deferred as deferred, not as calls or failures
    def metadata(asset: str) -> dict:
        [record] = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(asset), asset_partitions=["demo"]), limit=1).records
        return {k: v.value for k, v in record.asset_materialization.metadata.items()}

    filtered, answered = metadata("filtered_pool"), metadata("rag_answers")
    assert filtered["deferred_calls"] > 0 and filtered["call_failures"] == 0
    assert filtered["calls"] <= cap
    # the run's calls, reserved against its cap by whichever step sent them (llm.coordination)
    assert filtered["automation_calls_reserved"] == answered["automation_calls_reserved"] == cap
    assert answered["deferred_calls"] > 0 and answered["failed"] == 0 and answered["call_failures"] == 0
    is_deferred = "error = '" + llm_budget.DEFERRED.replace("'", "''") + "'"
    deferred = ledger(lake, f"select query_id || ' ' || doc_id, error from filter_votes where {is_deferred}")
    assert deferred
    sources = ledger(lake, "select query_id || ' ' || doc_id, source from bridge_qrels")
    assert {sources[pair] for pair in deferred} == {"pending"}  # never labels
    with store.connect_read_only(location(lake)) as con:
        summary = run_summary(con, "demo", time.time())
    assert re.search(r"\d+ deferred by the automation cap .* `bridge run --dataset demo` labels them", summary)

    finished = bridge("run", "-d", "demo")
    assert finished.exit_code == 0, finished.output
    assert "deferred" not in finished.output
    assert not ledger(lake, f"select error, count(*) from filter_votes where {is_deferred} group by 1")
    assert not ledger(lake, f"select 1, count(*) from debate_labels where list_contains(flags, '{FLAG_DEFERRED}') "
                            "having count(*) > 0")
    keys = ledger(lake, "select key, count(*) from llm_calls group by 1")
    assert set(keys.values()) == {1} and server.hits == len(keys)  # the capped run's calls not asked again
    answered = ledger(lake, "select query_id || ' ' || doc_id, is_supported from filter_votes where error is null")
    assert set(deferred) <= set(answered)  # each deferred pair's call made and answered now


def test_the_budget_counts_money_at_the_profiles_prices(data_lake):
    priced = http_profile("http://127.0.0.1:9/v1", name="priced",
                          prices=Prices(input_per_million=1.0, output_per_million=2.0))
    request = LLMRequest(messages=(("user", "x" * 4000),), max_tokens=500)
    assert prompt_tokens(request) == 1000
    budget = Budget(usd=0.0025)
    budget.admit(priced, [request])  # 1000 x 1 + 500 x 2 = 2000 per million: 0.002 USD
    with pytest.raises(BudgetExceeded, match=r"0.0000 USD spent of 0.0025"):
        budget.admit(priced, [request, request])
    free = http_profile("http://127.0.0.1:9/v1")
    budget.admit(free, [request] * 100)  # a profile without prices costs nothing
    euros = priced.model_copy(update={"prices": Prices(input_per_million=1.0, output_per_million=2.0,
                                                       currency="EUR")})
    with pytest.raises(BudgetError, match="priced in EUR: --budget-usd counts USD prices only"):
        budget.admit(euros, [request])

    client = LLMClient(priced, lake=location(data_lake))
    with llm_budget.enforce(Budget(tokens=1000)), pytest.raises(BudgetExceeded):
        client.generate([request])  # 1,500 tokens at most: never sent (the URL is dead anyway)
    assert client.stats.calls == 0



def test_prices_are_optional_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_REGISTRY_DIR", str(tmp_path))
    assert load_models_config().profile("qwen-0.5b").prices is None  # local: free
    (tmp_path / "models.yaml").write_text(
        "profiles:\n  hosted:\n    backend: openai\n    model: m\n    base_urls: [http://h/v1]\n"
        "    prices: {input_per_million: 0.15, output_per_million: 0.60}\n")
    prices = load_models_config().profile("hosted").prices
    assert prices.currency == "USD" and prices.cost(1_000_000, 500_000) == pytest.approx(0.45)
    (tmp_path / "models.yaml").write_text(
        "profiles:\n  hosted:\n    backend: openai\n    model: m\n    base_urls: [http://h/v1]\n"
        "    prices: {input_per_million: -1, output_per_million: 0.60}\n")
    with pytest.raises(ModelConfigError, match=r"(?s)models.yaml, line 2: .*'hosted'.*input_per_million"):
        load_models_config()


def test_a_malformed_run_file_fails_only_its_system_and_bridge_run_finishes_the_rest(scripted_demo, tmp_path):
    """Issue 59: a run file that fails validation, registered as a system, fails that system's
    retrieval_run; `bridge run` completes the dataset without it, names the file, line and
    field, and exits 4; fixing the file brings the system back in."""
    lake, _server = scripted_demo
    registry = Path(os.environ["BRIDGE_REGISTRY_DIR"]) / "retrievers.yaml"
    entries = yaml.safe_load(registry.read_text())
    run_file = tmp_path / "external.demo.trec"
    entries["systems"]["external"] = {"kind": "run_file", "path": str(tmp_path / "external.{dataset}.trec"),
                                      "profiles": ["costs"]}
    registry.write_text(yaml.safe_dump(entries))
    queries = [json.loads(line)["_id"] for line in (RESOURCES_DIR / "data" / "demo" / "queries.jsonl").open()][:2]
    docs = [json.loads(line)["_id"] for line in (RESOURCES_DIR / "data" / "demo" / "corpus.jsonl").open()][:3]
    lines = [f"{q} Q0 {d} {rank} {10 - rank} ext" for q in queries for rank, d in enumerate(docs, start=1)]
    lines[5] = lines[5].replace(" 7 ext", " notascore ext")
    run_file.write_text("\n".join(lines) + "\n")

    broken = bridge("run", "-d", "demo")
    assert broken.exit_code == 4, broken.output
    assert re.search(r'system external failed on demo and was left out: .*external\.demo\.trec, line 6, '
                     r'field "score": score "notascore" is not a number', broken.output)
    assert "holes found" in broken.output  # the summary of the rest
    pooled = set(ledger(lake, "select distinct unnest(systems), 1 from candidate_pool"))
    assert pooled and "external" not in pooled and "bm25" in pooled
    assert ledger(lake, "select count(*), 1 from bridge_qrels where dataset = 'demo'")  # the benchmark went on
    listed = bridge("runs", "list", "-d", "demo")
    assert re.search(r"demo +external +failed", listed.output), listed.output
    assert 'external.demo.trec, line 6, field "score"' in listed.output

    lines[5] = lines[5].replace(" notascore ext", " 7 ext")
    run_file.write_text("\n".join(lines) + "\n")
    fixed = bridge("run", "-d", "demo")
    assert fixed.exit_code == 0, fixed.output
    assert "external" in set(ledger(lake, "select distinct unnest(systems), 1 from candidate_pool"))
    assert re.search(r"demo +external +stored +6 ", bridge("runs", "list").output)


def test_two_bridge_runs_on_one_dataset_take_turns_and_the_second_finds_it_up_to_date(scripted_demo):
    """Issue 59: two `bridge run --dataset demo` started together: one computes, the other
    says it waits, then finds every asset up to date; each call was sent once."""
    lake, server = scripted_demo
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    runs = [subprocess.Popen([sys.executable, "-m", "bridge_assets.cli", "run", "-d", "demo"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    waited = [out for out in outputs if "another bridge command is running on dataset demo" in out]
    assert len(waited) == 1, outputs
    assert "nothing changed: every asset of demo is up to date" in waited[0]
    keys = ledger(lake, "select key, count(*) from llm_calls group by 1")
    assert keys and set(keys.values()) == {1} and server.hits == len(keys)
