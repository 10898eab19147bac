"""`bridge retrievers ...`: the retriever registry from the command line.

    bridge retrievers list [--profile P] [--all]
    bridge retrievers add NAME --kind dense --model all-minilm-l6-v2 --param index=hnsw --param m=16
    bridge retrievers export --dataset scifact --retriever bm25 [--out runs/scifact.bm25.trec]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

app = typer.Typer(help="The retriever registry (resources/retrievers.yaml).", no_args_is_help=True,
                  add_completion=False)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(2)


@app.command("list")
def list_systems(
    profile: str = typer.Option(None, "--profile", "-p", help="Profile to show (default: the active one)."),
    show_all: bool = typer.Option(False, "--all", help="Every declared system, whatever its profiles."),
    check: bool = typer.Option(True, "--check/--no-check", help="Say whether each system's models load here."),
) -> None:
    """The systems of a profile: kind, models, profiles and whether they can load here."""
    from bridge_assets.retrieval.errors import RegistryError
    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.retrieval.weights import availability

    try:
        registry = load_registry()
        names = list(registry.systems) if show_all else registry.profile_systems(profile)
    except RegistryError as exc:
        _fail(str(exc))
    shown = "all systems" if show_all else f"profile {profile or registry.active_profile}"
    typer.echo(f"{registry.path} ({shown}; active profile: {registry.active_profile}; "
               f"profiles: {', '.join(registry.profiles())})")
    typer.echo(f"{'name':<20}{'kind':<9}{'paper name':<17}{'model':<34}{'loadable':<9} detail")
    loadable = 0
    for name in names:
        spec = registry.system(name)
        model = spec.model or (f"llm:{spec.llm.role or spec.llm.profile}" if spec.llm else "")
        if spec.first_stage:
            model += f" on {spec.first_stage}"
        if spec.inputs:
            model = "+".join(spec.inputs)
        ok, detail = availability(registry, name) if check else (None, "")
        loadable += bool(ok)
        mark = "-" if ok is None else ("yes" if ok else "NO")
        typer.echo(f"{name:<20}{spec.kind:<9}{(spec.paper_name or ''):<17}{model:<34}{mark:<9} {detail}")
    if check:
        typer.echo(f"{loadable}/{len(names)} systems can load here")


def _parse_params(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values are YAML (numbers, booleans, lists); dots nest (rm3.fb_docs=5)."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--param expects key=value, got '{item}'")
        target = params
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = yaml.safe_load(value)
    return params


@app.command("add")
def add_system(
    name: str = typer.Argument(..., help="The new system's name (its partition key)."),
    kind: str = typer.Option(..., "--kind", "-k", help="bm25, splade, dense, fusion, rerank or rewrite."),
    model: str = typer.Option(None, "--model", "-m", help="A model of the registry's `models:`."),
    first_stage: str = typer.Option(None, "--first-stage", help="rerank/rewrite: the system run first."),
    inputs: list[str] = typer.Option(None, "--input", help="fusion: a system to fuse (repeat)."),
    llm_role: str = typer.Option(None, "--llm-role", help="rerank/rewrite: an LLM role of models.yaml."),
    llm_profile: str = typer.Option(None, "--llm-profile", help="rerank/rewrite: an LLM profile of models.yaml."),
    profiles: list[str] = typer.Option(None, "--profile", "-p",
                                       help="Profiles it joins (repeat; default: the active one)."),
    params: list[str] = typer.Option(None, "--param", help="A parameter key=value (repeat)."),
    description: str = typer.Option("", "--description"),
) -> None:
    """Append a system to resources/retrievers.yaml (validated; the file is unchanged on error).

    The registry sensor then adds its partition and requests its runs on every dataset."""
    from bridge_assets.retrieval.errors import RegistryError
    from bridge_assets.retrieval.registry import append_system, load_registry

    try:
        registry = load_registry()
    except RegistryError as exc:
        _fail(str(exc))
    body: dict[str, Any] = {"kind": kind}
    if description:
        body["description"] = description
    if model:
        body["model"] = model
    if first_stage:
        body["first_stage"] = first_stage
    if inputs:
        body["inputs"] = list(inputs)
    if llm_role or llm_profile:
        body["llm"] = {"role": llm_role} if llm_role else {"profile": llm_profile}
    body["profiles"] = list(profiles or [registry.active_profile])
    if params:
        body["parameters"] = _parse_params(params)
    try:
        registry = append_system(name, body, registry.path)
    except RegistryError as exc:
        _fail(str(exc))
    typer.echo(f"added '{name}' ({kind}) to {registry.path}, profiles {body['profiles']}, "
               f"config hash {registry.config_hash(name)}")


@app.command("export")
def export_run(
    dataset: str = typer.Option(..., "--dataset", "-d"),
    retriever: str = typer.Option(..., "--retriever", "-r"),
    out: Path = typer.Option(None, "--out", "-o", help="Default: <data lake>/runs/<dataset>.<retriever>.trec"),
) -> None:
    """Write a stored run (the `retrieval_run` table) as a TREC run file."""
    from bridge_assets.paths import data_lake_dir
    from bridge_assets.retrieval.runs import export_trec_run

    out = out or data_lake_dir() / "runs" / f"{dataset}.{retriever}.trec"
    try:
        path, rows = export_trec_run(dataset, retriever, out)
    except LookupError as exc:
        _fail(str(exc))
    typer.echo(f"{rows} lines -> {path}")
