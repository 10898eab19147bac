"""Where things live: the project's resources and the runtime data lake.

The data lake's location is decided in one place, `lake.location.lake_location()`: the `DuckDBStore`
resource's config (bridge_assets.lake.resource), else `BRIDGE_DATA_LAKE`, else the project's
`data_lake/`. The votes store (annotators, assignments, votes) is a DuckDB file of its own:
`BRIDGE_VOTES_DB`, else `<data lake>/annotations/votes.duckdb`, so the pipeline's file can be
rebuilt or deleted (`make clean`) without touching a vote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # paths is imported everywhere (read_sql): it does not import duckdb
    from bridge_assets.lake.ducklake import DuckLakeConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESOURCES_DIR = PROJECT_ROOT / "resources"
PROMPTS_DIR = RESOURCES_DIR / "prompts"  # the labelers' prompt files (labeling.prompts reads them)
SQL_DIR = PROJECT_ROOT / "sql"
PIPELINE_FILE = "bridge.duckdb"  # the DuckDB-file storage's file, and the path that stands for the store


@dataclass(frozen=True)
class LakeLocation:
    """The runtime storage, resolved once (lake.location.lake_location()): the lake folder and what
    is in it, the votes store, and where the pipeline's tables are: the DuckLake `ducklake`
    (the default storage), or the DuckDB file `duckdb` when `ducklake` is None."""

    folder: Path
    votes_db: Path                    # the votes store (annotators, assignments, votes)
    storage: str                      # ducklake or duckdb ($BRIDGE_STORAGE)
    ducklake_config: DuckLakeConfig   # this folder's DuckLake as configured, whatever the storage
                                      # (`bridge lake migrate` moves a DuckDB file into it)

    @property
    def ducklake(self) -> DuckLakeConfig | None:
        """The DuckLake holding the pipeline's tables; None on the DuckDB-file storage."""
        return self.ducklake_config if self.storage == "ducklake" else None

    @property
    def duckdb(self) -> Path:
        """The pipeline's DuckDB file (BRIDGE_STORAGE=duckdb): one table per asset, and the LLM
        call ledger. Under DuckLake it names the pipeline's store in messages and old lakes."""
        return self.folder / PIPELINE_FILE

    @property
    def dagster_home(self) -> Path:
        return self.folder / "dagster_home"

    @property
    def runs(self) -> Path:
        """TREC run files written by `bridge retrievers export`."""
        return self.folder / "runs"

    @property
    def downloads(self) -> Path:
        return self.folder / "downloads"

    def reports(self, dataset: str) -> Path:
        return self.folder / "reports" / dataset

    def exports(self, dataset: str) -> Path:
        return self.folder / "exports" / dataset


def read_sql(name: str) -> str:
    """The text of `sql/<name>.sql` (set-based steps are named after the asset they build)."""
    return (SQL_DIR / f"{name}.sql").read_text()
