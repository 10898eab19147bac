"""Dagster resources: one per external system the assets touch."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import dagster as dg
import duckdb
import polars as pl

from bridge_assets.lake import location, store
from bridge_assets.paths import LakeLocation


class VotesSource(Protocol):
    """What a snapshot needs of the votes store (which depends on this module, not the reverse)."""

    def copy_votes(self, con: duckdb.DuckDBPyConnection, dataset: str | None) -> None: ...


class DuckDBStore(dg.ConfigurableResource):
    """The data lake: the pipeline's tables (a DuckLake, or `<data lake>/bridge.duckdb`; named
    after assets) and the votes store beside it. The entry point to their location: it holds
    the LakeLocation (`lake`) and hands it to every store call; the LLM resource and the votes
    store take this resource (nested), the command line and the sensors ask it."""

    data_lake: str = ""  # empty: $BRIDGE_DATA_LAKE or the project's data_lake/
    votes_db: str = ""   # empty: $BRIDGE_VOTES_DB or <data lake>/annotations/votes.duckdb

    @property
    def lake(self) -> LakeLocation:
        """The location (built once per process and configuration by lake.location.lake_location;
        not kept on the resource, so a changed setting is seen)."""
        return location.lake_location(self.data_lake, self.votes_db)

    @property
    def path(self) -> Path:
        return self.lake.duckdb

    @property
    def votes_path(self) -> Path:
        return self.lake.votes_db

    def connect(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return store.connect(self.lake)

    def write_partitions(self, tables: dict[str, pl.DataFrame], **keys: Any) -> int | None:
        """Replace one partition of `tables` in one transaction. Inside an asset, the lake
        snapshot it wrote goes into the materialization's metadata (`lake_snapshot`: the
        DuckLake snapshot id, "n/a" on a DuckDB file) and the run id into the snapshot."""
        from bridge_assets.lake.snapshots import current_run_info, record_snapshot

        info = current_run_info()
        snapshot = store.write_partitions(tables, keys, self.lake, info=info)
        record_snapshot(snapshot, tables)
        return snapshot

    def read(self, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
        return store.read_frame(sql, params, self.lake)

    def snapshot(self, dataset: str, tables: Sequence[str], *,
                 votes: VotesSource | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory copy of `dataset`'s rows of `tables` (those that exist), and with
        `votes` (the votes store, human/votes_store.VotesStore) its human_votes. The caller
        closes it. `tables` is the asset's declared reads: its deps come from the same tuple,
        so lineage and reads cannot drift apart."""
        memory = store.dataset_snapshot(self.lake, dataset, tables)
        if votes is not None:
            try:
                votes.copy_votes(memory, dataset)
            except BaseException:
                memory.close()
                raise
        return memory
