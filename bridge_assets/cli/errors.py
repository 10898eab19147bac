"""How every `bridge` command stops on an error the user can fix: `error: ...` in red on stderr,
exit code 2 (typer's own usage errors use 2 too).

One place does it for every command: the `bridge` app and each sub-app are `BridgeTyper`s,
whose commands stop on any BridgeError with its message, so no command catches the errors of
the functions it calls. `fail` is for the checks a command makes itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from typer.core import TyperCommand

from bridge_assets.errors import BridgeError

if TYPE_CHECKING:
    # the context a command is invoked with: typer's vendored click's (typer.Context subclasses it)
    from typer._click import Context

Command = TypeVar("Command", bound=Callable[..., Any])

EXIT_ERROR = 2


def fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(EXIT_ERROR)


class StopsOnBridgeError(TyperCommand):
    """A command that turns a BridgeError it raises into `fail(message)`."""

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except BridgeError as exc:
            fail(str(exc))


class BridgeTyper(typer.Typer):
    """A typer app whose every command is a StopsOnBridgeError (unless it asks for another cls)."""

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **kwargs: Any) -> Callable[[Command], Command]:
        return super().command(name, cls=cls or StopsOnBridgeError, **kwargs)
