"""Dagster wiring of the `report` asset: <data lake>/reports/<dataset>/report.html (+ .md, PNGs)."""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import dagster as dg
from pydantic import Field

from bridge_assets.ingest.errors import DatasetError
from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline import asset_config
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import reuse_when_current
from bridge_assets.qrels.known_holes import read_known_holes
from bridge_assets.registry.datasets import DatasetSpec, get_dataset
from bridge_assets.reports.build import REPORT_TABLES, build_report


def dataset_spec(dataset: str) -> DatasetSpec | None:
    """The registry entry of `dataset`, None for a partition the registry no longer lists."""
    try:
        return get_dataset(dataset)
    except DatasetError:
        return None


class ReportConfig(dg.Config):
    k: int = Field(10, ge=1, description="Cutoff of the @k measures shown (as retrieval_metrics).")


# deps and reads: one tuple (REPORT_TABLES)
@dg.asset(partitions_def=dataset_partitions, group_name="reports", deps=list(REPORT_TABLES),
          tags=asset_config.reads_tags(asset_config.KNOWN_HOLES),  # the score against known holes
          description="One HTML page (and its Markdown twin) per dataset with tables and PNG "
                      "figures: labels (found holes, pending pairs, unverified guesses apart, the "
                      "score against known holes), holes per system, metrics before/after as "
                      "bounds over pending pairs with robust rank changes, significance of the "
                      "differences between systems before and after, pool saturation, "
                      "pool coverage, the student annotator (reliability, threshold retrieval), "
                      "partial annotation, RAG alignment. Sections whose tables are not "
                      "materialized say so.")
@reuse_when_current
def report(context: dg.AssetExecutionContext, config: ReportConfig, store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    settings = asset_config.for_run(context, config)
    config = settings.config
    out = store.lake.reports(dataset)
    spec = dataset_spec(dataset)
    key = read_known_holes(spec.resolve(spec.known_holes, "known_holes")) if spec and spec.known_holes else None
    with snapshots.inputs(store, dataset, REPORT_TABLES) as con:
        files = build_report(con, dataset, out, k=config.k, known_holes=key,
                             known_holes_source=spec.known_holes if spec and key else None,
                             relevance=spec.relevance if spec else None)
    missing = sorted({name for section in files.sections for name in section.missing})
    return dg.MaterializeResult(metadata={
        **settings.metadata(), "path": dg.MetadataValue.path(str(files.html)),
        "url": dg.MetadataValue.url(files.html.as_uri()),
        "markdown": dg.MetadataValue.path(str(files.markdown)),
        "figures": len(files.figures),
        "not_materialized": ", ".join(missing) or "none",
        "report": dg.MetadataValue.md(files.markdown.read_text(encoding="utf-8")),
    })
