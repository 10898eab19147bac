"""LLM backends behind one batched interface: `generate(requests) -> results`.

A backend only talks to the model: it returns the raw text (and log-probabilities, token
counts, latency) of each request, or the error that stopped it after its own transport
retries. Parsing, parse retries and the call ledger belong to `LLMClient`. One module per
engine: llama_backend (in-process llama.cpp), http_backend (OpenAI-compatible servers),
vllm_backend (in-process vLLM); `make_backend` picks the profile's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bridge_assets.errors import BridgeError
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult, TokenLogprob

if TYPE_CHECKING:  # imported where used: llama.cpp, numpy and aiohttp load slowly
    pass



class BackendUnavailable(BridgeError, RuntimeError):
    """A backend's library is not installed, or the profile cannot run on this machine."""


class Backend(Protocol):
    name: str      # "llama_cpp" | "openai" | "vllm": part of the cache key
    model_id: str  # the model as the cache key sees it

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]: ...

    def close(self) -> None: ...


def model_id(profile: ModelProfile) -> str:
    """The profile's model plus, for local weights, their hash: new weights = new cache keys."""
    return f"{profile.model}@sha256:{profile.weights.sha256}" if profile.weights else profile.model


def chat_messages(request: LLMRequest) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in request.messages]


def openai_logprobs(content: Sequence[Mapping[str, Any]] | None) -> list[TokenLogprob] | None:
    """OpenAI's `choices[0].logprobs.content` (llama.cpp uses the same shape) as TokenLogprobs."""
    if content is None:
        return None
    return [TokenLogprob(token=item["token"], logprob=item["logprob"],
                         top={alt["token"]: alt["logprob"] for alt in item.get("top_logprobs") or []})
            for item in content]


def token_count(value: Any) -> int | None:
    """A token count an engine or server reports, or None where it reports none (or nonsense)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def make_backend(profile: ModelProfile) -> Backend:
    """The backend of the profile's engine (each imported when first used: they load slowly)."""
    if profile.backend == "llama_cpp":
        from bridge_assets.llm.llama_backend import LlamaCppBackend

        return LlamaCppBackend(profile)
    if profile.backend == "openai":
        from bridge_assets.llm.http_backend import OpenAIHTTPBackend

        return OpenAIHTTPBackend(profile)
    from bridge_assets.llm.vllm_backend import VLLMBackend

    return VLLMBackend(profile)
