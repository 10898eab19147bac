"""DecodeLanes: greedy decoding of several calls at once, each lane its own KV buffer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge_assets.llm.llama_greedy import Grammar, context_error, greedy_step, prompt_tokens, stopped
from bridge_assets.llm.types import LLMRequest, TokenLogprob

if TYPE_CHECKING:  # imported where used: llama.cpp and numpy load slowly
    import numpy as np
    from llama_cpp import Llama


class _Lane:
    """One sequence of DecodeLanes: the tokens its KV buffer holds, and the call it decodes."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.call: int | None = None
        self.next: int | None = None  # the token to decode at the next step


class _LaneCall:
    """A call in a lane: its prompt's tokens computed and reused, what it generated so far, its
    latest logits and its seconds (its prefill's, plus its share of each step it took part in)."""

    def __init__(self, request: LLMRequest, tokens_in: int, reused: int, grammar: Grammar | None,
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
            token, entry = greedy_step(self.model, self.vocab, call.logits, call.grammar,
                                        call.request.top_logprobs)
            if token is None:
                return finish(k)
            if entry is not None:
                call.logprobs.append(entry)
            call.generated.append(token)
            call.text = self.model.detokenize(call.generated, special=False).decode("utf-8", errors="ignore")
            cut = stopped(call.text, call.request.stop)
            if cut is not None or len(call.generated) == call.request.max_tokens:
                call.text = call.text if cut is None else cut
                return finish(k)
            lane.next = token

        def start(k: int, i: int) -> None:
            started, request = time.perf_counter(), requests[i]
            tokens = prompt_tokens(self.model, request)
            too_long = context_error(len(tokens), request.max_tokens, self.per_lane)
            if too_long:
                out[i] = (None, too_long)
                return
            reused = self._prefill(k, tokens)
            logits = self._logits(self.batch.batch.n_tokens - 1)
            grammar = Grammar(self.model, request.json_schema) if request.json_schema is not None else None
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
                share = self._step() / len(decoding)
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
            self._abandon(calls)

    def _step(self) -> float:
        """One decode step of every lane, its seconds: each lane's next token (always the full
        width: a reply never depends on its neighbours; an idle lane's row is a dummy)."""
        started = time.perf_counter()
        self.batch.reset()
        rows = self.batch.batch
        rows.n_tokens = self.width
        for k, lane in enumerate(self.lanes):
            rows.token[k] = lane.next if lane.next is not None else 0
            rows.pos[k], rows.n_seq_id[k], rows.logits[k] = len(lane.held), 1, True
            rows.seq_id[k][0] = k
        self.context.decode(self.batch)
        return time.perf_counter() - started

    def _abandon(self, calls: dict[int, _LaneCall]) -> None:
        """After an exception mid-way: no grammar left behind, and no lane left holding a call."""
        for call in calls.values():
            if call.grammar:
                call.grammar.close()
        if calls:
            for lane in self.lanes:
                lane.call = lane.next = None


def decode_lanes(model: Llama, width: int, per_lane: int, threads: int) -> DecodeLanes:
    """The model's DecodeLanes of this shape, made on first use and freed with the model."""
    lanes: DecodeLanes | None = getattr(model, "_bridge_lanes", None)
    if lanes is None or (lanes.width, lanes.per_lane) != (width, per_lane):
        if lanes is not None:
            lanes.close()
        lanes = DecodeLanes(model, width, per_lane, threads)
        setattr(model, "_bridge_lanes", lanes)  # kept on the Llama object: freed with it
    return lanes
