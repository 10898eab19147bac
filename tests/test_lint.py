"""`make test` lints before it tests: ruff (pyflakes and import order, configured in
pyproject.toml) over the package, the tests and the scripts must pass, then mypy over the
checked modules ([tool.mypy] in pyproject.toml: the core and the stages' plain functions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bridge_assets.paths import PROJECT_ROOT

RUFF = Path(sys.executable).parent / "ruff"
MYPY = Path(sys.executable).parent / "mypy"
TARGETS = ["bridge_assets", "tests", "scripts"]


def test_the_code_passes_ruff():
    done = subprocess.run([str(RUFF), "check", *TARGETS], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_what_it_is_configured_to_find(tmp_path):
    """The configuration is in force: an unused import and imports out of order are errors."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nprint(os.sep)\n")
    done = subprocess.run([str(RUFF), "check", "--config", str(PROJECT_ROOT / "pyproject.toml"), str(bad)],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "F401" in done.stdout and "I001" in done.stdout


def test_the_code_passes_mypy():
    """The files [tool.mypy] names type-check (seconds: the cache under .mypy_cache; a run
    without one reads the libraries' types first, 10-20 s)."""
    done = subprocess.run([str(MYPY)], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_what_it_is_configured_to_find(tmp_path):
    """The configuration is in force: a function without annotations, a wrong argument type
    and an implicit Optional are errors."""
    bad = tmp_path / "bad.py"
    bad.write_text("def untyped(x):\n    return x\n\n\n"
                   "def add(a: int, b: int = None) -> int:\n    return a + (b or 0)\n\n\n"
                   "add('1', 2)\n")
    done = subprocess.run([str(MYPY), "--config-file", str(PROJECT_ROOT / "pyproject.toml"), str(bad)],
                          cwd=tmp_path, capture_output=True, text=True)  # its cache in tmp_path
    assert done.returncode == 1, done.stdout + done.stderr
    for code in ("no-untyped-def", "arg-type", "assignment"):
        assert f"[{code}]" in done.stdout, done.stdout


def test_make_test_runs_ruff_then_mypy_before_the_tests():
    dry = subprocess.run(["make", "-n", "test"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    lines = dry.stdout.splitlines()
    lint = next(i for i, line in enumerate(lines) if "ruff check " + " ".join(TARGETS) in line)
    types = next(i for i, line in enumerate(lines) if line.strip().endswith("bin/mypy"))
    tests = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert lint < types < tests
