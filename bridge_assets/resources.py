"""Dagster resources: one per external system the assets touch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import polars as pl

from bridge_assets import store
from bridge_assets.paths import Lake


class DuckDBStore(dg.ConfigurableResource):
    """The data lake: the pipeline's DuckDB file (`<data lake>/bridge.duckdb`, tables named
    after assets) and the votes store beside it. The one owner of their locations: the command
    line, the sensors and the LLM call ledger all ask it (`DuckDBStore().lake`)."""

    data_lake: str = ""  # empty: $BRIDGE_DATA_LAKE or the project's data_lake/
    votes_db: str = ""   # empty: $BRIDGE_VOTES_DB or <data lake>/annotations/votes.duckdb

    @property
    def lake(self) -> Lake:
        return Lake.locate(self.data_lake, self.votes_db)

    @property
    def path(self) -> Path:
        return self.lake.duckdb

    @property
    def votes_path(self) -> Path:
        return self.lake.votes_db

    def connect(self):
        return store.connect(self.path)

    def write_partitions(self, tables: dict[str, pl.DataFrame], **keys: Any) -> int | None:
        """Replace one partition of `tables` in one transaction. Inside an asset, the lake
        snapshot it wrote goes into the materialization's metadata (`lake_snapshot`: the
        DuckLake snapshot id, "n/a" on a DuckDB file) and the run id into the snapshot."""
        from bridge_assets.snapshots import current_run_info, record_snapshot

        info = current_run_info()
        snapshot = store.write_partitions(tables, keys, self.path, info=info)
        record_snapshot(snapshot, tables)
        return snapshot

    def read(self, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
        return store.read_frame(sql, params, self.path)

    def snapshot(self, dataset: str, tables: Sequence[str], *, votes: bool = False) -> duckdb.DuckDBPyConnection:
        """An in-memory copy of `dataset`'s rows of `tables` (those that exist), and with
        `votes` its human_votes from the votes store (attached read-only for the copy). The
        caller closes it. `tables` is the asset's declared reads: its deps come from the same
        tuple, so lineage and reads cannot drift apart."""
        memory = store.dataset_snapshot(self.path, dataset, tables)
        if votes:
            from bridge_assets.human.votes_store import copy_votes

            try:
                copy_votes(memory, dataset, lake_db=self.path, votes_db=self.votes_path)
            except BaseException:
                memory.close()
                raise
        return memory
