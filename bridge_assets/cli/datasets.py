"""`bridge datasets add`: register a dataset without editing a file by hand.

    bridge datasets add my_beir --kind beir --path /data/my_beir [--split test]
    bridge datasets add my_trec --kind trec --corpus c.jsonl --topics t.txt --qrels q.txt
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from bridge_assets.cli.errors import fail as _fail

# The options naming local files; written to the registry as absolute paths (a relative path
# on the command line is relative to where the command runs, not to the registry file).
PATH_OPTIONS = ("path", "corpus", "topics", "qrels", "answers", "queries", "known_holes")


def add_dataset_command(
    name: str = typer.Argument(..., help="The dataset's name (its partition key)."),
    kind: str = typer.Option(..., "--kind", "-k",
                             help="beir, trec, nq_open, bridge_release (or beir_url, huggingface, ir_datasets)."),
    path: Path = typer.Option(None, "--path", help="beir: the folder; nq_open: the jsonl(.gz)."),
    split: str = typer.Option(None, "--split", help="beir: qrels/<split>.tsv (default test)."),
    corpus: Path = typer.Option(None, "--corpus", help="trec, bridge_release: the collection."),
    topics: Path = typer.Option(None, "--topics", help="trec: the topics."),
    qrels: Path = typer.Option(None, "--qrels", help="trec: the qrels."),
    queries: Path = typer.Option(None, "--queries", help="bridge_release: the q_id/query/doc_id/answers file."),
    answers: Path = typer.Option(None, "--answers", help="Optional answers jsonl."),
    known_holes: Path = typer.Option(None, "--known-holes", help="Optional verified holes jsonl."),
    url: str = typer.Option(None, "--url", help="beir_url: a BEIR zip."),
    source_id: str = typer.Option(None, "--id", help="huggingface / ir_datasets: the dataset id."),
    description: str = typer.Option("", "--description"),
    query_field: str = typer.Option(None, "--query-field",
                                    help="trec: the topic field that is the query: title (default), "
                                         "description or title_description."),
    label_scale: str = typer.Option(None, "--label-scale",
                                    help="binary (default) or graded (0-3, as TREC DL / UMBRELA)."),
    replace: bool = typer.Option(False, "--replace", help="Replace a dataset of that name."),
) -> None:
    """Add a dataset to <BRIDGE_REGISTRY_DIR>/datasets.yaml, else to the shipped datasets.yaml
    (validated; the file is unchanged on error). It becomes a `dataset` partition in processes
    started afterwards (restart `make ui`)."""
    from bridge_assets.registry.datasets import add_dataset

    given: dict[str, Any] = {"path": path, "corpus": corpus, "topics": topics, "qrels": qrels,
                             "queries": queries, "answers": answers, "known_holes": known_holes}
    body: dict[str, Any] = {"kind": kind}
    if description:
        body["description"] = description
    for field in PATH_OPTIONS:
        if given[field] is not None:
            if not given[field].exists():
                _fail(f"--{field.replace('_', '-')} {given[field]}: no such file or folder")
            body[field] = str(given[field].resolve())
    for field, value in (("split", split), ("url", url), ("id", source_id),
                         ("query_field", query_field), ("label_scale", label_scale)):
        if value:
            body[field] = value
    written = add_dataset(name, body, replace=replace)
    typer.echo(f"added dataset '{name}' ({kind}) to {written}; `bridge run --dataset {name}` and the "
               f"UI see it from their next start")
