"""What processes sharing one lake agree on before they call an LLM: who sends each call key
(a lease) and how many calls an automation run has reserved of its cap.

Both live in `<lake folder>/coordination.sqlite`, a small SQLite file (WAL mode) beside the
catalog: SQLite's `BEGIN IMMEDIATE` gives a real cross-process lock for the few milliseconds a
claim or a reservation takes, which the lake itself cannot (DuckLake commits are optimistic and
two inserts into one table never conflict; a DuckDB file allows one writing process). So it holds
for every process on the machine that shares the lake folder: Dagster's step processes, the
daemon's runs, `bridge run`, `bridge label-eval --shard`. (Processes on other machines sharing a
Postgres catalog keep their own file: they may ask a key twice; the ledger still keeps one answer.)

- A **lease** on a key says "this holder is sending it". A client claims the keys of a chunk just
  before sending it and releases them once their replies are committed to the ledger, so another
  process asking the same key waits for that reply instead of paying for it again. A lease is
  renewed while its holder lives (`Leases`' keeper thread) and lapses `lease_seconds()` after its
  holder died (kill -9), so nobody waits forever on a dead process.
- A **reservation** counts an automation run's calls across all its step processes: a chunk is
  sent only after its calls were reserved, atomically, against the run's cap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from bridge_assets import settings
from bridge_assets.lake import store
from bridge_assets.paths import LakeLocation

logger = logging.getLogger(__name__)

FILE = "coordination.sqlite"
# How often a waiting process looks whether the keys it waits on were answered.
POLL_SECONDS = 0.25

SCHEMA = (
    """create table if not exists call_leases (
        key text primary key,       -- the ledger's call key
        holder text not null,       -- host:pid:uuid of the client sending it
        expires_at real not null    -- unix time, renewed while the holder lives
    )""",
    """create table if not exists released (
        id integer primary key check (id = 1),
        total integer not null      -- leases released so far, all holders: tells a claimer
    )""",                           # whether others answered keys since it read the ledger
    """create table if not exists released_by (
        holder text primary key,    -- a live holder's own share of released.total
        total integer not null
    )""",
    """create table if not exists run_calls (
        run_id text primary key,    -- the Dagster run id
        reserved integer not null   -- calls reserved (sent or being sent) under the run's cap
    )""",
)


def lease_seconds() -> int:
    """How long a dead holder's lease outlives it (BRIDGE_LEASE_SECONDS, default 60)."""
    return settings.env.lease_seconds()


class Coordination:
    """The coordination file of one lake folder. Every method is one short transaction."""

    def __init__(self, file: Path):
        self.file = Path(file)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        fresh = self.file not in _prepared
        if fresh:
            self.file.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.file, timeout=60, isolation_level=None)
        try:
            # leases and reservations outlive no crash that matters: no fsync on each commit
            con.execute("pragma synchronous=normal")
            if fresh:
                _prepare(con, self.file)
            con.execute("begin immediate")  # the write lock first: claims never interleave
            try:
                yield con
            except BaseException:
                con.execute("rollback")
                raise
            con.execute("commit")
        finally:
            con.close()

    # --- leases ---------------------------------------------------------------------------

    def claim(self, keys: Iterable[str], holder: str, ttl: float) -> tuple[set[str], int]:
        """Take the lease of every key in `keys` that nobody holds (or whose lease lapsed, or
        that `holder` holds already); return the keys `holder` now holds, and the leases
        other holders released so far (it only grows)."""
        keys = sorted(set(keys))
        now = time.time()
        with self._transaction() as con:
            held = dict(_select(con, "select key, holder from call_leases where expires_at > ? and key in ({})",
                                [now], keys))
            mine = [k for k in keys if held.get(k, holder) == holder]
            con.executemany("insert into call_leases values (?, ?, ?) on conflict(key) do update "
                            "set holder = excluded.holder, expires_at = excluded.expires_at",
                            [(k, holder, now + ttl) for k in mine])
            own = con.execute("select total from released_by where holder = ?", [holder]).fetchone()
            others = _released(con) - (own[0] if own else 0)
        return set(mine), others

    def renew(self, holder: str, ttl: float) -> None:
        with self._transaction() as con:
            con.execute("update call_leases set expires_at = ? where holder = ?", [time.time() + ttl, holder])

    def release(self, keys: Iterable[str], holder: str) -> int:
        """Give up `holder`'s leases on `keys`; return how many it held."""
        keys = list(set(keys))
        if not keys:
            return 0
        with self._transaction() as con:
            before = con.total_changes
            _select(con, "delete from call_leases where holder = ? and key in ({})", [holder], keys)
            count = con.total_changes - before
            con.execute("insert into released values (1, ?) on conflict(id) do update "
                        "set total = total + excluded.total", [count])
            con.execute("insert into released_by values (?, ?) on conflict(holder) do update "
                        "set total = total + excluded.total", [holder, count])
        return count

    def forget(self, holder: str) -> None:
        """Drop a finished holder's share (it never claims again)."""
        with self._transaction() as con:
            con.execute("delete from released_by where holder = ?", [holder])

    def released_total(self) -> int:
        with self._transaction() as con:
            return _released(con)

    def held(self, keys: Iterable[str]) -> set[str]:
        """The keys among `keys` someone holds a live lease on."""
        keys = list(set(keys))
        if not keys:
            return set()
        with self._transaction() as con:
            return {k for k, in _select(con, "select key from call_leases where expires_at > ? and key in ({})",
                                        [time.time()], keys)}

    # --- an automation run's call cap -----------------------------------------------------

    def reserve_calls(self, run_id: str, cap: int, wanted: int) -> int:
        """Reserve up to `wanted` calls of run `run_id`'s `cap`, atomically across processes;
        return how many were reserved (0 once the cap is spent)."""
        with self._transaction() as con:
            row = con.execute("select reserved from run_calls where run_id = ?", [run_id]).fetchone()
            reserved = row[0] if row else 0
            granted = max(0, min(wanted, cap - reserved))
            con.execute("insert into run_calls values (?, ?) on conflict(run_id) do update "
                        "set reserved = excluded.reserved", [run_id, reserved + granted])
        return granted

    def calls_reserved(self, run_id: str) -> int:
        with self._transaction() as con:
            row = con.execute("select reserved from run_calls where run_id = ?", [run_id]).fetchone()
        return row[0] if row else 0


_prepared: set[Path] = set()  # coordination files this process made ready


def _prepare(con: sqlite3.Connection, file: Path) -> None:
    """Create the tables and switch the file to WAL (readers never wait on a claim), once per
    process. A journal-mode switch is refused, not queued, while another process has the file
    open for it, so it is retried."""
    deadline = time.monotonic() + 60
    while True:
        try:
            con.execute("pragma journal_mode=wal")
            con.execute("begin immediate")
            for statement in SCHEMA:
                con.execute(statement)
            con.execute("commit")
            break
        except sqlite3.OperationalError as exc:
            if con.in_transaction:
                con.execute("rollback")
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    _prepared.add(file)


def _released(con: sqlite3.Connection) -> int:
    row = con.execute("select total from released").fetchone()
    return row[0] if row else 0


def _select(con: sqlite3.Connection, sql: str, head: list, keys: Sequence[str]) -> list[tuple]:
    """Run `sql`, whose `{}` is a list of `keys`' placeholders, in slices (SQLite's limit on
    host parameters)."""
    rows: list[tuple] = []
    for start in range(0, len(keys), 500):
        part = keys[start:start + 500]
        rows += con.execute(sql.format(", ".join("?" * len(part))), [*head, *part]).fetchall()
    return rows


class Leases:
    """One client call's leases: a holder name of its own, the keys it holds, and a keeper
    thread renewing them while it lives. Use as a context manager: leaving it releases
    everything still held (a failed batch never leaves keys locked until they lapse)."""

    def __init__(self, coordination: Coordination, ttl: float | None = None):
        self.coordination = coordination
        self.ttl = float(ttl if ttl is not None else lease_seconds())
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._held: set[str] = set()
        self._seen = 0   # leases other holders had released when this one read the ledger
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def __enter__(self) -> Leases:
        """Enter before reading the ledger: a claim then tells whether others answered since."""
        self._seen = self.coordination.released_total()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
        with self._lock:
            held, self._held = set(self._held), set()
        self.coordination.release(held, self.holder)
        self.coordination.forget(self.holder)

    def claim(self, keys: Sequence[str]) -> tuple[list[str], list[str], bool]:
        """(the keys this holder now holds, the keys another live holder is sending, in order;
        whether another holder released leases since this one read the ledger (entering):
        then some of the keys now held may have been answered meanwhile, and the ledger must
        be read again for them before they are sent)."""
        mine, others = self.coordination.claim(keys, self.holder, self.ttl)
        with self._lock:
            self._held |= mine
            recheck = others > self._seen
        if mine and self._keeper is None:
            self._keeper = threading.Thread(target=self._keep, name="lease-keeper", daemon=True)
            self._keeper.start()
        return [k for k in keys if k in mine], [k for k in keys if k not in mine], recheck

    def release(self, keys: Iterable[str]) -> None:
        keys = set(keys)
        with self._lock:
            self._held -= keys
        self.coordination.release(keys, self.holder)

    def wait(self, keys: Sequence[str]) -> None:
        """Return once no live holder holds any of `keys` (each released or lapsed)."""
        left = set(keys)
        if left:
            logger.info("waiting for %d LLM call(s) another process is sending", len(left))
        while left:
            left &= self.coordination.held(left)
            if left:
                time.sleep(POLL_SECONDS)

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.coordination.renew(self.holder, self.ttl)
            except sqlite3.Error as exc:  # a busy file this once: the next beat renews
                logger.warning("LLM call leases not renewed this time: %s", exc)


def for_store(lake: LakeLocation) -> Coordination:
    """The coordination file of the lake `lake`."""
    return Coordination(store.location(lake).folder / FILE)
