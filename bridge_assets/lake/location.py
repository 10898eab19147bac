"""Where the lake is: a LakeLocation built from the BRIDGE_* settings (or the arguments), once
per process and configuration. Only the edges call `lake_location()`: the DuckDBStore resource,
the commands that open the votes store without Dagster, an LLMClient used on its own, scripts;
everything else is handed the location."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bridge_assets.lake import ducklake
from bridge_assets.paths import PROJECT_ROOT, LakeLocation
from bridge_assets.settings import env

# What a lake location is built from: a change to any of them is another location.
LOCATION_VARIABLES = ("BRIDGE_DATA_LAKE", "BRIDGE_VOTES_DB", "BRIDGE_STORAGE", "BRIDGE_LAKE_CATALOG",
                      "BRIDGE_LAKE_DATA_PATH", "BRIDGE_LAKE_INLINE_ROWS")

_locations: dict[tuple, LakeLocation] = {}
_locations_lock = threading.Lock()


def lake_location(data_lake: str | Path = "", votes_db: str | Path = "") -> LakeLocation:
    """The lake's location: `data_lake` (empty: BRIDGE_DATA_LAKE, else the project's data_lake/)
    and `votes_db` (empty: BRIDGE_VOTES_DB, else <data lake>/annotations/votes.duckdb); relative
    paths are relative to the working directory. Built once per process for each configuration,
    so every store call of a run shares one object (a test that changes a variable gets another)."""
    key = (str(data_lake), str(votes_db), os.getcwd(), *(os.environ.get(name) for name in LOCATION_VARIABLES))
    with _locations_lock:
        location = _locations.get(key)
        if location is None:
            location = _locations[key] = build_location(data_lake, votes_db)
        return location


def build_location(data_lake: str | Path, votes_db: str | Path) -> LakeLocation:
    """A new LakeLocation from the settings (lake_location() is the one caller: it caches)."""
    folder = Path(data_lake or env.raw("BRIDGE_DATA_LAKE") or PROJECT_ROOT / "data_lake").resolve()
    votes = Path(votes_db or env.raw("BRIDGE_VOTES_DB") or folder / "annotations" / "votes.duckdb").resolve()
    lake = ducklake.DuckLakeConfig.for_folder(folder, catalog=env.raw("BRIDGE_LAKE_CATALOG") or "",
                                              data_path=env.raw("BRIDGE_LAKE_DATA_PATH") or "",
                                              inline_rows=int(env.raw("BRIDGE_LAKE_INLINE_ROWS") or ducklake.INLINE_ROWS))
    return LakeLocation(folder, votes, env.storage, lake)
