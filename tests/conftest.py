"""Shared fixtures. Tests never touch the project's own data lake: each gets a temporary one.

One fixture name, one meaning: each lake fixture is named after what it holds. What the
fixtures build (and the helpers tests share) lives in tests/fixtures/, imported as
`fixtures.<module>` (the fixtures below import them when first used: they import this
module's helpers, and a test that needs no lake needs no bridge_assets); test modules never
import one another."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def _one_thread_models_file() -> None:
    """Under pytest-xdist the other worker keeps a core busy, and llama.cpp's threads wait for
    each other at every layer (resources/models.yaml, `threads`): the local models run on one
    thread there, through a copy of models.yaml that differs only in `threads` (set before
    bridge_assets reads $BRIDGE_MODELS; subprocesses inherit it). Measured: the real-model
    modules beside a busy core, 101 s with two threads, 83 s with one (docs/testing.md)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or "BRIDGE_MODELS" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    import yaml

    from bridge_assets.paths import RESOURCES_DIR  # imports nothing that reads $BRIDGE_MODELS

    models = yaml.safe_load((RESOURCES_DIR / "models.yaml").read_text())
    for profile in models["profiles"].values():
        if profile.get("backend") == "llama_cpp":
            profile["threads"] = 1
    folder = Path(tempfile.mkdtemp(prefix=f"bridge-models-{os.environ['PYTEST_XDIST_WORKER']}-"))
    (folder / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    os.environ["BRIDGE_MODELS"] = str(folder / "models.yaml")
    atexit.register(shutil.rmtree, folder, True)


_one_thread_models_file()


def _shared_index_cache() -> None:
    """One index and embedding cache for every lake of the test session (BRIDGE_INDEX_DIR, set
    in the first process and inherited by xdist's workers and every subprocess; builds run
    under a file lock, as for parallel runs): the demo's BM25 index and MiniLM embeddings are
    built once, not once per test lake (about 7% of the suite's CPU time, py-spy,
    docs/testing.md). The cache is keyed by corpus content and encoder, so a test sees what it
    would have built itself; tests that assert a build happens use their lake's own
    (tests/test_retrieval_systems.py)."""
    if "BRIDGE_INDEX_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"bridge-indexes-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    os.environ["BRIDGE_INDEX_DIR"] = folder
    atexit.register(shutil.rmtree, folder, True)


_shared_index_cache()


@pytest.fixture
def data_lake(tmp_path, monkeypatch) -> Path:
    lake = tmp_path / "lake"
    lake.mkdir()
    monkeypatch.setenv("BRIDGE_DATA_LAKE", str(lake))
    monkeypatch.delenv("BRIDGE_VOTES_DB", raising=False)  # the votes store: votes_db(lake)
    return lake


@pytest.fixture
def duckdb_storage(monkeypatch) -> None:
    """The DuckDB-file storage (BRIDGE_STORAGE=duckdb) whatever the default: for what only a
    DuckDB file has (its write lock) and for lakes from before DuckLake."""
    monkeypatch.setenv("BRIDGE_STORAGE", "duckdb")


@pytest.fixture
def ducklake_lake(data_lake, monkeypatch) -> Iterator[Path]:
    """The test lake on DuckLake storage, with its catalog and data folder inside it."""
    from bridge_assets.lake import ducklake

    monkeypatch.setenv("BRIDGE_STORAGE", "ducklake")
    monkeypatch.delenv("BRIDGE_LAKE_CATALOG", raising=False)
    monkeypatch.delenv("BRIDGE_LAKE_DATA_PATH", raising=False)
    yield data_lake
    ducklake.forget_instances()


@pytest.fixture
def escalated_lake(data_lake, tmp_path_factory) -> Path:
    """The escalated set of tests/fixtures/escalated_set.py: what the annotation app serves.
    Built once per session, each test gets its own copy (0.7 s a build, 1 ms a copy)."""
    from fixtures.escalated_set import write_escalated_set
    from fixtures.lake_templates import copy_of

    return copy_of("escalated", write_escalated_set, data_lake, tmp_path_factory)


@pytest.fixture
def labeled_lake(data_lake, tmp_path_factory) -> Path:
    """Every stage's tables up to human_labels (tests/fixtures/labeled_lake.py): what qrels,
    analysis, reports and audit read. Built once per session, each test gets its own copy
    (tests/fixtures/lake_templates.py)."""
    from fixtures.labeled_lake import write_labeled_lake
    from fixtures.lake_templates import copy_of

    return copy_of("labeled", write_labeled_lake, data_lake, tmp_path_factory)


@pytest.fixture(autouse=True)
def no_dagster_instance_left_entered() -> Iterator[None]:
    """Fails the test that leaves a Dagster instance entered (e.g. a `build_schedule_context`
    never closed: it enters an instance of its own). That instance's state storage stays
    Dagster's current one after the test, and the next Definitions to resolve in the session,
    in whatever later test, fails on its dead weakref ("Attempted to resolve undefined
    DagsterInstance weakref")."""
    yield
    if "dagster" not in sys.modules:  # nothing could have entered an instance
        return
    from dagster._core.storage.defs_state import base

    if base.DefsStateStorage.get() is not None:
        base._current_storage.set(None)  # so that only this test fails, not the ones after it
        pytest.fail("the test left a Dagster instance entered: close what enters one (`with ...`)")


# pytest-xdist (`make test` runs `pytest -n 2 --dist loadscope --no-loadscope-reorder`): each
# test module is one unit of work, run in order on one worker (its module-scoped fixtures are
# built once, and tests that build on an earlier one's index keep their order); the modules
# that run the real local LLM (llama.cpp on every core) are one unit together, so two models
# never share the cores; the longest units are handed out first. (xdist's own `loadgroup`
# cannot do this under pytest 9: it renames node ids through an attribute pytest 9 no longer
# reads.) A plain `pytest` is unchanged.
REAL_MODEL_MODULES = ("test_automation_daemon.py", "test_llm_real.py", "test_labeling_real.py",
                      "test_evaluation_real.py", "test_retrieval_llm.py", "test_analysis_rag.py")
REAL_MODEL_GROUP = "real-local-llm"
LONGEST_FIRST = (REAL_MODEL_GROUP, "test_scripts.py", "test_main_job_growth.py", "test_ui_graphql.py",
                 "test_student.py",
                 "test_main_job_costs.py", "test_retrieval_systems.py", "test_ingest_assets.py",
                 "test_human_browser.py", "test_annotate_browser.py", "test_report_render.py")


def unit_of_work(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return REAL_MODEL_GROUP if module.rsplit("/", 1)[-1] in REAL_MODEL_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnitOfWork(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return ByUnitOfWork(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    if not hasattr(config, "workerinput"):  # only an xdist worker's collection, the scheduler's order
        return
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of_work(item.nodeid).rsplit("/", 1)[-1], len(rank)))
