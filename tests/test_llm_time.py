"""The model's time, measured per call: prompt tokens computed (prefill evaluated) vs reused (the
prefix taken from the KV cache) and decode tokens, recorded in the call ledger, migrated into
older ledgers, and summed per stage by scripts/llm_time_by_stage.py.

The in-process case runs the real offline 0.5B on two short prompts that share a prefix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_assets.lake import store
from bridge_assets.llm import LLMClient, get_profile, weights
from bridge_assets.llm.http_backend import reported_prefill
from bridge_assets.llm.ledger import ADDED_COLUMNS, TABLE, CallRecord, append, read_calls
from bridge_assets.llm.types import LLMRequest, LLMResult
from fixtures.paths import location
from fixtures.scripted_llm import ScriptedServer, completion, http_profile

ROOT = Path(__file__).resolve().parents[1]
YES_NO = {"type": "object", "properties": {"response": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["response"], "additionalProperties": False}
SYSTEM = ("You judge whether a short statement about geography is true. Reply in JSON: "
          '{"response": "yes"} or {"response": "no"}.')
PREFILL = ["prompt_tokens_computed", "prompt_tokens_reused", "decode_tokens"]


def stage_table(lake: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "llm_time_by_stage.py"), "--lake", str(lake), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_real_in_process_calls_record_prompt_computed_reused_and_decode(data_lake):
    pytest.importorskip("llama_cpp")
    weights.provision(get_profile("qwen-0.5b"))
    client = LLMClient("qwen-0.5b")
    first, second = (client.request([("system", SYSTEM), ("user", statement)], json_schema=YES_NO,
                                     max_tokens=12, purpose="filter")
                     for statement in ("Paris is in France.", "Lyon is in Spain."))
    # the greedy log-probability path (its own decoding loop) after a prompt sharing the system text
    scored = client.request([("system", SYSTEM), ("user", "Rome is in Italy. One word: yes or no?")],
                            max_tokens=2, top_logprobs=3, purpose="judge")
    results = [*client.generate([first, second], context="t"), *client.generate([scored], context="t")]

    for result in results:
        assert result.ok, result.error
        assert result.prompt_computed is not None and result.prompt_reused is not None
        assert result.prompt_computed + result.prompt_reused == result.tokens_in
        assert result.prompt_computed >= 1  # the last prompt token is always evaluated
        assert result.decode_tokens == result.tokens_out > 0
    # the system prompt (~40 tokens) is shared: the second and third calls continue from it
    assert results[1].prompt_reused > 30 and results[1].prompt_computed < results[1].tokens_in
    assert results[2].prompt_reused > 30

    calls = read_calls(location())
    assert calls.height == 3
    rows = calls.select("tokens_in", "tokens_out", *PREFILL).rows()
    assert rows == [(r.tokens_in, r.tokens_out, r.prompt_computed, r.prompt_reused, r.decode_tokens)
                    for r in results]
    # cached answers make no call: nothing new is measured or recorded
    again = LLMClient("qwen-0.5b").generate([first, second, scored])
    assert all(r.cached for r in again) and read_calls(location()).height == 3

    table = stage_table(data_lake)
    filter_row = next(line for line in table.splitlines() if line.startswith("| filter |"))
    cells = [c.strip() for c in filter_row.strip("|").split("|")]
    computed = sum(r.prompt_computed for r in results[:2])
    reused = sum(r.prompt_reused for r in results[:2])
    assert cells[1:5] == ["2", "0", "2", str(results[0].tokens_in + results[1].tokens_in)]
    assert cells[5] == f"{computed:,}" and cells[6].startswith(f"{reused:,} (")
    assert cells[7] == str(results[0].tokens_out + results[1].tokens_out)
    assert "| **total** | 3 |" in table and "no prefill measurement" not in table


OLD_TABLE = f"""create table {TABLE} (
    key VARCHAR not null, profile VARCHAR, backend VARCHAR, model VARCHAR, purpose VARCHAR,
    context VARCHAR, request_json VARCHAR, raw_reply VARCHAR, parsed_json VARCHAR,
    logprobs_json VARCHAR, tokens_in INTEGER, tokens_out INTEGER, latency_s DOUBLE,
    attempts INTEGER, error VARCHAR, created_at TIMESTAMP)"""


@pytest.mark.parametrize("storage", ["ducklake", "duckdb"])
def test_an_old_ledger_gets_the_columns_null_in_its_rows(data_lake, monkeypatch, storage):
    monkeypatch.setenv("BRIDGE_STORAGE", storage)
    with store.connect(location()) as con:  # a ledger written before the columns existed
        con.execute(OLD_TABLE)
        con.execute(f"insert into {TABLE} values ('old', 'p', 'llama_cpp', 'm', 'debate', 'run-0', '{{}}', "
                    "'yes', null, null, 40, 5, 2.5, 1, null, now()::timestamp)")

    table = stage_table(data_lake)  # read-only: the script never migrates
    assert "| debate | 1 | 0 | 0 | 40 | - | - | - | 2.5 (100%) |" in table
    assert "predates the prefill columns" in table and "unknown (NULL)" in table

    request = LLMRequest(messages=(("user", "q"),), purpose="filter")
    append([CallRecord(request, LLMResult(key="new", text="x", tokens_in=30, tokens_out=4, prompt_computed=12,
                                          prompt_reused=18, decode_tokens=4, latency_s=1.0), 1),
            CallRecord(request, LLMResult(key="unknown", text="y", tokens_in=9, tokens_out=2, latency_s=0.5), 1)],
           profile="p", backend="llama_cpp", model="m", context="run-1", lake=location())
    calls = read_calls(location())
    assert set(ADDED_COLUMNS) <= set(calls.columns)
    by_key = {row["key"]: row for row in calls.iter_rows(named=True)}
    assert [by_key["old"][c] for c in PREFILL] == [None, None, None]  # never guessed
    assert [by_key["new"][c] for c in PREFILL] == [12, 18, 4]
    assert [by_key["unknown"][c] for c in PREFILL] == [None, None, None]
    # a second append finds the columns there: no schema change, rows keep coming
    append([CallRecord(request, LLMResult(key="later", text="z", prompt_computed=1, prompt_reused=0,
                                          decode_tokens=1), 1)], profile="p", backend="llama_cpp", model="m",
           context="run-1", lake=location())
    assert read_calls(location()).height == 4

    table = stage_table(data_lake)
    assert "| filter | 3 | 0 | 2 | 39 | 13 | 18 (58%) | 5 |" in table
    assert "| **total** | 4 | 0 | 2 |" in table
    assert "2 of 4 calls have no prefill measurement" in table
    assert "| filter | 3 |" in stage_table(data_lake, "--context", "run-1")
    assert "| debate |" not in stage_table(data_lake, "--context", "run-1")


def test_what_an_openai_compatible_server_reports_and_nothing_more():
    # llama.cpp's llama-server: timings
    assert reported_prefill({"usage": {"prompt_tokens": 50, "completion_tokens": 7},
                             "timings": {"prompt_n": 8, "cache_n": 42, "predicted_n": 7}}) == (8, 42, 7)
    # an older llama-server: prompt_n alone, the rest of the prompt was cached
    assert reported_prefill({"usage": {"prompt_tokens": 50, "completion_tokens": 7},
                             "timings": {"prompt_n": 8}}) == (8, 42, 7)
    # OpenAI, vLLM with prompt-token details: cached_tokens
    assert reported_prefill({"usage": {"prompt_tokens": 2000, "completion_tokens": 9,
                                       "prompt_tokens_details": {"cached_tokens": 1024}}}) == (976, 1024, 9)
    # llama-cpp-python's server, vLLM without details: what was reused is unknown
    assert reported_prefill({"usage": {"prompt_tokens": 50, "completion_tokens": 7}}) == (None, None, 7)
    assert reported_prefill({"usage": {"prompt_tokens": 50, "completion_tokens": 7,
                                       "prompt_tokens_details": None}}) == (None, None, 7)
    assert reported_prefill({}) == (None, None, None)


def test_http_calls_record_what_the_server_reported_summed_over_parse_retries(data_lake):
    """A first reply off the schema is asked again: the call's prefill is the sum of both
    attempts; a server that says nothing of its cache leaves it NULL."""
    def llama_server(index: int, body: dict):
        reply = completion("I think yes" if index == 0 else '{"response": "yes"}')
        reply["timings"] = {"prompt_n": 20 if index == 0 else 1, "cache_n": 0 if index == 0 else 19,
                            "predicted_n": 3}
        reply["usage"]["prompt_tokens"] = 20
        return 200, reply, 0

    with ScriptedServer(llama_server) as server:
        client = LLMClient(http_profile(server.url, concurrency=1))
        [result] = client.generate([client.request([("user", "is it?")], json_schema=YES_NO, purpose="judge")])
    assert result.ok and (result.prompt_computed, result.prompt_reused, result.decode_tokens) == (21, 19, 6)
    assert result.tokens_in == 40

    with ScriptedServer(lambda index, body: (200, completion('{"response": "no"}'), 0)) as server:
        client = LLMClient(http_profile(server.url, concurrency=1))
        [plain] = client.generate([client.request([("user", "is it not?")], json_schema=YES_NO, purpose="judge")])
    assert (plain.prompt_computed, plain.prompt_reused, plain.decode_tokens) == (None, None, 3)

    rows = {row["raw_reply"]: row for row in read_calls(location()).iter_rows(named=True)}
    assert [rows['{"response": "yes"}'][c] for c in PREFILL] == [21, 19, 6]
    assert [rows['{"response": "no"}'][c] for c in PREFILL] == [None, None, 3]
    assert json.loads(rows['{"response": "no"}']["request_json"])["purpose"] == "judge"


# --- the KV state cache (llm.llama_states.KVStateCache) --------------------------------------

SCORER = "You judge statements about geography. Answer with one word: yes or no, then say why in a few words."


def scored(statement: str) -> LLMRequest:
    return LLMRequest(messages=(("system", SCORER), ("user", statement)), max_tokens=5, top_logprobs=3)


def fresh(backend):
    """The backend's model with an empty KV cache and no kept state."""
    from bridge_assets.llm import llama_backend as backends

    with backends._LLAMA_LOCK:
        model = backend._model(logits_all=False)
        model.reset()
        if getattr(model, "_bridge_state_cache", None) is not None:
            model._bridge_state_cache.clear()
    return model


@pytest.fixture
def cached_backends(data_lake):
    """The 0.5B in-process, KV state cache off and on (8 MiB), sharing one loaded model."""
    pytest.importorskip("llama_cpp")
    from bridge_assets.llm.llama_backend import LlamaCppBackend

    profile = get_profile("qwen-0.5b")
    weights.provision(profile)
    off = LlamaCppBackend(profile.model_copy(update={"engine_args": {"state_cache_bytes": 0}}))
    on = LlamaCppBackend(profile.model_copy(update={"engine_args": {"state_cache_bytes": 8 << 20}}))
    return off, on


def test_a_prompt_continuing_a_cached_prefix_answers_as_computed_without_the_cache(cached_backends):
    off, on = cached_backends
    first = scored("Statement one: Paris is the capital of France. Is it true?")
    other = scored("Completely different: is the Nile in Africa?")
    again = scored("Statement one: Paris is the capital of France. Is it false?")

    fresh(off)  # without the cache, `again` after `other` reuses the system prompt only
    _, _, after_other = off.generate([first, other, again])

    model = fresh(on)
    a, _, continued = on.generate([first, other, again])
    states = model._bridge_state_cache
    assert states.restored == 1 and 0 < states.size <= 8 << 20
    # restored from `first`'s state: the statement's shared words were not computed again
    assert continued.prompt_reused > after_other.prompt_reused + 5
    assert continued.prompt_computed < after_other.prompt_computed
    assert continued.prompt_computed + continued.prompt_reused == continued.tokens_in

    fresh(off)  # without the cache the same prefix is reused only when `again` follows `first`
    a_off, direct = off.generate([first, again])
    assert (direct.prompt_computed, direct.prompt_reused) == (continued.prompt_computed, continued.prompt_reused)
    assert a_off.text == a.text and a_off.logprobs == a.logprobs
    assert direct.text == continued.text and direct.logprobs == continued.logprobs  # bit for bit

    fresh(off)  # from scratch: the whole prompt in one batch
    [scratch] = off.generate([again])
    assert scratch.prompt_reused == 0 and scratch.prompt_computed == scratch.tokens_in
    assert scratch.text == continued.text
    assert [t.token for t in scratch.logprobs] == [t.token for t in continued.logprobs]
    for ours, theirs in zip(continued.logprobs, scratch.logprobs, strict=True):
        # llama.cpp's CPU kernels round a prompt split in two batches (a reused prefix, with or
        # without this cache: `direct` is bit for bit the same) differently from one batch:
        # measured here up to 0.051 on a runner-up, 0.15 (2%) on a token at -7.5; the tokens equal
        assert ours.logprob == pytest.approx(theirs.logprob, abs=0.1)
        assert set(ours.top) == set(theirs.top)
        assert ours.top == pytest.approx(theirs.top, rel=0.05, abs=0.1)  # 2% at -7.5 measured


def test_the_state_cache_is_bounded_oldest_evicted_first(cached_backends):
    _, on = cached_backends
    model = fresh(on)
    statements = ["Is Oslo in Norway?", "Is Lima in Peru?", "Is Cairo in Egypt?"]
    [probe] = on.generate([scored(statements[0])])
    states = model._bridge_state_cache
    one_state = states.size
    assert len(states) == 1 and one_state / (probe.tokens_in + probe.tokens_out) > 1000  # KV rows, 24 layers

    on.state_cache_bytes = int(one_state * 1.5)  # room for one state of this size, not two
    try:
        for statement in statements[1:]:
            on.generate([scored(statement)])
            assert states.size <= on.state_cache_bytes and len(states) == 1
        assert states.evicted == 2
        [kept] = list(states._states)
        assert statements[-1].encode() in model.detokenize(list(kept))  # the newest is the one kept

        on.state_cache_bytes = 1  # a state larger than the whole bound is not kept
        on.generate([scored("Is Bern in Switzerland?")])
        assert len(states) == 0 and states.size == 0
    finally:
        on.state_cache_bytes = 8 << 20


def test_a_changed_model_or_weights_never_reuses_a_state(cached_backends):
    from bridge_assets.llm import llama_backend as backends
    from bridge_assets.llm.llama_backend import LlamaCppBackend
    from bridge_assets.llm.llama_states import state_cache

    _, on = cached_backends
    model = fresh(on)
    on.generate([scored("Is Oslo in Norway?")])
    states = model._bridge_state_cache
    assert len(states) == 1 and states.model_id == on.model_id and "sha256:" in on.model_id
    with backends._LLAMA_LOCK:  # the same loaded object asked for by other weights: emptied first
        assert len(state_cache(model, on.model_id.replace("sha256:", "sha256:0"), 8 << 20)) == 0

    on.generate([scored("Is Oslo in Norway?")])
    assert len(states) == 1
    # another model (here the same file at another context size) is another Llama object: the
    # first one is closed with its states, and the new one starts with none
    longer = LlamaCppBackend(on.profile.model_copy(update={"context_size": 1024}))
    [result] = longer.generate([scored("Is Oslo in Norway? Answer now.")])
    [new_model] = backends._LLAMA_MODELS.values()
    assert new_model is not model and len(states) == 0
    assert result.prompt_reused == 0 and new_model._bridge_state_cache.restored == 0


# --- decoding in lanes (llm.llama_lanes.DecodeLanes, engine_args.decode_lanes) -------------------

SCHEMA_STATEMENT = {"type": "object", "properties": {"response": {"type": "string", "enum": ["yes", "no"]}},
                    "required": ["response"], "additionalProperties": False}


def judged(statement: str) -> LLMRequest:
    return LLMRequest(messages=(("system", SYSTEM), ("user", statement)), max_tokens=8,
                      json_schema=SCHEMA_STATEMENT)


@pytest.fixture
def lane_backend(data_lake):
    """The 0.5B in-process decoding 4 greedy calls at a time, at a 512-token lane."""
    pytest.importorskip("llama_cpp")
    from bridge_assets.llm.llama_backend import LlamaCppBackend

    profile = get_profile("qwen-0.5b")
    weights.provision(profile)
    return LlamaCppBackend(profile.model_copy(update={"context_size": 512, "engine_args": {"decode_lanes": 4}}))


def fresh_lanes(backend) -> None:
    """The backend's lanes emptied: every lane starts with nothing to reuse."""
    from bridge_assets.llm import llama_backend as backends

    with backends._LLAMA_LOCK:
        model = backend._model(logits_all=False)
        if getattr(model, "_bridge_lanes", None) is not None:
            model._bridge_lanes.close()
            model._bridge_lanes = None


def test_a_reply_decoded_in_lanes_does_not_depend_on_its_neighbours_or_its_lane(lane_backend):
    """Every step is 4 rows wide whatever is left to decode (llama.cpp's CPU kernels round a
    4-row batch differently from a 1- or 2-row one: with steps only as wide as the calls still
    decoding, this test fails), and each lane has its own KV buffer."""
    probe = scored("Is Oslo in Norway?")
    neighbours = [judged("Is Lima in Peru?"), scored("Is Cairo in Egypt? Think of the Nile."),
                  LLMRequest(messages=(("user", "Name three colours."),), max_tokens=12)]

    fresh_lanes(lane_backend)  # the probe in lane 0, beside three calls
    first = lane_backend.generate([probe, *neighbours])
    fresh_lanes(lane_backend)  # in lane 0 beside one call and two idle lanes
    fewer = lane_backend.generate([probe, neighbours[2]])
    fresh_lanes(lane_backend)  # alone, in lane 0
    [alone] = lane_backend.generate([probe])
    fresh_lanes(lane_backend)  # in the last lane, behind other calls
    last = lane_backend.generate([neighbours[2], neighbours[0], neighbours[1], probe])

    replies = [first[0], fewer[0], alone, last[3]]
    assert all(r.ok and r.tokens_out > 0 and r.prompt_reused == 0 for r in replies)
    assert len({r.text for r in replies}) == 1
    assert all(r.logprobs == replies[0].logprobs for r in replies)  # bit for bit
    assert json.loads(first[1].text)["response"] in ("yes", "no")  # its grammar held in a lane
    assert json.loads(last[1].text) == json.loads(first[1].text)
    assert first[1].logprobs is None and len(replies[0].logprobs) == replies[0].tokens_out


def test_lanes_reuse_a_lanes_prefix_answer_the_rest_when_one_call_does_not_fit_and_record_each(lane_backend):
    statements = ["Is Oslo in Norway?", "Is Oslo in Sweden?", "Is Rome in Italy?", "Is Rome in Spain?"]
    requests = [scored(s) for s in statements]
    too_long = LLMRequest(messages=(("user", "word " * 600),), max_tokens=4)
    sampled = LLMRequest(messages=(("user", "Say a number."),), max_tokens=4, temperature=0.7, seed=1)
    client = LLMClient(lane_backend.profile)
    fresh_lanes(lane_backend)
    results = client.generate([*requests[:2], too_long, *requests[2:], sampled], context="lanes")

    # the 5 greedy calls dealt to the 4 lanes in order, in runs: [0], [1], [too long], [2, 3];
    # the sampled call one at a time. Rome in Spain follows Rome in Italy in its lane
    assert not results[2].ok and "context window of 512" in results[2].error
    answered = [r for i, r in enumerate(results) if i != 2]
    assert all(r.ok and r.tokens_out > 0 for r in answered), [r.error for r in answered]
    assert results[4].prompt_reused > results[3].prompt_reused == 0
    for r in answered[:4]:
        assert r.prompt_computed + r.prompt_reused == r.tokens_in and r.decode_tokens == r.tokens_out
    calls = read_calls(location())
    assert calls.height == 6 and calls["error"].drop_nulls().to_list() == [results[2].error]
    assert (calls.filter(calls["error"].is_null())["latency_s"] > 0).all()  # a lane step's time shared
