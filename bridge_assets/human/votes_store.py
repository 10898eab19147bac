"""The votes store: annotators, assignments and votes in a DuckDB file of their own.

The pipeline's bridge.duckdb is rebuilt, deleted (`make clean`) and written by many processes;
votes are people's work and outlive all of that. So the annotation app and `bridge annotate`
write only the votes store (the lake location's `votes_db`: `BRIDGE_VOTES_DB`, else
`<data lake>/annotations/votes.duckdb`; `VotesStore`, the Dagster resource, in the assets), reading the pipeline's tables (queries, chunks,
debates) from bridge.duckdb attached read-only. The pipeline never writes the votes store: it
attaches it read-only, briefly. human_labels copies one dataset's votes, once per run (the
refined qrels take the ids of the votes each label counted from human_labels); the votes sensor
and the staleness check read only a hash of them, in place (`votes_version`); `bridge audit`
copies the dataset's it shows a pair of.

A vote never waits on the pipeline: recording one reads and writes the votes store only.

Lakes from before the split kept these tables in bridge.duckdb. Their first use (the app, a
`bridge annotate` command, or a pipeline step that reads votes) moves them here, vote ids and
token hashes kept, and drops them from the lake (`migrate`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from bridge_assets.errors import BridgeError
from bridge_assets.human import tables
from bridge_assets.human.tables import HUMAN_VOTES, SCHEMA, ensure_schema
from bridge_assets.lake import ducklake, store

if TYPE_CHECKING:
    import pyarrow as pa

    from bridge_assets.human.votes_resource import VotesStore
from bridge_assets.paths import LakeLocation

HUMAN_TABLES = ("annotators", "annotation_assignments", "human_votes")
PIPELINE = "pipeline"   # the alias bridge.duckdb is attached under
VOTES = "votes"         # the alias the votes store is attached under in a pipeline snapshot


class VotesConflict(BridgeError, RuntimeError):
    """The lake and the votes store both hold votes, and not the same ones."""


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def legacy_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The human tables the lake of `con` still holds (lakes from before the votes store)."""
    present = {row[0] for row in con.execute(
        "select table_name from duckdb_tables() where database_name = current_database() "
        "and schema_name = 'main' and not temporary").fetchall()}
    return [table for table in HUMAN_TABLES if table in present]


def _missing_rows(votes: duckdb.DuckDBPyConnection, table: str, frame: pa.Table) -> int:
    """Rows of the lake's `frame` of `table` that the votes store lacks (compared whole)."""
    columns = ", ".join(_ident(name) for name in frame.column_names)
    votes.register("_legacy", frame)
    try:
        return store.one_row(votes, f"select count(*) from (select {columns} from _legacy "
                             f"except select {columns} from {table})")[0]
    finally:
        votes.unregister("_legacy")


def _fill(votes: duckdb.DuckDBPyConnection, frames: dict[str, pa.Table]) -> None:
    """Copy the lake's human tables into an empty votes store, vote ids kept (the id sequence
    continues after the highest)."""
    last = 0
    if "human_votes" in frames:
        votes.register("_legacy", frames["human_votes"])
        last = store.one_row(votes, "select coalesce(max(vote_id), 0) from _legacy")[0]
        votes.unregister("_legacy")
    with store.transaction(votes):
        votes.execute("drop table if exists human_votes")
        votes.execute("drop sequence if exists human_vote_ids")
        votes.execute(f"create sequence human_vote_ids start {int(last) + 1}")
        votes.execute(SCHEMA)
        for table in HUMAN_TABLES:
            if table in frames:
                votes.register("_legacy", frames[table])
                votes.execute(f"insert into {table} by name select * from _legacy")
                votes.unregister("_legacy")


def move_from(lake: duckdb.DuckDBPyConnection, votes_db: Path, *,
              wait_seconds: float = store.LOCK_WAIT_SECONDS) -> int:
    """Move the human tables of the lake `lake` is connected to (read-write) into the votes
    store at `votes_db`, then drop them from the lake. Returns the votes moved (0: nothing to
    move). Safe to repeat after a crash between the two steps: rows already in the votes store
    are not copied twice. Refuses (VotesConflict) when both hold different votes."""
    legacy = legacy_tables(lake)
    if not legacy:
        return 0
    frames = {table: lake.execute(f'select * from "{table}"').to_arrow_table() for table in legacy}
    with store.connect_file(votes_db, wait_seconds=wait_seconds) as votes:
        ensure_schema(votes)
        stored = sum(store.one_row(votes, f"select count(*) from {table}")[0] for table in HUMAN_TABLES)
        if stored:
            missing = {table: n for table, frame in frames.items() if (n := _missing_rows(votes, table, frame))}
            if missing:
                raise VotesConflict(
                    f"both the data lake ({lake_path(lake)}) and the votes store ({votes_db}) hold "
                    f"annotations, and the lake has rows the store lacks ({missing}). Export the "
                    "lake's votes with an older BRIDGE (bridge annotate export), move or delete one "
                    "of the two, and import them (bridge annotate import).")
        else:
            _fill(votes, frames)
    with store.transaction(lake):
        for table in ("human_votes", "annotation_assignments", "annotators"):
            if table in legacy:
                lake.execute(f"drop table {table}")
        lake.execute("drop sequence if exists human_vote_ids")
    return frames["human_votes"].num_rows if "human_votes" in frames else 0


def lake_path(con: duckdb.DuckDBPyConnection) -> str:
    return store.one_row(con, "select path from duckdb_databases() where database_name = current_database()")[0]


def migrate(lake: LakeLocation, *, wait_seconds: float = store.LOCK_WAIT_SECONDS) -> int:
    """Move an old lake's annotators, assignments and votes into the lake's votes store (a
    no-op once done); returns the votes moved."""
    if not store.exists(lake):
        return 0
    with store.connect(lake, wait_seconds=wait_seconds) as con:
        return move_from(con, lake.votes_db, wait_seconds=wait_seconds)


def prepare(lake: LakeLocation, *, wait_seconds: float = store.LOCK_WAIT_SECONDS) -> int:
    """Before first use: move an old lake's votes in, and create the votes store's tables.
    A lake folder kept in the other storage than the one in force raises store.StoreMismatch
    (an old bridge.duckdb under the DuckLake default: `bridge lake migrate` moves its votes)."""
    store.check(lake)
    moved = migrate(lake, wait_seconds=wait_seconds)
    with store.connect_file(lake.votes_db, wait_seconds=wait_seconds) as votes:
        ensure_schema(votes)
    return moved


@contextlib.contextmanager
def connect(lake: LakeLocation, *, pipeline: bool = True,
            wait_seconds: float = store.LOCK_WAIT_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short connection to the lake's votes store (read-write; call prepare() once first).
    With `pipeline` (once the pipeline's store exists), the pipeline's tables are readable too,
    by their plain names: bridge.duckdb attached read-only, or the votes store attached beside
    the process's DuckLake. Waits at most `wait_seconds` for either file's lock, then raises
    store.StoreBusy."""
    config = store.location(lake).ducklake if pipeline else None
    if config is not None and config.exists():
        with _beside_the_lake(lake.votes_db, config, wait_seconds) as con:
            yield con
        return
    with store.connect_file(lake.votes_db, wait_seconds=wait_seconds) as con:
        if pipeline and store.exists(lake):
            store.attach(con, lake, PIPELINE, wait_seconds=wait_seconds)
            name = store.one_row(con, "select current_database()")[0]
            con.execute(f"set search_path = '{_ident(name)}.main,{PIPELINE}.main'")
        yield con


# One call at a time per process: an instance attaches a file once.
_BESIDE_THE_LAKE = threading.Lock()


@contextlib.contextmanager
def _beside_the_lake(votes_db: Path, config: ducklake.DuckLakeConfig,
                     wait_seconds: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """On DuckLake: a cursor of this process's DuckLake instance with the votes store attached
    (read-write, in use, for this call only). Loading the DuckLake extensions into a fresh
    connection costs ~0.2 s (their signature checks), which every page of the annotation app
    would pay; the instance has them loaded once."""
    with _BESIDE_THE_LAKE, ducklake.connect(config) as con:
        store.attach_file(con, votes_db, VOTES, read_only=False, wait_seconds=wait_seconds)
        try:
            con.execute(f"use {VOTES}")
            con.execute(f"set search_path = '{VOTES}.main,{ducklake.ALIAS}.main'")
            yield con
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute("rollback")  # a transaction the caller left open (none: an error, ignored)
            con.execute(f'use "{ducklake.ALIAS}"')
            con.execute(f"detach {VOTES}")


def copy_votes(con: duckdb.DuckDBPyConnection, dataset: str | None, lake: LakeLocation, *,
               wait_seconds: float = store.LOCK_WAIT_SECONDS) -> None:
    """Copy `dataset`'s votes (every dataset's with None) into `con` (an in-memory snapshot, or
    a connection to the lake) as the temp table human_votes: the lake's votes store attached
    read-only for the copy only, an old lake's votes moved in first."""
    _ready(lake, wait_seconds)
    with _BESIDE_THE_LAKE, _attached(con, lake.votes_db, wait_seconds) as source:  # `con` may be a cursor of the process's DuckLake instance
        con.execute(f"create or replace temp table human_votes as select * from {source} "
                    "where $dataset is null or dataset = $dataset", {"dataset": dataset})


def votes_version(lake: LakeLocation, dataset: str, *, wait_seconds: float = store.LOCK_WAIT_SECONDS) -> str:
    """tables.votes_version of the lake's votes store as it is now, read in place: nothing is
    copied (the votes sensor and the staleness check ask it; human_labels copies the votes, once)."""
    _ready(lake, wait_seconds)
    with contextlib.closing(duckdb.connect()) as con, _attached(con, lake.votes_db, wait_seconds) as source:
        con.execute(f"create temp view human_votes as select * from {source}")
        return tables.votes_version(con, dataset)


def _ready(lake: LakeLocation, wait_seconds: float) -> None:
    """An old lake's votes moved in; the file created where nobody has opened it yet."""
    migrate(lake, wait_seconds=wait_seconds)
    if not lake.votes_db.exists():
        with store.connect_file(lake.votes_db, wait_seconds=wait_seconds) as votes:
            ensure_schema(votes)


@contextlib.contextmanager
def _attached(con: duckdb.DuckDBPyConnection, votes_db: Path, wait_seconds: float) -> Iterator[str]:
    """The votes store attached to `con` read-only for the block; yields the name its
    human_votes is read by (an empty stand-in in a store without the table)."""
    store.attach_file(con, votes_db, VOTES, wait_seconds=wait_seconds)
    stand_in = False
    try:
        stand_in = not store.one_row(con, "select count(*) from duckdb_tables() where database_name = ? "
                                     "and table_name = 'human_votes'", [VOTES])[0]
        if stand_in:  # a votes store nobody has opened yet
            con.execute(HUMAN_VOTES.replace("create table if not exists human_votes",
                                            "create or replace temp table _no_votes")
                        .replace(" default nextval('human_vote_ids')", ""))
        yield "_no_votes" if stand_in else f"{VOTES}.human_votes"
    finally:
        if stand_in:
            con.execute("drop table if exists temp._no_votes")
        con.execute(f"detach {VOTES}")


def __getattr__(name: str) -> type[VotesStore]:
    """VotesStore, the Dagster resource, from bridge_assets.human.votes_resource: imported when
    asked for, so that `bridge annotate` and the app do not import dagster."""
    if name == "VotesStore":
        from bridge_assets.human.votes_resource import VotesStore

        return VotesStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
