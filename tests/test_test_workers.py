"""How `make test` runs the suite: two pytest-xdist workers by default, and in a worker the
local models on one thread (tests/conftest.py: the other worker keeps a core busy, and
llama.cpp's threads wait for each other at every layer), from a models.yaml that differs from
the shipped one only there; bytecode is written whatever the environment says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from bridge_assets.llm.profiles import MODELS_PATH, get_profile
from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR


def _make_test_commands(**env: str) -> list[str]:
    """The commands `make test` runs (its set-up prerequisites taken as done)."""
    done = subprocess.run(["make", "-n", "-s", "-o", "setup", "-o", "browser", "test"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, check=True,
                          env={**{k: v for k, v in os.environ.items() if k != "TEST_WORKERS"}, **env})
    return done.stdout.splitlines()


def test_make_test_runs_two_workers_by_default():
    default = next(c for c in _make_test_commands() if " -m pytest " in c)
    assert " -n 2 --dist loadscope " in f"{default} "
    chosen = next(c for c in _make_test_commands(TEST_WORKERS="0") if " -m pytest " in c)
    assert " -n 0 " in chosen  # TEST_WORKERS=0: one process (debugging)


def test_make_test_writes_bytecode_where_the_environment_says_not_to():
    """CI images may set PYTHONDONTWRITEBYTECODE; then every process the suite starts compiled the
    project and pytest rewrote every test module again (docs/testing.md)."""
    probe = ["make", "-n", "-s", "--eval", 'bytecode_probe: ; +@echo "probe[$$PYTHONDONTWRITEBYTECODE]"',
             "--eval", "test: bytecode_probe", "test"]
    done = subprocess.run(probe, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert "probe[]" in done.stdout.splitlines()


def test_local_models_run_on_one_thread_in_a_worker_only():
    shipped = yaml.safe_load((RESOURCES_DIR / "models.yaml").read_text())
    if "PYTEST_XDIST_WORKER" not in os.environ:
        assert MODELS_PATH == (RESOURCES_DIR / "models.yaml").resolve()
        assert get_profile("qwen-0.5b").threads == shipped["profiles"]["qwen-0.5b"].get("threads")
        return
    assert Path(os.environ["BRIDGE_MODELS"]) == MODELS_PATH != (RESOURCES_DIR / "models.yaml").resolve()
    used = yaml.safe_load(MODELS_PATH.read_text())
    local = [name for name, body in used["profiles"].items() if body.get("backend") == "llama_cpp"]
    assert local and all(get_profile(name).threads == 1 for name in local)
    for name in local:
        del used["profiles"][name]["threads"]
        shipped["profiles"][name].pop("threads", None)
    assert used == shipped
