"""Imports flow one way: cli -> orchestration -> definitions -> the stages -> pipeline, llm,
lake and the root modules (settings, paths, errors...). Each top-level package (or root module)
of bridge_assets is a node; every import counts, the ones inside functions too, except those
under `if TYPE_CHECKING:` (never executed: annotations only)."""

from __future__ import annotations

import ast
from pathlib import Path

import bridge_assets

ROOT = Path(bridge_assets.__file__).parent
ABOVE_STAGES = {"cli", "orchestration", "definitions"}


def _node(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "bridge_assets" or len(parts) < 2:
        return None
    name = parts[1]
    return name if (ROOT / name).is_dir() or (ROOT / f"{name}.py").exists() else None


def _runtime_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) of each import that can run: those under `if TYPE_CHECKING:` left out."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_imports() -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> the places (file:line) that import it."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        source = _node("bridge_assets." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        if source is None:
            continue
        graph.setdefault(source, {})
        for module, line in _runtime_imports(ast.parse(path.read_text(), str(path))):
            target = _node(module)
            if target is not None and target != source:
                place = f"{path.relative_to(ROOT.parent)}:{line}"
                graph[source].setdefault(target, [])
                if place not in graph[source][target]:
                    graph[source][target].append(place)
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """A path a -> b -> ... -> a of imports, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all below it are

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":
                return [*path[path.index(target):], target] if target in path else [node, target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_there_are_no_import_cycles_between_packages():
    graph = package_imports()
    cycle = find_cycle(graph)
    edges = [f"{a} -> {b} ({', '.join(graph[a][b][:3])})" for a, b in zip(cycle, cycle[1:], strict=False)] if cycle else []
    assert cycle is None, "import cycle:\n  " + "\n  ".join(edges)


def test_the_cycle_finder_finds_a_cycle_and_passes_a_dag():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": [], "c": []}, "b": {"c": []}, "c": {}}) is None


def test_the_stages_and_what_is_below_them_never_import_the_layers_above():
    graph = package_imports()
    wrong = [f"{source} -> {target}: {', '.join(places)}"
             for source, targets in graph.items() if source not in ABOVE_STAGES
             for target, places in targets.items() if target in ABOVE_STAGES]
    assert not wrong, "\n".join(wrong)


def test_the_command_line_is_only_in_the_cli_package():
    # typer is the command line's library: a stage that imports it holds command-line code
    holders = sorted(str(path.relative_to(ROOT.parent)) for path in ROOT.rglob("*.py")
                     if "cli" not in path.relative_to(ROOT).parts
                     and any(module in ("typer", "click") for module, _ in _runtime_imports(ast.parse(path.read_text()))))
    assert not holders


def test_the_check_sees_function_level_imports_and_skips_type_checking_ones():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from bridge_assets.cli import app\n"
                     "def f():\n    from bridge_assets.orchestration import runs\n")
    modules = {module for module, _ in _runtime_imports(tree)}
    assert "bridge_assets.orchestration" in modules and "bridge_assets.cli" not in modules
