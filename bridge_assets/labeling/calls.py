"""How labelers call models: a `generate(profile, requests) -> results` callable, metered.

Labelers batch their requests (one call per round and model profile) and read replies
strictly: a reply that is not the JSON object its schema asks for is a failed call, never a
default answer.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationError

from bridge_assets.llm.budget import DEFERRED
from bridge_assets.llm.types import LLMRequest, LLMResult

# A model's yes/no and grade as the reply models read them: case and spaces aside, a grade
# written as a string ("2") taken as the number.
YesNo = Annotated[Literal["yes", "no"],
                  BeforeValidator(lambda value: value.strip().lower() if isinstance(value, str) else value)]
Grade = Annotated[Literal[0, 1, 2, 3],
                  BeforeValidator(lambda value: int(value.strip())
                                  if isinstance(value, str) and value.strip().isdigit() else value)]

# (model profile name, requests) -> one result per request, in the same order.
Generate = Callable[[str, Sequence[LLMRequest]], list[LLMResult]]

Reply = TypeVar("Reply", bound=BaseModel)


@dataclass
class CallStats:
    """What a labeler's model calls cost: the figures an asset reports in its metadata."""

    requests: int = 0        # results received (cached or not)
    calls: int = 0           # distinct requests the model answered now (not from the cache)
    cache_hits: int = 0
    failures: int = 0        # results with an error (deferred ones aside: they were never sent)
    tokens_in: int = 0       # of the calls made now (cached calls cost nothing)
    tokens_out: int = 0
    batches: int = 0         # generate() invocations
    seconds_in_generate: float = 0.0
    by_profile: dict[str, int] = field(default_factory=dict)  # calls per profile

    def as_metadata(self) -> dict[str, Any]:
        return {"requests": self.requests, "calls": self.calls, "cache_hits": self.cache_hits,
                "call_failures": self.failures, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "tokens": self.tokens_in + self.tokens_out,
                "batches": self.batches, "seconds_in_generate": round(self.seconds_in_generate, 3)}


class MeteredGenerate:
    """Wraps a `Generate`, checks it answers every request, and counts what it cost."""

    def __init__(self, generate: Generate, stats: CallStats | None = None):
        self._generate = generate
        self.stats = stats or CallStats()

    def __call__(self, profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if not requests:
            return []
        started = time.perf_counter()
        results = list(self._generate(profile, list(requests)))
        self.stats.seconds_in_generate += time.perf_counter() - started
        if len(results) != len(requests):
            raise RuntimeError(f"LLM profile '{profile}' returned {len(results)} results "
                               f"for {len(requests)} requests")
        self.stats.batches += 1
        self.stats.requests += len(results)
        made_now: dict[str, LLMResult] = {}  # identical requests in a batch are one call
        for result in results:
            if result.error == DEFERRED:  # past an automation run's cap: not a call, not a failure
                continue
            if result.cached:
                self.stats.cache_hits += 1
            else:
                made_now[result.key] = result
            if result.error is not None:
                self.stats.failures += 1
        self.stats.calls += len(made_now)
        self.stats.tokens_in += sum(r.tokens_in for r in made_now.values())
        self.stats.tokens_out += sum(r.tokens_out for r in made_now.values())
        self.stats.by_profile[profile] = self.stats.by_profile.get(profile, 0) + len(made_now)
        return results


def generate_grouped(requests: Sequence[tuple[str, LLMRequest]], generate: Generate) -> list[LLMResult]:
    """Send (profile, request) pairs as one generate call per profile, so a server sees many
    requests at once (the LLM client records them in the ledger chunk by chunk, so a killed
    run loses at most one chunk); results come back in the order of `requests`."""
    by_model: dict[str, list[int]] = defaultdict(list)
    for index, (model, _) in enumerate(requests):
        by_model[model].append(index)
    results: list[LLMResult | None] = [None] * len(requests)
    for model, indices in by_model.items():
        for index, result in zip(indices, generate(model, [requests[i][1] for i in indices]),
                                 strict=True):
            results[index] = result
    return results  # type: ignore[return-value]


def parse_reply(result: LLMResult, model: type[Reply]) -> tuple[Reply | None, str | None]:
    """The reply as `model`, or (None, why) when the call failed or the reply does not fit."""
    if result.error is not None:
        return None, result.error
    try:
        raw = result.parsed if result.parsed is not None else json.loads(result.text)
    except json.JSONDecodeError as exc:
        return None, f"reply is not JSON ({exc.msg}): {result.text[:200]!r}"
    try:
        return model.model_validate(raw), None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors())
        return None, f"reply does not fit {model.__name__} ({problems}): {str(raw)[:200]!r}"
