"""`bridge retrievers ...`: the retriever registry from the command line.

    bridge retrievers list [--profile P] [--all]
    bridge retrievers add NAME --kind dense --model all-minilm-l6-v2 --param index=hnsw --param m=16
    bridge retrievers export --dataset scifact --retriever bm25 [--out runs/scifact.bm25.trec]
    bridge runs import FILE --dataset scifact --name my_system [--k 100] [--replace]
    bridge runs list [--dataset scifact]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from bridge_assets.cli.console import VERBOSE_HELP
from bridge_assets.cli.errors import BridgeTyper
from bridge_assets.cli.errors import fail as _fail

app = BridgeTyper(help="The retriever registry (resources/retrievers.yaml).", no_args_is_help=True,
                  add_completion=False)
runs_app = BridgeTyper(help="External runs (TREC run files) as retrieval systems.", no_args_is_help=True,
                       add_completion=False)


@app.command("list")
def list_systems(
    profile: str = typer.Option(None, "--profile", "-p", help="Profile to show (default: the active one)."),
    show_all: bool = typer.Option(False, "--all", help="Every declared system, whatever its profiles."),
    check: bool = typer.Option(True, "--check/--no-check", help="Say whether each system's models load here."),
) -> None:
    """The systems of a profile: kind, models, profiles and whether they can load here."""
    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.retrieval.weights import availability

    registry = load_registry()
    names = (list(registry.systems) if show_all
             else registry.profile_systems(profile) + registry.evaluation_systems(profile))
    shown = "all systems" if show_all else f"profile {profile or registry.active_profile}"
    typer.echo(f"{registry.source} ({shown}; active profile: {registry.active_profile}; "
               f"profiles: {', '.join(registry.profiles())})")
    typer.echo(f"{'name':<20}{'kind':<15}{'paper name':<17}{'model':<34}{'loadable':<9} detail")
    loadable = 0
    for name in names:
        spec = registry.system(name)
        model = spec.model or (f"llm:{spec.llm.role or spec.llm.profile}" if spec.llm else "")
        if spec.first_stage:
            model += f" on {spec.first_stage}"
        if spec.inputs:
            model = "+".join(spec.inputs)
        if spec.path:
            model = spec.path
        if spec.kind == "student_rerank":
            model = f"student on {spec.first_stage} (not pooled)"
        elif spec.kind == "trained_retriever":
            model = f"{spec.model} trained (not pooled)"
        ok, detail = availability(registry, name) if check else (None, "")
        loadable += bool(ok)
        mark = "-" if ok is None else ("yes" if ok else "NO")
        typer.echo(f"{name:<20}{spec.kind:<15}{(spec.paper_name or ''):<17}{model:<34}{mark:<9} {detail}")
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
    kind: str = typer.Option(..., "--kind", "-k", help="bm25, splade, dense, fusion, rerank, rewrite, run_file, "
                                                       "student_rerank or trained_retriever (these two "
                                                       "evaluated, never pooled)."),
    model: str = typer.Option(None, "--model", "-m", help="A model of the registry's `models:` "
                                                    "(trained_retriever: the bi-encoder it fine-tunes)."),
    first_stage: str = typer.Option(None, "--first-stage", help="rerank/rewrite/student_rerank: the system "
                                                                    "run first."),
    inputs: list[str] = typer.Option(None, "--input", help="fusion: a system to fuse (repeat)."),
    llm_role: str = typer.Option(None, "--llm-role", help="rerank/rewrite, and a trained_retriever with "
                                                          "labels=utility: an LLM role of models.yaml."),
    llm_profile: str = typer.Option(None, "--llm-profile", help="rerank/rewrite, and a trained_retriever with "
                                                                "labels=utility: an LLM profile of models.yaml."),
    profiles: list[str] = typer.Option(None, "--profile", "-p",
                                       help="Profiles it joins (repeat; default: the active one)."),
    path: str = typer.Option(None, "--path", help="run_file: the TREC run file per dataset, with {dataset}."),
    params: list[str] = typer.Option(None, "--param", help="A parameter key=value (repeat)."),
    description: str = typer.Option("", "--description"),
    replace: bool = typer.Option(False, "--replace", help="Replace a system of that name."),
) -> None:
    """Add a system to <BRIDGE_REGISTRY_DIR>/retrievers.yaml, else to resources/retrievers.yaml
    (validated; the file is unchanged on error).

    The registry sensor then adds its partition and requests its runs on every dataset."""
    from bridge_assets.retrieval.registry import append_system, load_registry, target_path

    registry = load_registry()
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
    if path:
        body["path"] = path
    body["profiles"] = list(profiles or [registry.active_profile])
    if params:
        body["parameters"] = _parse_params(params)
    registry = append_system(name, body, replace=replace)
    typer.echo(f"added '{name}' ({kind}) to {target_path()}, profiles {body['profiles']}, "
               f"config hash {registry.config_hash(name)}")
    if registry.system(name).evaluation_only:
        typer.echo("evaluated, never pooled: `bridge run` builds its run (student_rerank_run) after the "
                   "labels, and retrieval_metrics scores it")


@app.command("export")
def export_run(
    dataset: str = typer.Option(..., "--dataset", "-d"),
    retriever: str = typer.Option(..., "--retriever", "-r"),
    out: Path = typer.Option(None, "--out", "-o", help="Default: <data lake>/runs/<dataset>.<retriever>.trec"),
) -> None:
    """Write a stored run (the `retrieval_run` table) as a TREC run file."""
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.retrieval.runs import export_trec_run

    lake = DuckDBStore().lake
    out = out or lake.runs / f"{dataset}.{retriever}.trec"
    path, rows = export_trec_run(dataset, retriever, out, lake)
    typer.echo(f"{rows} lines -> {path}")


def materialize_run(dataset: str, retriever: str, verbose: bool = False) -> dict[str, Any]:
    """Materialize the `retrieval_run` partition (dataset, retriever) now, on the Dagster instance
    the UI uses (ingesting the dataset first if it never was), with a line per step
    (cli.console); its materialization metadata."""
    import dagster as dg

    from bridge_assets.cli import console

    key = dg.MultiPartitionKey({"dataset": dataset, "retriever": retriever})
    return console.materialize(["retrieval_run"], dataset, verbose=verbose,
                               partition_key=key).metadata("retrieval_run")


@runs_app.command("list")
def list_runs(
    dataset: str = typer.Option(None, "--dataset", "-d", help="Only this dataset (default: every one)."),
) -> None:
    """Every run file a run_file system reads, per dataset, and its run: stored (with its rows),
    failed (with the error naming the file, line and field: the rest of the dataset ran without
    it), running, or never run."""
    import dagster as dg

    from bridge_assets.orchestration import runs as orchestration
    from bridge_assets.registry.datasets import get_dataset
    from bridge_assets.registry.datasets import load_registry as load_datasets
    from bridge_assets.retrieval.registry import load_registry

    registry = load_registry()
    datasets = [get_dataset(dataset).name] if dataset else list(load_datasets())
    files = {dg.MultiPartitionKey({"dataset": d, "retriever": name}): registry.run_file(name, d)
             for name, spec in registry.systems.items() if spec.kind == "run_file" for d in datasets
             if registry.run_file(name, d).exists()}
    if not files:
        typer.echo("no run files: drop one in <runs folder>/<dataset>/<name>.trec or use `bridge runs import`")
        return
    states = orchestration.partition_states("retrieval_run", list(files))
    typer.echo(f"{'dataset':<14}{'system':<22}{'run':<11}{'rows':>8}  file")
    for key, path in files.items():
        state = states[key]
        rows = "" if state.rows is None else str(state.rows)
        typer.echo(f"{key.keys_by_dimension['dataset']:<14}{key.keys_by_dimension['retriever']:<22}"
                   f"{state.status:<11}{rows:>8}  {path}")
        if state.error:
            typer.secho(f"  {state.error}\n  (fix the file, then `bridge run -d {key.keys_by_dimension['dataset']}`"
                        f" brings the system back in)", fg="red")


@runs_app.command("import")
def import_run(
    file: Path = typer.Argument(..., exists=True, dir_okay=False,
                                help="A TREC run file (qid Q0 docid rank score tag), gzipped when it ends in .gz."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="The dataset the run is on."),
    name: str = typer.Option(..., "--name", "-n", help="The system's name (its partition key)."),
    k: int = typer.Option(None, "--k", min=1, help="Documents kept per query (default: the registry's defaults.k)."),
    profiles: list[str] = typer.Option(None, "--profile", "-p",
                                       help="Profiles it joins (repeat; default: the active one)."),
    replace: bool = typer.Option(False, "--replace", help="Replace a run file or a system of that name."),
    run: bool = typer.Option(True, "--run/--no-run", help="Materialize its retrieval_run partition now."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
) -> None:
    """Copy FILE to <runs folder>/DATASET/NAME.trec[.gz], register NAME as a run_file system and
    materialize its run on DATASET. The runs folder is <BRIDGE_REGISTRY_DIR>/runs, else
    <data lake>/runs."""
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.registry.datasets import get_dataset
    from bridge_assets.retrieval.registry import load_registry, target_path
    from bridge_assets.retrieval.run_files import copy_run_file, register_run_file, runs_dir, validate_system_name
    from bridge_assets.trec_io import read_trec_run

    get_dataset(dataset)
    validate_system_name(name)
    lines = len(read_trec_run(file).lines)  # a malformed file stops here, before anything is written
    registry = load_registry()
    suffix = ".trec.gz" if file.name.endswith(".gz") else ".trec"
    if name in registry.systems and registry.system(name).kind == "run_file":
        suffix = ".trec.gz" if registry.system(name).required_path().endswith(".gz") else ".trec"  # keep its file name
    target = runs_dir(DuckDBStore().lake) / dataset / f"{name}{suffix}"
    if target.exists() and target.resolve() != file.resolve() and not replace:
        _fail(f"{target} exists (replace it with --replace)")
    # first: a name taken by another system stops here, before the file is copied
    _, written = register_run_file(name, dataset, target, k=k, profiles=profiles, replace=replace)
    copy_run_file(file, target)
    typer.echo(f"{lines} lines -> {target}")
    typer.echo(f"registered '{name}' (run_file) in {target_path()}" if written else
               f"'{name}' already reads {target}")
    if not run:
        return
    try:
        metadata = materialize_run(dataset, name, verbose=verbose)
    except Exception as exc:  # the asset's own error names the file and line
        _fail(f"{type(exc).__name__}: {exc}\n(the file and the registry entry stay; fix the file and "
              f"import it again with --replace)")
    report = metadata["details"].get("run_files", {}).get(name, {})
    typer.echo(f"retrieval_run ({dataset}, {name}): {metadata['dagster/row_count']} rows, "
               f"{report.get('kept', 0)} of {report.get('lines', 0)} lines kept")
    skipped = report.get("unknown_query_lines", 0) + report.get("unknown_document_lines", 0)
    if skipped:
        typer.secho(f"skipped {report['unknown_query_lines']} lines with unknown query ids "
                    f"({report['unknown_query_ids']} ids) and {report['unknown_document_lines']} with unknown "
                    f"document ids ({report['unknown_document_ids']} ids), e.g.\n  "
                    + "\n  ".join(report["examples"]), fg="yellow", err=True)
