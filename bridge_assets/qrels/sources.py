"""Label sources of the refined qrels and where each ranks.

The built-in sources have fixed precedences (sql/bridge_qrels.sql uses the same numbers; the
lower wins). Imported sources (`bridge qrels import`) are registered per dataset in the
`qrels_sources` table of the data lake, beside their judgments in `imported_qrels`, so the
registry travels with the judgments it ranks and changes with them in one transaction:

    qrels_sources   dataset, source, precedence, verified, corrects_original, format, file,
                    lines, stored, unknown_query_lines, unknown_document_lines,
                    not_original_lines, imported_at
    imported_qrels  dataset, source, query_id, doc_id, relevance, file, line, imported_at

Rules:
- Only a correction source (`corrects_original`) ranks above 'original', and only it may change
  an original judgment; any other imported source ranks below 'original'.
- `verified` says whether people stand behind the source's labels: only a verified source's
  relevant labels outside the original qrels count as found holes (like 'human'); an
  unverified one's (an LLM's, e.g. UMBRELA) are labels in the qrels but reported apart.
"""

from __future__ import annotations

import re

import duckdb
import polars as pl

from bridge_assets.errors import BridgeError
from bridge_assets.lake.store import table_exists

BUILTIN_PRECEDENCE = {"original": 10.0, "human": 20.0, "debate": 30.0, "pending": 40.0, "filter": 50.0}
SOURCES = tuple(BUILTIN_PRECEDENCE)
# Labels a person or a passed check stands behind. (Pending pairs have no label; the filter's
# drops are a model's unverified "no", audited by people: bridge_assets.human.audit.)
VERIFIED_BUILTINS = ("original", "human", "debate")
# Who guessed a pending pair (bridge_qrels.unverified_source): never a source name.
UNVERIFIED_GUESSERS = ("adjudicator", "vote", "provisional")
RESERVED = {*SOURCES, *UNVERIFIED_GUESSERS, "all", "unlabelled"}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

IMPORTED_QRELS_DDL = ("dataset varchar, source varchar, query_id varchar, doc_id varchar, "
                      "relevance integer, file varchar, line integer, imported_at timestamp")
QRELS_SOURCES_DDL = ("dataset varchar, source varchar, precedence double, verified boolean, "
                     "corrects_original boolean, format varchar, file varchar, lines integer, "
                     "stored integer, unknown_query_lines integer, unknown_document_lines integer, "
                     "not_original_lines integer, imported_at timestamp")
IMPORT_TABLES = {"imported_qrels": IMPORTED_QRELS_DDL, "qrels_sources": QRELS_SOURCES_DDL}


class SourceError(BridgeError, ValueError):
    """An imported source's name or place is not allowed."""


def validate_source_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SourceError(f"invalid source name {name!r}: use letters, digits, '_', '.' and '-' only")
    if name.lower() in RESERVED:
        raise SourceError(f"source name {name!r} is reserved (built-in sources and words the "
                          f"reports use: {', '.join(sorted(RESERVED))})")
    return name


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    for name, columns in IMPORT_TABLES.items():
        con.execute(f"create table if not exists {name} ({columns})")


def registered(con: duckdb.DuckDBPyConnection, dataset: str) -> pl.DataFrame:
    """The imported sources of `dataset`, best precedence first (empty before any import)."""
    if not table_exists(con, "qrels_sources"):
        return pl.DataFrame(schema={"source": pl.Utf8, "precedence": pl.Float64, "verified": pl.Boolean,
                                    "corrects_original": pl.Boolean})
    return con.execute("select * exclude (dataset) from qrels_sources where dataset = ? "
                       "order by precedence", [dataset]).pl()


def precedences(imported: pl.DataFrame) -> dict[str, float]:
    """Every source (built-in and imported) -> its precedence, best first."""
    ranks = {**BUILTIN_PRECEDENCE, **dict(imported.select("source", "precedence").iter_rows())}
    return dict(sorted(ranks.items(), key=lambda item: item[1]))


def precedence_order(imported: pl.DataFrame) -> str:
    return " > ".join(precedences(imported))


def place(ranks: dict[str, float], *, precedence: float | None = None, before: str | None = None,
          after: str | None = None, corrects_original: bool = False) -> float:
    """The precedence of a new source among `ranks` (source -> precedence): a number given, or
    just before / just after a named source (half way to its neighbour). Default: just before
    'original' for a correction source, else just after it."""
    if sum(x is not None for x in (precedence, before, after)) > 1:
        raise SourceError("give at most one of --precedence, --before and --after")
    if precedence is None and before is None and after is None:
        before, after = ("original", None) if corrects_original else (None, "original")
    for name in (before, after):
        if name is not None and name not in ranks:
            raise SourceError(f"unknown source {name!r} (known: {', '.join(ranks)})")
    if before is not None:
        above = [p for p in ranks.values() if p < ranks[before]]
        precedence = ((max(above) if above else 0.0) + ranks[before]) / 2
    elif after is not None:
        below = [p for p in ranks.values() if p > ranks[after]]
        precedence = (ranks[after] + min(below)) / 2 if below else ranks[after] + 10
    assert precedence is not None  # given, or placed by before / after (one of them is set)
    tied = [name for name, p in ranks.items() if p == precedence]
    if tied:
        raise SourceError(f"precedence {precedence:g} is taken by {tied[0]!r}: each source needs its own")
    original = BUILTIN_PRECEDENCE["original"]
    if corrects_original and precedence >= original:
        raise SourceError(f"a correction source must rank above 'original' (precedence below {original:g}, "
                          f"e.g. --before original); got {precedence:g}")
    if not corrects_original and precedence <= original:
        raise SourceError(f"precedence {precedence:g} ranks above 'original' ({original:g}): only a "
                          "correction source (--corrects-original) may change the benchmark's judgments")
    return precedence
