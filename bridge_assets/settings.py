"""Every `BRIDGE_*` environment variable, declared once: its name, default and meaning (`VARIABLES`,
the source of README.md's table of settings, which tests/test_settings.py checks against it).

Other modules ask `env` (a `Settings`), never `os.environ`. A value is read when asked, not at
import, so a test's `monkeypatch.setenv` is seen by the code it then runs.

The lake's location is built from these settings in one place, bridge_assets.lake.location.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bridge_assets.errors import SettingsError
from bridge_assets.paths import RESOURCES_DIR


@dataclass(frozen=True)
class Setting:
    name: str
    default: str   # what applies when unset, in words for the README ("" = nothing)
    meaning: str   # one line


VARIABLES: tuple[Setting, ...] = (
    Setting("BRIDGE_DATA_LAKE", "data_lake/ in the project",
            "the lake folder: the pipeline's tables, the votes store, caches, reports, Dagster's home"),
    Setting("BRIDGE_VOTES_DB", "<data lake>/annotations/votes.duckdb",
            "the votes store (annotators, assignments, votes)"),
    Setting("BRIDGE_STORAGE", "ducklake",
            "how the pipeline's tables are stored: ducklake, or duckdb (one file, <data lake>/bridge.duckdb)"),
    Setting("BRIDGE_LAKE_CATALOG", "sqlite:ducklake.sqlite",
            "the DuckLake catalog (what follows ducklake:), relative to the lake folder, or postgres:..."),
    Setting("BRIDGE_LAKE_DATA_PATH", "<data lake>/ducklake/",
            "where the DuckLake's Parquet files go: a folder, s3://... or gs://..."),
    Setting("BRIDGE_LAKE_INLINE_ROWS", "1000",
            "inserts of at most this many rows stay in the DuckLake catalog"),
    Setting("BRIDGE_EXECUTOR", "multiprocess",
            "the asset jobs' executor: multiprocess, dask or in_process"),
    Setting("BRIDGE_DASK_SCHEDULER", "a LocalCluster", "the Dask cluster to run steps on (tcp://host:8786)"),
    Setting("BRIDGE_DASK_WORKERS", "2", "the LocalCluster's worker processes"),
    Setting("BRIDGE_REGISTRY_DIR", "none",
            "a folder of your own registries (datasets.yaml, retrievers.yaml, models.yaml, runs/)"),
    Setting("BRIDGE_DATASETS", "resources/datasets.yaml", "the dataset registry file"),
    Setting("BRIDGE_RETRIEVERS", "resources/retrievers.yaml", "the retriever registry file"),
    Setting("BRIDGE_MODELS", "resources/models.yaml", "the LLM profiles file"),
    Setting("BRIDGE_GOLDSETS", "resources/goldsets.yaml", "the labeler evaluation's gold sets file"),
    Setting("BRIDGE_RETRIEVER_PROFILE", "the registry's profile:", "which retriever profile runs"),
    Setting("BRIDGE_INDEX_DIR", "<data lake>/indexes",
            "where indexes and document embeddings are cached (keyed by corpus content and encoder: "
            "lakes over the same corpora may share one folder)"),
    Setting("BRIDGE_MODELS_DIR", "~/.cache/bridge/models", "where joined or downloaded LLM weights are kept"),
    Setting("BRIDGE_MAX_LINE_BYTES", str(8 * 1024 * 1024), "the longest line a dataset file may have (bytes)"),
    Setting("BRIDGE_MAX_TEXT_CHARS", str(1_000_000), "the longest text a dataset may have (characters)"),
    Setting("BRIDGE_SENSOR_INTERVAL_S", "60 (automation: 30)",
            "the least seconds between two ticks of each sensor (registry, run files, votes, "
            "student re-rankers, automation)"),
    Setting("BRIDGE_ANNOTATE_SECRET", "random, kept in <data lake>/annotate.secret",
            "the annotation app's session secret"),
    Setting("BRIDGE_ANNOTATOR_RATE", "none",
            "what an hour of people's annotation time costs: 30 (USD) or 30 EUR (the dry run's human cost)"),
    Setting("BRIDGE_LEASE_SECONDS", "60",
            "how long a dead process's lease on an LLM call outlives it (others then send the call)"),
    Setting("BRIDGE_TEST_PAUSE_IN_WRITE", "none",
            "tests only: seconds a partition write sleeps before its commit (to kill it there)"),
)
BY_NAME = {setting.name: setting for setting in VARIABLES}
STORAGES = ("duckdb", "ducklake")


class Settings:
    """The settings in force, read from the environment when asked."""

    @staticmethod
    def raw(name: str) -> str | None:
        """The variable's value; None when unset. Only declared variables can be asked for."""
        if name not in BY_NAME:
            raise KeyError(f"{name} is not declared in bridge_assets.settings.VARIABLES")
        return os.environ.get(name)

    def text(self, name: str) -> str:
        """The value stripped; "" when unset or blank."""
        return (self.raw(name) or "").strip()

    @property
    def storage(self) -> str:
        kind = (self.raw("BRIDGE_STORAGE") or BY_NAME["BRIDGE_STORAGE"].default).strip().lower()
        if kind not in STORAGES:
            raise SettingsError(f"BRIDGE_STORAGE={kind!r}: expected one of {', '.join(STORAGES)}")
        return kind

    @property
    def executor(self) -> str | None:
        """The executor named, lower case; None when unset (multiprocess)."""
        value = self.raw("BRIDGE_EXECUTOR")
        return value.strip().lower() if value else None

    @property
    def dask_workers(self) -> int:
        return int(self.raw("BRIDGE_DASK_WORKERS") or BY_NAME["BRIDGE_DASK_WORKERS"].default)

    @property
    def registry_dir(self) -> Path | None:
        value = self.text("BRIDGE_REGISTRY_DIR")
        return Path(value).expanduser().resolve() if value else None

    def registry_file(self, name: str, shipped: str) -> Path:
        """A registry file: the variable `name` (when set at all), else resources/<shipped>."""
        value = self.raw(name)
        return Path(value if value is not None else RESOURCES_DIR / shipped).resolve()

    @property
    def annotator_rate(self) -> tuple[float, str] | None:
        """BRIDGE_ANNOTATOR_RATE as (amount per hour, currency): '30' is 30 USD, '30 EUR' 30 EUR;
        None when unset."""
        value = self.text("BRIDGE_ANNOTATOR_RATE")
        if not value:
            return None
        amount, _, currency = value.partition(" ")
        try:
            rate = float(amount)
        except ValueError:
            rate = -1.0
        if rate < 0 or (currency.strip() and not currency.strip().isalpha()):
            raise SettingsError(f"BRIDGE_ANNOTATOR_RATE={value!r}: expected an amount per hour, "
                             "e.g. 30 (USD) or '30 EUR'")
        return rate, currency.strip().upper() or "USD"

    def sensor_interval(self, default: int) -> int:
        """BRIDGE_SENSOR_INTERVAL_S, else `default`: read when the definitions load (the daemon's
        code server), so a change takes effect when the daemon restarts."""
        value = self.text("BRIDGE_SENSOR_INTERVAL_S")
        if not value:
            return default
        if not value.isdigit() or int(value) < 1:
            raise SettingsError(f"BRIDGE_SENSOR_INTERVAL_S={value!r}: expected a whole number of seconds >= 1")
        return int(value)

    def lease_seconds(self) -> int:
        value = self.text("BRIDGE_LEASE_SECONDS")
        if not value:
            return int(BY_NAME["BRIDGE_LEASE_SECONDS"].default)
        if not value.isdigit() or int(value) < 1:
            raise SettingsError(f"BRIDGE_LEASE_SECONDS={value!r}: expected a whole number of seconds >= 1")
        return int(value)

    def index_dir(self, lake_folder: Path) -> Path:
        """BRIDGE_INDEX_DIR, else the lake folder's indexes/."""
        value = self.text("BRIDGE_INDEX_DIR")
        return Path(value).expanduser().resolve() if value else lake_folder / "indexes"

    @property
    def models_dir(self) -> Path | None:
        value = self.raw("BRIDGE_MODELS_DIR")
        return Path(value).expanduser().resolve() if value else None

    @staticmethod
    def hf_offline() -> bool:
        """HF_HUB_OFFLINE, the Hugging Face libraries' own switch (not a BRIDGE_ setting), read
        as they read it: only the local cache serves weights and datasets."""
        return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


env = Settings()
