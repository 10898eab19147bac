"""Test modules never import one another (conftest.py): what tests share lives in tests/fixtures/."""

from __future__ import annotations

import ast

from fixtures.paths import PROJECT_ROOT


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):  # function-level imports included
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_no_test_module_imports_another():
    offenders = [f"{path.name} imports {name}"
                 for path in sorted((PROJECT_ROOT / "tests").glob("test_*.py"))
                 for name in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
                 if name.split(".")[0].startswith("test_") or name.startswith("tests.")]
    assert offenders == []
