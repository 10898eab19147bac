"""Shared fixtures. Tests never touch the project's own data lake: each gets a temporary one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


def shared_data(relative: str) -> Path:
    """A path under ../shared/data, skipping the test with a message when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} is absent (the real data lives in ../shared/data beside the project)")
    return path


@pytest.fixture
def data_lake(tmp_path, monkeypatch) -> Path:
    lake = tmp_path / "lake"
    lake.mkdir()
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(lake))
    return lake
