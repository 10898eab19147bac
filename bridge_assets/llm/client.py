"""`LLMClient`: the one entry point to LLMs. Cached, batched, strictly parsed, recorded.

    client = LLMClient("qwen-0.5b")
    results = client.generate([client.request(messages, json_schema=SCHEMA, purpose="filter")],
                              context=run_id)

`generate` answers keys the ledger already holds from the ledger (no model call), sends the
rest to the backend in chunks (64 requests by default), re-asks the replies that fail strict
parsing (up to the profile's `parse_retries`), and appends each chunk's calls to the ledger
in one short transaction (in the background, while the next chunk is asked), so a killed run
repeats none of the calls already recorded. Each key is sent by one process at a time: a chunk's
keys are leased before it is sent (llm.coordination), and a key another process is sending is
waited for and read from the ledger, not sent again. A call that still fails comes back with `error` set: callers must treat it as failed, never as
a label. Under an active budget (llm.budget) a chunk that would pass it is not sent:
`BudgetExceeded` is raised instead, with the earlier chunks already recorded; the calls past
an automation run's call cap come back unsent, with error `budget.DEFERRED`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from bridge_assets.lake import location
from bridge_assets.llm import budget, coordination, ledger
from bridge_assets.llm.backends import Backend, make_backend, model_id
from bridge_assets.llm.parsing import check_schema, parse_reply
from bridge_assets.llm.profiles import ModelProfile, get_profile
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.paths import LakeLocation


@dataclass
class ClientStats:
    """Running totals for materialization metadata."""

    requests: int = 0       # results asked for (duplicates within a batch included)
    cache_hits: int = 0     # answered from the ledger
    calls: int = 0          # model calls made (parse retries included)
    failures: int = 0       # results returned with `error` set (deferred ones aside)
    deferred: int = 0       # results not asked: past an automation run's call cap (budget.DEFERRED)
    waited: int = 0         # answered by another process that was sending the same call (its reply read)
    tokens_in: int = 0
    tokens_out: int = 0
    model_seconds: float = 0.0  # sum of model call latencies
    wall_seconds: float = 0.0   # time spent inside generate(), ledger included

    def as_metadata(self) -> dict[str, Any]:
        values = asdict(self)
        values["model_seconds"] = round(self.model_seconds, 3)
        values["wall_seconds"] = round(self.wall_seconds, 3)
        return values


# Chunks that may wait for the ledger while one append is being committed.
QUEUED_CHUNKS = 4


def _sum_known(a: int | None, b: int | None) -> int | None:
    """a + b, or None when either is unknown (a backend that does not report prefill)."""
    return None if a is None or b is None else a + b


class LLMClient:
    """Calls one models.yaml profile through its backend, with the DuckDB ledger as cache."""

    def __init__(self, profile: str | ModelProfile, *, lake: LakeLocation | None = None, chunk_size: int = 64):
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        # the ledger's lake: the LLM resource's; None, for a client used on its own (a script, the
        # labeler evaluation's command), the environment's, resolved here once (its edge)
        self.lake = lake if lake is not None else location.lake_location()
        # Requests sent (and then recorded) together: big enough to keep an HTTP server's
        # batch full, small enough that killing a run loses little work.
        self.chunk_size = max(chunk_size, self.profile.concurrency)
        self.model_id = model_id(self.profile)
        self.stats = ClientStats()
        self._backend: Backend | None = None
        self._ledger_writer: ThreadPoolExecutor | None = None

    def _writer(self) -> ThreadPoolExecutor:
        if self._ledger_writer is None:
            self._ledger_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        return self._ledger_writer

    @property
    def backend(self) -> Backend:
        if self._backend is None:  # lazily: a fully cached run never loads a model
            self._backend = make_backend(self.profile)
        return self._backend

    def key(self, request: LLMRequest) -> str:
        return ledger.call_key(self.profile.backend, self.model_id, request)

    def request(self, messages: Sequence[tuple[str, str]], *, json_schema: dict[str, Any] | None = None,
                purpose: str = "", **overrides: Any) -> LLMRequest:
        """A request with the profile's sampling defaults (temperature, max_tokens)."""
        fields = {"temperature": self.profile.sampling.temperature,
                  "max_tokens": self.profile.sampling.max_tokens, **overrides}
        return LLMRequest(messages=tuple((role, text) for role, text in messages),
                          json_schema=json_schema, purpose=purpose, **fields)

    def generate(self, requests: Sequence[LLMRequest], *, context: str | None = None) -> list[LLMResult]:
        """One result per request, in order. `context` (e.g. a run id) is recorded on new calls."""
        started = time.perf_counter()
        for request in requests:
            if request.json_schema is not None:
                check_schema(request.json_schema)
        keys = [self.key(r) for r in requests]
        # One process sends a key at a time: a chunk's keys are leased just before it is sent
        # (llm.coordination); keys another process is sending are waited for once this
        # process's own chunks are answered, then read from the ledger (or sent here, when
        # their sender died or got no reply).
        with coordination.Leases(coordination.for_store(self.lake)) as leases:
            return self._generate(requests, keys, leases, context, started)

    def _generate(self, requests: Sequence[LLMRequest], keys: list[str], leases: coordination.Leases,
                  context: str | None, started: float) -> list[LLMResult]:
        answered = ledger.lookup(keys, self.lake)
        pending: dict[str, LLMRequest] = {}
        for key, request in zip(keys, requests):
            if key not in answered:
                pending.setdefault(key, request)  # identical requests in a batch: one call
        fresh: dict[str, tuple[LLMResult, int]] = {}
        deferred: dict[str, LLMResult] = {}  # never recorded: a later run asks them
        # Recorded as the chunks return, in the background while the next chunk is asked: one
        # append in flight at most; the chunks that return meanwhile wait and go together in the
        # next append (at most QUEUED_CHUNKS of them, then the client waits). A slow model gets
        # one transaction per chunk; an instant server is never idled by the ledger's commits.
        # A killed run loses the chunks not yet committed (QUEUED_CHUNKS + 1 at most), and a
        # failed append stops the batch.
        writing: Future | None = None
        queued: list[ledger.CallRecord] = []

        def record(records: list[ledger.CallRecord]) -> None:
            ledger.append(records, profile=self.profile.name, backend=self.profile.backend,
                          model=self.model_id, context=context, lake=self.lake)
            leases.release(r.result.key for r in records)  # committed: waiters read the replies

        def flush(wait: bool) -> None:
            nonlocal writing, queued
            if writing is not None and (wait or writing.done() or len(queued) >= QUEUED_CHUNKS * self.chunk_size):
                writing.result()
                writing = None
            if writing is None and queued:
                writing = self._writer().submit(record, queued)
                queued = []

        todo = list(pending.items())
        while todo:
            elsewhere: dict[str, LLMRequest] = {}
            try:
                for start in range(0, len(todo), self.chunk_size):
                    chunk = dict(todo[start:start + self.chunk_size])
                    mine, others, recheck = leases.claim(list(chunk))
                    elsewhere.update((k, chunk.pop(k)) for k in others)
                    if recheck:  # others released leases since the ledger was read: read it again
                        meanwhile = ledger.lookup(mine, self.lake)
                        answered.update(meanwhile)
                        leases.release(meanwhile)
                        mine = [k for k in mine if k not in meanwhile]
                        for key in meanwhile:
                            del chunk[key]
                    admitted = budget.admit(self.profile, list(chunk.values()))
                    for key in mine[admitted:]:  # past an automation run's call cap: not sent
                        deferred[key] = LLMResult(key=key, error=budget.DEFERRED)
                        del chunk[key]
                    leases.release(mine[admitted:])
                    if not chunk:
                        continue
                    answers = self._call(chunk)
                    queued.extend(ledger.CallRecord(chunk[k], result, attempts)
                                  for k, (result, attempts) in answers.items())
                    flush(wait=False)
                    budget.charge(self.profile, (result for result, _ in answers.values()))
                    fresh.update(answers)
            finally:  # everything answered is recorded before generate() waits, returns or raises
                flush(wait=True)
                flush(wait=True)
            leases.wait(list(elsewhere))
            replies = ledger.lookup(list(elsewhere), self.lake)
            answered.update(replies)
            self.stats.waited += len(replies)
            todo = [(k, r) for k, r in elsewhere.items() if k not in replies]
        results = [answered[k] if k in answered else deferred[k] if k in deferred else fresh[k][0]
                   for k in keys]
        self.stats.requests += len(requests)
        self.stats.cache_hits += sum(1 for k in keys if k in answered)  # waited-for replies included
        self.stats.failures += sum(1 for r in results if not r.ok and r.error != budget.DEFERRED)
        self.stats.deferred += sum(1 for r in results if r.error == budget.DEFERRED)
        self.stats.wall_seconds += time.perf_counter() - started
        return results

    def _call(self, pending: dict[str, LLMRequest]) -> dict[str, tuple[LLMResult, int]]:
        """Send the batch; re-send replies that fail strict parsing. Key -> (result, attempts)."""
        final: dict[str, tuple[LLMResult, int]] = {}
        spent: dict[str, tuple[int, int, float]] = {}  # key -> tokens in, tokens out, seconds so far
        # key -> prompt tokens computed, reused, decode tokens so far (None: a backend did not say)
        prefill: dict[str, tuple[int | None, int | None, int | None]] = {}
        todo = dict(pending)
        for attempt in range(1, self.profile.parse_retries + 2):
            replies = self.backend.generate(list(todo.values()))
            self.stats.calls += len(replies)
            retry = {}
            for (key, request), reply in zip(todo.items(), replies):
                if reply.key != key:
                    raise RuntimeError(f"backend {self.profile.backend} answered key {reply.key} for {key}")
                self.stats.tokens_in += reply.tokens_in
                self.stats.tokens_out += reply.tokens_out
                self.stats.model_seconds += reply.latency_s
                t_in, t_out, seconds = spent.get(key, (0, 0, 0.0))
                spent[key] = (t_in + reply.tokens_in, t_out + reply.tokens_out, seconds + reply.latency_s)
                now = (reply.prompt_computed, reply.prompt_reused, reply.decode_tokens)
                before = prefill.get(key)
                prefill[key] = now if before is None else (
                    _sum_known(before[0], now[0]), _sum_known(before[1], now[1]), _sum_known(before[2], now[2]))
                result = reply
                if reply.ok and request.json_schema is not None:
                    parsed, problem = parse_reply(reply.text, request.json_schema)
                    result = reply.model_copy(update={"parsed": parsed, "error": problem})
                    if problem is not None and attempt <= self.profile.parse_retries:
                        retry[key] = request
                        continue
                t_in, t_out, seconds = spent[key]
                computed, reused, decoded = prefill[key]
                final[key] = (result.model_copy(update={"tokens_in": t_in, "tokens_out": t_out,
                                                        "prompt_computed": computed, "prompt_reused": reused,
                                                        "decode_tokens": decoded, "latency_s": seconds}),
                              attempt)
            if not retry:
                break
            todo = retry
        return final

    def close(self) -> None:
        if self._ledger_writer is not None:
            self._ledger_writer.shutdown(wait=True)
            self._ledger_writer = None
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
