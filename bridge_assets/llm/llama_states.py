"""KVStateCache: a loaded model's recent KV states, for a prompt to continue from the longest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: llama.cpp and numpy load slowly
    import numpy as np
    from llama_cpp import Llama


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
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

    llama.cpp keeps one sequence in its KV cache: llama-cpp-python (and `greedy_with_logprobs`)
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
            shared = common_prefix(key, tokens)
            if shared > length:
                best, length = key, shared
        return best, length

    def restore(self, model: Llama, tokens: Sequence[int]) -> int:
        """Load into `model` the kept state that shares more of `tokens` than its live KV
        does; returns the tokens that state shares (0: nothing restored)."""
        import ctypes

        import llama_cpp

        key, shared = self.longest(tokens)
        if key is None or shared <= common_prefix(model._input_ids, tokens):
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


def state_cache(model: Llama, model_id: str, capacity_bytes: int) -> KVStateCache | None:
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
