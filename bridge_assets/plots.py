"""The report's figures, drawn with matplotlib (Agg: no display needed) and saved as PNG."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110


@functools.cache
def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display), imported when a figure is
    drawn: importing it costs ~0.7 s, paid otherwise by every process that loads the definitions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    pyplot().close(figure)
    return path


def bars(frame: pl.DataFrame, label: str, columns: dict[str, str], title: str, ylabel: str,
         path: Path) -> Path:
    """Grouped bars: one group per row (named by `label`), one bar per column (name -> legend)."""
    names = frame[label].to_list()
    x = np.arange(len(names))
    width = 0.8 / max(len(columns), 1)
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(max(5.0, 0.9 * len(names) + 2), 3.6))
    for i, (column, legend) in enumerate(columns.items()):
        values = frame[column].fill_null(0.0).to_numpy()
        axis.bar(x + (i - (len(columns) - 1) / 2) * width, values, width, label=legend)
    axis.set_xticks(x, names, rotation=30, ha="right")
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    if len(columns) > 1:
        axis.legend()
    return _save(figure, path)


def before_after(panels: list[tuple[str, pl.DataFrame]], path: Path) -> Path:
    """One panel per measure: each system's score on the original and the refined qrels."""
    plt = pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for axis, (title, frame) in zip(axes[0], panels):
        names = frame["retriever"].to_list()
        x = np.arange(len(names))
        axis.bar(x - 0.2, frame["value_original"].to_numpy(), 0.4, label="original qrels")
        axis.bar(x + 0.2, frame["value_refined"].to_numpy(), 0.4, label="refined qrels")
        axis.set_xticks(x, names, rotation=30, ha="right")
        axis.set_title(title)
    axes[0][0].legend()
    return _save(figure, path)


def saturation(found: pl.DataFrame, growth: pl.DataFrame, path: Path) -> Path:
    """Filled holes found and growth rate GR(m) as systems are added (mean +- std)."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    m, mean, std = (found[c].to_numpy() for c in ("systems_added", "value", "std"))
    left.errorbar(m, mean, yerr=std, marker="o", capsize=3)
    left.set_xlabel("systems added (m)")
    left.set_ylabel("|H(C_m)|: holes found")
    left.set_title("Holes found as systems are added")
    defined = growth.filter(pl.col("value").is_not_null())
    if defined.height:
        right.errorbar(defined["systems_added"].to_numpy(), defined["value"].to_numpy(),
                       yerr=defined["std"].fill_null(0.0).to_numpy(), marker="o", capsize=3, color="C1")
    right.set_xlabel("systems added (m)")
    right.set_ylabel("GR(m)")
    right.set_title("Growth rate of found holes")
    for axis in (left, right):
        axis.xaxis.get_major_locator().set_params(integer=True)
    return _save(figure, path)


def partial_curves(sweep: pl.DataFrame, random_single: pl.DataFrame, path: Path) -> Path:
    """Kendall tau-b against the fraction of known relevant items, one line per measure, with
    random single-relevant annotation (D-MERIT's baseline) as a dashed level of the same colour."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for i, ((measure,), group) in enumerate(sweep.sort("fraction").group_by(["measure"], maintain_order=True)):
        axis.errorbar(group["fraction"].to_numpy(), group["mean"].fill_null(np.nan).to_numpy(),
                      yerr=group["std"].fill_null(0.0).to_numpy(), marker="o", capsize=3,
                      label=f"{measure}: fraction known", color=f"C{i}")
        level = random_single.filter(pl.col("measure") == measure)["mean"]
        if level.len() and level[0] is not None:
            axis.axhline(level[0], linestyle="--", linewidth=0.9, color=f"C{i}", alpha=0.7,
                         label=f"{measure}: one random relevant")
    axis.set_xlabel("fraction of known relevant items")
    axis.set_ylabel("Kendall tau-b vs full qrels")
    axis.set_title("Partial annotation: ranking agreement")
    axis.legend(fontsize=7)
    return _save(figure, path)


def contribution_curve(curve: pl.DataFrame, path: Path) -> Path:
    """Marginal contribution of the m-th system added (mean +- std over orders), one line per
    measure."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    for i, ((measure,), group) in enumerate(curve.sort("systems_added").group_by(["measure"], maintain_order=True)):
        axis.errorbar(group["systems_added"].to_numpy(), group["value"].fill_null(np.nan).to_numpy(),
                      yerr=group["std"].fill_null(0.0).to_numpy(), marker="o", capsize=3, label=measure,
                      color=f"C{i}")
    axis.set_xlabel("systems added (m)")
    axis.set_ylabel("MC of the m-th system")
    axis.set_title("Marginal contribution as the pool grows")
    axis.xaxis.get_major_locator().set_params(integer=True)
    axis.legend(fontsize=8)
    return _save(figure, path)


def coverage(found: pl.DataFrame, fitted: pl.DataFrame | None, total: tuple[float, float, float] | None,
             path: Path) -> Path:
    """Relevant chunks in the pool as systems are added (mean, and the band over orders), with
    the fitted saturation curve extrapolated beyond the systems run and the interval of its
    asymptote (`total`: estimate, low, high) when there is one."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    m = found["systems_added"].to_numpy()
    axis.fill_between(m, found["low"].to_numpy(), found["high"].to_numpy(), alpha=0.25, color="C0",
                      label="band over orders (5-95%)")
    axis.plot(m, found["value"].to_numpy(), marker="o", color="C0", label="relevant chunks found (mean)")
    if fitted is not None and fitted.height:
        axis.plot(fitted["systems_added"].to_numpy(), fitted["value"].to_numpy(), linestyle="--", color="C1",
                  label="fitted saturation curve")
    if total is not None:
        estimate, low, high = total
        axis.axhspan(low, high, color="C1", alpha=0.12, label="total relevant, 95% interval")
        axis.axhline(estimate, color="C1", linewidth=0.8)
    axis.axvline(m.max(), color="grey", linewidth=0.8, linestyle=":")
    axis.set_xlabel("systems added (m)")
    axis.set_ylabel("relevant chunks in the pool")
    axis.set_title("Pool coverage")
    axis.xaxis.get_major_locator().set_params(integer=True)
    # counts from 0: a flat curve (the first system found them all) would otherwise be drawn
    # on a 1e-5 offset axis, its rounding noise looking like growth
    axis.set_ylim(0, max(axis.get_ylim()[1], 1.0) * 1.08)
    axis.ticklabel_format(axis="y", useOffset=False)
    axis.legend(fontsize=7)
    return _save(figure, path)


def reliability(diagrams: dict[str, list[dict]], path: Path, title: str = "Reliability diagram") -> Path:
    """Predicted P(relevant) against the share relevant, per equal-width bin (the bins of ECE,
    evaluation.metrics.reliability_bins), one line per scorer; marker area grows with the
    bin's cases; the diagonal is perfect calibration."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(4.6, 4.2))
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfectly calibrated")
    for name, rows in diagrams.items():
        if not rows:
            continue
        cases = np.array([r["cases"] for r in rows], dtype=float)
        line, = axis.plot([r["predicted"] for r in rows], [r["observed"] for r in rows], marker="", label=name)
        axis.scatter([r["predicted"] for r in rows], [r["observed"] for r in rows],
                     s=20 + 180 * cases / cases.max(), color=line.get_color(), alpha=0.7)
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.set_xlabel("predicted P(relevant) (bin mean)")
    axis.set_ylabel("share relevant")
    axis.set_title(title)
    axis.legend(loc="upper left", fontsize="small")
    return _save(figure, path)
