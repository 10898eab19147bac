"""The Dagster resource that hands assets their LLM clients (one per profile, per run)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.llm import progress
from bridge_assets.llm.client import ClientStats, LLMClient
from bridge_assets.llm.profiles import ROLES, load_models_config
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.paths import LakeLocation

# requests between two progress lines of a run's LLM calls (and the in-process chunk size)
PROGRESS_EVERY = 16


class SmallBatchProgress:
    """Requests answered in batches that get no progress line of their own (a pair-major debate
    sends one pair's turns at a time; a server gets a round at once), counted per profile and purpose: `add` gives a progress line each
    time the count passes a multiple of `every`, else None."""

    def __init__(self, every: int = PROGRESS_EVERY):
        self.every = every
        self.answered: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # requests, cached

    def add(self, profile: str, purposes: str, results: Sequence[LLMResult]) -> str | None:
        count = self.answered[(profile, purposes)]
        before = count[0]
        count[0] += len(results)
        count[1] += sum(r.cached for r in results)
        if before // self.every == count[0] // self.every:
            return None
        return f"{purposes}: {count[0]} LLM requests answered by {profile} so far ({count[1]} from the ledger)"


class LLMResource(dg.ConfigurableResource):
    """Which profile each labeling role uses; empty = the `defaults` of resources/models.yaml."""

    store: DuckDBStore             # the lake whose call ledger to use (nested: the run's store resource)
    filter: list[str] = []         # the filter's models (the paper uses three)
    debate: str = ""               # the debating agents' model
    adjudicator: str = ""          # the LLM that resolves escalated debates
    judge: str = ""                # single-agent LLMJudge / P(yes) scorers
    rewrite: str = ""              # query rewriting (e.g. HyDE)

    _clients: dict[str, LLMClient] = PrivateAttr(default_factory=dict)

    def __init__(self, **config: Any):
        # Dagster allows no default for a nested resource: without one, the environment's lake.
        config.setdefault("store", DuckDBStore())
        super().__init__(**config)

    @property
    def lake(self) -> LakeLocation:
        """Where the call ledger is: the store's lake."""
        return self.store.lake

    def profiles_for(self, role: str) -> list[str]:
        if role not in ROLES:
            raise ValueError(f"unknown LLM role '{role}' (roles: {', '.join(ROLES)})")
        configured = getattr(self, role)
        if configured:
            return list(configured) if isinstance(configured, list) else [configured]
        return load_models_config().role_profiles(role)

    def profile_for(self, role: str) -> str:
        names = self.profiles_for(role)
        if len(names) != 1:
            raise ValueError(f"role '{role}' uses {len(names)} profiles ({names}); use profiles_for()")
        return names[0]

    def client(self, profile: str) -> LLMClient:
        """The client of a profile, shared by every caller in this run (its stats add up)."""
        if profile not in self._clients:
            self._clients[profile] = LLMClient(profile, lake=self.lake)
        return self._clients[profile]

    def generate_fn(self, run_id: str, log: Callable[[str], None] | None = None
                    ) -> Callable[[str, Sequence[LLMRequest]], list[LLMResult]]:
        """`generate(profile, requests)` through this run's clients, each call tagged with the
        run id in the ledger. A long batch on the in-process CPU backend is answered in chunks
        so that `log` shows progress; servers (HTTP, vLLM) get the whole batch at once. Small
        batches (a pair-major debate sends one pair's turns at a time) are counted per profile
        and purpose, and `log` says so every PROGRESS_EVERY requests."""
        small_batches = SmallBatchProgress()

        def generate(profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
            client = self.client(profile)
            chunk = PROGRESS_EVERY if client.profile.backend == "llama_cpp" else max(len(requests), 1)
            purposes = "/".join(sorted({r.purpose for r in requests}))
            results: list[LLMResult] = []
            progress.asked(len(requests))
            for start in range(0, len(requests), chunk):
                answered = client.generate(requests[start:start + chunk], context=run_id)
                progress.answered(answered)
                results.extend(answered)
                if log and len(requests) > chunk:
                    log(f"{purposes}: {len(results)}/{len(requests)} LLM requests answered by "
                        f"{profile} ({sum(r.cached for r in results)} from the ledger)")
            if log and len(requests) <= chunk:
                line = small_batches.add(profile, purposes, results)
                if line:
                    log(line)
            return results
        return generate

    def clients_for(self, role: str) -> list[LLMClient]:
        return [self.client(name) for name in self.profiles_for(role)]

    def stats(self) -> dict[str, ClientStats]:
        return {name: client.stats for name, client in self._clients.items()}

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
