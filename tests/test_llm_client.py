"""The LLM client over HTTP: cache keys, the call ledger as cache, and every fault it must survive.

The faults come from a real HTTP server started in the test on 127.0.0.1 that answers from a
script (slow, HTTP 500, malformed JSON, off-schema answers); the client code under test is the
production code path that talks to llama.cpp's server or vLLM.
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge_assets.llm import LLMClient, LLMRequest, get_profile, load_models_config
from bridge_assets.llm.ledger import call_key, read_calls
from bridge_assets.llm.parsing import InvalidSchema
from bridge_assets.llm.resource import LLMResource
from fixtures.paths import location
from fixtures.scripted_llm import Reply, ScriptedServer, completion, http_profile

YES_NO = {"type": "object", "properties": {"response": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["response"], "additionalProperties": False}


def ask(client: LLMClient, question: str, **fields: Any) -> LLMRequest:
    return client.request([("system", "Answer in JSON."), ("user", question)], json_schema=YES_NO,
                          purpose="test", max_tokens=32, **fields)


def always(reply: Reply) -> Callable[[int, dict], Reply]:
    return lambda index, body: reply


def dead_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on once this socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --- keys --------------------------------------------------------------------------------

def test_call_key_covers_what_decides_the_reply_and_nothing_else():
    base = LLMRequest(messages=(("user", "q"),), json_schema=YES_NO, max_tokens=32)
    key = call_key("openai", "m", base)
    assert key == call_key("openai", "m", LLMRequest(messages=(("user", "q"),), json_schema=YES_NO,
                                                     max_tokens=32, purpose="another purpose"))
    variants = [
        call_key("llama_cpp", "m", base),
        call_key("openai", "m2", base),
        call_key("openai", "m", base.model_copy(update={"messages": (("user", "q2"),)})),
        call_key("openai", "m", base.model_copy(update={"messages": (("system", "q"),)})),
        call_key("openai", "m", base.model_copy(update={"json_schema": None})),
        call_key("openai", "m", base.model_copy(update={"max_tokens": 33})),
        call_key("openai", "m", base.model_copy(update={"temperature": 0.7})),
        call_key("openai", "m", base.model_copy(update={"seed": 1})),
        call_key("openai", "m", base.model_copy(update={"stop": ("\n",)})),
        call_key("openai", "m", base.model_copy(update={"top_logprobs": 5})),
    ]
    assert len({key, *variants}) == len(variants) + 1


def test_local_weights_hash_is_part_of_the_model_id():
    client = LLMClient("qwen-0.5b")
    assert client.model_id.endswith(get_profile("qwen-0.5b").weights.sha256)


# --- the ledger as cache -------------------------------------------------------------------

def test_second_generate_makes_zero_calls_and_reads_the_ledger(data_lake):
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        client = LLMClient(http_profile(server.url))
        requests = [ask(client, f"question {i}") for i in range(3)]
        first = client.generate(requests, context="run-1")
        assert [r.parsed for r in first] == [{"response": "yes"}] * 3
        assert not any(r.cached for r in first) and server.hits == 3

        second = LLMClient(http_profile(server.url)).generate(requests, context="run-2")
        assert server.hits == 3  # no request reached the server
        assert all(r.cached for r in second)
        assert [r.parsed for r in second] == [r.parsed for r in first]
        assert [r.key for r in second] == [r.key for r in first]

    calls = read_calls(location())
    assert calls.height == 3  # the second run appended nothing: it made no call
    assert set(calls["context"]) == {"run-1"}
    assert set(calls["purpose"]) == {"test"}
    assert calls["error"].is_null().all()
    assert calls["tokens_in"].to_list() == [11] * 3 and calls["tokens_out"].to_list() == [3] * 3
    assert json.loads(calls["parsed_json"][0]) == {"response": "yes"}
    assert json.loads(calls["request_json"][0])["json_schema"] == YES_NO
    assert calls["created_at"].is_not_null().all()


def test_only_new_requests_are_sent_and_duplicates_in_a_batch_once(data_lake):
    with ScriptedServer(always((200, completion('{"response": "no"}'), 0))) as server:
        client = LLMClient(http_profile(server.url))
        client.generate([ask(client, "a"), ask(client, "b")])
        assert server.hits == 2
        results = client.generate([ask(client, "a"), ask(client, "c"), ask(client, "c"), ask(client, "b")])
        assert server.hits == 3  # only "c", once
        assert [r.cached for r in results] == [True, False, False, True]
        assert results[1] == results[2]
    assert client.stats.requests == 6 and client.stats.cache_hits == 2 and client.stats.calls == 3
    assert client.stats.tokens_in == 33 and client.stats.failures == 0
    assert read_calls(location()).height == 3


# --- faults ----------------------------------------------------------------------------------

def test_timeout_is_retried_then_succeeds(data_lake):
    script = lambda i, body: (200, completion('{"response": "yes"}'), 2.0 if i == 0 else 0)  # noqa: E731
    with ScriptedServer(script) as server:
        client = LLMClient(http_profile(server.url, timeout_s=0.5))
        [result] = client.generate([ask(client, "slow first")])
        assert result.ok and result.parsed == {"response": "yes"}
        assert server.hits == 2


def test_timeout_forever_is_a_recorded_failure_then_retried_on_the_next_run(data_lake):
    slow = {"on": True}
    script = lambda i, body: (200, completion('{"response": "yes"}'), 1.5 if slow["on"] else 0)  # noqa: E731
    with ScriptedServer(script) as server:
        client = LLMClient(http_profile(server.url, timeout_s=0.3, retries=1))
        [failed] = client.generate([ask(client, "never answers in time")])
        assert not failed.ok and "Timeout" in failed.error and failed.parsed is None
        assert server.hits == 2  # the first try and one retry
        slow["on"] = False
        [again] = client.generate([ask(client, "never answers in time")])
        assert again.ok and not again.cached  # a failure is recorded but never served from cache
        assert server.hits == 3
        [cached] = client.generate([ask(client, "never answers in time")])
        assert cached.cached and server.hits == 3
    calls = read_calls(location())
    assert calls["error"].is_null().to_list() == [False, True]


def test_http_500_then_success(data_lake):
    script = lambda i, body: (500, {"error": "overloaded"}, 0) if i < 2 else (200, completion('{"response": "no"}'), 0)  # noqa: E731
    with ScriptedServer(script) as server:
        client = LLMClient(http_profile(server.url, retries=3))
        [result] = client.generate([ask(client, "flaky")])
        assert result.ok and result.parsed == {"response": "no"}
        assert server.hits == 3
    assert read_calls(location())["attempts"].to_list() == [1]  # transport retries are the backend's business


def test_http_500_forever_fails_with_the_status_and_body(data_lake):
    with ScriptedServer(always((500, {"error": "model crashed"}, 0))) as server:
        client = LLMClient(http_profile(server.url, retries=2))
        [result] = client.generate([ask(client, "broken")])
        assert server.hits == 3
    assert not result.ok and "HTTP 500" in result.error and "model crashed" in result.error
    assert read_calls(location())["error"].to_list() == [result.error]


def test_client_errors_are_not_retried(data_lake):
    with ScriptedServer(always((400, {"error": "bad request: unknown field"}, 0))) as server:
        client = LLMClient(http_profile(server.url, retries=3))
        [result] = client.generate([ask(client, "rejected")])
        assert server.hits == 1
    assert "HTTP 400" in result.error and "unknown field" in result.error


def test_malformed_json_forever_is_retried_then_recorded_as_failed(data_lake):
    with ScriptedServer(always((200, completion('{"response": "yes"'), 0))) as server:
        client = LLMClient(http_profile(server.url, parse_retries=2))
        [result] = client.generate([ask(client, "truncated")])
        assert server.hits == 3  # the first answer and two re-asks
    assert not result.ok and result.parsed is None and "not valid JSON" in result.error
    assert result.text == '{"response": "yes"'  # the raw reply is kept for the audit
    calls = read_calls(location())
    assert calls["attempts"].to_list() == [3] and calls["error"].to_list() == [result.error]
    assert calls["raw_reply"].to_list() == ['{"response": "yes"']
    assert client.stats.failures == 1 and client.stats.calls == 3
    # the model's final answer: the next run reads it (still a failure) instead of asking again
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        again = LLMClient(http_profile(server.url, parse_retries=2))
        [cached] = again.generate([ask(again, "truncated")])
        assert server.hits == 0 and again.stats.calls == 0
    assert cached.cached and not cached.ok and cached.error == result.error and cached.parsed is None
    assert read_calls(location()).height == 1


def test_neither_yes_nor_no_is_an_error_never_a_label(data_lake):
    with ScriptedServer(always((200, completion('{"response": "maybe"}'), 0))) as server:
        client = LLMClient(http_profile(server.url, parse_retries=1))
        [result] = client.generate([ask(client, "undecided")])
        assert server.hits == 2
    assert result.parsed is None and "violates the schema at response" in result.error
    assert "maybe" in result.error


def test_a_bad_first_answer_is_replaced_by_a_valid_retry(data_lake):
    replies = ['I think yes', '{"response": "yes"}']
    with ScriptedServer(lambda i, body: (200, completion(replies[min(i, 1)]), 0)) as server:
        client = LLMClient(http_profile(server.url))
        [result] = client.generate([ask(client, "chatty model")])
        assert server.hits == 2
    assert result.ok and result.parsed == {"response": "yes"}
    assert read_calls(location())["attempts"].to_list() == [2]


def test_a_reply_without_content_is_an_error(data_lake):
    with ScriptedServer(always((200, completion(None), 0))) as server:
        client = LLMClient(http_profile(server.url))
        [result] = client.generate([ask(client, "tool call instead")])
    assert not result.ok and "no message content" in result.error


def test_invalid_schema_fails_before_any_call(data_lake):
    with ScriptedServer(always((200, completion("{}"), 0))) as server:
        client = LLMClient(http_profile(server.url))
        with pytest.raises(InvalidSchema):
            client.generate([client.request([("user", "q")], json_schema={"type": "no-such-type"})])
        assert server.hits == 0


# --- several servers, concurrency, wire format -------------------------------------------------

def test_a_dead_base_url_fails_over_to_the_next(data_lake):
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        client = LLMClient(http_profile(dead_url(), server.url, retries=2))
        results = client.generate([ask(client, f"q{i}") for i in range(4)])
        assert all(r.ok for r in results) and server.hits == 4


def test_requests_are_spread_over_base_urls(data_lake):
    ok = always((200, completion('{"response": "yes"}'), 0))
    with ScriptedServer(ok) as one, ScriptedServer(ok) as two:
        client = LLMClient(http_profile(one.url, two.url))
        client.generate([ask(client, f"q{i}") for i in range(6)])
        assert one.hits == 3 and two.hits == 3


def test_concurrency_is_bounded(data_lake):
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0.3))) as server:
        client = LLMClient(http_profile(server.url, concurrency=3))
        client.generate([ask(client, "warm-up")])  # the first call opens the ledger (2-3 s cold)
        started = time.perf_counter()
        client.generate([ask(client, f"q{i}") for i in range(9)])
        elapsed = time.perf_counter() - started
        assert server.max_in_flight == 3
    assert elapsed < 9 * 0.3  # parallel, not one after another


def test_wire_format_per_structured_output_style_and_logprobs(data_lake):
    tokens = [{"token": "yes", "logprob": -0.1, "top_logprobs": [{"token": "yes", "logprob": -0.1},
                                                                  {"token": "no", "logprob": -2.4}]}]
    with ScriptedServer(always((200, completion("yes", logprobs=tokens), 0))) as server:
        for style in ("json_object_schema", "json_schema", "none"):
            client = LLMClient(http_profile(server.url, structured_output=style, parse_retries=0))
            client.generate([ask(client, f"schema via {style}")])
        llama_cpp_form, vllm_form, no_form = server.bodies
        assert llama_cpp_form["response_format"] == {"type": "json_object", "schema": YES_NO}
        assert vllm_form["response_format"]["type"] == "json_schema"
        assert vllm_form["response_format"]["json_schema"]["schema"] == YES_NO
        assert "response_format" not in no_form
        assert llama_cpp_form["model"] == "qwen2.5-coder-0.5b-instruct"
        assert llama_cpp_form["temperature"] == 0.0 and llama_cpp_form["max_tokens"] == 32

        client = LLMClient(http_profile(server.url))
        [scored] = client.generate([client.request([("user", "yes or no?")], top_logprobs=2, max_tokens=1)])
        assert server.bodies[-1]["logprobs"] is True and server.bodies[-1]["top_logprobs"] == 2
    assert scored.logprobs[0].token == "yes" and scored.logprobs[0].top == {"yes": -0.1, "no": -2.4}
    [cached] = client.generate([client.request([("user", "yes or no?")], top_logprobs=2, max_tokens=1)])
    assert cached.cached and cached.logprobs == scored.logprobs


def test_api_key_comes_from_the_named_environment_variable(data_lake, monkeypatch):
    monkeypatch.setenv("BRIDGE_TEST_KEY", "sk-test")
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        client = LLMClient(http_profile(server.url, api_key_env="BRIDGE_TEST_KEY"))
        client.generate([ask(client, "authorised")])
        client = LLMClient(http_profile(server.url, api_key_env="BRIDGE_UNSET_KEY"))
        client.generate([ask(client, "anonymous")])
    assert server.authorization == ["Bearer sk-test", None]


# --- configuration, resource, CLI -----------------------------------------------------------

def test_models_yaml_profiles_and_role_defaults():
    config = load_models_config()
    assert {"qwen-0.5b", "qwen-1.5b", "openai-local", "vllm-qwen-7b"} <= set(config.profiles)
    assert config.profile("qwen-0.5b").backend == "llama_cpp"
    assert config.profile("openai-local").base_urls == ("http://127.0.0.1:8080/v1",)
    assert config.profile("vllm-qwen-7b").backend == "vllm"
    for role in ("filter", "debate", "adjudicator", "judge", "rewrite"):
        assert config.role_profiles(role)
    assert all(p.sampling.temperature == 0.0 for p in config.profiles.values())


def test_a_malformed_profile_is_reported_with_file_and_name(tmp_path):
    from bridge_assets.llm.profiles import ModelConfigError

    path = tmp_path / "models.yaml"
    path.write_text("profiles:\n  broken:\n    backend: llama_cpp\n    model: x\n")
    with pytest.raises(ModelConfigError, match="(?s)broken.*needs `weights`"):
        load_models_config(path)
    path.write_text("defaults:\n  debate: nowhere\nprofiles: {}\n")
    with pytest.raises(ModelConfigError, match="unknown LLM profile 'nowhere'"):
        load_models_config(path)
    weights = "    weights: {file: m.gguf, sha256: '" + "0" * 64 + "', sources: [{local: m.gguf}]}\n"
    for lanes in ("0", "two", "1.5", "true"):
        path.write_text(f"profiles:\n  lanes:\n    backend: llama_cpp\n    model: x\n{weights}"
                        f"    engine_args: {{decode_lanes: {lanes}}}\n")
        with pytest.raises(ModelConfigError, match="(?s)lanes.*decode_lanes must be a whole number of 1 or more"):
            load_models_config(path)
    path.write_text(f"profiles:\n  lanes:\n    backend: llama_cpp\n    model: x\n{weights}"
                    "    engine_args: {decode_lanes: 4}\n")
    assert load_models_config(path).profile("lanes").decode_lanes == 4


def test_llm_resource_uses_defaults_unless_configured(data_lake):
    resource = LLMResource()
    assert resource.profiles_for("filter") == load_models_config().role_profiles("filter")
    assert LLMResource(debate="qwen-1.5b").profile_for("debate") == "qwen-1.5b"
    assert LLMResource(filter=["qwen-0.5b", "qwen-1.5b"]).profiles_for("filter") == ["qwen-0.5b", "qwen-1.5b"]
    assert resource.client("qwen-0.5b") is resource.client("qwen-0.5b")
    assert resource.client("qwen-0.5b").lake.duckdb == data_lake / "bridge.duckdb"
    with pytest.raises(ValueError, match="unknown LLM role"):
        resource.profiles_for("summarise")


def test_vllm_profile_without_vllm_installed_says_what_to_do(data_lake):
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from bridge_assets.llm.backends import BackendUnavailable

    client = LLMClient("vllm-qwen-7b")
    with pytest.raises(BackendUnavailable, match="vllm is not installed"):
        client.generate([client.request([("user", "hi")])])


def test_cli_models_list_and_unknown_profile(data_lake):
    from bridge_assets.cli.models import models_app

    runner = CliRunner()
    listing = runner.invoke(models_app, ["list"])
    assert listing.exit_code == 0, listing.output
    assert "qwen-0.5b" in listing.output and "llama_cpp" in listing.output
    assert "openai-local" in listing.output
    unknown = runner.invoke(models_app, ["fetch", "no-such-model"])
    assert unknown.exit_code == 2 and "unknown LLM profile 'no-such-model'" in unknown.output


def test_yes_probability_reads_the_first_yes_or_no_token():
    from bridge_assets.llm.scores import yes_probability
    from bridge_assets.llm.types import TokenLogprob

    tokens = [TokenLogprob(token='{"', logprob=-0.01, top={'{"': -0.01, "yes": -6.0}),
              TokenLogprob(token=' "', logprob=-0.1),
              TokenLogprob(token="no", logprob=math.log(0.7),
                           top={"no": math.log(0.7), "yes": math.log(0.2), " Yes": math.log(0.05),
                                "maybe": math.log(0.05)})]
    assert yes_probability(tokens) == pytest.approx(0.25 / 0.95)
    assert yes_probability(tokens[:2]) is None  # no token says yes or no: no score, not 0.5
    assert yes_probability(None) is None


def test_a_killed_run_repeats_no_recorded_call(data_lake):
    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        client = LLMClient(http_profile(server.url, concurrency=2), chunk_size=2)
        requests = [ask(client, f"pair {i}") for i in range(5)]
        real_generate = client.backend.generate
        chunks_sent = []

        def killed_during_second_chunk(batch):  # the fault: the process dies mid-run
            chunks_sent.append(len(batch))
            if len(chunks_sent) == 2:
                raise KeyboardInterrupt
            return real_generate(batch)

        client.backend.generate = killed_during_second_chunk
        with pytest.raises(KeyboardInterrupt):
            client.generate(requests)
        assert server.hits == 2 and read_calls(location()).height == 2  # the first chunk was recorded

        rerun = LLMClient(http_profile(server.url, concurrency=2), chunk_size=2).generate(requests)
        assert server.hits == 5  # only the three unanswered pairs were sent
        assert [r.cached for r in rerun] == [True, True, False, False, False]
    calls = read_calls(location())
    assert calls.height == 5 and calls["key"].n_unique() == 5
    assert calls["created_at"].n_unique() == 3  # one transaction per chunk: 1 + 2 on the rerun


# --- the automation run's call cap -------------------------------------------------------------

def test_a_call_cap_defers_the_calls_past_it_unsent_and_unrecorded(data_lake):
    from bridge_assets.llm import budget

    with ScriptedServer(always((200, completion('{"response": "yes"}'), 0))) as server:
        client = LLMClient(http_profile(server.url))
        client.generate([ask(client, "cached")])  # answered before: free under any cap
        requests = [ask(client, "cached")] + [ask(client, f"new {i}") for i in range(4)]
        with budget.enforce(budget.Budget(calls=2)) as cap:
            results = client.generate(requests, context="automation-run")
        assert server.hits == 1 + 2
        assert [r.cached for r in results] == [True, False, False, False, False]
        assert [r.ok for r in results] == [True, True, True, False, False]
        assert [r.error for r in results[3:]] == [budget.DEFERRED] * 2
        assert cap.spent_calls == 2 and cap.deferred_calls == 2
        # reported as deferred, not as failed calls
        assert client.stats.failures == 0 and client.stats.deferred == 2
        assert client.stats.as_metadata()["deferred"] == 2
        # deferred calls are not in the ledger: the next (explicit) run asks them
        assert read_calls(location()).height == 3
        again = client.generate(requests, context="explicit-run")
        assert all(r.ok for r in again) and server.hits == 5


def test_small_batches_still_show_progress_every_sixteen_requests():
    # a pair-major debate sends two turns at a time: no batch is long enough to log alone
    from bridge_assets.llm.resource import SmallBatchProgress
    from bridge_assets.llm.types import LLMResult

    progress = SmallBatchProgress(every=16)
    lines = [progress.add("qwen-1.5b", "debate", [LLMResult(key=f"k{i}", cached=i == 0), LLMResult(key=f"j{i}")])
             for i in range(9)]
    assert [i for i, line in enumerate(lines) if line] == [7]   # 16 answered after the eighth batch
    assert lines[7] == "debate: 16 LLM requests answered by qwen-1.5b so far (1 from the ledger)"
    # counted apart per profile and purpose
    assert progress.add("qwen-0.5b", "debate", [LLMResult(key="x")]) is None
