"""The dry run's replay of the LLM stages: a `Generate` that answers from the call ledger only,
and the tally of the calls one stage would make to one model profile. Each LLM-calling stage
estimates its own calls with these, beside its code (`bridge run --dry-run`, bridge_assets/orchestration/costs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bridge_assets.llm import ledger
from bridge_assets.llm.budget import prompt_tokens
from bridge_assets.llm.client import LLMClient
from bridge_assets.llm.profiles import get_profile
from bridge_assets.llm.types import LLMRequest, LLMResult
from bridge_assets.paths import LakeLocation

NOT_ANSWERED = "not answered yet (dry run)"


class LedgerReplay:
    """A `Generate` answering from the call ledger only; a request the ledger lacks comes back
    failed with NOT_ANSWERED. Remembers every request it saw, by key."""

    def __init__(self, lake: LakeLocation | None):
        self.lake = lake  # the lake whose ledger answers; None: an empty ledger
        self.requests: dict[str, LLMRequest] = {}
        self.made: set[str] = set()  # keys a stage surely asks: answered for any stage after it
        self._clients: dict[str, LLMClient] = {}

    def stage(self, name: str, profile: str, purpose: str) -> StageCalls:
        return StageCalls(name, profile, purpose, self.made)

    def client(self, profile: str) -> LLMClient:
        """The profile's client, for its keys and request defaults only: it never calls."""
        if profile not in self._clients:
            self._clients[profile] = LLMClient(profile, lake=self.lake)
        return self._clients[profile]

    def __call__(self, profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        keys = [self.client(profile).key(r) for r in requests]
        self.requests.update(zip(keys, requests))
        answered = ledger.lookup(keys, self.lake) if self.lake else {}
        return [answered.get(key) or LLMResult(key=key, error=NOT_ANSWERED) for key in keys]


@dataclass
class StageCalls:
    """The calls one stage makes to one model profile."""

    stage: str
    profile: str
    purpose: str                 # the ledger's purpose of these calls (for the typical reply)
    made: set[str] = field(repr=False)  # keys asked by earlier stages (shared): answered by then
    answered: int = 0            # requests known, already in the ledger: free
    new: int = 0                 # requests known, not in the ledger
    bound: int = 0               # at most this many more, whose requests depend on replies not made yet
    prompt_tokens: int = 0       # estimated, of the new and bounded calls
    reply_tokens: int = 0        # their max_tokens: an upper bound
    typical_reply: float | None = None  # mean reply tokens of this purpose in the ledger
    _keys: set[str] = field(default_factory=set, repr=False)

    @property
    def calls(self) -> int:
        return self.answered + self.new + self.bound

    @property
    def to_make(self) -> int:
        return self.new + self.bound

    def add(self, key: str, request: LLMRequest, answered: bool, surely: bool = True) -> None:
        """A request whose key is known (identical requests are one call). `surely` False: it is
        asked only if a reply not made yet leads there (a filter vote keeps its pair)."""
        if key in self._keys:
            return
        self._keys.add(key)
        if answered or key in self.made:
            self.answered += 1
            return
        if surely:
            self.new += 1
            self.made.add(key)
        else:
            self.bound += 1
        self.prompt_tokens += prompt_tokens(request)
        self.reply_tokens += request.max_tokens

    def add_bound(self, prompt: int, reply: int, calls: int = 1) -> None:
        """`calls` calls that may be made, each of about `prompt` tokens and at most `reply`."""
        self.bound += calls
        self.prompt_tokens += prompt * calls
        self.reply_tokens += reply * calls

    @property
    def typical_reply_tokens(self) -> float | None:
        return None if self.typical_reply is None else self.typical_reply * self.to_make

    def price(self, reply_tokens: float) -> tuple[str, float] | None:
        """(currency, price) of the calls to make with `reply_tokens` of replies in all; None
        for a profile without prices (a local model)."""
        prices = get_profile(self.profile).prices
        return (prices.currency, prices.cost(self.prompt_tokens, round(reply_tokens))) if prices else None
