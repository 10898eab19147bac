"""Markdown rows of docs/labeler-eval.md from `bridge label-eval --json` outputs.

    .venv/bin/python scripts/labeler_eval_table.py RUN.json [RUN.json ...]

Each file holds one method's JSON summary; its name (without .json) names the row. Prints
one table row per file: n, class recalls, bAcc with its 95% bootstrap interval, escalation,
bAcc once escalations are resolved (with its interval), distinct calls and model seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = ("| run | n | irrel. recall | rel. recall | bAcc [95% CI] | esc. | resolved [95% CI] | "
          "calls | model s |\n|---|---|---|---|---|---|---|---|---|")


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def with_interval(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "-"
    return f"{percent(value)} [{percent(low)}, {percent(high)}]" if low is not None else percent(value)


def row(path: Path) -> str:
    result = json.loads(path.read_text())
    cells = [path.stem, str(result["n"]), percent(result["recall_irrelevant"]), percent(result["recall_relevant"]),
             with_interval(result["bacc"], result.get("bacc_ci_low"), result.get("bacc_ci_high")),
             percent(result["escalation_ratio"]),
             with_interval(result["bacc_resolved"], result.get("bacc_resolved_ci_low"),
                           result.get("bacc_resolved_ci_high")),
             str(result["calls"]), f"{result['model_seconds']:.0f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    paths = [Path(arg) for arg in sys.argv[1:]]
    if not paths:
        sys.exit(__doc__)
    print(HEADER)
    for path in paths:
        print(row(path))


if __name__ == "__main__":
    main()
