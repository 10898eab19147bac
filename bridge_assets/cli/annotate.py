"""`bridge annotate ...`: serve the annotation app, manage annotators, move votes in and out."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

import typer

from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.errors import fail as _fail

app = BridgeTyper(help="Human annotation of escalated pairs (the annotation web app and its votes).",
                  no_args_is_help=True, add_completion=False)


@contextmanager
def _votes(lake: bool = False) -> Iterator:
    """A connection to the votes store (an old lake's votes moved in first), with the
    pipeline's tables readable when `lake`."""
    from bridge_assets.human import votes_store
    from bridge_assets.lake.location import lake_location

    where = lake_location()  # the command's edge, as the store resource's (no dagster imported)
    moved = votes_store.prepare(where)
    if moved:
        typer.secho(f"moved {moved} votes from {where.duckdb} to the votes store {where.votes_db}",
                    err=True)
    with votes_store.connect(where, pipeline=lake) as con:
        yield con


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; 0.0.0.0 opens it to the network."),
    port: int = typer.Option(8765, min=1, max=65535),
    with_history: bool = typer.Option(True, "--with-history/--without-history",
                                      help="Show the debate history (recorded with every vote)."),
    attention_rate: float = typer.Option(0.1, min=0.0, max=1.0,
                                         help="Share of items that are attention checks."),
    known_rate: float = typer.Option(0.1, min=0.0, max=1.0,
                                     help="Share of items that are known-answer items, while any are "
                                          "loaded (bridge annotate load-known); they measure accuracy."),
    dataset: list[str] = typer.Option(None, "--dataset", "-d", help="Only these datasets' pairs."),
    secure_cookies: bool = typer.Option(False, help="Mark cookies Secure (serving over HTTPS)."),
    insecure_http_ok: bool = typer.Option(
        False, "--insecure-http-ok",
        help="Serve plain HTTP off the loopback anyway (tokens and cookies travel in clear)."),
    session_hours: int = typer.Option(12, min=1, help="A login lasts this long, however active."),
) -> None:
    """Serve the annotation app (log in with a token from add-annotator)."""
    if not is_loopback(host) and not (secure_cookies or insecure_http_ok):
        _fail(f"--host {host} is reachable from other machines, and plain HTTP would send the "
              "login tokens and session cookies in clear. Serve it behind HTTPS (a reverse proxy "
              "that terminates TLS) and pass --secure-cookies, or pass --insecure-http-ok to "
              "accept plain HTTP on a network you trust.")
    import uvicorn

    from bridge_assets.human.app import AppSettings, annotation_app
    from bridge_assets.human.security import load_secret
    from bridge_assets.lake.location import lake_location
    from bridge_assets.registry.datasets import graded_datasets

    lake = lake_location()
    settings = AppSettings(lake=lake, secret=load_secret(lake.folder),
                           with_history=with_history, attention_rate=attention_rate, known_rate=known_rate,
                           datasets=tuple(dataset) if dataset else None, graded=graded_datasets(),
                           secure_cookies=secure_cookies, session_hours=session_hours)
    typer.secho(f"annotation app on http://{host}:{port}/ ({'with' if with_history else 'without'} "
                f"debate history) -> votes in {lake.votes_db}, pipeline {lake.duckdb}",
                fg="cyan", err=True)
    uvicorn.run(annotation_app(settings), host=host, port=port, log_level="info")


@app.command("add-annotator")
def add_annotator(
    name: str = typer.Argument(..., help="Annotator name (also their id in human_votes)."),
    admin: bool = typer.Option(False, "--admin", help="May open the admin pages."),
    rotate: bool = typer.Option(False, "--rotate", help="Issue a new token for an existing annotator."),
) -> None:
    """Create an annotator and print their personal token (shown once; only its hash is kept)."""
    from bridge_assets.human.annotators import add_annotator as add

    with _votes() as con:
        token = add(con, name, admin=admin, rotate=rotate)
    typer.secho(f"{'admin' if admin else 'annotator'} {name}: personal token (keep it secret, "
                "it is shown only once):", err=True)
    typer.echo(token)


@app.command()
def migrate() -> None:
    """Move the annotators, assignments and votes of a lake from before the votes store out of
    bridge.duckdb into the votes store (every other command does it on first use; `make clean`
    runs this first). Prints where the votes are."""
    from bridge_assets.human import votes_store
    from bridge_assets.lake.location import lake_location

    where = lake_location()
    moved = votes_store.prepare(where)
    typer.echo(f"moved {moved} votes from {where.duckdb} to {where.votes_db}" if moved
               else f"votes store: {where.votes_db} (nothing to move)")


class ImportKind(str, Enum):
    auto = "auto"
    csv = "csv"
    json = "json"
    label_studio = "label-studio"


@app.command("import")
def import_(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True),
    fmt: ImportKind = typer.Option(ImportKind.auto, "--format", "-f",
                                   help="auto: CSV by extension, else JSON or Label Studio's export."),
    override: bool = typer.Option(
        False, "--override-app-annotators",
        help="Accept votes under the names of annotators who log in to the app (their source "
             "becomes import:override:<file>)."),
) -> None:
    """Import votes collected elsewhere (validated; all or nothing)."""
    from bridge_assets.human.transfer import ImportFailed, import_votes
    from bridge_assets.registry.datasets import graded_datasets

    try:
        with _votes(lake=True) as con:
            added = import_votes(con, file.read_bytes(), file.name, fmt.value, override=override,
                                 graded=graded_datasets())
    except ImportFailed as exc:
        hint = (f"\n{', '.join(exc.token_holders)} log(s) in to the app; pass "
                "--override-app-annotators to import their votes anyway") if exc.token_holders else ""
        _fail(f"{exc}{hint}")
    typer.echo(f"imported {added} votes from {file}")


class ExportKind(str, Enum):
    csv = "csv"
    json = "json"


@app.command()
def export(
    fmt: ExportKind = typer.Option(ExportKind.csv, "--format", "-f"),
    output: Path = typer.Option(None, "--output", "-o", help="File to write (default: stdout)."),
    dataset: str = typer.Option(None, "--dataset", "-d", help="Only this dataset's votes."),
) -> None:
    """Export every vote (accepted and excluded) as CSV or JSON."""
    from bridge_assets.human.transfer import export_votes

    with _votes() as con:
        body = export_votes(con, fmt.value, dataset)
    if output:
        output.write_text(body)
        typer.secho(f"wrote {output}", err=True)
    else:
        typer.echo(body, nl=False)


@app.command()
def plan(
    dataset: str = typer.Option(..., "--dataset", "-d", help="The dataset whose pending pairs to plan."),
    systems: tuple[str, str] | None = typer.Option(None, "--systems", metavar="A B",
                                                   help="Only the pairs that decide the order of these two systems."),
    limit: int = typer.Option(20, min=0, help="Pairs to list."),
) -> None:
    """The pending pairs in the order the queue serves them (by impact: pending_impact), how
    many labels make every rank change robust (the stopping point), and why each pair matters."""
    from bridge_assets.human.plan import plan_text

    with _votes(lake=True) as con:
        text = plan_text(con, dataset, systems=systems or None, limit=limit)
    typer.echo(text)


@app.command("export-gold")
def export_gold(
    output: Path = typer.Option(None, "--output", "-o", help="JSONL file to write (default: stdout)."),
    dataset: str = typer.Option(None, "--dataset", "-d", help="Only this dataset's pairs."),
    min_agreement: float = typer.Option(0.0, min=0.0, max=1.0,
                                        help="Keep only pairs whose most frequent vote has at least "
                                             "this share (e.g. 1.0: unanimous)."),
) -> None:
    """The pairs people decided, as a gold set for `bridge label-eval --gold FILE` (the votes'
    median as the label, their agreement in each triplet's note)."""
    from bridge_assets.human.gold import export_gold as gold

    with _votes(lake=True) as con:
        body = gold(con, dataset, min_agreement)
    if output:
        output.write_text(body, encoding="utf-8")
        typer.secho(f"wrote {body.count(chr(10))} triplet(s) to {output}", err=True)
    else:
        typer.echo(body, nl=False)


@app.command("load-known")
def load_known(
    dataset: str = typer.Option(None, "--dataset", "-d",
                                help="Load this dataset's known holes (its known_holes: key) and as many "
                                     "of its pool's pairs the key says are no hole."),
    goldset: str = typer.Option(None, "--goldset", help="Load this gold set of goldsets.yaml."),
    gold: Path = typer.Option(None, "--gold", exists=True, dir_okay=False,
                              help="Load this gold-set file (label-eval's format); named by its stem."),
    limit: int = typer.Option(None, min=1, help="At most this many (a gold set: both classes in turn; "
                                                "known holes: the pairs that are no hole)."),
) -> None:
    """Load pairs whose answer is known as annotation items: served like attention checks
    (serve --known-rate) and scored per arm (bridge annotate accuracy, the admin page)."""
    from bridge_assets.human import known

    if sum(x is not None for x in (dataset, goldset, gold)) != 1:
        _fail("give one of --dataset, --goldset or --gold")
    if dataset is not None:
        from bridge_assets.qrels.known_holes import read_known_holes
        from bridge_assets.registry.datasets import get_dataset

        spec = get_dataset(dataset)
        if not spec.known_holes:
            _fail(f"dataset '{dataset}' has no known_holes key")
        key = read_known_holes(spec.resolve(spec.known_holes, "known_holes"))
        with _votes(lake=True) as con:
            relevant, irrelevant = known.load_holes(con, dataset, key, limit)
        typer.echo(f"loaded holes:{dataset}: {relevant} known hole(s) (relevant) and {irrelevant} "
                   "pool pair(s) the key says are no hole (irrelevant)")
        return
    from bridge_assets.evaluation.goldsets import load_registry, read_goldset, stratified_head

    name, path = (goldset, load_registry().goldset(goldset).file) if goldset else (gold.stem, gold)
    triplets = stratified_head(read_goldset(path), limit)
    with _votes() as con:
        count = known.load_goldset(con, name, triplets)
    relevant = sum(t.label for t in triplets)
    typer.echo(f"loaded {known.goldset_source(name)}: {count} triplet(s), {relevant} relevant and "
               f"{count - relevant} irrelevant")


@app.command()
def accuracy(
    dataset: str = typer.Option(None, "--dataset", "-d",
                                help="Only this dataset's votes (or a gold set's: goldset:NAME)."),
) -> None:
    """People's accuracy against known answers (attention checks, known holes, gold sets), per
    source and arm (debate history shown or not)."""
    from bridge_assets.human.known import describe_accuracy, known_accuracy

    with _votes() as con:
        frame = known_accuracy(con, dataset)
    typer.echo(describe_accuracy(frame))
