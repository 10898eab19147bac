"""The in-process llama.cpp backend (local GGUF models): the model cache, the KV-state cache,
the JSON-schema grammar and the batched decode lanes behind `LlamaCppBackend`.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from bridge_assets.llm.backends import chat_messages, model_id, openai_logprobs
from bridge_assets.llm.ledger import call_key
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult, TokenLogprob

if TYPE_CHECKING:  # imported where used: llama.cpp, numpy and aiohttp load slowly
    import numpy as np
    from llama_cpp import Llama
    from llama_cpp.llama_types import CreateChatCompletionResponse



_LLAMA_MODELS: dict[tuple[str, int, int, bool], Llama] = {}
_LLAMA_LOCK = threading.Lock()


def _close_llama_models() -> None:
    for model in _LLAMA_MODELS.values():
        _CHAT_FORMATTERS.pop(id(model), None)
        if (states := getattr(model, "_bridge_state_cache", None)) is not None:
            states.clear()  # its KV states go with it
        if (lanes := getattr(model, "_bridge_lanes", None)) is not None:
            lanes.close()  # its lanes' context goes with it
        model.close()
    _LLAMA_MODELS.clear()


atexit.register(_close_llama_models)  # llama.cpp prints a harmless but noisy error otherwise


def release_local_models() -> None:
    """Close the resident in-process model, if any, for a step that needs its memory (a
    student's training); the next request loads it again (about a second from the page cache)."""
    with _LLAMA_LOCK:
        _close_llama_models()


def _llama(path: str, n_ctx: int, threads: int, logits_all: bool) -> Llama:
    """The loaded model of (file, context, logits mode), loaded on first use. Call with
    _LLAMA_LOCK held, and keep holding it while the model runs.

    One model is resident per process: asking for another closes the one loaded. Requests run
    one after another here anyway, so a second resident model only adds its memory (the 0.5B
    beside the 1.5B took the demo past 4 GiB), while loading again from the page cache takes
    about a second.

    llama-cpp-python returns log-probabilities only with `logits_all`, which makes every prompt
    token pay for the vocabulary projection and keeps an n_ctx x vocabulary score array (2.5 GB
    for Qwen at 4,096 tokens), so only sampled log-prob requests use that instance; greedy ones
    take `_greedy_with_logprobs` on the ordinary one.
    """
    key = (path, n_ctx, threads, logits_all)
    if key not in _LLAMA_MODELS:
        from llama_cpp import Llama

        _close_llama_models()

        _LLAMA_MODELS[key] = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, logits_all=logits_all, verbose=False)
    return _LLAMA_MODELS[key]


class _PrefillMeter:
    """What one call on a Llama actually evaluated, read from the model itself: the first
    `eval` of the call is the prompt's (llama-cpp-python's generate() and our greedy loop both
    evaluate the prompt's uncached suffix in one eval, every later eval is one decoded token),
    so the tokens it was given were computed and the `n_tokens` it found in the KV cache were
    reused (the prefix shared with the previous prompt, or a restored state). Wraps the
    instance's `eval` for the duration of the `with`; call with _LLAMA_LOCK held."""

    def __init__(self, model: Llama):
        self.model = model
        self.computed: int | None = None
        self.reused: int | None = None

    def __enter__(self) -> _PrefillMeter:
        model, original = self.model, type(self.model).eval

        def eval_(tokens: Sequence[int]) -> None:
            if self.computed is None:
                self.reused, self.computed = int(model.n_tokens), len(tokens)
            return original(model, tokens)

        setattr(model, "eval", eval_)  # the instance's attribute shadows the class's method
        return self

    def __exit__(self, *exc: object) -> None:
        del self.model.eval


def _common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """The length of the longest common prefix of two token sequences (numpy arrays or lists)."""
    import numpy as np

    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


class KVStateCache:
    """A bounded cache of one loaded model's KV states, so a prompt continues from the longest
    prefix it shares with any recent call, not only with the previous one.

    llama.cpp keeps one sequence in its KV cache: llama-cpp-python (and `_greedy_with_logprobs`)
    reuse the prefix the new prompt shares with the previous call only. This keeps, after each
    call, a copy of sequence 0's state (llama_state_seq_get_data: the KV rows of the tokens it
    holds, nothing else) keyed by those tokens; before a call whose prompt shares a longer
    prefix with a kept state than with the live one, that state is copied back
    (llama_state_seq_set_data) and the model evaluates only the rest. The bytes kept are at most
    `capacity_bytes` (least recently used states evicted first; a state larger than the whole
    capacity is not kept); a state whose tokens are a prefix of a newer state's is dropped (the
    newer covers every prompt it could serve).

    The cache lives on the Llama object (one per weights file, context size, threads and logits
    mode, closed with it) and is bound to the model id that filled it (weights hash included):
    another model id empties it first, so a changed model or weights never reuses a state.
    Only for models without `logits_all` (a restored state carries no per-position scores; the
    last prompt token is always evaluated again, so the logits used are fresh).
    """

    def __init__(self, capacity_bytes: int, model_id: str):
        self.capacity_bytes = int(capacity_bytes)
        self.model_id = model_id
        self._states: dict[tuple[int, ...], bytes] = {}  # insertion order = recency
        self.size = 0
        self.restored = 0  # calls that continued from a kept state
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._states)

    def bind(self, model_id: str, capacity_bytes: int) -> None:
        if model_id != self.model_id:
            self.clear()
            self.model_id = model_id
        self.capacity_bytes = int(capacity_bytes)
        self._evict()

    def clear(self) -> None:
        self._states.clear()
        self.size = 0

    def _evict(self) -> None:
        while self._states and self.size > self.capacity_bytes:
            oldest = next(iter(self._states))
            self.size -= len(self._states.pop(oldest))
            self.evicted += 1

    def longest(self, tokens: Sequence[int]) -> tuple[tuple[int, ...] | None, int]:
        """The kept state sharing the longest prefix with `tokens`, and that length."""
        best, length = None, 0
        for key in self._states:
            shared = _common_prefix(key, tokens)
            if shared > length:
                best, length = key, shared
        return best, length

    def restore(self, model: Llama, tokens: Sequence[int]) -> int:
        """Load into `model` the kept state that shares more of `tokens` than its live KV
        does; returns the tokens that state shares (0: nothing restored)."""
        import ctypes

        import llama_cpp

        key, shared = self.longest(tokens)
        if key is None or shared <= _common_prefix(model._input_ids, tokens):
            return 0
        data = self._states.pop(key)
        self._states[key] = data  # most recently used
        model._ctx.kv_cache_seq_rm(0, 0, -1)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if llama_cpp.llama_state_seq_set_data(model._ctx.ctx, buffer, len(data), 0) != len(data):
            model._ctx.kv_cache_seq_rm(0, 0, -1)
            model.reset()  # nothing half-restored is ever used: the prompt is computed whole
            return 0
        model.input_ids[:len(key)] = key
        model.n_tokens = len(key)
        model._requires_eval = True
        self.restored += 1
        return shared

    def save(self, model: Llama) -> None:
        """Keep the model's live state (the tokens it holds: the last prompt and its reply)."""
        import ctypes

        import llama_cpp

        key = tuple(int(t) for t in model._input_ids)
        if not key or key in self._states:
            return
        size = llama_cpp.llama_state_seq_get_size(model._ctx.ctx, 0)
        if size > self.capacity_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(model._ctx.ctx, buffer, size, 0)
        if not written or written > size:
            return
        for older in [k for k in self._states if len(k) < len(key) and key[:len(k)] == k]:
            self.size -= len(self._states.pop(older))
        data = bytes(memoryview(buffer)[:written])
        self._states[key] = data
        self.size += len(data)
        self._evict()


def _state_cache(model: Llama, model_id: str, capacity_bytes: int) -> KVStateCache | None:
    """The model's KV state cache (created on first use), or None when it is off (capacity 0)
    or the model keeps per-position logits."""
    if capacity_bytes <= 0 or model._logits_all:
        return None
    cache: KVStateCache | None = getattr(model, "_bridge_state_cache", None)
    if cache is None:  # kept on the Llama object: freed with it
        cache = KVStateCache(capacity_bytes, model_id)
        setattr(model, "_bridge_state_cache", cache)
    cache.bind(model_id, capacity_bytes)
    return cache


_CHAT_FORMATTERS: dict[int, Any] = {}  # id(Llama) -> its compiled chat template


def _prompt_tokens(model: Llama, request: LLMRequest) -> list[int]:
    """The tokens `create_chat_completion` would feed: the GGUF's own chat template."""
    if id(model) not in _CHAT_FORMATTERS:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        eos, bos = model.token_eos(), model.token_bos()
        _CHAT_FORMATTERS[id(model)] = Jinja2ChatFormatter(
            template=model.metadata["tokenizer.chat_template"],
            eos_token=model._model.token_get_text(eos) if eos != -1 else "",
            bos_token=model._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])
    prompt = _CHAT_FORMATTERS[id(model)](messages=chat_messages(request))
    return model.tokenize(prompt.prompt.encode("utf-8"), add_bos=not prompt.added_special, special=True)


# llama-cpp-python's JSON-schema converter lets a string hold any character but `"` and `\`,
# raw line breaks and tabs included, which JSON (and json.loads) forbids: a debate reply quoting
# a chunk's line break was valid for the grammar, rejected when read, and asked again at
# temperature 0 for the same reply (docs/llm-time.md). As in llama.cpp's own converter, the
# string's characters exclude the control characters U+0000-U+001F (escapes stay allowed).
_CONVERTER_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x00-\\x1F] |'


def json_grammar(schema: dict[str, Any]) -> str:
    """The GBNF grammar of a JSON schema, its strings as JSON defines them."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    lines = json_schema_to_gbnf(json.dumps(schema)).split("\n")
    for i, line in enumerate(lines):
        if line.startswith("char ::="):
            if not line.startswith(_CONVERTER_CHAR):
                raise ValueError(f"llama-cpp-python's JSON grammar has another string rule: {line[:80]}")
            lines[i] = _JSON_CHAR + line[len(_CONVERTER_CHAR):]
    return "\n".join(lines)


class _Grammar:
    """A JSON schema's grammar as a llama.cpp sampler, applied by hand in the greedy loop: the
    model's raw distribution gives the log-probabilities, the grammar only picks the token."""

    def __init__(self, model: Llama, schema: dict[str, Any]):
        import ctypes

        import llama_cpp
        from llama_cpp._internals import LlamaTokenDataArray

        self._llama_cpp, self._ctypes = llama_cpp, ctypes
        vocab = llama_cpp.llama_model_get_vocab(model.model)
        self._sampler = llama_cpp.llama_sampler_init_grammar(vocab, json_grammar(schema).encode(), b"root")
        if not self._sampler:
            raise ValueError("llama.cpp could not compile the JSON schema's grammar")
        self._all = LlamaTokenDataArray(n_vocab=model.n_vocab())
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)

    def choose(self, logits: np.ndarray) -> int:
        """The most likely token the grammar allows (the greedy token is tried alone first, as
        llama.cpp's own sampler does, because checking the whole vocabulary is slow)."""
        import numpy as np

        token = int(logits.argmax())
        # llama-cpp-python declares the field `id` as ctypes.c_int32; ctypes reads and writes an int
        self._one[0].id, self._one[0].logit, self._one[0].p = token, float(logits[token]), 0.0  # type: ignore[assignment]
        self._one_array.size, self._one_array.selected = 1, -1
        self._llama_cpp.llama_sampler_apply(self._sampler, self._ctypes.byref(self._one_array))
        if np.isfinite(self._one[0].logit):
            return token
        self._all.copy_logits(logits.astype(np.single))
        self._llama_cpp.llama_sampler_apply(self._sampler, self._ctypes.byref(self._all.candidates))
        allowed = self._all.candidates_data.logit
        if not np.isfinite(allowed.max()):
            raise ValueError("the grammar allows no token here")
        return int(self._all.candidates_data.id[int(allowed.argmax())])

    def accept(self, token: int) -> None:
        self._llama_cpp.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        self._llama_cpp.llama_sampler_free(self._sampler)


def _greedy_step(model: Llama, vocab: Any, logits: np.ndarray, grammar: _Grammar | None,
                 top_logprobs: int | None) -> tuple[int | None, TokenLogprob | None]:
    """One greedy token from the last position's logits: argmax, or under a JSON schema the most
    likely token its grammar allows (the grammar then accepts it), and, when asked, its top-k
    log-softmax entry. (None, None) at the end of generation. Both greedy loops use it (one
    sequence, `_greedy_with_logprobs`; several, `DecodeLanes`)."""
    import llama_cpp
    import numpy as np

    log_softmax = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    token = grammar.choose(logits) if grammar else int(log_softmax.argmax())
    if llama_cpp.llama_vocab_is_eog(vocab, token):
        return None, None
    if grammar:
        grammar.accept(token)
    if top_logprobs is None:
        return token, None
    top = np.argpartition(-log_softmax, top_logprobs)[:top_logprobs]
    top = top[np.argsort(-log_softmax[top])]

    def piece(t: int) -> str:
        return model.detokenize([t], special=False).decode("utf-8", errors="ignore")

    return token, TokenLogprob(token=piece(token), logprob=float(log_softmax[token]),
                               top={piece(int(t)): float(log_softmax[t]) for t in top})


def _stopped(text: str, stops: Sequence[str]) -> str | None:
    """`text` cut before the first stop string it holds; None when it holds none."""
    if not any(stop in text for stop in stops):
        return None
    return text[:min(text.index(stop) for stop in stops if stop in text)]


def _context_error(tokens: int, max_tokens: int, window: int) -> str | None:
    if tokens + max_tokens > window:
        return f"Requested tokens ({tokens + max_tokens}) exceed context window of {window}"
    return None


def _greedy_with_logprobs(model: Llama, request: LLMRequest) -> tuple[str, list[TokenLogprob], int, int]:
    """Greedy decoding that reads the log-probabilities from the last position's logits only.

    Same tokens as llama.cpp's greedy sampler (argmax; under the request's JSON schema, the most
    likely token its grammar allows) and the same top-k log-softmax values of the model's own
    distribution, without `logits_all`; the KV cache of the prefix shared with the previous
    prompt is reused, as llama-cpp-python's own generate() does. Returns text, log-probs,
    tokens in and out.
    """
    import llama_cpp
    import numpy as np

    tokens = _prompt_tokens(model, request)
    too_long = _context_error(len(tokens), request.max_tokens, model.n_ctx())
    if too_long:
        raise ValueError(too_long)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    n_vocab = model.n_vocab()
    grammar = _Grammar(model, request.json_schema) if request.json_schema is not None else None
    keep = min(model.longest_token_prefix(model._input_ids.tolist(), tokens), len(tokens) - 1)
    model.n_tokens = keep
    model.eval(tokens[keep:])
    generated: list[int] = []
    logprobs: list[TokenLogprob] = []
    text = ""
    try:
        for _ in range(request.max_tokens):
            logits = np.ctypeslib.as_array(model._ctx.get_logits_ith(-1), shape=(n_vocab,)).astype(np.float64)
            token, entry = _greedy_step(model, vocab, logits, grammar, request.top_logprobs)
            if token is None:
                break
            if entry is not None:
                logprobs.append(entry)
            generated.append(token)
            text = model.detokenize(generated, special=False).decode("utf-8", errors="ignore")
            cut = _stopped(text, request.stop)
            if cut is not None:
                text = cut
                break
            model.eval([token])
    finally:
        if grammar:
            grammar.close()
    return text, logprobs, len(tokens), len(generated)


class _Lane:
    """One sequence of DecodeLanes: the tokens its KV buffer holds, and the call it decodes."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.call: int | None = None
        self.next: int | None = None  # the token to decode at the next step


class _LaneCall:
    """A call in a lane: its prompt's tokens computed and reused, what it generated so far, its
    latest logits and its seconds (its prefill's, plus its share of each step it took part in)."""

    def __init__(self, request: LLMRequest, tokens_in: int, reused: int, grammar: _Grammar | None,
                 logits: np.ndarray, seconds: float) -> None:
        self.request, self.tokens_in, self.reused, self.grammar = request, tokens_in, reused, grammar
        self.computed = tokens_in - reused
        self.generated: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.text, self.logits, self.seconds = "", logits, seconds


class DecodeLanes:
    """Greedy decoding of several calls at once: `width` lanes, each one sequence with its own KV
    buffer in one llama.cpp context beside the model's own, every step one batch of `width` rows.

    On these CPUs decoding is bound by reading the weights, so a step of 4 rows costs little more
    than a step of 1 (docs/llm-time.md: 1.22 s a 40-token reply at width 4, 3.03 s alone, 1.5B).
    A batch rounds differently from a single row, so a reply can differ from the one-at-a-time
    reply; with a buffer per lane and every step the full width (an idle lane decodes a dummy
    row that is dropped again), a call's reply does not depend on which calls share its steps or
    which lane it takes (tests/test_llm_time.py). The calls are dealt to the lanes in order, in
    contiguous runs, and a lane's next call reuses the prefix its prompt shares with the lane's
    last (consecutive requests are often the same pair's agents); as one at a time, a reused
    prefix can move the low digits of what follows. Each lane holds `per_lane` tokens (the
    profile's context size), so the context's KV memory is `width` times the model's own
    (1.5B, 4 lanes of 4,096 tokens: about 450 MiB). The KV state cache is not used here.
    Call with _LLAMA_LOCK held."""

    def __init__(self, model: Llama, width: int, per_lane: int, threads: int):
        import llama_cpp
        from llama_cpp import _internals

        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = width * per_lane, 512, 512
        params.n_seq_max, params.kv_unified = width, False
        params.n_threads = params.n_threads_batch = threads
        self.model, self.width, self.per_lane = model, width, per_lane
        self.context = _internals.LlamaContext(model=model._model, params=params, verbose=False)
        self.batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
        self.lanes = [_Lane() for _ in range(width)]
        self.vocab = llama_cpp.llama_model_get_vocab(model.model)

    def close(self) -> None:
        self.context.close()
        self.batch.close()

    def _logits(self, row: int) -> np.ndarray:
        import numpy as np

        return np.ctypeslib.as_array(self.context.get_logits_ith(row),
                                     shape=(self.model.n_vocab(),)).astype(np.float64)

    def _prefill(self, k: int, tokens: list[int]) -> int:
        """Lane k's KV buffer set to `tokens`, keeping the prefix it already holds; returns the
        tokens reused. The last prompt token is always computed: its logits start the reply."""
        lane = self.lanes[k]
        keep = min(self.model.longest_token_prefix(lane.held, tokens), len(tokens) - 1)
        self.context.kv_cache_seq_rm(k, keep, -1)
        lane.held = lane.held[:keep]
        for at in range(keep, len(tokens), 512):
            self.batch.reset()
            self.batch.set_batch(tokens[at:at + 512], n_past=at, logits_all=False)
            for j in range(self.batch.batch.n_tokens):
                self.batch.batch.seq_id[j][0] = k
            self.context.decode(self.batch)
        lane.held = list(tokens)
        return keep

    def generate(self, requests: Sequence[LLMRequest]) -> list[tuple[_LaneCall | None, str | None]]:
        """(call, None) for each request answered, (None, error) for one that does not fit a lane."""
        n = len(requests)
        queues = [list(range(k * n // self.width, (k + 1) * n // self.width)) for k in range(self.width)]
        calls: dict[int, _LaneCall] = {}
        out: list[tuple[_LaneCall | None, str | None]] = [(None, None)] * n

        def finish(k: int) -> None:
            lane = self.lanes[k]
            i = lane.call
            assert i is not None  # finish and choose see a lane holding a call
            call = calls.pop(i)
            if call.grammar:
                call.grammar.close()
            out[i] = (call, None)
            lane.call = lane.next = None

        def choose(k: int) -> None:
            """Lane k's next token from its call's latest logits, or the call's end."""
            lane = self.lanes[k]
            assert lane.call is not None
            call = calls[lane.call]
            token, entry = _greedy_step(self.model, self.vocab, call.logits, call.grammar,
                                        call.request.top_logprobs)
            if token is None:
                return finish(k)
            if entry is not None:
                call.logprobs.append(entry)
            call.generated.append(token)
            call.text = self.model.detokenize(call.generated, special=False).decode("utf-8", errors="ignore")
            cut = _stopped(call.text, call.request.stop)
            if cut is not None or len(call.generated) == call.request.max_tokens:
                call.text = call.text if cut is None else cut
                return finish(k)
            lane.next = token

        def start(k: int, i: int) -> None:
            started, request = time.perf_counter(), requests[i]
            tokens = _prompt_tokens(self.model, request)
            too_long = _context_error(len(tokens), request.max_tokens, self.per_lane)
            if too_long:
                out[i] = (None, too_long)
                return
            reused = self._prefill(k, tokens)
            logits = self._logits(self.batch.batch.n_tokens - 1)
            grammar = _Grammar(self.model, request.json_schema) if request.json_schema is not None else None
            calls[i] = _LaneCall(request, len(tokens), reused, grammar, logits, time.perf_counter() - started)
            self.lanes[k].call = i
            choose(k)

        try:
            while True:
                for k, lane in enumerate(self.lanes):
                    while lane.call is None and queues[k]:
                        start(k, queues[k].pop(0))
                decoding = [k for k, lane in enumerate(self.lanes) if lane.next is not None]
                if not decoding:
                    return out
                started = time.perf_counter()
                self.batch.reset()
                rows = self.batch.batch
                rows.n_tokens = self.width  # always the full width: a reply never depends on its neighbours
                for k, lane in enumerate(self.lanes):
                    rows.token[k] = lane.next if lane.next is not None else 0
                    rows.pos[k], rows.n_seq_id[k], rows.logits[k] = len(lane.held), 1, True
                    rows.seq_id[k][0] = k
                self.context.decode(self.batch)
                share = (time.perf_counter() - started) / len(decoding)
                for k, lane in enumerate(self.lanes):
                    if lane.next is None:  # an idle lane's dummy row is dropped again
                        self.context.kv_cache_seq_rm(k, len(lane.held), -1)
                        continue
                    lane.held.append(lane.next)
                    assert lane.call is not None  # a lane with a next token holds a call
                    call = calls[lane.call]
                    call.logits, call.seconds = self._logits(k), call.seconds + share
                    lane.next = None
                    choose(k)
        finally:
            for call in calls.values():  # an exception mid-way: no grammar left behind
                if call.grammar:
                    call.grammar.close()
            if calls:  # and no lane left holding a call
                for lane in self.lanes:
                    lane.call = lane.next = None


def _decode_lanes(model: Llama, width: int, per_lane: int, threads: int) -> DecodeLanes:
    """The model's DecodeLanes of this shape, made on first use and freed with the model."""
    lanes: DecodeLanes | None = getattr(model, "_bridge_lanes", None)
    if lanes is None or (lanes.width, lanes.per_lane) != (width, per_lane):
        if lanes is not None:
            lanes.close()
        lanes = DecodeLanes(model, width, per_lane, threads)
        setattr(model, "_bridge_lanes", lanes)  # kept on the Llama object: freed with it
    return lanes


# KVStateCache's default bound for llama_cpp profiles that do not set engine_args.state_cache_bytes
# (0: off; docs/llm-time.md has the measurement).
STATE_CACHE_BYTES = 0


class LlamaCppBackend:
    """llama-cpp-python in this process: the CPU default. Requests run one after another.
    A profile's `engine_args: {state_cache_bytes: N}` keeps up to N bytes of KV states
    (KVStateCache), so a prompt continues from the longest prefix of any recent call;
    `engine_args: {decode_lanes: W}` (W >= 2) decodes the greedy requests of a batch W at a
    time (DecodeLanes; off by default: its replies can differ from one-at-a-time decoding, so
    it becomes a default only once the gold set says it labels no worse, docs/llm-time.md)."""

    name = "llama_cpp"

    def __init__(self, profile: ModelProfile):
        self.profile = profile
        self.model_id = model_id(profile)
        # the KV state cache's bound: the profile's engine_args.state_cache_bytes (0: off)
        self.state_cache_bytes = int(profile.engine_args.get("state_cache_bytes", STATE_CACHE_BYTES))

    def _model(self, logits_all: bool) -> Llama:
        """This profile's model; call with _LLAMA_LOCK held (another profile may close it)."""
        from bridge_assets.llm.weights import provision

        path = str(provision(self.profile).path)
        return _llama(path, self.profile.context_size, self._threads(), logits_all)

    def _threads(self) -> int:
        return self.profile.threads or os.cpu_count() or 1

    def _states(self, model: Llama, request: LLMRequest) -> KVStateCache | None:
        """The model's KV state cache, with the state sharing the longest prefix with the
        request's prompt restored (when it shares more than the live one); None when off."""
        states = _state_cache(model, self.model_id, self.state_cache_bytes)
        if states is not None:
            states.restore(model, _prompt_tokens(model, request))
        return states

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if self.profile.decode_lanes < 2:
            return [self._one(request) for request in requests]
        # with lanes on, every greedy request takes them, alone or not: a reply does not depend
        # on which calls share its steps
        greedy = [i for i, request in enumerate(requests) if request.temperature == 0]
        results: list[LLMResult | None] = [None] * len(requests)
        for i, result in zip(greedy, self._in_lanes([requests[i] for i in greedy]), strict=True):
            results[i] = result
        return [result if result is not None else self._one(request)
                for result, request in zip(results, requests, strict=True)]

    def _in_lanes(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if not requests:
            return []
        started = time.perf_counter()
        try:
            with _LLAMA_LOCK:
                model = self._model(logits_all=False)
                lanes = _decode_lanes(model, self.profile.decode_lanes, self.profile.context_size, self._threads())
                answered = lanes.generate(requests)
        except ValueError as exc:  # e.g. the grammar of a schema llama.cpp cannot compile
            failed = time.perf_counter() - started
            return [LLMResult(key=call_key(self.name, self.model_id, request), error=f"llama.cpp: {exc}",
                              latency_s=failed / len(requests)) for request in requests]
        results = []
        for request, (call, error) in zip(requests, answered, strict=True):
            key = call_key(self.name, self.model_id, request)
            if call is None:
                results.append(LLMResult(key=key, error=f"llama.cpp: {error}"))
                continue
            results.append(LLMResult(
                key=key, text=call.text, logprobs=call.logprobs if request.top_logprobs is not None else None,
                tokens_in=call.tokens_in, tokens_out=len(call.generated), prompt_computed=call.computed,
                prompt_reused=call.reused, decode_tokens=len(call.generated), latency_s=call.seconds))
        return results

    def _one(self, request: LLMRequest) -> LLMResult:
        key = call_key(self.name, self.model_id, request)
        if request.top_logprobs is not None and request.temperature == 0:
            return self._greedy_logprobs(key, request)
        kwargs: dict[str, Any] = dict(
            messages=chat_messages(request), max_tokens=request.max_tokens,
            temperature=request.temperature, seed=request.seed, stop=list(request.stop) or None,
            repeat_penalty=1.0)  # no repetition penalty: the OpenAI/vLLM default
        if request.json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": request.json_schema}
        if request.top_logprobs is not None:
            kwargs.update(logprobs=True, top_logprobs=request.top_logprobs)
        started = time.perf_counter()
        try:
            with _LLAMA_LOCK:  # a Llama object is not thread-safe, and one is resident at a time
                model = self._model(logits_all=request.top_logprobs is not None)
                states = self._states(model, request)
                with _PrefillMeter(model) as meter:
                    # not streamed (no `stream` in kwargs): one response, not an iterator of chunks
                    reply = cast("CreateChatCompletionResponse", model.create_chat_completion(**kwargs))
                if states is not None:
                    states.save(model)
        except ValueError as exc:  # e.g. the prompt does not fit the context window
            return LLMResult(key=key, error=f"llama.cpp: {exc}",
                             latency_s=time.perf_counter() - started)
        choice = reply["choices"][0]
        usage = reply.get("usage") or {}
        choice_logprobs = choice.get("logprobs")
        return LLMResult(
            key=key, text=choice["message"].get("content") or "",
            logprobs=openai_logprobs(choice_logprobs.get("content") if choice_logprobs else None)
            if request.top_logprobs is not None else None,
            tokens_in=usage.get("prompt_tokens", 0), tokens_out=usage.get("completion_tokens", 0),
            prompt_computed=meter.computed, prompt_reused=meter.reused,
            decode_tokens=usage.get("completion_tokens"),
            latency_s=time.perf_counter() - started)

    def _greedy_logprobs(self, key: str, request: LLMRequest) -> LLMResult:
        started = time.perf_counter()
        try:
            with _LLAMA_LOCK:
                model = self._model(logits_all=False)
                states = self._states(model, request)
                with _PrefillMeter(model) as meter:
                    text, logprobs, tokens_in, tokens_out = _greedy_with_logprobs(model, request)
                if states is not None:
                    states.save(model)
        except ValueError as exc:
            return LLMResult(key=key, error=f"llama.cpp: {exc}", latency_s=time.perf_counter() - started)
        return LLMResult(key=key, text=text, logprobs=logprobs, tokens_in=tokens_in,
                         tokens_out=tokens_out, prompt_computed=meter.computed, prompt_reused=meter.reused,
                         decode_tokens=tokens_out, latency_s=time.perf_counter() - started)

    def close(self) -> None:
        """Models stay loaded for the process (loading is the slow part); closed at exit."""
