"""Ingest assets: `corpus`, `queries` (with answers) and `original_qrels`, per dataset.

One multi-asset loads a dataset once and writes its three tables in a single transaction, so
bad input leaves all three as they were.
"""


import time

import dagster as dg
import polars as pl

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.ingest.registry import get_dataset
from bridge_assets.partitions import dataset_partitions
from bridge_assets.resources import DuckDBStore

INGEST_TABLES = ("corpus", "queries", "original_qrels")


@dg.multi_asset(
    specs=[
        dg.AssetSpec("corpus", description="Documents (chunks) of each dataset: doc_id, title, text."),
        dg.AssetSpec("queries", description="Queries with their gold answers (a list, may be empty)."),
        dg.AssetSpec("original_qrels", description="The benchmark's own judgments: query_id, doc_id, relevance."),
    ],
    partitions_def=dataset_partitions,
    group_name="ingest",
    can_subset=False,
)
def ingest_dataset(context: dg.AssetExecutionContext, store: DuckDBStore):
    dataset = context.partition_key
    spec = get_dataset(dataset)
    started = time.monotonic()
    tables = load_dataset(spec)
    frames = {
        "corpus": tables.corpus, "queries": tables.queries, "original_qrels": tables.qrels,
    }
    store.write_partitions({name: frame.with_columns(pl.lit(dataset).alias("dataset"))
                            for name, frame in frames.items()}, dataset=dataset)
    counts = tables.counts()
    context.log.info(f"{dataset}: {counts} ({time.monotonic() - started:.1f}s)")
    common = {"source": spec.source, "kind": spec.kind}
    yield dg.MaterializeResult(asset_key="corpus", metadata={
        **common, "dagster/row_count": counts["documents"]})
    yield dg.MaterializeResult(asset_key="queries", metadata={
        **common, "dagster/row_count": counts["queries"],
        "queries_with_answers": counts["queries_with_answers"]})
    yield dg.MaterializeResult(asset_key="original_qrels", metadata={
        **common, "dagster/row_count": counts["qrels"]})
