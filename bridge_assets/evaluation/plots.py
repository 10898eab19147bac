"""The paper's Figure 2 for a gold set: labeling bAcc against the escalation ratio."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge_assets.plots import pyplot

MARKERS = {"judge": "s", "lara": "o", "dream": "D", "diras": "^", "utilsel": "v", "utilrank": "<"}


def plot_bacc_vs_escalation(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """One point per method at (escalation ratio, bAcc once escalations are resolved); the
    LARA runs of one model joined by a line over their ratios. Writes a PNG to `path`."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7.5, 5))
    lara_lines: dict[str, list[tuple[float, float]]] = {}
    placed: dict[tuple[float, float], int] = {}  # labels of coinciding points are stacked
    for row in rows:
        if row.get("bacc_resolved") is None:
            continue
        x, y = 100 * row["escalation_ratio"], 100 * row["bacc_resolved"]
        if row["kind"] == "lara":
            lara_lines.setdefault(row["models"], []).append((x, y))
        axis.scatter([x], [y], marker=MARKERS.get(row["kind"], "x"), s=40)
        spot = (round(x, 1), round(y, 1))
        placed[spot] = placed.get(spot, -1) + 1
        axis.annotate(row["method"], (x, y), textcoords="offset points", xytext=(4, 3 + 8 * placed[spot]),
                      fontsize=7)
    for model, points in lara_lines.items():
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", linewidth=1,
                  label=f"LARA ({model})")
    axis.set_xlabel("escalation ratio (% of pairs sent to humans)")
    axis.set_ylabel("bAcc with escalations resolved (%)")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    if lara_lines:
        axis.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
