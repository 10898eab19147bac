"""Errors that name what is wrong with a user's input: the file, the line and the field."""

from __future__ import annotations

from pathlib import Path


class DatasetError(ValueError):
    """Bad dataset input, e.g. `queries.jsonl, line 7, field "_id": duplicate id "q3"`."""

    def __init__(self, problem: str, file: Path | str | None = None, line: int | None = None,
                 field: str | None = None):
        self.problem, self.file, self.line, self.field = problem, file, line, field
        where = [str(file)] if file else []
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f'field "{field}"')
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)
