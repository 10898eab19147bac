"""A spending limit on the LLM calls of one command (`bridge run --budget / --budget-usd`).

While a budget is active (`enforce`), the LLM client asks it before each chunk of requests it
sends (`admit`) and tells it what the chunk cost once answered (`charge`); calls the ledger
answers are free. A chunk whose cost, estimated at its most, would take the spend past the
limit is not sent: `BudgetExceeded` stops the asset that asked before that asset writes
anything, and the chunks answered so far are in the ledger, so the next run resumes without
asking them again.

Estimates: a prompt at 4 characters a token (no tokenizer is loaded: llama.cpp's needs the
weights, a hosted model's is not at hand), a reply at its max_tokens (an upper bound). The
spend counts the tokens the backend reports.

Automation runs (bridge_assets.pipeline.automation) get a cap on the number of calls instead, which
*defers* rather than stops: each chunk's calls are reserved against the run's cap before they
are sent, atomically across the run's step processes (`reserve_calls`), and the calls past it
are not sent and come back as failed results with error DEFERRED (never recorded in the ledger, so an explicit run asks them later); the
pairs they touch stay pending, and the rest of the run goes on.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from bridge_assets.errors import BridgeError
from bridge_assets.llm.profiles import ModelProfile
from bridge_assets.llm.types import LLMRequest, LLMResult

CHARS_PER_TOKEN = 4
CURRENCY = "USD"  # what --budget-usd counts
# The error of a call an automation run's cap left unsent (a pair it touches stays pending).
DEFERRED = "deferred: the automation run's LLM call cap was reached"


def prompt_tokens(request: LLMRequest) -> int:
    """The request's prompt tokens, estimated from its messages at 4 characters a token."""
    return math.ceil(sum(len(text) for _, text in request.messages) / CHARS_PER_TOKEN)


class BudgetError(BridgeError, ValueError):
    """The money budget meets a profile priced in another currency."""


@dataclass
class Budget:
    """Limits on what the calls made now may cost: tokens (prompt + reply) and money."""

    tokens: int | None = None
    usd: float | None = None
    calls: int | None = None  # calls sent at most; those past it are deferred, not an error
    # Reserves calls of the cap where several processes share it (an automation run's steps:
    # llm.coordination): wanted -> granted, atomically. None: this process counts alone.
    reserve_calls: Callable[[int], int] | None = None
    spent_tokens: int = 0
    spent_usd: float = 0.0
    spent_calls: int = 0
    deferred_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, profile: ModelProfile, requests: Sequence[LLMRequest]) -> int:
        """How many of `requests` (a prefix) may be sent: all of them, or fewer under the call
        cap (the rest are deferred). Raise BudgetExceeded when they would pass the token or
        money limit, at their estimated most."""
        if self.calls is not None:
            with self._lock:
                admitted = (self.reserve_calls(len(requests)) if self.reserve_calls is not None
                            else max(0, min(len(requests), self.calls - self.spent_calls)))
                self.spent_calls += admitted
                self.deferred_calls += len(requests) - admitted
            requests = requests[:admitted]
        tokens_in = sum(prompt_tokens(r) for r in requests)
        tokens_out = sum(r.max_tokens for r in requests)
        usd = self._usd(profile, tokens_in, tokens_out)
        with self._lock:
            over_tokens = self.tokens is not None and self.spent_tokens + tokens_in + tokens_out > self.tokens
            over_usd = self.usd is not None and self.spent_usd + usd > self.usd
            if over_tokens or over_usd:
                raise BudgetExceeded(self, profile.name, requests, tokens_in + tokens_out, usd)
        return len(requests)

    def charge(self, profile: ModelProfile, results: Iterable[LLMResult]) -> None:
        results = list(results)
        tokens_in = sum(r.tokens_in for r in results)
        tokens_out = sum(r.tokens_out for r in results)
        with self._lock:
            self.spent_tokens += tokens_in + tokens_out
            self.spent_usd += self._usd(profile, tokens_in, tokens_out)

    def _usd(self, profile: ModelProfile, tokens_in: int, tokens_out: int) -> float:
        if profile.prices is None:
            return 0.0
        if profile.prices.currency != CURRENCY:
            if self.usd is not None:
                raise BudgetError(f"LLM profile '{profile.name}' is priced in {profile.prices.currency}: "
                                  f"--budget-usd counts {CURRENCY} prices only")
            return 0.0
        return profile.prices.cost(tokens_in, tokens_out)

    def status(self) -> str:
        """What was spent and what is left, e.g. '1,234 tokens spent of 5,000 (3,766 left)'."""
        tokens = f"{self.spent_tokens:,} tokens spent"
        if self.tokens is not None:
            tokens += f" of {self.tokens:,} ({self.tokens - self.spent_tokens:,} left)"
        parts = [tokens]
        if self.usd is not None:
            parts.append(f"{self.spent_usd:.4f} {CURRENCY} spent of {self.usd:.4f} "
                         f"({self.usd - self.spent_usd:.4f} left)")
        return ", ".join(parts)


class BudgetExceeded(BridgeError, RuntimeError):
    """The next chunk of calls would take the spend past the budget; none of it was sent."""

    def __init__(self, budget: Budget, profile: str, requests: Sequence[LLMRequest], tokens: int,
                 usd: float):
        purposes = "/".join(sorted({r.purpose for r in requests if r.purpose})) or "LLM"
        cost = f"{tokens:,} tokens" + (f", {usd:.4f} {CURRENCY}" if usd else "")
        super().__init__(f"budget reached: {budget.status()}; the next {len(requests)} {purposes} "
                         f"calls to {profile} need up to {cost}, so they were not sent")


_active: Budget | None = None


@contextlib.contextmanager
def enforce(budget: Budget | None) -> Iterator[Budget | None]:
    """Make `budget` the limit of every LLM call this process makes inside the block (None:
    no limit)."""
    global _active
    previous, _active = _active, budget
    try:
        yield budget
    finally:
        _active = previous


def admit(profile: ModelProfile, requests: Sequence[LLMRequest]) -> int:
    """How many of `requests` (a prefix) the active budget lets through (all without one)."""
    return len(requests) if _active is None else _active.admit(profile, requests)


def charge(profile: ModelProfile, results: Iterable[LLMResult]) -> None:
    if _active is not None:
        _active.charge(profile, results)
