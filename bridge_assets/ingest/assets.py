"""Ingest assets: `corpus`, `queries` (with answers) and `original_qrels`, per dataset.

One multi-asset loads a dataset once and writes its three tables in a single transaction, so
bad input leaves all three as they were.
"""


import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import polars as pl

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import external_input, reuse_when_current
from bridge_assets.registry.datasets import DatasetSpec, get_dataset

INGEST_TABLES = ("corpus", "queries", "original_qrels")
# What the ingest assets read from the lake, declared once like every stage's (their deps come
# from it; tests/test_lineage.py checks it): nothing, they load the dataset's own files.
READS: tuple[str, ...] = ()
SOURCE_FIELDS = ("path", "corpus", "topics", "qrels", "answers", "queries")


def source_version(spec: DatasetSpec) -> str:
    """Changes when the dataset's entry (what is loaded, not how the pipeline runs) or one of
    its local files (size, modification time) does: `bridge run` ingests again only then."""
    entry = spec.model_dump(exclude={"pipeline", "automation", "description", "known_holes"})
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode())
    for field in SOURCE_FIELDS:
        value = getattr(spec, field)
        if not value or "://" in value:
            continue
        root = spec.resolve(value, field)
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@dg.multi_asset(
    specs=[
        dg.AssetSpec("corpus", deps=READS, description="Documents (chunks) of each dataset: doc_id, title, text."),
        dg.AssetSpec("queries", deps=READS, description="Queries with their gold answers (a list, may be empty)."),
        dg.AssetSpec("original_qrels", deps=READS,
                     description="The benchmark's own judgments: query_id, doc_id, relevance."),
    ],
    partitions_def=dataset_partitions,
    group_name="ingest",
    can_subset=False,
)
@reuse_when_current
def ingest_dataset(context: dg.AssetExecutionContext, store: DuckDBStore) -> Iterator[dg.MaterializeResult]:
    dataset = context.partition_key
    spec = get_dataset(dataset)
    started = time.monotonic()
    tables = load_dataset(spec, store.lake.downloads)
    frames = {
        "corpus": tables.corpus, "queries": tables.queries, "original_qrels": tables.qrels,
    }
    store.write_partitions({name: frame.with_columns(pl.lit(dataset).alias("dataset"))
                            for name, frame in frames.items()}, dataset=dataset)
    counts = tables.counts()
    context.log.info(f"{dataset}: {counts} ({time.monotonic() - started:.1f}s)")
    common = {"source": spec.source, "kind": spec.kind, "source_version": source_version(spec)}
    yield dg.MaterializeResult(asset_key="corpus", metadata={
        **common, "dagster/row_count": counts["documents"]})
    yield dg.MaterializeResult(asset_key="queries", metadata={
        **common, "dagster/row_count": counts["queries"],
        "queries_with_answers": counts["queries_with_answers"]})
    yield dg.MaterializeResult(asset_key="original_qrels", metadata={
        **common, "dagster/row_count": counts["qrels"]})


@external_input("corpus", "queries", "original_qrels")
def _dataset_changed(dataset: str, metadata: dict[str, Any],
                   resources: Mapping[str, Any]) -> str | None:
    if metadata.get("source_version") != source_version(get_dataset(dataset)):
        return "the dataset's entry or files changed"
    return None
