"""The `bridge` command line: a thin layer over the same functions and assets the UI runs."""

from __future__ import annotations

import importlib
import os
import time
from typing import TYPE_CHECKING, NoReturn

import typer
from typer.core import TyperGroup

from bridge_assets.cli.console import VERBOSE_HELP
from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.errors import fail as _fail
from bridge_assets.errors import BridgeError

if TYPE_CHECKING:
    # typer carries its own copy of click: its groups take and return these classes, not the
    # click package's (named for types only: the private module is not imported at runtime)
    from typer._click import Command, Context

    from bridge_assets.orchestration.runs import Materialized

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class LazyGroup(TyperGroup):
    """A command group whose commands from other modules are imported when one is run (or
    `--help` lists them), not when `bridge` starts: a command pays for its own imports only
    (`bridge annotate plan` does not wait for dagster, audit, scipy...). `LAZY` maps a command
    name to (module, attribute, is_app): a typer sub-app, or a command function."""

    LAZY: dict[str, tuple[str, str, bool]] = {}

    def list_commands(self, ctx: Context) -> list[str]:
        return [*self.LAZY, *(name for name in super().list_commands(ctx) if name not in self.LAZY)]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, attribute, is_app = self.LAZY[cmd_name]
            target = getattr(importlib.import_module(module), attribute)
            holder = BridgeTyper(add_completion=False)  # registered as on the main app
            if is_app:
                holder.add_typer(target, name=cmd_name)
                command = typer.main.get_group(holder).commands[cmd_name]
            else:
                holder.command(cmd_name)(target)
                command = typer.main.get_command(holder)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


def lazy_group(commands: dict[str, tuple[str, str, bool]]) -> type[LazyGroup]:
    return type("LazyGroup", (LazyGroup,), {"LAZY": commands})


app = BridgeTyper(help="BRIDGE: find and fill the holes in IR benchmarks, then re-benchmark.",
                  no_args_is_help=True, add_completion=False, cls=lazy_group({
                      "annotate": ("bridge_assets.cli.annotate", "app", True),
                      "models": ("bridge_assets.cli.models", "models_app", True),
                      "eval": ("bridge_assets.cli.eval", "eval_command", False),
                      "qrels": ("bridge_assets.cli.qrels", "app", True),
                      "audit": ("bridge_assets.cli.audit", "audit_command", False),
                      "retrievers": ("bridge_assets.cli.retrievers", "app", True),
                      "runs": ("bridge_assets.cli.retrievers", "runs_app", True),
                      "label-eval": ("bridge_assets.cli.label_eval", "label_eval_command", False),
                      "lake": ("bridge_assets.cli.lake", "app", True),
                      "sql": ("bridge_assets.cli.lake", "sql_command", False),
                  }))
datasets_app = BridgeTyper(help="The dataset registry (resources/datasets.yaml).", no_args_is_help=True,
                           cls=lazy_group({"add": ("bridge_assets.cli.datasets", "add_dataset_command", False)}))


@datasets_app.callback()
def datasets() -> None:
    """The dataset registry (resources/datasets.yaml)."""


app.add_typer(datasets_app, name="datasets")


# `bridge run` stopped by its --budget / --budget-usd: not an error, the next run resumes
BUDGET_EXIT = 3
# `bridge run` finished without a system whose input failed validation (its run file): it says which
SYSTEM_FAILED_EXIT = 4


@datasets_app.command("list")
def datasets_list() -> None:
    """Name, kind, source and (once ingested) counts of every registered dataset."""
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.registry.datasets import load_registry

    counts: dict[str, dict[str, int]] = {}
    if store.exists(lake := DuckDBStore().lake):
        with store.connect(lake) as con:
            for table in ("corpus", "queries", "original_qrels"):
                if store.table_exists(con, table):
                    for dataset, n in con.execute(
                            f"select dataset, count(*) from {table} group by dataset").fetchall():
                        counts.setdefault(dataset, {})[table] = n
    typer.echo(f"{'name':<16}{'kind':<16}{'documents':>10}{'queries':>9}{'qrels':>8}  source")
    for name, spec in load_registry().items():
        c = counts.get(name, {})
        cells = [str(c.get(t, "-")) for t in ("corpus", "queries", "original_qrels")]
        typer.echo(f"{name:<16}{spec.kind:<16}{cells[0]:>10}{cells[1]:>9}{cells[2]:>8}  {spec.source}")


def _budget_stop(exc: Exception) -> NoReturn:
    typer.secho(f"{exc}.", fg="yellow", err=True)
    typer.secho("The run stopped there: the asset that asked for them and those after it keep their "
                "previous state, and every answered call is in the LLM ledger, so the next run "
                "resumes without asking them again.", err=True)
    raise typer.Exit(BUDGET_EXIT)


def _materialize(assets: list[str], dataset: str | None, overrides: dict[str, dict] | None = None,
                 stale_only: bool = False, verbose: bool = False) -> Materialized:
    """Run `assets` with a line per step (bridge_assets.cli.console.materialize); Dagster's log
    goes to a log file under the lake, or with `verbose` to the console as it comes.
    `overrides` is the explicit run config (the dataset's `pipeline:` entry is applied inside
    the run)."""
    from bridge_assets.cli import console
    from bridge_assets.llm.budget import BudgetExceeded

    try:
        outcome = console.materialize(assets, dataset, verbose=verbose, asset_config=overrides or {},
                                      stale_only=stale_only)
    except BudgetExceeded as exc:  # a BridgeError with an exit code and a message of its own
        _budget_stop(exc)
    except BridgeError:
        raise  # an unknown asset or dataset, a lake in the other storage, ...: the one handler
    except Exception as exc:  # an asset's own unexpected failure (a bug, a library): one line
        _fail(console.error_line(exc))
    if outcome.added_retrievers or outcome.retired_retrievers:
        typer.secho(f"retrievers: added {outcome.added_retrievers or 'none'}, retired "
                    f"{outcome.retired_retrievers or 'none'}", err=True)
    return outcome


@app.command()
def materialize(
    assets: list[str] = typer.Argument(None, help="Asset names; all assets when none are given."),
    dataset: str = typer.Option(None, "--dataset", "-d", help="Only this dataset's partitions."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Materialize ASSETS (and whatever they depend on that was never materialized)."""
    _materialize(assets or [], dataset, verbose=verbose)


@app.command()
def run(
    dataset: str = typer.Option("demo", "--dataset", "-d", help="Dataset to run the main job on."),
    sample: int = typer.Option(0, "--sample", "-n", min=0,
                               help="Label only a stable sample of this many queries (0: the "
                                    "dataset's pipeline setting, else every query)."),
    adjudicate: bool = typer.Option(None, "--adjudicate/--no-adjudicate",
                                    help="Let the LLM adjudicator guess the escalated pairs. Its "
                                         "guesses are reported apart as unverified, never as found "
                                         "holes; the pairs stay pending until people vote. "
                                         "Default: the dataset's pipeline setting (off)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print the pool and, per stage, the LLM calls the run would "
                                      "make at most (those the ledger already answered apart: they "
                                      "are free), their tokens and price; run nothing."),
    budget: int = typer.Option(None, "--budget", min=1,
                               help="Stop before the LLM calls of this run pass this many tokens "
                                    "(prompt + reply; calls the ledger answers are free), with exit "
                                    "code 3; the next run resumes from the ledger."),
    budget_usd: float = typer.Option(None, "--budget-usd", min=0.0,
                                     help="The same in US dollars, at the `prices:` of the LLM "
                                          "profiles (a profile without prices costs nothing)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """The main job: the whole pipeline for one dataset, then a short summary. Only what is
    missing or out of date runs (an upstream change, changed settings, a changed retriever
    entry, new votes); with nothing changed it says so and runs nothing."""
    from bridge_assets.cli.summary import run_summary
    from bridge_assets.ingest.errors import DatasetError
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.llm import budget as llm_budget
    from bridge_assets.orchestration import runs as orchestration
    from bridge_assets.registry.datasets import get_dataset

    started = time.time()
    overrides: dict[str, dict] = {}
    if sample:
        overrides["candidate_pool"] = {"query_limit": sample}
    if adjudicate is not None:
        overrides["debate_labels"] = {"adjudicate": adjudicate}
    limit = None if budget is None and budget_usd is None else llm_budget.Budget(budget, budget_usd)
    if dry_run:
        from bridge_assets.orchestration.costs import estimate_run, render

        # each stage resolves what its asset would: the dataset's `pipeline:` entry under the
        # explicit settings; a bad entry stops in the one handler (cli_errors) with `error: ...`
        estimate = estimate_run(dataset, overrides)
        typer.echo(render(estimate, limit))
        return
    with llm_budget.enforce(limit):
        outcome = _materialize(orchestration.main_assets(), dataset, overrides=overrides, stale_only=True,
                               verbose=verbose)
    if not outcome.results:
        typer.secho(f"nothing changed: every asset of {dataset} is up to date "
                    f"({outcome.planned} partition steps checked)", fg="green", err=True)
    try:
        spec = get_dataset(dataset)
    except DatasetError:
        spec = None
    lake = DuckDBStore().lake
    with store.connect(lake) as con:
        typer.echo(run_summary(con, dataset, started, spec, report=lake.reports(dataset) / "report.html"))
    if limit is not None:
        typer.echo(f"LLM budget: {limit.status()}.")
    for system in outcome.failed_systems:
        typer.secho(f"system {system.retriever} failed on {system.dataset} and was left out: {system.error}",
                    fg="red", err=True)
    if outcome.failed_systems:
        raise typer.Exit(SYSTEM_FAILED_EXIT)

