"""Real models, no fakes: the offline 0.5B joined from its PyPI parts, run in-process by
llama.cpp and behind llama-cpp-python's OpenAI-compatible server (the same HTTP path that
talks to `vllm serve` in production). Prompts are few and short: this machine has two cores.
"""

from __future__ import annotations

import math

import dagster as dg
import pytest
from typer.testing import CliRunner

from bridge_assets.cli.models import models_app
from bridge_assets.llm import LLMClient, get_profile, weights
from bridge_assets.llm.ledger import read_calls
from bridge_assets.llm.resource import LLMResource
from bridge_assets.llm.scores import yes_probability
from bridge_assets.llm.server import llama_cpp_server
from fixtures.paths import location

pytest.importorskip("llama_cpp")

YES_NO = {"type": "object", "properties": {"response": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["response"], "additionalProperties": False}
SYSTEM = 'Answer the question. Reply in JSON: {"response": "yes"} or {"response": "no"}.'


@pytest.fixture
def small_model(data_lake):
    """The offline 0.5B, joined once into the machine's models cache and verified."""
    return weights.provision(get_profile("qwen-0.5b"))


def test_offline_weights_join_to_the_published_hash(small_model):
    # `bridge models fetch` provisions the same file (and says where it is)
    fetched = CliRunner().invoke(models_app, ["fetch", "qwen-0.5b"])
    assert fetched.exit_code == 0, fetched.output
    assert str(small_model.path) in fetched.output and small_model.sha256 in fetched.output
    assert small_model.sha256 == get_profile("qwen-0.5b").weights.sha256
    assert small_model.size == 491_400_064
    with open(small_model.path, "rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_in_process_llama_cpp_json_schema_and_p_yes(small_model):
    client = LLMClient("qwen-0.5b")
    judged = client.request([("system", SYSTEM), ("user", "Is Paris the capital of France?")],
                            json_schema=YES_NO, max_tokens=16, purpose="test")
    scored = client.request([("system", "Answer with one word: yes or no."),
                             ("user", "Is Paris the capital of France?")], max_tokens=1, top_logprobs=10)
    verdict, score = client.generate([judged, scored], context="real-test")

    assert verdict.ok, verdict.error
    assert verdict.parsed["response"] in ("yes", "no") and verdict.tokens_out > 0
    assert score.ok and score.logprobs and len(score.logprobs) == 1
    first = score.logprobs[0]
    assert first.token == score.text
    assert first.logprob == pytest.approx(max(first.top.values()))  # greedy at temperature 0
    assert sum(math.exp(lp) for lp in first.top.values()) <= 1.0 + 1e-6
    p_yes = yes_probability(score.logprobs)
    assert p_yes is not None and 0.0 < p_yes < 1.0

    again = LLMClient("qwen-0.5b").generate([judged, scored])
    assert [r.cached for r in again] == [True, True]
    assert again[1].logprobs == score.logprobs and again[0].parsed == verdict.parsed
    assert read_calls(location()).height == 2  # the second run made no model call


def test_greedy_log_probs_equal_llama_cpps_own_without_logits_all(small_model):
    """The fast path (last position's logits only) gives llama.cpp's own tokens and top-k
    log-probabilities (which need logits_all there)."""
    from llama_cpp import Llama

    from bridge_assets.llm.backends import chat_messages
    from bridge_assets.llm.llama_backend import LlamaCppBackend
    from bridge_assets.llm.llama_greedy import greedy_with_logprobs

    profile = get_profile("qwen-0.5b")
    backend = LlamaCppBackend(profile)
    client = LLMClient("qwen-0.5b")
    # the reference outside the backend's cache, which keeps one model resident at a time
    reference_model = Llama(model_path=str(small_model.path), n_ctx=profile.context_size, n_threads=2,
                            logits_all=True, verbose=False)
    questions = ["Is Paris the capital of France?", "Is Lyon the capital of France?"]
    for question in questions:
        request = client.request([("system", "Answer with one word: yes or no, then say why."),
                                  ("user", question)], max_tokens=4, top_logprobs=5)
        # from an empty KV cache on both sides: a reused prefix (either implementation) moves
        # the low digits (measured here: up to 0.04 on the runner-up log-probs)
        fast_model = backend._model(logits_all=False)
        fast_model.reset()
        reference_model.reset()
        fast_text, fast, tokens_in, tokens_out = greedy_with_logprobs(fast_model, request)
        reference = reference_model.create_chat_completion(
            messages=chat_messages(request),
            max_tokens=4, temperature=0.0, logprobs=True, top_logprobs=5, repeat_penalty=1.0)
        choice = reference["choices"][0]
        assert fast_text == choice["message"]["content"]
        assert tokens_in == reference["usage"]["prompt_tokens"] and tokens_out == len(fast)
        for ours, theirs in zip(fast, choice["logprobs"]["content"], strict=True):
            assert ours.token == theirs["token"]
            assert ours.logprob == pytest.approx(theirs["logprob"], abs=1e-3)
            expected = {alt["token"]: float(alt["logprob"]) for alt in theirs["top_logprobs"]}
            assert ours.top == pytest.approx(expected, abs=1e-3)
    reference_model.close()


@pytest.fixture
def llama_server(small_model):
    """llama-cpp-python's OpenAI-compatible server on the offline model, stopped afterwards."""
    with llama_cpp_server(small_model.path, alias=get_profile("openai-local").model, n_ctx=2048) as url:
        yield url


def test_end_to_end_through_a_real_openai_compatible_server(llama_server):
    profile = get_profile("openai-local").model_copy(update={"base_urls": (llama_server,), "concurrency": 2})
    client = LLMClient(profile)
    questions = ["Is Paris the capital of France?", "Is the Pacific Ocean a desert?"]
    requests = [client.request([("system", SYSTEM), ("user", q)], json_schema=YES_NO, max_tokens=16,
                               purpose="e2e") for q in questions]
    requests.append(client.request([("system", "Answer with one word: yes or no."),
                                    ("user", questions[0])], max_tokens=1, top_logprobs=5))
    results = client.generate(requests, context="e2e")

    for result in results[:2]:
        assert result.ok, result.error
        assert result.parsed["response"] in ("yes", "no")  # the server's grammar kept it in the schema
        assert result.tokens_in > 10 and result.tokens_out > 0
    scored = results[2]
    assert scored.ok and scored.logprobs and yes_probability(scored.logprobs) is not None
    calls = read_calls(location())
    assert calls.height == 3 and set(calls["backend"]) == {"openai"}
    assert calls["error"].is_null().all()

    again = LLMClient(profile).generate(requests)
    assert all(r.cached for r in again) and read_calls(location()).height == 3


def test_a_prompt_longer_than_the_context_is_a_recorded_failure(small_model):
    tiny_context = get_profile("qwen-0.5b").model_copy(update={"context_size": 512})
    client = LLMClient(tiny_context)
    [result] = client.generate([client.request([("user", "word " * 800)], max_tokens=4)])
    assert not result.ok and "context window" in result.error
    assert read_calls(location())["error"].to_list() == [result.error]


def test_one_llama_cpp_model_is_resident_at_a_time(small_model):
    """Two profiles one after the other (here the same file at two context sizes): asking for
    the second closes the first, whose memory would otherwise stay held beside it."""
    from bridge_assets.llm import llama_backend as backends

    short, longer = (LLMClient(get_profile("qwen-0.5b").model_copy(update={"context_size": n}))
                     for n in (512, 1024))
    for n, client in enumerate((short, longer, short), start=2):  # new questions: no ledger answers
        [result] = client.generate([client.request([("system", SYSTEM), ("user", f"Is {n} + {n} = {2 * n}?")],
                                                    max_tokens=8, json_schema=YES_NO)])
        assert result.ok and not result.cached, result.error
        assert [key[1] for key in backends._LLAMA_MODELS] == [client.profile.context_size]


def test_llm_resource_inside_a_dagster_materialization(small_model):
    @dg.asset
    def judged(context, llm: LLMResource) -> dg.MaterializeResult:
        client = llm.client(llm.profile_for("judge"))
        [result] = client.generate([client.request([("system", SYSTEM), ("user", "Is ice cold?")],
                                                   json_schema=YES_NO, max_tokens=16, purpose="judge")],
                                   context=context.run_id)
        assert result.ok, result.error
        return dg.MaterializeResult(metadata=client.stats.as_metadata())

    outcome = dg.materialize([judged], resources={"llm": LLMResource(judge="qwen-0.5b")})
    assert outcome.success
    metadata = outcome.asset_materializations_for_node("judged")[0].metadata
    assert metadata["calls"].value == 1 and metadata["cache_hits"].value == 0
    assert metadata["tokens_out"].value > 0
    calls = read_calls(location())
    assert calls["purpose"].to_list() == ["judge"] and calls["context"].to_list() == [outcome.run_id]


def test_a_schema_s_grammar_keeps_raw_control_characters_out_of_strings(small_model, monkeypatch):
    """llama-cpp-python's converter let a string take a raw line break, which json.loads then
    rejects (a debate quote ending at a chunk's line break failed three times at temperature
    0). The grammar used now forbids U+0000-U+001F inside strings, as JSON does, and still lets
    the model escape them or close the string; the converter's own grammar is checked to allow
    the raw break, so this test would fail without the fix."""
    import json

    import numpy as np
    from llama_cpp import Llama
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from bridge_assets.llm import llama_greedy

    schema = {"type": "object", "properties": {"quote": {"type": "string", "maxLength": 80}},
              "required": ["quote"], "additionalProperties": False}
    vocab = Llama(model_path=str(small_model.path), vocab_only=True, verbose=False)
    newline, tab, escaped, letter, close = (
        vocab.tokenize(text.encode(), add_bos=False, special=False) for text in ("\n", "\t", "\\n", "x", '"}'))
    assert all(len(t) == 1 for t in (newline, tab, letter))

    def next_token(preferred: list[int]) -> int:
        """The token the grammar picks after `{"quote": "Roses are red` when the model ranks
        `preferred` first, then the other candidates in this order."""
        grammar = llama_greedy.Grammar(vocab, schema)
        try:
            for token in vocab.tokenize(b'{"quote": "Roses are red', add_bos=False, special=False):
                grammar.accept(token)
            logits = np.full(vocab.n_vocab(), -10.0, dtype=np.single)
            ranked = [preferred[0], *(t[0] for t in (escaped, letter, close) if t[0] != preferred[0])]
            for rank, token in enumerate(ranked):
                logits[token] = 10.0 - rank
            return grammar.choose(logits)
        finally:
            grammar.close()

    assert next_token(newline) == escaped[0]  # the model may still write "\n", escaped
    assert next_token(tab) == escaped[0]
    assert next_token(letter) == letter[0]    # any other character as before
    [string_rule] = [line for line in llama_greedy.json_grammar(schema).splitlines() if line.startswith("char ::=")]
    assert "\\x00-\\x1F" in string_rule

    monkeypatch.setattr(llama_greedy, "json_grammar", lambda s: json_schema_to_gbnf(json.dumps(s)))
    assert next_token(newline) == newline[0]  # the converter's grammar takes the raw break
    vocab.close()
