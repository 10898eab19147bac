"""The house's size limits (issue 58): no module of bridge_assets over 600 lines, no function
over 80. A module or function past them is split by what it does, not trimmed to fit."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bridge_assets"
MODULE_LINES = 600
FUNCTION_LINES = 80


def oversized(root: Path = PACKAGE) -> list[str]:
    """'path:line what (n lines)' for every module and function past its limit; a nested
    function counts on its own, and its lines count in the function around it too."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(root.parent)
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            found.append(f"{where}:1 module ({lines} lines, limit {MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None  # parsed from source: every node has its end
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} function {node.name} ({length} lines, "
                                 f"limit {FUNCTION_LINES})")
    return found


def test_no_module_or_function_of_bridge_assets_is_over_its_limit():
    assert oversized() == []


def test_the_walk_names_an_oversized_module_and_function_by_file_and_line(tmp_path):
    package = tmp_path / "bridge_assets"
    (package / "sub").mkdir(parents=True)
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    (package / "sub" / "long.py").write_text(f"\n\ndef outer():\n    def inner():\n{body}\n", encoding="utf-8")
    (package / "big.py").write_text("x = 1\n" * (MODULE_LINES + 1), encoding="utf-8")
    (package / "fine.py").write_text("def short():\n    return 1\n", encoding="utf-8")
    assert oversized(package) == [
        f"bridge_assets/big.py:1 module ({MODULE_LINES + 1} lines, limit {MODULE_LINES})",
        f"bridge_assets/sub/long.py:3 function outer ({FUNCTION_LINES + 2} lines, limit {FUNCTION_LINES})",
        f"bridge_assets/sub/long.py:4 function inner ({FUNCTION_LINES + 1} lines, limit {FUNCTION_LINES})",
    ]
