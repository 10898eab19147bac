"""pyproject.toml declares what bridge_assets imports, and nothing it never uses (issue 15, item 6)."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib

from packaging.requirements import Requirement

from fixtures.paths import PROJECT_ROOT

# Needed at run time without an import of their own.
RUNTIME_ONLY = {"pyarrow": "polars' DuckDB and Arrow exchange", "python-multipart": "FastAPI's form parsing",
                "dagster-webserver": "the UI (make ui: dagster dev)",
                "duckdb-extension-ducklake": "DuckLake storage: the extension file, loaded by path",
                "duckdb-extension-sqlite-scanner": "DuckLake's SQLite catalog: the extension file"}


def imported_distributions() -> dict[str, set[str]]:
    """distribution name -> the modules of bridge_assets that import it."""
    by_module = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in (PROJECT_ROOT / "bridge_assets").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "bridge_assets":
                    continue
                for distribution in by_module.get(top, [top]):
                    found.setdefault(distribution.lower().replace("_", "-"), set()).add(
                        str(path.relative_to(PROJECT_ROOT)))
    return found


def declared() -> set[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                              for r in extra]
    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


def test_pyproject_declares_every_import_and_nothing_unused():
    imported = imported_distributions()
    missing = {name: sorted(where) for name, where in imported.items() if name not in declared()}
    assert not missing, f"imported but not in pyproject.toml: {missing}"
    unused = declared() - set(imported) - set(RUNTIME_ONLY)
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"
