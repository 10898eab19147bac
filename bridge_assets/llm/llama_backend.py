"""The in-process llama.cpp backend (local GGUF models): the model cache and `LlamaCppBackend`.

Its parts: the KV-state cache (llama_states.py), the grammar and the one-sequence greedy loop
(llama_greedy.py) and the batched decode lanes (llama_lanes.py).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from bridge_assets.llm.backends import chat_messages, model_id, openai_logprobs
from bridge_assets.llm.ledger import call_key
from bridge_assets.llm.llama_greedy import forget_chat_template, greedy_with_logprobs, prompt_tokens
from bridge_assets.llm.llama_lanes import decode_lanes
from bridge_assets.llm.llama_states import KVStateCache, state_cache
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult

if TYPE_CHECKING:  # imported where used: llama.cpp, numpy and aiohttp load slowly
    from llama_cpp import Llama
    from llama_cpp.llama_types import CreateChatCompletionResponse


_LLAMA_MODELS: dict[tuple[str, int, int, bool], Llama] = {}
_LLAMA_LOCK = threading.Lock()


def _close_llama_models() -> None:
    for model in _LLAMA_MODELS.values():
        forget_chat_template(model)
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
    take `greedy_with_logprobs` on the ordinary one.
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
        states = state_cache(model, self.model_id, self.state_cache_bytes)
        if states is not None:
            states.restore(model, prompt_tokens(model, request))
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
                lanes = decode_lanes(model, self.profile.decode_lanes, self.profile.context_size, self._threads())
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
                    text, logprobs, tokens_in, tokens_out = greedy_with_logprobs(model, request)
                if states is not None:
                    states.save(model)
        except ValueError as exc:
            return LLMResult(key=key, error=f"llama.cpp: {exc}", latency_s=time.perf_counter() - started)
        return LLMResult(key=key, text=text, logprobs=logprobs, tokens_in=tokens_in,
                         tokens_out=tokens_out, prompt_computed=meter.computed, prompt_reused=meter.reused,
                         decode_tokens=tokens_out, latency_s=time.perf_counter() - started)

    def close(self) -> None:
        """Models stay loaded for the process (loading is the slow part); closed at exit."""
