"""Dagster wiring of `pending_impact` (bridge_assets.analysis.impact), one partition per
dataset, its deps from assets.READS like every analysis asset (the significance table among
them: the calls each pending pair may flip, read when it holds the headline measure at both
bounds; without it the table says nothing about significance)."""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import dagster as dg
import polars as pl
from pydantic import Field

from bridge_assets.analysis.assets import READS, AnalysisRun, analysis_asset
from bridge_assets.analysis.impact import (
    HEADLINE,
    column_max,
    compute_pending_impact,
    stopping_point,
    stopping_point_with_significance,
)
from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.registry.datasets import GRADES, get_dataset


class PendingImpactConfig(dg.Config):
    measure: str = Field(HEADLINE, description="The headline measure, nDCG@k (ndcg_cut_<k>) of "
                         "retrieval_metrics, whose system order the pending pairs may decide.")


@analysis_asset("pending_impact",
                "Per pending pair: the system pairs whose order on the headline measure "
                "(nDCG@10) differs between the two bounds and whose rankings hold its chunk, "
                "the share of each one's doubt its label moves, the significance calls "
                "(significance table) that differ between the bounds and that it may flip, "
                "the impact (the shares, plus a modest weight per significance flip), its "
                "place in impact order and the reason in words. The annotation queue serves "
                "by it; the stopping points count the pairs up to the last that decides a rank "
                "change (and, with significance, that may flip a call).")
def pending_impact(context: dg.AssetExecutionContext, config: PendingImpactConfig,
                   store: DuckDBStore) -> dg.MaterializeResult:
    run = AnalysisRun.start(context, config)
    top_grade = GRADES[-1] if get_dataset(run.dataset).label_scale == "graded" else 1
    with snapshots.inputs(store, run.dataset, READS["pending_impact"]) as con:
        frame = compute_pending_impact(con, run.dataset, measure=run.config.measure, top_grade=top_grade)
    top = frame.filter(pl.col("impact") > 0).head(5)
    with_significance = stopping_point_with_significance(frame)
    significance = ({} if with_significance is None else {
        "significance_pairs_in_doubt": column_max(frame["significance_in_doubt"]),
        "stopping_point_with_significance": with_significance})
    return run.finish(store, frame, {
        "pending_pairs": frame.height,
        "system_pairs_in_doubt": column_max(frame["pairs_in_doubt"]) if frame.height else 0,
        "stopping_point": stopping_point(frame),
        **significance,
        "first_pairs": dg.MetadataValue.md("\n".join(
            f"{rank}. {q} / {d}: {reason}" for rank, q, d, reason in
            top.select("impact_rank", "query_id", "doc_id", "reason").iter_rows()) or "none")})
