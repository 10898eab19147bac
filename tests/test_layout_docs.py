"""The README's layout and docs/architecture.md name what exists: every package of
bridge_assets has its line, and each place a newcomer is sent to add something is that place."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import bridge_assets
from bridge_assets.paths import PROJECT_ROOT

PACKAGE = Path(bridge_assets.__file__).parent
README = (PROJECT_ROOT / "README.md").read_text()
ARCHITECTURE = (PROJECT_ROOT / "docs" / "architecture.md").read_text()


def _layout() -> str:
    return README.split("## Layout", 1)[1].split("\n## ", 1)[0]


def test_every_package_and_root_module_has_its_line_in_the_readme_layout():
    layout = _layout()
    packages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    missing = [f"{name}/" for name in packages if not re.search(rf"^  {name}/ ", layout, re.M)]
    missing += [name for name in modules if not re.search(rf"^  {re.escape(name)} ", layout, re.M)]
    assert not missing


def test_every_module_the_layout_names_in_a_package_exists():
    layout = _layout()
    for package, text in re.findall(r"^  (\w+)/\s+(.*?)(?=^  \S|^\S|\Z)", layout, re.M | re.S):
        for module in re.findall(r"\b([\w/]+\.py)\b", text):
            assert (PACKAGE / package / module).exists() or (PACKAGE / module).exists(), (package, module)


def test_the_layers_the_architecture_page_lists_are_the_packages():
    named = set(re.findall(r"`(\w+)/`", ARCHITECTURE))
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= named, packages - named


def test_each_place_to_add_a_thing_is_that_place():
    import importlib

    from bridge_assets.cli.main import LazyGroup
    from bridge_assets.ingest.loaders import LOADERS
    from bridge_assets.labeling.labeler import LABELERS
    from bridge_assets.metrics.judged_rows import DEFINITIONS
    from bridge_assets.registry.datasets import DatasetKind
    from bridge_assets.retrieval.systems import KINDS

    assert (PROJECT_ROOT / "resources" / "retrievers.yaml").exists() and KINDS
    assert LABELERS and DEFINITIONS
    # a format is its loader (or a remote kind's fetcher) and its name: neither without the other
    from bridge_assets.ingest.remote import FETCHERS

    assert set(LOADERS) | set(FETCHERS) == set(get_args(DatasetKind))
    assert not set(LOADERS) & set(FETCHERS)
    # every router module of the annotation app is the one list the app includes
    app_dir = PACKAGE / "human" / "app"
    routers = {p.stem for p in app_dir.glob("*.py")
               if hasattr(importlib.import_module(f"bridge_assets.human.app.{p.stem}"), "router")}
    included = {node.id for loop in ast.walk(ast.parse((app_dir / "__init__.py").read_text()))
                if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Tuple)
                for node in loop.iter.elts if isinstance(node, ast.Name)}
    assert routers and routers == included
    # every command group under cli/ is reachable from `bridge` (main.py's lazy table or main itself)
    lazy_modules = {module for cls in LazyGroup.__subclasses__() for module, _, _ in cls.LAZY.values()}
    helpers = {"__init__", "__main__", "main", "errors", "console", "summary"}
    commands = {f"bridge_assets.cli.{p.stem}" for p in (PACKAGE / "cli").glob("*.py") if p.stem not in helpers}
    assert commands <= lazy_modules, commands - lazy_modules
