"""Where things live: the project's resources and the runtime data lake.

The data lake's location is decided in one place, `Lake.locate()`: the `DuckDBStore`
resource's config (bridge_assets.resources), else `BRIDGE_DATA_LAKE`, else the project's
`data_lake/`. The votes store (annotators, assignments, votes) is a DuckDB file of its own:
`BRIDGE_VOTES_DB`, else `<data lake>/annotations/votes.duckdb`, so the pipeline's file can be
rebuilt or deleted (`make clean`) without touching a vote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESOURCES_DIR = PROJECT_ROOT / "resources"
SQL_DIR = PROJECT_ROOT / "sql"

LAKE_ENV = "BRIDGE_DATA_LAKE"
VOTES_ENV = "BRIDGE_VOTES_DB"
STORAGE_ENV = "BRIDGE_STORAGE"
STORAGES = ("duckdb", "ducklake")
# How the pipeline's tables are stored unless $BRIDGE_STORAGE says otherwise: "ducklake" (a
# DuckLake: SQLite catalog + Parquet under the lake folder, bridge_assets.ducklake; many writers,
# snapshots) or "duckdb" (one file, <lake>/bridge.duckdb, one writer at a time).
DEFAULT_STORAGE = "ducklake"


def storage() -> str:
    """The storage backend in force: $BRIDGE_STORAGE, else DEFAULT_STORAGE."""
    kind = (os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE).strip().lower()
    if kind not in STORAGES:
        raise ValueError(f"{STORAGE_ENV}={kind!r}: expected one of {', '.join(STORAGES)}")
    return kind


@dataclass(frozen=True)
class Lake:
    """The runtime storage: the lake folder and the files and folders in it."""

    folder: Path
    votes_db: Path      # the votes store (annotators, assignments, votes)

    @classmethod
    def locate(cls, data_lake: str | Path = "", votes_db: str | Path = "") -> Lake:
        """`data_lake` (empty: $BRIDGE_DATA_LAKE, else the project's data_lake/) and `votes_db`
        (empty: $BRIDGE_VOTES_DB, else <data lake>/annotations/votes.duckdb); relative paths
        are relative to the working directory."""
        folder = Path(data_lake or os.environ.get(LAKE_ENV) or PROJECT_ROOT / "data_lake").resolve()
        votes = Path(votes_db or os.environ.get(VOTES_ENV) or folder / "annotations" / "votes.duckdb")
        return cls(folder, votes.resolve())

    @property
    def duckdb(self) -> Path:
        """The pipeline's DuckDB file: one table per asset, and the LLM call ledger."""
        return self.folder / "bridge.duckdb"

    @property
    def storage(self) -> str:
        """duckdb or ducklake (see storage()); the pipeline's tables are reached through
        store.connect(self.duckdb) either way."""
        return storage()

    @property
    def dagster_home(self) -> Path:
        return self.folder / "dagster_home"

    @property
    def runs(self) -> Path:
        """TREC run files written by `bridge retrievers export`."""
        return self.folder / "runs"

    @property
    def indexes(self) -> Path:
        return self.folder / "indexes"

    @property
    def downloads(self) -> Path:
        return self.folder / "downloads"

    def reports(self, dataset: str) -> Path:
        return self.folder / "reports" / dataset

    def exports(self, dataset: str) -> Path:
        return self.folder / "exports" / dataset


def data_lake_dir() -> Path:
    """The lake folder as configured by the environment (see Lake.locate)."""
    return Lake.locate().folder


def duckdb_path() -> Path:
    """The pipeline's DuckDB file as configured by the environment (see Lake.locate)."""
    return Lake.locate().duckdb


def read_sql(name: str) -> str:
    """The text of `sql/<name>.sql` (set-based steps are named after the asset they build)."""
    return (SQL_DIR / f"{name}.sql").read_text()
