"""The in-process vLLM backend (the optional `gpu` extra): `VLLMBackend`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bridge_assets.llm.backends import BackendUnavailable, chat_messages, model_id, token_count
from bridge_assets.llm.ledger import call_key
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult, TokenLogprob

if TYPE_CHECKING:  # imported where used: llama.cpp, numpy and aiohttp load slowly
    pass



class VLLMBackend:
    """vLLM in this process (CUDA GPU). The whole batch goes to the engine at once."""

    name = "vllm"

    def __init__(self, profile: ModelProfile):
        try:
            import vllm
        except ImportError:
            raise BackendUnavailable(
                f"profile '{profile.name}' uses the vllm backend, but vllm is not installed: "
                "pip install 'bridge-assets[gpu]' on a machine with a CUDA GPU, or serve the model "
                "with `vllm serve` and use an openai profile") from None
        self.profile = profile
        self.model_id = model_id(profile)
        self._vllm = vllm
        self._engine: Any = None  # a vllm.LLM (vllm, an optional extra, is not installed here)

    def _llm(self) -> Any:
        if self._engine is None:
            self._engine = self._vllm.LLM(model=self.profile.model, max_model_len=self.profile.context_size,
                                          seed=0, **self.profile.engine_args)
        return self._engine

    def _sampling(self, request: LLMRequest) -> Any:
        from vllm import SamplingParams

        extra: dict[str, Any] = {}
        if request.json_schema is not None:
            try:  # vLLM >= 0.11
                from vllm.sampling_params import StructuredOutputsParams
                extra["structured_outputs"] = StructuredOutputsParams(json=request.json_schema)
            except ImportError:  # older vLLM names it guided decoding
                from vllm.sampling_params import GuidedDecodingParams
                extra["guided_decoding"] = GuidedDecodingParams(json=request.json_schema)
        return SamplingParams(temperature=request.temperature, max_tokens=request.max_tokens,
                              stop=list(request.stop) or None, seed=request.seed,
                              logprobs=request.top_logprobs, **extra)

    @staticmethod
    def _logprobs(completion: Any) -> list[TokenLogprob] | None:
        if completion.logprobs is None:
            return None
        tokens = []
        for token_id, alternatives in zip(completion.token_ids, completion.logprobs):
            chosen = alternatives[token_id]
            tokens.append(TokenLogprob(
                token=chosen.decoded_token or "", logprob=chosen.logprob,
                top={(alt.decoded_token or ""): alt.logprob for alt in alternatives.values()}))
        return tokens

    @staticmethod
    def _prefill(output: Any) -> tuple[int | None, int | None]:
        """Prompt tokens computed and reused (vLLM's prefix cache), where this vLLM reports it."""
        cached = token_count(getattr(output, "num_cached_tokens", None))
        prompt = len(output.prompt_token_ids or [])
        if cached is None or cached > prompt:
            return None, None
        return prompt - cached, cached

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        keys = [call_key(self.name, self.model_id, r) for r in requests]
        started = time.perf_counter()
        try:
            outputs = self._llm().chat([chat_messages(r) for r in requests],
                                       sampling_params=[self._sampling(r) for r in requests],
                                       use_tqdm=False)
        except Exception as exc:  # the engine failed the whole batch: every call is failed
            elapsed = time.perf_counter() - started
            return [LLMResult(key=k, error=f"vllm: {type(exc).__name__}: {exc}", latency_s=elapsed)
                    for k in keys]
        share = (time.perf_counter() - started) / max(len(requests), 1)  # batch time, shared out
        results = []
        for key, output in zip(keys, outputs):
            completion = output.outputs[0]
            computed, reused = self._prefill(output)
            results.append(LLMResult(
                key=key, text=completion.text, logprobs=self._logprobs(completion),
                tokens_in=len(output.prompt_token_ids or []), tokens_out=len(completion.token_ids),
                prompt_computed=computed, prompt_reused=reused, decode_tokens=len(completion.token_ids),
                latency_s=share))
        return results

    def close(self) -> None:
        self._engine = None
