"""The report's building blocks: a section, its tables, and a frame rendered as a table."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    key: str
    title: str
    intro: str
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (caption, file name)
    missing: list[str] = field(default_factory=list)  # tables not materialized for the dataset
    notes: list[str] = field(default_factory=list)    # what to do next, said plainly



def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def table(title: str, frame: pl.DataFrame, headers: dict[str, str] | None = None) -> Table:
    """A frame as a report table; `headers` renames columns (and selects them, in order)."""
    if headers:
        frame = frame.select(list(headers))
    return Table(title, [headers[c] if headers else c for c in frame.columns],
                 [[_cell(v) for v in row] for row in frame.iter_rows()])
