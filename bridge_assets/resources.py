"""Dagster resources: one per external system the assets touch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from bridge_assets import store
from bridge_assets.paths import data_lake_dir


class DuckDBStore(dg.ConfigurableResource):
    """The DuckDB file of the data lake (`<data lake>/bridge.duckdb`), tables named after assets."""

    data_lake: str = ""  # empty: $BRIDGE_DATA_LAKE or the project's data_lake/

    @property
    def path(self) -> Path:
        return (Path(self.data_lake) if self.data_lake else data_lake_dir()) / "bridge.duckdb"

    def connect(self):
        return store.connect(self.path)

    def write_partitions(self, tables: dict[str, pl.DataFrame], **keys: Any) -> None:
        store.write_partitions(tables, keys, self.path)

    def read(self, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
        return store.read_frame(sql, params, self.path)
