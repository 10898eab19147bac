"""`bridge qrels export`: the refined qrels of a dataset as TREC, BEIR, BRIDGE release or HF."""

from __future__ import annotations

from pathlib import Path

import typer

from bridge_assets.qrels.exports import ExportError, ExportFormat

app = typer.Typer(help="The refined qrels (bridge_qrels) and their exports.", no_args_is_help=True,
                  add_completion=False)


@app.callback()
def qrels() -> None:
    """The refined qrels (bridge_qrels) and their exports."""


@app.command("export")
def export(
    dataset: str = typer.Option(..., "--dataset", "-d", help="Dataset whose bridge_qrels to export."),
    fmt: ExportFormat = typer.Option(ExportFormat.trec, "--format", "-f",
                                     help="trec: one qrels file; beir: a BEIR folder; bridge: the "
                                          "BRIDGE release layout; hf: a Hugging Face dataset folder."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Target: a file for trec (a folder gets <dataset>.bridge.qrels), "
                                  "else a folder."),
) -> None:
    """Write the refined qrels of DATASET (materialize bridge_qrels first)."""
    from bridge_assets import store
    from bridge_assets.ingest.errors import DatasetError
    from bridge_assets.qrels.exports import export_qrels

    if not store.duckdb_path().exists():
        typer.secho(f"error: no data lake at {store.duckdb_path()}", fg="red", err=True)
        raise typer.Exit(2)
    try:
        with store.connect() as con:
            written = export_qrels(con, dataset, fmt, out)
    except (ExportError, DatasetError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(written))
