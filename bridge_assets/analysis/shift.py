"""`ranking_shift`: how the system ranking changes from the original to the refined qrels.

Per measure: each system's score and place before and after (sql/ranking_shift.sql), and the
agreement of the two rankings as Kendall's tau (tau-a: (concordant - discordant) / all pairs)
and tau-b (scipy, which corrects for ties, with its p-value).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl

from bridge_assets.analysis.views import require_rows
from bridge_assets.paths import read_sql

DEFAULT_MEASURES = ("ndcg_cut_10", "success_10", "recall_10", "recip_rank_cut_10", "P_10", "map")


def kendall_tau_a(x: Sequence[float], y: Sequence[float]) -> float:
    """(concordant - discordant) / (n (n - 1) / 2); tied pairs count as neither."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    if n < 2:
        return float("nan")
    upper = np.triu_indices(n, k=1)
    signs = np.sign(xs[:, None] - xs[None, :])[upper] * np.sign(ys[:, None] - ys[None, :])[upper]
    return float(signs.sum() / len(signs))


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """scipy's tau-b and its p-value (NaN when either side is constant or n < 2)."""
    from scipy import stats

    if len(x) < 2:
        return float("nan"), float("nan")
    result = stats.kendalltau(x, y, variant="b")
    return float(result.statistic), float(result.pvalue)


def compute_ranking_shift(con: duckdb.DuckDBPyConnection, dataset: str,
                          measures: Sequence[str] = DEFAULT_MEASURES) -> pl.DataFrame:
    """Rows of the ranking_shift table: one per (measure, system), each carrying its measure's
    Kendall tau, tau-b and tau-b p-value between the original and the refined ranking."""
    require_rows(con, "retrieval_metrics", dataset, "ranking_shift")
    shift = con.execute(read_sql("ranking_shift"), {"dataset": dataset, "measures": list(measures)}).pl()
    taus = []
    for (measure,), group in shift.group_by(["measure"], maintain_order=True):
        before, after = group["value_original"].to_list(), group["value_refined"].to_list()
        tau_b, p_value = kendall_tau_b(before, after)
        taus.append({"measure": measure, "kendall_tau": kendall_tau_a(before, after),
                     "kendall_tau_b": tau_b, "kendall_tau_b_p_value": p_value,
                     "systems": group.height})
    summary = pl.DataFrame(taus, schema={"measure": pl.Utf8, "kendall_tau": pl.Float64,
                                         "kendall_tau_b": pl.Float64,
                                         "kendall_tau_b_p_value": pl.Float64, "systems": pl.Int32})
    return shift.join(summary, on="measure", how="left").with_columns(
        pl.col("kendall_tau", "kendall_tau_b", "kendall_tau_b_p_value").fill_nan(None))
