"""DuckLake: the data lake as a catalog plus Parquet files (the default storage;
`BRIDGE_STORAGE=duckdb` is the one-file alternative).

DuckLake (https://ducklake.select) is DuckDB's own lakehouse format: the tables' metadata lives
in a SQL catalog (a SQLite or DuckDB file, or Postgres) and their rows in Parquet files under a
data path (a folder, or s3:// / gs://). Every change is one snapshot; a snapshot is atomic, so a
partition's tables are replaced in one commit, and an older snapshot can still be read (time
travel: `bridge qrels export --as-of`). Many processes, on one machine or many, write at once:
nobody holds a file lock; a commit that lost a race to another is retried (store.py).

Where it lives (`for_folder`, given these settings by bridge_assets.lake.location.lake_location()):

- `BRIDGE_LAKE_CATALOG`: what follows `ducklake:` in the ATTACH. Default
  `sqlite:<lake>/ducklake.sqlite` (embedded, in WAL mode so readers never block a commit).
  `postgres:dbname=bridge host=db user=bridge` for many machines; a relative `sqlite:` or
  DuckDB file path is relative to the lake folder. (A DuckDB catalog file is one process at a
  time: use SQLite or Postgres when processes run in parallel.)
- `BRIDGE_LAKE_DATA_PATH`: where the Parquet files go. Default `<lake>/ducklake/`;
  `s3://bucket/bridge/` or `gs://bucket/bridge/` (credentials: a DuckDB secret, see README).
- `BRIDGE_LAKE_INLINE_ROWS`: inserts of at most this many rows are kept in the catalog (data
  inlining) instead of a Parquet file each: the LLM call ledger's chunks, small metrics tables.
  `compact()` flushes them to Parquet and merges small files.

The extensions are loaded from the pinned PyPI packages (duckdb-extension-ducklake,
duckdb-extension-sqlite-scanner, ...; their version must equal duckdb's), else from DuckDB's
extension folder, else installed (`INSTALL ducklake`, needs the network).

Each process keeps one DuckDB instance with the lake attached (loading the extensions takes
0.4 s); `connect()` hands out a cursor of it, so a short connection costs what a query costs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from bridge_assets.errors import BridgeError

logger = logging.getLogger(__name__)

ALIAS = "lake"
CATALOG_FILE = "ducklake.sqlite"
DATA_FOLDER = "ducklake"
# Inserts up to this many rows stay in the catalog: the ledger's chunks (64 calls) and the
# small per-dataset tables never make a Parquet file each.
INLINE_ROWS = 1000
# Extensions by catalog kind (what `ducklake:<kind>:...` needs besides ducklake itself).
CATALOG_EXTENSIONS = {"sqlite": "sqlite_scanner", "postgres": "postgres_scanner"}
REMOTE_PREFIXES = {"s3://": "httpfs", "gs://": "httpfs", "gcs://": "httpfs", "r2://": "httpfs",
                   "az://": "azure", "abfss://": "azure"}


class LakeError(BridgeError, RuntimeError):
    """The DuckLake cannot be opened as configured (missing extension, bad catalog)."""


@dataclass(frozen=True)
class DuckLakeConfig:
    """One DuckLake: its catalog (after `ducklake:`), data path and inlining limit."""

    folder: Path          # the lake folder (reports, indexes, dagster_home stay there)
    catalog: str          # e.g. sqlite:/abs/ducklake.sqlite, postgres:dbname=bridge host=db
    data_path: str        # a folder (ending in /) or s3://... / gs://...
    inline_rows: int = INLINE_ROWS
    # whether catalog and data path are the folder's own defaults (follow_moved_folder)
    own_places: bool = True

    @classmethod
    def for_folder(cls, folder: str | Path, *, catalog: str = "", data_path: str = "",
                   inline_rows: int = INLINE_ROWS) -> DuckLakeConfig:
        """The DuckLake of `folder`: `catalog` (BRIDGE_LAKE_CATALOG; empty: the folder's SQLite
        file) and `data_path` (BRIDGE_LAKE_DATA_PATH; empty: <folder>/ducklake/)."""
        folder = Path(folder).resolve()
        own_places = not catalog and not data_path
        catalog = catalog or f"sqlite:{CATALOG_FILE}"
        kind, _, rest = catalog.partition(":")
        if kind in ("sqlite", "duckdb") and rest:
            catalog = f"{kind}:{_local(folder, rest)}" if kind == "sqlite" else str(_local(folder, rest))
        elif not rest and kind not in ("postgres",):  # a bare path: a DuckDB catalog file
            catalog = str(_local(folder, catalog))
        data_path = data_path or str(folder / DATA_FOLDER)
        if "://" not in data_path:
            data_path = str(_local(folder, data_path))
        if not data_path.endswith("/"):
            data_path += "/"
        return cls(folder, catalog, data_path, inline_rows, own_places)

    @property
    def kind(self) -> str:
        """sqlite, postgres or duckdb (a DuckDB catalog file)."""
        head = self.catalog.split(":", 1)[0]
        return head if head in ("sqlite", "postgres") else "duckdb"

    @property
    def catalog_file(self) -> Path | None:
        """The local catalog file (None for Postgres)."""
        if self.kind == "postgres":
            return None
        return Path(self.catalog.split(":", 1)[1] if self.kind == "sqlite" else self.catalog)

    def exists(self) -> bool:
        """Whether the lake was created (a Postgres catalog is taken to exist)."""
        return self.catalog_file is None or self.catalog_file.exists()

    def attach_sql(self, alias: str = ALIAS, *, read_only: bool = False,
                   snapshot: int | None = None) -> str:
        options = [f"DATA_PATH {_quote(self.data_path)}"]
        if read_only or snapshot is not None:
            options.append("READ_ONLY")
        if snapshot is not None:
            options.append(f"SNAPSHOT_VERSION {int(snapshot)}")
        else:
            options.append(f"DATA_INLINING_ROW_LIMIT {int(self.inline_rows)}")
        return f"ATTACH {_quote('ducklake:' + self.catalog)} AS \"{alias}\" ({', '.join(options)})"


def _local(folder: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else folder / p


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# -- extensions -------------------------------------------------------------------------------

def _package_file(name: str) -> Path | None:
    """The extension file shipped by the PyPI package duckdb-extension-<name>, if installed
    for this duckdb version."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        if path.exists():
            return path
    return None


def load_extension(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """LOAD `name`: the pinned package's file, else DuckDB's extension folder, else INSTALL."""
    if (path := _package_file(name)) is not None:
        con.execute(f"LOAD {_quote(str(path))}")
        return
    try:
        con.execute(f"LOAD {name}")
        return
    except duckdb.Error:
        pass
    try:
        con.execute(f"INSTALL {name}")
        con.execute(f"LOAD {name}")
    except duckdb.Error as exc:
        raise LakeError(
            f"the DuckDB extension '{name}' is not available: install the package "
            f"duckdb-extension-{name.replace('_', '-')}=={duckdb.__version__} (requirements.txt "
            f"pins it), or let DuckDB download it (INSTALL {name}; needs the network): {exc}") from exc


def extensions_for(config: DuckLakeConfig) -> list[str]:
    names = ["ducklake"]
    if (extra := CATALOG_EXTENSIONS.get(config.kind)) is not None:
        names.append(extra)
    for prefix, extension in REMOTE_PREFIXES.items():
        if config.data_path.startswith(prefix) and extension not in names:
            names.append(extension)
    return names


def stored_data_path(config: DuckLakeConfig) -> str | None:
    """The data path a local SQLite catalog holds; None for other catalogs, or a catalog DuckLake
    has not initialised yet."""
    path = config.catalog_file
    if config.kind != "sqlite" or path is None or not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as con:
        try:
            row = con.execute("select value from ducklake_metadata where key = 'data_path'").fetchone()
        except sqlite3.OperationalError:  # no ducklake_metadata yet
            return None
    return row[0] if row else None


def repoint(config: DuckLakeConfig, data_path: str | None = None) -> tuple[str, str] | None:
    """Make a local SQLite catalog name `data_path` (default: the config's) as its data path;
    (old, new) when it named another, None when nothing changed. The data files' own paths are
    relative to the data path, so they follow."""
    catalog_file = config.catalog_file  # a SQLite catalog's is never None
    if config.kind != "sqlite" or catalog_file is None:
        raise LakeError(f"only a local SQLite catalog can be re-pointed here; {config.catalog} is "
                        "changed where it lives (its ducklake_metadata table, key data_path)")
    new = data_path or config.data_path
    if "://" not in new:
        if not Path(new).is_dir():
            raise LakeError(f"no data folder at {new}")
        new = str(Path(new).resolve()) + "/"
    old = stored_data_path(config)
    if old is None or old == new:
        return None
    with contextlib.closing(sqlite3.connect(catalog_file, timeout=60)) as con:
        con.execute("update ducklake_metadata set value = ? where key = 'data_path'", [new])
        con.commit()
    return old, new


_followed: set[DuckLakeConfig] = set()


def follow_moved_folder(config: DuckLakeConfig) -> None:
    """A lake folder copied or moved (a backup, a bigger disk, a finished benchmark shared) keeps
    a catalog that names the old data path. When both the catalog and the data path are the
    folder's own (no BRIDGE_LAKE_CATALOG / BRIDGE_LAKE_DATA_PATH) and the folder holds its data,
    the catalog is re-pointed at it, saying so; explicit places are never changed behind the
    user's back (`bridge lake repoint` does it on request)."""
    if config in _followed:
        return
    _followed.add(config)
    if not config.own_places or not Path(config.data_path).is_dir():
        return
    moved = repoint(config)
    if moved:
        logger.warning("the lake folder %s was moved or copied: its catalog named the data path %s, "
                       "it now names %s", config.folder, *moved)


def attach(con: duckdb.DuckDBPyConnection, config: DuckLakeConfig, alias: str = ALIAS, *,
           read_only: bool = False, snapshot: int | None = None) -> None:
    """ATTACH the lake to `con` (its extensions loaded), following a moved lake folder."""
    follow_moved_folder(config)
    try:
        con.execute(config.attach_sql(alias, read_only=read_only, snapshot=snapshot))
    except duckdb.Error as exc:
        if "does not match existing data path" not in str(exc):
            raise
        raise LakeError(f"{str(exc).splitlines()[0]} (after moving the lake's data, `bridge lake repoint` "
                        "makes the catalog name where it is now)") from None


def new_instance(config: DuckLakeConfig, *, read_only: bool = False, snapshot: int | None = None,
                 alias: str = ALIAS) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB with the lake attached as `alias` and in use."""
    con = duckdb.connect()
    try:
        for name in extensions_for(config):
            load_extension(con, name)
        if not read_only and snapshot is None:
            _prepare_catalog(config)
        elif not config.exists():
            raise LakeError(f"no DuckLake at {config.catalog_file}")
        attach(con, config, alias, read_only=read_only, snapshot=snapshot)
        con.execute(f'USE "{alias}"')
    except BaseException:
        con.close()
        raise
    return con


def _prepare_catalog(config: DuckLakeConfig) -> None:
    """Create the folders, and a new SQLite catalog in WAL mode (readers then never block a
    commit, and a writer's long transaction never blocks another's commit)."""
    if not config.data_path.startswith(tuple(REMOTE_PREFIXES)):
        Path(config.data_path).mkdir(parents=True, exist_ok=True)
    path = config.catalog_file
    if path is None or path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if config.kind == "sqlite":
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as con:
            con.execute("pragma journal_mode=wal")


_instances: dict[tuple[int, DuckLakeConfig], duckdb.DuckDBPyConnection] = {}
_instances_lock = threading.Lock()


def instance(config: DuckLakeConfig) -> duckdb.DuckDBPyConnection:
    """This process's DuckDB instance with `config`'s lake attached (created on first use).
    Keyed by process id too: a forked child never uses its parent's instance."""
    key = (os.getpid(), config)
    with _instances_lock:
        con = _instances.get(key)
        if con is None:
            con = _instances[key] = _attach_retrying(config)
        return con


def _attach_retrying(config: DuckLakeConfig) -> duckdb.DuckDBPyConnection:
    """Two processes creating the same new lake race on its first snapshot: the loser retries."""
    import time

    for attempt in range(20):
        try:
            return new_instance(config)
        except duckdb.Error as exc:
            if attempt == 19 or not is_conflict(exc):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def forget_instances() -> None:
    """Close this process's lake instances (tests; a process that changes its configuration)."""
    with _instances_lock:
        for (pid, _), con in list(_instances.items()):
            if pid == os.getpid():
                with contextlib.suppress(Exception):
                    con.close()
        _instances.clear()


@contextlib.contextmanager
def connect(config: DuckLakeConfig) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short connection to the lake: a cursor of this process's instance, the lake in use."""
    cursor = instance(config).cursor()
    try:
        cursor.execute(f'USE "{ALIAS}"')
        yield cursor
    finally:
        cursor.close()


def is_conflict(exc: BaseException) -> bool:
    """A commit that lost a race to another writer (nothing of it was committed): retry it."""
    if isinstance(exc, duckdb.TransactionException):
        return True
    text = str(exc)
    return any(marker in text for marker in (
        "database is locked", "Transaction conflict", "conflict", "Failed to commit DuckLake",
        "could not serialize access", "does not have any columns", "already exists"))


# -- snapshots --------------------------------------------------------------------------------

def set_commit_info(con: duckdb.DuckDBPyConnection, message: str, info: dict[str, Any]) -> None:
    """Label the open transaction's snapshot (author bridge, `message`, `info` as JSON)."""
    con.execute(f"CALL ducklake_set_commit_message('{ALIAS}', 'bridge', ?, extra_info => ?)",
                [message, json.dumps(info, sort_keys=True, default=str)])


def last_committed_snapshot(con: duckdb.DuckDBPyConnection) -> int | None:
    """The snapshot this connection's last commit made (None when it changed nothing)."""
    row = con.execute(f"FROM ducklake_last_committed_snapshot('{ALIAS}')").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def current_snapshot(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute(f"FROM ducklake_current_snapshot('{ALIAS}')").fetchone()
    assert row is not None  # the table function's one row
    return int(row[0])


def snapshots(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every snapshot, oldest first: id, time, changes, message and the info BRIDGE recorded
    (run_id, assets, partition)."""
    rows = con.execute(f"SELECT snapshot_id, snapshot_time, changes, commit_message, commit_extra_info "
                       f"FROM ducklake_snapshots('{ALIAS}') ORDER BY snapshot_id").fetchall()
    out = []
    for snapshot_id, when, changes, message, extra in rows:
        try:
            info = json.loads(extra) if extra else {}
        except json.JSONDecodeError:
            info = {}
        out.append({"snapshot": int(snapshot_id), "time": when, "changes": changes,
                    "message": message, **({"info": info} if info else {})})
    return out


def snapshot_of_run(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The last snapshot that the Dagster run `run_id` (or a unique prefix of it) committed."""
    matches = [s for s in snapshots(con) if str(s.get("info", {}).get("run_id", "")).startswith(run_id)]
    runs = {s["info"]["run_id"] for s in matches}
    if len(runs) > 1:
        raise LakeError(f"run id prefix '{run_id}' matches several runs: {', '.join(sorted(runs))}")
    return matches[-1]["snapshot"] if matches else None


# -- maintenance ------------------------------------------------------------------------------

def compact(con: duckdb.DuckDBPyConnection, *, table: str | None = None,
            expire_older_than: str | None = None) -> dict[str, Any]:
    """Flush inlined rows to Parquet, merge small adjacent files, rewrite files with many
    deletions; with `expire_older_than` (e.g. '30 days') also expire older snapshots and delete
    the files only they used (time travel before then is gone). Returns the file counts."""
    before = file_counts(con)
    target = ", table_name => ?" if table else ""
    args = [table] if table else []
    con.execute(f"CALL ducklake_flush_inlined_data('{ALIAS}'{target})", args)
    con.execute(f"CALL ducklake_merge_adjacent_files('{ALIAS}'{', ?' if table else ''})", args)
    con.execute(f"CALL ducklake_rewrite_data_files('{ALIAS}'{', ?' if table else ''})", args)
    con.execute(f"CALL ducklake_merge_adjacent_files('{ALIAS}'{', ?' if table else ''})", args)
    if expire_older_than:
        con.execute(f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => now() - ?::INTERVAL)",
                    [expire_older_than])
    con.execute(f"CALL ducklake_cleanup_old_files('{ALIAS}', cleanup_all => true)")
    return {"before": before, "after": file_counts(con)}


def file_counts(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int]]:
    """Per table: live Parquet data files and delete files."""
    return {name: {"files": int(files), "delete_files": int(deletes)}
            for name, files, deletes in con.execute(
                f"SELECT table_name, file_count, delete_file_count FROM ducklake_table_info('{ALIAS}') "
                f"ORDER BY table_name").fetchall()}
