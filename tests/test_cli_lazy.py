"""The `bridge` CLI imports a command's module when that command runs (issue 26: `bridge annotate
plan` answers in under 2 s on 10,000 pending pairs, and the CLI's start was ~2 s of it): every
command is still there, with its help, and stops on a BridgeError as before."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from bridge_assets.cli.main import app

COMMANDS = ["annotate", "audit", "datasets", "eval", "label-eval", "lake", "materialize", "models", "qrels",
            "retrievers", "run", "runs", "sql"]
HEAVY = ("dagster", "bridge_assets.cli.audit", "scipy", "pandas", "pyarrow", "sklearn", "statsmodels")


def _modules_after(code: str, env: dict | None = None, heavy: tuple[str, ...] = HEAVY) -> dict:
    """The heavy modules a fresh Python has imported after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {heavy!r}}}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_starting_the_cli_imports_no_command_module():
    assert not any(_modules_after("import bridge_assets.cli.main").values())


def test_loading_the_definitions_leaves_statistics_and_plotting_for_the_steps_that_use_them():
    """Every Dagster process (code server, run worker, each step of the multiprocess executor)
    loads the definitions: scipy.stats, scipy.optimize, scikit-learn and matplotlib are imported
    by the functions that use them (docs/testing.md: the import took 4.4 s with them, 2.2 s
    without)."""
    loaded = _modules_after("import bridge_assets.definitions",
                            heavy=("scipy.stats", "scipy.optimize", "sklearn", "matplotlib"))
    assert not any(loaded.values()), loaded


def test_annotate_plan_imports_neither_dagster_nor_pandas(data_lake):
    import os

    code = ("import sys\nfrom bridge_assets.cli.main import app\nsys.argv = ['bridge', 'annotate', 'plan', "
            "'--dataset', 'demo']\ntry:\n    app()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code")
    loaded = _modules_after(code, env={**os.environ, "BRIDGE_DATA_LAKE": str(data_lake)})
    assert not any(loaded.values()), loaded


def test_every_command_is_listed_and_answers_its_help():
    runner = CliRunner()
    listed = runner.invoke(app, ["--help"])
    assert listed.exit_code == 0, listed.output
    for name in COMMANDS:
        assert f" {name} " in listed.output, name
        helped = runner.invoke(app, [name, "--help"])
        assert helped.exit_code == 0 and "Usage" in helped.output, (name, helped.output)
        assert "--install-completion" not in helped.output, name  # as the main app: no completion options
    datasets = runner.invoke(app, ["datasets", "--help"])
    assert "The dataset registry" in datasets.output and " add " in datasets.output and " list " in datasets.output
    assert runner.invoke(app, ["nosuch"]).exit_code == 2


@pytest.mark.parametrize("args", [["label-eval", "--gold", "/nonexistent/gold.jsonl"],
                                  ["annotate", "load-known"]])
def test_a_lazily_loaded_command_still_stops_on_its_errors(args, data_lake):
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2 and "error:" in out.output, out.output
