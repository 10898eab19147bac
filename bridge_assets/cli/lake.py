"""`bridge sql` and `bridge lake ...`: the store without knowing how it is stored.

    bridge sql "SELECT ..." [--as-of SNAPSHOT]   read-only SQL; a header line, then one
                                                 tab-separated line per row
    bridge lake info                             storage, catalog, data path, files per table
    bridge lake migrate [--from FILE] [--keep]   a bridge.duckdb into the DuckLake
    bridge lake snapshots [--limit N]            the DuckLake's snapshots and the runs behind them
    bridge lake compact [--expire-older-than I]  flush inlined rows, merge small Parquet files
    bridge lake repoint [--data-path P]          the catalog names its (moved) data path anew
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import typer

from bridge_assets.cli.errors import BridgeTyper, fail
from bridge_assets.errors import BridgeError

if TYPE_CHECKING:
    from bridge_assets.lake.ducklake import DuckLakeConfig
    from bridge_assets.paths import LakeLocation

app = BridgeTyper(help="The lake's storage: DuckLake migration, snapshots, compaction.",
                  no_args_is_help=True, add_completion=False)

# Tables of a lake from before the votes store (human/votes_store.py moves them out first).
HUMAN_TABLES = ("annotators", "annotation_assignments", "human_votes")


def _cell(value: Any) -> str:
    """One value as text: NULL empty; tab, newline and backslash escaped (PostgreSQL's COPY
    text format), so every row stays one line."""
    if value is None:
        return ""
    if isinstance(value, (list, dict, tuple)):
        text = json.dumps(value, default=str, ensure_ascii=False)
    else:
        text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def format_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Iterable[str]:
    yield "\t".join(_cell(c) for c in columns)
    for row in rows:
        yield "\t".join(_cell(v) for v in row)


# `EXPLAIN [(options)] [ANALYZE]`: what an EXPLAIN statement explains follows it
_EXPLAIN = re.compile(r"^\s*explain\s+(\([^)]*\)\s*)?(analy[sz]e\s+)?", re.IGNORECASE)
READS = "SELECT, FROM, WITH, EXPLAIN, DESCRIBE, SHOW, SUMMARIZE and PRAGMA reads such as table_info"


class SqlRefused(BridgeError, ValueError):
    """A statement `bridge sql` does not run: not exactly one, or not a read."""


class SqlFailed(BridgeError):
    """DuckDB's error on the statement `bridge sql` ran (or on opening the lake for it): its
    first line, e.g. a table or column that does not exist, or a write the read-only lake refuses."""

    @classmethod
    def of(cls, exc: duckdb.Error) -> SqlFailed:
        first = str(exc).splitlines()[0]
        return cls(f"bridge sql is read-only: {first}" if "read-only" in str(exc) else first)


def read_only_statement(query: str) -> str:
    """`query` when it is exactly one read-only statement, judged by DuckDB's own parser
    (DESCRIBE, SHOW, SUMMARIZE and PRAGMA reads parse as SELECT); else SqlRefused naming the
    statement type refused."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise SqlRefused(str(exc).splitlines()[0]) from None
    if len(statements) != 1:
        raise SqlRefused(f"bridge sql runs exactly one statement, not {len(statements)}")
    kind = statements[0].type
    if kind == duckdb.StatementType.EXPLAIN:  # EXPLAIN ANALYZE runs what it explains
        inner = duckdb.extract_statements(_EXPLAIN.sub("", query, count=1))
        kind = inner[0].type if len(inner) == 1 else kind
    if kind != duckdb.StatementType.SELECT:
        raise SqlRefused(f"bridge sql is read-only: a {kind.name} statement is refused (it runs {READS})")
    return query


def sql_command(
    query: str = typer.Argument(..., help="One read-only SQL statement (tables by their plain names)."),
    as_of: int | None = typer.Option(None, "--as-of", help="A DuckLake snapshot id: the lake as it was then."),
) -> None:
    """Run one read-only SQL statement against the data lake (DuckDB file or DuckLake): a header
    line, then one tab-separated line per row (NULL empty; tab, newline, backslash as \\t \\n
    \\\\). Writes, ATTACH, COPY, SET, INSTALL/LOAD and several statements are refused, and the
    connection cannot reach files outside the lake."""
    from bridge_assets.lake import store

    statement = read_only_statement(query)
    try:
        lake = _lake()
        with store.connect_read_only(lake, snapshot=as_of) as con:
            # the lake is attached: nothing else on disk is reachable, and it stays so; its
            # Parquet files (DuckLake reads them as a query needs them) are the one place allowed
            if (config := lake.ducklake) is not None:
                con.execute("set allowed_directories = $places", {"places": [config.data_path]})
            con.execute("set enable_external_access = false")
            con.execute("set lock_configuration = true")
            cursor = con.execute(statement)
            if cursor.description is None:
                return
            columns = [d[0] for d in cursor.description]
            typer.echo(next(iter(format_rows(columns, []))))
            while batch := cursor.fetchmany(10_000):
                for line in list(format_rows(columns, batch))[1:]:
                    typer.echo(line)
    except duckdb.Error as exc:  # StoreMismatch, LakeError and LakeMissing are BridgeErrors already
        raise SqlFailed.of(exc) from None


def _lake() -> LakeLocation:
    """The lake's location, as the store resource holds it."""
    from bridge_assets.lake.resource import DuckDBStore

    return DuckDBStore().lake


@app.command("info")
def info_command() -> None:
    """Which storage is in force, where it lives, and the files of each DuckLake table."""
    from bridge_assets.lake import ducklake, store

    lake = _lake()
    typer.echo(f"storage\t{lake.storage}")
    typer.echo(f"lake folder\t{lake.folder}")
    typer.echo(f"duckdb file\t{lake.duckdb}{'' if lake.duckdb.exists() else ' (absent)'}")
    config = lake.ducklake_config
    typer.echo(f"ducklake catalog\tducklake:{config.catalog}{'' if config.exists() else ' (absent)'}")
    typer.echo(f"ducklake data path\t{config.data_path}")
    if lake.ducklake is not None and config.exists():
        with store.connect(lake) as con:
            typer.echo(f"snapshot\t{ducklake.current_snapshot(con)}")
            for table, counts in ducklake.file_counts(con).items():
                typer.echo(f"table {table}\t{counts['files']} data files, {counts['delete_files']} delete files")


@app.command("repoint")
def repoint_command(
    data_path: str = typer.Option(None, "--data-path",
                                  help="The folder (or s3://, gs:// path) that now holds the lake's "
                                       "Parquet files; default: the lake folder's ducklake/ (or "
                                       "BRIDGE_LAKE_DATA_PATH)."),
) -> None:
    """Make the DuckLake's catalog name its data path anew: after its data moved, or a lake folder
    was copied somewhere with BRIDGE_LAKE_DATA_PATH set (a copied folder on its own is re-pointed
    on first use)."""
    from bridge_assets.lake import ducklake

    config = _lake().ducklake_config
    if not config.exists():
        fail(f"no DuckLake at {config.catalog_file}")
    moved = ducklake.repoint(config, data_path)
    ducklake.forget_instances()
    typer.echo(f"data path {moved[0]} -> {moved[1]}" if moved else
               f"the catalog already names {data_path or config.data_path}")


@app.command("snapshots")
def snapshots_command(limit: int = typer.Option(20, "--limit", "-n", help="The latest N (0: all).")) -> None:
    """The DuckLake's snapshots, newest last: id, time, Dagster run, what it wrote."""
    from bridge_assets.lake import ducklake, store

    lake = _lake()
    if lake.ducklake is None:
        fail("the lake is a DuckDB file (BRIDGE_STORAGE=duckdb): it keeps no snapshots; `bridge lake migrate` "
             "moves it into a DuckLake (the default storage)")
    if not store.exists(lake):
        fail(f"no DuckLake at {store.describe(lake)}")
    with store.connect(lake) as con:
        rows = ducklake.snapshots(con)
    typer.echo("snapshot\ttime\trun_id\tmessage")
    for row in rows[-limit:] if limit else rows:
        when = row["time"].strftime("%Y-%m-%d %H:%M:%S") if isinstance(row["time"], datetime) else row["time"]
        typer.echo(f"{row['snapshot']}\t{when}\t{row.get('info', {}).get('run_id', '')}\t{row['message'] or ''}")


@app.command("compact")
def compact_command(
    expire_older_than: str | None = typer.Option(
        None, "--expire-older-than", help="Also expire snapshots older than this interval (e.g. "
                                          "'30 days') and delete the files only they used: "
                                          "time travel before then is gone."),
) -> None:
    """Flush inlined rows to Parquet, merge small files, rewrite files with many deletions."""
    from bridge_assets.lake import ducklake, store

    lake = _lake()
    if lake.ducklake is None or not store.exists(lake):
        fail(f"no DuckLake in force ({store.describe(lake)}): unset BRIDGE_STORAGE=duckdb (DuckLake is the default)")
    with store.connect(lake) as con:
        counts = ducklake.compact(con, expire_older_than=expire_older_than)
    before = sum(c["files"] + c["delete_files"] for c in counts["before"].values())
    after = sum(c["files"] + c["delete_files"] for c in counts["after"].values())
    typer.echo(f"files: {before} before, {after} after")


def migrate(source: Path, config: DuckLakeConfig, *, votes_db: Path | None = None, keep: bool = False) -> dict[str, int]:
    """Copy every table of the DuckDB lake `source` into the (new or empty) DuckLake `config`
    in one transaction, check the row counts, then rename `source` to <name>.migrated (unless
    `keep`). The source stays locked (its writers wait) while it is copied. Returns rows per
    table. Annotators, assignments and votes go to the votes store first, not into the lake."""
    from bridge_assets.lake import ducklake, store

    with store.connect_file(source) as con:  # the file itself, whatever BRIDGE_STORAGE says
        if votes_db is not None:
            try:
                from bridge_assets.human import votes_store
            except ImportError:  # a BRIDGE without the votes store: the votes move with the rest
                pass
            else:
                votes_store.move_from(con, votes_db)
        con.execute("checkpoint")
        source_name = store.one_row(con, "select current_database()")[0]
        tables = [row[0] for row in con.execute(
            "select table_name from duckdb_tables() where database_name = current_database() "
            "and schema_name = 'main' and not temporary and not internal order by table_name").fetchall()]
        views = con.execute("select view_name, sql from duckdb_views() where database_name = current_database() "
                            "and schema_name = 'main' and not internal and not temporary").fetchall()
        for name in ducklake.extensions_for(config):
            ducklake.load_extension(con, name)
        ducklake._prepare_catalog(config)
        con.execute(config.attach_sql("migration_target"))
        try:
            present = [row[0] for row in con.execute(
                "select table_name from duckdb_tables() where database_name = 'migration_target'").fetchall()]
            if present:
                raise ducklake.LakeError(f"the DuckLake ducklake:{config.catalog} already holds tables "
                                         f"({', '.join(sorted(present))}): migrate into a new lake only")
            counts = {table: store.one_row(con, f'select count(*) from "{table}"')[0] for table in tables}
            con.execute("begin transaction")
            try:
                con.execute("CALL ducklake_set_commit_message('migration_target', 'bridge', ?, extra_info => ?)",
                            [f"bridge lake migrate from {source}",
                             json.dumps({"migrated_from": str(source), "tables": tables})])
                for table in tables:
                    con.execute(f'create table migration_target.main."{table}" as '
                                f'select * from "{source_name}".main."{table}"')
                for name, sql in views:
                    con.execute(sql.replace(f"CREATE VIEW {name}", f"CREATE VIEW migration_target.main.{name}", 1))
                con.execute("commit")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    con.execute("rollback")
                raise
            copied = {table: store.one_row(con, f'select count(*) from migration_target.main."{table}"')[0]
                      for table in tables}
            if copied != counts:
                raise ducklake.LakeError(f"row counts differ after the copy: {counts} in the file, {copied} in the lake")
            con.execute("CALL ducklake_flush_inlined_data('migration_target')")
        finally:
            con.execute(f'use "{source_name}"')
            con.execute("detach migration_target")
    if not keep:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", ".wal"):
            old = source.with_name(source.name + suffix)
            if old.exists():
                old.rename(source.with_name(f"{source.name}.migrated-{stamp}{suffix}"))
    ducklake.forget_instances()
    return counts


@app.command("migrate")
def migrate_command(
    source: Path | None = typer.Option(None, "--from", help="The DuckDB file to move (default: "
                                                           "<data lake>/bridge.duckdb)."),
    keep: bool = typer.Option(False, "--keep", help="Leave the DuckDB file where it is (default: "
                                                    "renamed to bridge.duckdb.migrated-<time>)."),
) -> None:
    """Move a DuckDB lake (every table, the LLM call ledger included) into the DuckLake of the
    data lake folder (the default storage; unset BRIDGE_STORAGE=duckdb if you had set it)."""
    lake = _lake()
    source = (source or lake.duckdb).resolve()
    if not source.exists():
        fail(f"no DuckDB lake at {source}")
    config = lake.ducklake_config
    started = time.monotonic()
    try:
        counts = migrate(source, config, votes_db=lake.votes_db, keep=keep)
    except duckdb.Error as exc:  # the lake file or the catalog cannot be read or written
        fail(str(exc))
    for table, rows in counts.items():
        typer.echo(f"{table}\t{rows} rows")
    typer.echo(f"moved {len(counts)} tables into ducklake:{config.catalog} (data {config.data_path}) in "
               f"{time.monotonic() - started:.1f} s" + ("" if keep else f"; {source.name} renamed to "
                                                                        f"{source.name}.migrated-*"))
    if lake.storage != "ducklake":
        typer.echo("use it: unset BRIDGE_STORAGE=duckdb (DuckLake is the default)")
