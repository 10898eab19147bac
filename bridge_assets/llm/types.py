"""The LLM layer's data types: what every backend takes and returns.

One interface for all backends (in-process llama.cpp, OpenAI-compatible HTTP, in-process
vLLM): `LLMClient.generate(requests) -> results`, batched, cached in the DuckDB call ledger.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LLMRequest(BaseModel):
    """One chat completion to make. Everything here is part of the call's cache key."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[tuple[str, str], ...]  # ((role, content), ...): system/user/assistant
    json_schema: dict[str, Any] | None = None  # structured output where the backend supports it
    max_tokens: int = 256
    temperature: float = 0.0
    top_logprobs: int | None = None  # ask for token log-probabilities (P(yes) scorers)
    stop: tuple[str, ...] = ()
    seed: int = 0
    purpose: str = ""  # e.g. "filter", "debate", "hyde": recorded, not part of the key


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    top: dict[str, float] = Field(default_factory=dict)  # alternative token -> logprob


class LLMResult(BaseModel):
    """One completion's outcome. `error` is set (and `text` may be empty) when it failed."""

    key: str
    text: str = ""
    parsed: dict[str, Any] | None = None  # the JSON object when a schema was requested
    logprobs: list[TokenLogprob] | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    # Where the prompt's time went, as the backend measured or reported it (None: unknown, never
    # guessed): prompt tokens evaluated by this call (prefill), prompt tokens taken from the KV
    # cache (a prefix shared with an earlier prompt), and tokens decoded (the completion).
    prompt_computed: int | None = None
    prompt_reused: int | None = None
    decode_tokens: int | None = None
    latency_s: float = 0.0
    error: str | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None
