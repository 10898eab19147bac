"""One error type: every exception class of bridge_assets derives from BridgeError, and every
`bridge` command stops on one with `error: <message>` and exit code 2 through cli_errors."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from typer.testing import CliRunner

import bridge_assets
from bridge_assets.cli.errors import EXIT_ERROR, BridgeTyper, StopsOnBridgeError
from bridge_assets.errors import BridgeError, DatasetError

# Classes in files their owners are rewriting; each leaves this set when it gains the base
# (the test below fails on an entry that already has it, so the set only shrinks; an entry
# whose module is not written yet is ignored).
PENDING: set[str] = set()  # classes waiting for the base: none left


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of bridge_assets, by its dotted name."""
    found = {}
    for info in pkgutil.walk_packages(bridge_assets.__path__, "bridge_assets."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_every_exception_class_derives_from_bridge_error():
    classes = exception_classes()
    assert len(classes) > 30
    outside = {name for name, cls in classes.items() if not issubclass(cls, BridgeError)}
    assert outside - PENDING == set(), "derive these from bridge_assets.errors.BridgeError"
    assert (PENDING & set(classes)) - outside == set(), "these have the base now: remove them from PENDING"


def test_the_base_names_file_line_and_field():
    assert str(BridgeError("duplicate id", "q.jsonl", 7, "_id")) == 'q.jsonl, line 7, field "_id": duplicate id'
    assert str(DatasetError("bad", line=3)) == "line 3: bad"
    assert str(BridgeError("plain")) == "plain"
    assert isinstance(DatasetError("x"), ValueError)


def test_an_error_in_a_sub_command_reaches_the_user_through_the_one_handler():
    root, sub = BridgeTyper(), BridgeTyper()
    root.add_typer(sub, name="sub")

    @root.callback()
    def main() -> None:
        """The root (a group, as `bridge` is)."""

    @sub.command("broken")
    def broken() -> None:
        raise DatasetError('duplicate id "q3"', "queries.jsonl", 7, "_id")

    @sub.command("other")
    def other() -> None:
        """A second command, so `sub` is a group."""

    result = CliRunner().invoke(root, ["sub", "broken"])
    assert result.exit_code == EXIT_ERROR == 2
    assert result.output.strip() == 'error: queries.jsonl, line 7, field "_id": duplicate id "q3"'
    assert not isinstance(result.exception, BridgeError)  # stopped in the handler, no traceback


def test_every_bridge_command_goes_through_the_handler():
    """No command of `bridge` bypasses the handler (each app is a BridgeTyper)."""
    import typer.main

    from bridge_assets.cli.main import app

    def leaves(command, path=()):  # through click's listing: lazily loaded commands too
        if hasattr(command, "list_commands"):  # a group
            ctx = command.context_class(command)
            for name in command.list_commands(ctx):
                yield from leaves(command.get_command(ctx, name), (*path, name))
        else:
            yield " ".join(path), command

    commands = dict(leaves(typer.main.get_command(app)))
    assert {"eval", "qrels export", "retrievers add", "annotate migrate", "lake repoint"} <= set(commands)
    assert [name for name, command in commands.items() if not isinstance(command, StopsOnBridgeError)] == []


@pytest.mark.parametrize("args, message", [
    (["-m", "utility"], "unknown measure 'utility'"),
    (["-m", "hole_10"], "original qrels"),
])
def test_bridge_eval_stops_through_the_handler(args, message, tmp_path):
    """`bridge eval` (metrics/cli.py) catches nothing itself any more."""
    from bridge_assets.cli.main import app
    from fixtures.paths import shared_data

    folder = shared_data("trec_eval_tests")
    result = CliRunner().invoke(app, ["eval", "--qrels", str(folder / "qrels.test"),
                                      "--run", str(folder / "results.test"), *args])
    assert result.exit_code == 2 and result.output.startswith("error: ") and message in result.output
