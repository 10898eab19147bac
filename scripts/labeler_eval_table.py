"""Markdown rows of docs/labeler-eval.md from `bridge label-eval --json` outputs.

    .venv/bin/python scripts/labeler_eval_table.py RUN.json [RUN.json ...]
    .venv/bin/python scripts/labeler_eval_table.py --paired REFERENCE.items.jsonl OTHER.items.jsonl

Each file holds one method's JSON summary; its name (without .json) names the row. Prints
one table row per file: n, class recalls, bAcc with its 95% bootstrap interval, escalation,
bAcc once escalations are resolved (with its interval), distinct calls and model seconds.

--paired compares two labelers on the same triplets from their `label-eval --items` files
(matched by id): how many outcomes are the same, and OTHER's bAcc and resolved bAcc minus
REFERENCE's with 95% paired bootstrap intervals (both arms resampled together), and how many
more triplets OTHER escalates (percentage points of the triplets, with its interval).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from bridge_assets.evaluation.scores import BOOTSTRAP_RESAMPLES, NO_LABEL, bacc_difference_interval, final_labels

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


def outcomes(path: Path) -> dict[str, dict]:
    return {item["id"]: item for item in map(json.loads, path.read_text().splitlines()) if item["gold"] is not None}


def paired(reference_path: Path, other_path: Path) -> str:
    reference, other = outcomes(reference_path), outcomes(other_path)
    if reference.keys() != other.keys():
        sys.exit(f"{reference_path} and {other_path} hold different triplets "
                 f"({len(reference.keys() ^ other.keys())} ids in one only)")
    ids = sorted(reference)
    gold = [reference[i]["gold"] for i in ids]

    def decided(items: dict) -> list[int]:
        return [NO_LABEL if items[i]["escalated"] else items[i]["label"] for i in ids]

    def final(items: dict) -> list[int]:
        return final_labels(gold, *([items[i][field] for i in ids] for field in ("label", "escalated", "resolved")))

    same = sum((reference[i]["escalated"], reference[i]["label"]) == (other[i]["escalated"], other[i]["label"])
               for i in ids)

    def difference(values: tuple[float | None, float | None, float | None]) -> str:
        value, low, high = values
        if value is None:
            return "-"
        return f"{100 * value:+.1f}" if low is None else f"{100 * value:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"

    escalated = [np.array([items[i]["escalated"] for i in ids], dtype=float) for items in (reference, other)]
    more = escalated[1] - escalated[0]  # per triplet: +1 escalated only by OTHER, -1 only by REFERENCE
    interval = stats.bootstrap((more,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                               rng=np.random.default_rng(0)).confidence_interval if more.any() else (0.0, 0.0)
    return ("| n | same outcome | bAcc difference [95% CI] | resolved bAcc difference [95% CI] "
            "| escalated | escalation difference [95% CI] |\n|---|---|---|---|---|---|\n"
            f"| {len(ids)} | {same} | {difference(bacc_difference_interval(gold, decided(other), decided(reference)))} "
            f"| {difference(bacc_difference_interval(gold, final(other), final(reference)))} "
            f"| {int(escalated[0].sum())} -> {int(escalated[1].sum())} "
            f"| {difference((more.mean(), *interval))} |")


def main() -> None:
    if sys.argv[1:2] == ["--paired"]:
        if len(sys.argv) != 4:
            sys.exit(__doc__)
        print(paired(Path(sys.argv[2]), Path(sys.argv[3])))
        return
    paths = [Path(arg) for arg in sys.argv[1:]]
    if not paths:
        sys.exit(__doc__)
    print(HEADER)
    for path in paths:
        print(row(path))


if __name__ == "__main__":
    main()
