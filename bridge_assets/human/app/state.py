"""What every route shares, built once per app and kept on `app.state`: the settings, the
session signer, the database runner and the attention-check draws."""

import functools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from fastapi import Depends, Request

from bridge_assets.human import votes_store
from bridge_assets.human.app.config import AppSettings
from bridge_assets.human.queue import QueueSettings
from bridge_assets.human.security import Clock, SessionSigner
from bridge_assets.lake.store import transaction
from bridge_assets.paths import LakeLocation

T = TypeVar("T")


class Database:
    """Runs database work in a worker thread, one call at a time, each on a short connection
    to the votes store: `votes` on it alone, `run` with the pipeline's tables readable too.
    A file locked for longer than `busy_seconds` raises StoreBusy."""

    def __init__(self, lake: LakeLocation, busy_seconds: float):
        self.lake, self.busy_seconds = lake, busy_seconds
        self._lock = threading.Lock()

    def _call(self, lake: bool, fn: Callable[..., T], *args: Any, one_transaction: bool = False,
              **kwargs: Any) -> T:
        with self._lock, votes_store.connect(self.lake, pipeline=lake, wait_seconds=self.busy_seconds) as con:
            if not one_transaction:
                return fn(con, *args, **kwargs)
            with transaction(con):
                return fn(con, *args, **kwargs)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._call, True, fn, *args, **kwargs))

    async def page(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run` in one transaction, for a page's work (reads, and the assignment it serves):
        every statement sees one snapshot of the lake, and on DuckLake that snapshot is looked
        up once instead of once per statement (~2.4 ms each, about twenty a page). Not for work
        that opens a transaction of its own (a vote, an import)."""
        return await anyio.to_thread.run_sync(functools.partial(
            self._call, True, fn, *args, one_transaction=True, **kwargs))

    async def votes(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._call, False, fn, *args, **kwargs))


@dataclass
class AppState:
    settings: AppSettings
    clock: Clock  # dates sessions; replaced in tests
    signer: SessionSigner = field(init=False)
    db: Database = field(init=False)
    rng: random.Random = field(init=False)
    queue: QueueSettings = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.signer = SessionSigner(s.secret, s.session_hours * 3600, self.clock)
        self.db = Database(s.lake, s.busy_seconds)
        self.rng = random.Random(s.seed)
        self.queue = s.queue


def state_of(request: Request) -> AppState:
    return request.app.state.bridge


async def _state(request: Request) -> AppState:  # async: FastAPI runs a plain def in a thread
    return state_of(request)


State = Annotated[AppState, Depends(_state)]  # a route's parameter `state: State`
