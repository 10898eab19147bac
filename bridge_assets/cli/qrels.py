"""`bridge qrels ...`: the refined qrels of a dataset.

    bridge qrels export -d D -f trec|beir|bridge|hf -o OUT
    bridge qrels import FILE -d D --source NAME [--precedence N | --before S | --after S]
                        [--format trec|beir-tsv|bridge] [--verified] [--corrects-original]
    bridge qrels sources -d D
    bridge qrels remove -d D --source NAME
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import typer

from bridge_assets.cli.console import VERBOSE_HELP
from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.errors import fail as _fail
from bridge_assets.paths import LakeLocation
from bridge_assets.qrels.exports import ExportFormat
from bridge_assets.qrels.imports import ImportFormat

app = BridgeTyper(help="The refined qrels (bridge_qrels) and their exports.", no_args_is_help=True,
                  add_completion=False)


@app.callback()
def qrels() -> None:
    """The refined qrels (bridge_qrels) and their exports."""


def _require_lake() -> LakeLocation:
    """The command's lake (its edge: the store resource's location), failing when there is none."""
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore

    if not store.exists(lake := DuckDBStore().lake):
        _fail(f"no data lake at {store.describe(lake)}")
    return lake


@app.command("export")
def export(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset whose bridge_qrels to export."),
    fmt: ExportFormat = typer.Option(ExportFormat.trec, "--format", "-f",
                                     help="trec: one qrels file; beir: a BEIR folder; bridge: the "
                                          "BRIDGE release layout; hf: a Hugging Face dataset folder."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Target: a file for trec (a folder gets <dataset>.bridge.qrels), "
                                  "else a folder."),
    as_of: str | None = typer.Option(None, "--as-of", metavar="RUN_ID|SNAPSHOT",
                                     help="The qrels as they were then: after the last lake snapshot "
                                          "of that Dagster run (an id or a unique prefix), or at that "
                                          "DuckLake snapshot id (the DuckLake storage, the default)."),
) -> None:
    """Write the refined qrels of DATASET (materialize bridge_qrels first)."""
    from bridge_assets.lake import store
    from bridge_assets.lake.snapshots import resolve_as_of
    from bridge_assets.qrels.exports import export_qrels

    lake = _require_lake()
    snapshot = resolve_as_of(as_of, lake) if as_of else None
    with store.connect_read_only(lake, snapshot=snapshot) if snapshot is not None else store.connect(lake) as con:
        written = export_qrels(con, dataset, fmt, out)
    if snapshot is not None:
        typer.echo(f"as of lake snapshot {snapshot}", err=True)
    typer.echo(str(written))


def materialize_bridge_qrels(dataset: str, verbose: bool = False) -> dict[str, Any]:
    """Materialize bridge_qrels for `dataset` now (nothing upstream: the labels stay as they
    are), on the Dagster instance the UI uses, with a line per step (cli.console); its metadata
    and whether its checks passed."""
    from bridge_assets.cli import console

    outcome = console.materialize(["bridge_qrels"], dataset, verbose=verbose, with_missing_upstream=False)
    checks = {e.check_name: e.passed for e in outcome.results[-1].get_asset_check_evaluations()}
    return {**outcome.metadata("bridge_qrels"), "checks": checks}


@app.command("import")
def import_command(
    file: Path = typer.Argument(..., exists=True,
                                help="The judgments: TREC qrels, a BEIR qrels TSV, or a BRIDGE release "
                                     "(queries.jsonl, or its folder)."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="The dataset they judge."),
    source: str = typer.Option(..., "--source", "-s", help="Name of the label source, e.g. umbrela, assessor2."),
    fmt: ImportFormat = typer.Option(ImportFormat.trec, "--format", "-f", help="trec | beir-tsv | bridge."),
    precedence: float = typer.Option(None, "--precedence",
                                     help="Where the source ranks: built-ins are original 10, human 20, "
                                          "debate 30, pending 40, filter 50; the lowest wins."),
    before: str = typer.Option(None, "--before", help="Rank just before this source."),
    after: str = typer.Option(None, "--after", help="Rank just after this source (default: after original)."),
    verified: bool = typer.Option(False, "--verified/--unverified",
                                  help="People stand behind these judgments: their relevant labels outside "
                                       "the original qrels count as found holes. Default: unverified "
                                       "(an LLM's, e.g. UMBRELA: labels, reported apart)."),
    corrects_original: bool = typer.Option(False, "--corrects-original",
                                           help="A correction source: ranks above original (default just "
                                                "before it), holds original pairs only, and every judgment it "
                                                "changes is listed in the report and in bridge audit."),
    unknown_ids: str = typer.Option("skip", "--unknown-ids", help="skip (count and report) or error."),
    replace: bool = typer.Option(False, "--replace", help="Replace a source of that name (its judgments and place)."),
    run: bool = typer.Option(True, "--run/--no-run", help="Materialize bridge_qrels for DATASET now."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Store the judgments of FILE as label source SOURCE of DATASET's refined qrels, ranked
    among the built-in sources, then rebuild bridge_qrels."""
    from bridge_assets.lake import store
    from bridge_assets.qrels.imports import UnknownIds, import_qrels

    lake = _require_lake()
    if unknown_ids not in ("skip", "error"):
        _fail(f"--unknown-ids must be skip or error, not {unknown_ids!r}")
    with store.connect(lake) as con:
        report = import_qrels(con, dataset, file, source, fmt=fmt, precedence=precedence, before=before,
                              after=after, verified=verified, corrects_original=corrects_original,
                              unknown_ids=cast(UnknownIds, unknown_ids),  # checked above
                              replace=replace)
    kind = "correction source" if report.corrects_original else \
        ("verified source" if report.verified else "unverified source")
    typer.echo(f"{report.stored} of {report.lines} judgments from {report.file} -> '{source}' "
               f"({kind}, precedence {report.precedence:g}) on {dataset}")
    typer.echo(f"precedence: {report.order}")
    if report.skipped:
        typer.secho(f"skipped {report.unknown_query_lines} line(s) with unknown query ids, "
                    f"{report.unknown_document_lines} with unknown document ids"
                    + (f", {report.not_original_lines} on pairs the original qrels do not judge (a correction "
                       "source corrects original judgments only: import those as an ordinary source)"
                       if report.corrects_original else "") + ", e.g.\n  " + "\n  ".join(report.examples),
                    fg="yellow", err=True)
    if report.corrects_original:
        typer.echo(f"{report.corrections} original judgment(s) corrected (listed in the report; "
                   f"bridge audit shows each)")
    elif report.disagreeing_original:
        typer.secho(f"{report.disagreeing_original} judgment(s) differ from the original qrels and are not "
                    "applied: the original wins (import them with --corrects-original to correct it)",
                    fg="yellow", err=True)
    if not run:
        return
    try:
        metadata = materialize_bridge_qrels(dataset, verbose=verbose)
    except Exception as exc:  # the asset's own error
        _fail(f"{type(exc).__name__}: {exc}\n(the import is stored; bridge qrels remove undoes it)")
    typer.echo(f"bridge_qrels ({dataset}): {metadata['pairs']} pairs, {metadata['relevant']} relevant, "
               f"{metadata['holes_found']} found holes (verified), {metadata.get('corrections', 0)} corrections, "
               f"{metadata['pending']} pending; the metrics and the report follow by themselves under "
               f"the daemon (make ui), else with: bridge run --dataset {dataset}")
    if metadata["checks"].get("bridge_qrels_is_valid") is False:
        typer.secho("the bridge_qrels_is_valid check failed: see its metadata in the UI", fg="yellow", err=True)


@app.command("sources")
def sources_command(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset whose label sources to list."),
) -> None:
    """Every label source of DATASET, best precedence first: the built-ins and the imported ones."""
    from bridge_assets.lake import store
    from bridge_assets.qrels.sources import BUILTIN_PRECEDENCE, registered

    lake = _require_lake()
    with store.connect(lake) as con:
        imported = registered(con, dataset)
    rows = [(p, name, "built-in", "") for name, p in BUILTIN_PRECEDENCE.items()]
    rows += [(r["precedence"], r["source"], "correction" if r["corrects_original"] else
              ("verified" if r["verified"] else "unverified"),
              f"{r['stored']} of {r['lines']} judgments from {r['file']} "
              f"({r['format']}, {r['imported_at']:%Y-%m-%d %H:%M} UTC)")
             for r in imported.iter_rows(named=True)]
    typer.echo(f"{'precedence':>10}  {'source':<16}{'kind':<12}imported")
    for precedence, name, kind, what in sorted(rows):
        typer.echo(f"{precedence:>10g}  {name:<16}{kind:<12}{what}")


@app.command("remove")
def remove_command(
    dataset: str = typer.Option(..., "--dataset", "-d"),
    source: str = typer.Option(..., "--source", "-s", help="The imported source to remove."),
    run: bool = typer.Option(True, "--run/--no-run", help="Materialize bridge_qrels for DATASET now."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Remove an imported source of DATASET and its judgments, then rebuild bridge_qrels."""
    from bridge_assets.lake import store
    from bridge_assets.qrels.imports import remove_source

    lake = _require_lake()
    with store.connect(lake) as con:
        removed = remove_source(con, dataset, source)
    typer.echo(f"removed '{source}' ({removed} judgments) from {dataset}")
    if run:
        metadata = materialize_bridge_qrels(dataset, verbose=verbose)
        typer.echo(f"bridge_qrels ({dataset}): {metadata['pairs']} pairs, {metadata['relevant']} relevant")
