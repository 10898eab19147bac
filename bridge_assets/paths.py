"""Where things live: the project's resources and the runtime data lake."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESOURCES_DIR = PROJECT_ROOT / "resources"
SQL_DIR = PROJECT_ROOT / "sql"


def data_lake_dir() -> Path:
    """The runtime storage folder; `BRIDGE_DATA_LAKE` overrides the project's `data_lake/`."""
    return Path(os.environ.get("BRIDGE_DATA_LAKE", PROJECT_ROOT / "data_lake")).resolve()


def duckdb_path() -> Path:
    return data_lake_dir() / "bridge.duckdb"


def read_sql(name: str) -> str:
    """The text of `sql/<name>.sql` (set-based steps are named after the asset they build)."""
    return (SQL_DIR / f"{name}.sql").read_text()
