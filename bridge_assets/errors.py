"""Errors that name what is wrong with a user's input: the file, the line and the field.

Every error a user can fix derives from BridgeError, so the `bridge` command line stops on all of
them in one place (cli_errors) with `error: <message>` and exit code 2."""

from __future__ import annotations

from pathlib import Path


class BridgeError(Exception):
    """An error the user can fix; the message says where, e.g.
    `queries.jsonl, line 7, field "_id": duplicate id "q3"` (each part only when known)."""

    def __init__(self, problem: str, file: Path | str | None = None, line: int | None = None,
                 field: str | None = None):
        self.problem, self.file, self.line, self.field = problem, file, line, field
        where = [str(file)] if file else []
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f'field "{field}"')
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)


class DatasetError(BridgeError, ValueError):
    """Bad dataset input, e.g. `queries.jsonl, line 7, field "_id": duplicate id "q3"`."""


class SettingsError(BridgeError, ValueError):
    """A setting BRIDGE cannot use: a BRIDGE_* environment variable, or an asset's run settings,
    e.g. `BRIDGE_STORAGE='s3': expected one of duckdb, ducklake`."""


class AssetError(BridgeError, ValueError):
    """An asset named on the command line that BRIDGE does not have, or that has no settings."""
