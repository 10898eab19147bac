"""The OpenAI-compatible HTTP backend (vLLM, SGLang, llama.cpp's server, hosted APIs):
`OpenAIHTTPBackend`, its transport retries and the usage it reports.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from bridge_assets.errors import BridgeError
from bridge_assets.llm.backends import chat_messages, model_id, openai_logprobs, token_count
from bridge_assets.llm.ledger import call_key
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult

if TYPE_CHECKING:  # imported where used: llama.cpp, numpy and aiohttp load slowly
    import aiohttp



class HTTPStatusFailure(BridgeError):
    """A reply with an error status; 429 and 5xx are worth retrying, other 4xx are not."""

    def __init__(self, response: httpx.Response | None = None, *, status: int = 0, url: str = "", text: str = ""):
        if response is not None:
            status, url, text = response.status_code, str(response.request.url), response.text
        self.retryable = status == 429 or status >= 500
        super().__init__(f"HTTP {status} from {url}: {text[:300]}")


def _transient(exc: BaseException) -> bool:
    import aiohttp

    return isinstance(exc, (httpx.TransportError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                            TimeoutError)) or (isinstance(exc, HTTPStatusFailure) and exc.retryable)


def response_format(style: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    if style == "json_object_schema":  # llama.cpp's server, llama-cpp-python's server
        return {"type": "json_object", "schema": schema}
    if style == "json_schema":  # OpenAI, vLLM, SGLang
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    return None


def reported_prefill(payload: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens computed, prompt tokens reused from the cache, tokens decoded) as an
    OpenAI-compatible server reported them; None where it did not say.

    llama.cpp's `llama-server` adds `timings` (prompt_n: prompt tokens evaluated, cache_n:
    taken from the cache, predicted_n: decoded); OpenAI, vLLM (with prompt-token details on)
    and newer llama-servers give `usage.prompt_tokens_details.cached_tokens`, the rest of
    `prompt_tokens` being computed; llama-cpp-python's server gives only prompt_tokens and
    completion_tokens, so what it reused stays unknown."""
    usage = payload.get("usage") or {}
    timings = payload.get("timings") or {}
    decoded = token_count(timings.get("predicted_n"))
    if decoded is None:
        decoded = token_count(usage.get("completion_tokens"))
    computed, reused = token_count(timings.get("prompt_n")), token_count(timings.get("cache_n"))
    if computed is None and reused is None:
        reused = token_count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    prompt = token_count(usage.get("prompt_tokens"))
    if prompt is not None:  # the other half of the prompt, where one half was reported
        if computed is None and reused is not None and reused <= prompt:
            computed = prompt - reused
        elif reused is None and computed is not None and computed <= prompt:
            reused = prompt - computed
    return computed, reused, decoded


class OpenAIHTTPBackend:
    """Any OpenAI-compatible chat-completions server, over httpx.

    Up to `concurrency` requests in flight; each retried with exponential backoff on timeouts,
    connection errors, HTTP 429 and 5xx; successive attempts and successive requests rotate
    over `base_urls`, so one dead replica only slows things down. A batch is sent from one
    asyncio event loop (a thread of its own, kept across batches): 64 threads fighting for the
    GIL managed 500 requests/s against an instant server; aiohttp on the loop, 5,000 (httpx's
    async client: 230). A single request goes through httpx.
    """

    name = "openai"

    def __init__(self, profile: ModelProfile):
        self.profile = profile
        self.model_id = model_id(profile)
        self._urls = [u.rstrip("/") for u in profile.base_urls]
        self._next_url = itertools.count()
        headers = {}
        if profile.api_key_env and os.environ.get(profile.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[profile.api_key_env]}"
        self._headers = headers
        self._timeout = httpx.Timeout(profile.timeout_s, connect=min(10.0, profile.timeout_s))
        self._http = httpx.Client(headers=headers, timeout=self._timeout,
                                  limits=httpx.Limits(max_connections=profile.concurrency))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None  # created on the loop
        self._loop_lock = threading.Lock()

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.profile.model, "messages": chat_messages(request),
                                "max_tokens": request.max_tokens, "temperature": request.temperature,
                                "seed": request.seed}
        if request.stop:
            body["stop"] = list(request.stop)
        if request.json_schema is not None:
            fmt = response_format(self.profile.structured_output, request.json_schema)
            if fmt is not None:
                body["response_format"] = fmt
        if request.top_logprobs is not None:
            body.update(logprobs=True, top_logprobs=request.top_logprobs)
        return body

    def _post(self, first_url: int, body: dict[str, Any]) -> dict[str, Any]:
        url_index = itertools.count(first_url)  # each retry goes to the next base URL

        def attempt() -> dict[str, Any]:
            url = self._urls[next(url_index) % len(self._urls)]
            response = self._http.post(f"{url}/chat/completions", json=body)
            if response.status_code >= 400:
                raise HTTPStatusFailure(response)
            return response.json()

        return Retrying(stop=stop_after_attempt(self.profile.retries + 1),
                        wait=wait_exponential(multiplier=self.profile.backoff_s, max=30),
                        retry=retry_if_exception(_transient), reraise=True)(attempt)

    async def _apost(self, first_url: int, body: dict[str, Any]) -> dict[str, Any]:
        """_post on the event loop: the same retries, waits and rotation over base_urls."""
        url_index = itertools.count(first_url)
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.profile.retries + 1),
                                           wait=wait_exponential(multiplier=self.profile.backoff_s, max=30),
                                           retry=retry_if_exception(_transient), reraise=True):
            with attempt:
                assert self._session is not None  # _agenerate made it
                url = f"{self._urls[next(url_index) % len(self._urls)]}/chat/completions"
                async with self._session.post(url, json=body) as response:
                    text = await response.text()
                    if response.status >= 400:
                        raise HTTPStatusFailure(status=response.status, url=url, text=text)
                    return json.loads(text)
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    def _result(self, key: str, request: LLMRequest, payload: dict[str, Any] | None,
                error: Exception | None, started: float) -> LLMResult:
        try:
            if error is not None:
                raise error
            assert payload is not None  # no error: the server's reply
            choice = payload["choices"][0]
            text = choice["message"]["content"]
            if text is None:
                raise ValueError(f"the server's reply has no message content: {str(payload)[:300]}")
        except Exception as exc:  # recorded on the call, which counts as failed
            return LLMResult(key=key, error=f"{type(exc).__name__}: {exc}",
                             latency_s=time.perf_counter() - started)
        usage = payload.get("usage") or {}
        computed, reused, decoded = reported_prefill(payload)
        return LLMResult(
            key=key, text=text,
            logprobs=openai_logprobs((choice.get("logprobs") or {}).get("content"))
            if request.top_logprobs is not None else None,
            tokens_in=usage.get("prompt_tokens") or 0, tokens_out=usage.get("completion_tokens") or 0,
            prompt_computed=computed, prompt_reused=reused, decode_tokens=decoded,
            latency_s=time.perf_counter() - started)

    def _one(self, request: LLMRequest) -> LLMResult:
        key = call_key(self.name, self.model_id, request)
        started = time.perf_counter()
        try:
            payload, error = self._post(next(self._next_url), self._body(request)), None
        except Exception as exc:
            payload, error = None, exc
        return self._result(key, request, payload, error, started)

    async def _aone(self, request: LLMRequest, slots: asyncio.Semaphore) -> LLMResult:
        key = call_key(self.name, self.model_id, request)
        body = self._body(request)
        async with slots:
            started = time.perf_counter()
            try:
                payload, error = await self._apost(next(self._next_url), body), None
            except Exception as exc:
                payload, error = None, exc
        return self._result(key, request, payload, error, started)

    async def _agenerate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if self._session is None:  # created on the loop that uses it
            import aiohttp

            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(limit=self.profile.concurrency),
                timeout=aiohttp.ClientTimeout(total=self.profile.timeout_s,
                                              connect=min(10.0, self.profile.timeout_s)))
        slots = asyncio.Semaphore(self.profile.concurrency)
        return list(await asyncio.gather(*(self._aone(r, slots) for r in requests)))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever, name="llm-http",
                                                     daemon=True)
                self._loop_thread.start()
                atexit.register(self.close)  # close the session even when nobody calls close()
            return self._loop

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if len(requests) <= 1 or self.profile.concurrency == 1:
            return [self._one(r) for r in requests]
        return asyncio.run_coroutine_threadsafe(self._agenerate(requests), self._event_loop()).result()

    def close(self) -> None:
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            atexit.unregister(self.close)
            if self._session is not None:
                asyncio.run_coroutine_threadsafe(self._session.close(), loop).result(timeout=30)
                self._session = None
            loop.call_soon_threadsafe(loop.stop)
            assert self._loop_thread is not None  # started with the loop
            self._loop_thread.join(timeout=30)
            loop.close()
        self._http.close()
