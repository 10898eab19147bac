"""The votes store as a Dagster resource (bridge_assets.human.votes_store: what it is; kept
apart so that the annotation commands and app do not import dagster)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb

from bridge_assets.human.votes_store import connect, copy_votes, prepare, votes_version
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import LOCK_WAIT_SECONDS  # by name: the class's field `store` hides the module


class VotesStore(dg.ConfigurableResource):
    """The votes store of the store resource's lake (nested: it asks the store where it is).
    Built once, in the definitions (resource key `votes`), beside the store it is nested on;
    human_labels (the one copy of a run's votes), the votes sensor and the staleness check (each
    reading the votes' version in place) take it from there."""

    store: DuckDBStore

    def __init__(self, **config: Any):
        # Dagster allows no default for a nested resource: without one, the environment's lake.
        config.setdefault("store", DuckDBStore())
        super().__init__(**config)

    @property
    def path(self) -> Path:
        return self.store.lake.votes_db

    def prepare(self, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> int:
        """See prepare(): once before first use."""
        return prepare(self.store.lake, wait_seconds=wait_seconds)

    def connect(self, *, wait_seconds: float = LOCK_WAIT_SECONDS) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """See connect(): the votes store read-write, the pipeline's tables readable."""
        return connect(self.store.lake, wait_seconds=wait_seconds)

    def copy_votes(self, con: duckdb.DuckDBPyConnection, dataset: str | None) -> None:
        """See copy_votes(): `dataset`'s votes (all with None) into `con` as human_votes."""
        copy_votes(con, dataset, self.store.lake)

    def version(self, dataset: str) -> str:
        """See votes_version(): a hash of `dataset`'s counted votes, read in place."""
        return votes_version(self.store.lake, dataset)
