"""How every `bridge` command stops on an error the user can fix: `error: ...` in red on stderr,
exit code 2 (typer's own usage errors use 2 too). The sub-apps import `fail` from here."""

from __future__ import annotations

from typing import NoReturn

import typer

EXIT_ERROR = 2


def fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(EXIT_ERROR)
