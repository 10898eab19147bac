"""Dagster wiring of the retrieval stage: the `retrieval_run` asset (dataset x retriever), its
job, its asset check, and the re-benchmark schedule. The work itself is
`systems.run_retriever`; the registry sensor lives in sensors.py.

No `from __future__ import annotations` here: Dagster reads the config class from the
asset's real (not stringified) annotations.
"""

import hashlib
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
import polars as pl

from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.llm.resource import LLMResource
from bridge_assets.paths import read_sql
from bridge_assets.pipeline import asset_config
from bridge_assets.pipeline.partitions import dataset_partitions, run_partitions
from bridge_assets.pipeline.staleness import external_input, reuse_when_current
from bridge_assets.quality import expectations, validate
from bridge_assets.retrieval.errors import RetrievalError
from bridge_assets.retrieval.registry import load_registry
from bridge_assets.retrieval.run_files import file_sha256
from bridge_assets.retrieval.runs import rank_problems
from bridge_assets.retrieval.systems import STORED_COLUMNS, run_retriever

RUN_COLUMNS = ["dataset", "retriever", "query_id", "doc_id", "rank", "score", "config_hash", "inputs_hash"]
# What retrieval_run reads, declared once: its deps and its snapshot come from this tuple
# (tests/test_lineage.py checks it reads nothing else). A re-ranker also reads its first
# stage's stored run (stored_run): another partition of its own table, so never a dep.
READS = ("corpus", "queries")


class RetrievalRunConfig(dg.Config):
    k: int = 0  # documents kept per query; 0 = the system's (a run_file's `k`, else `defaults.k`)


def run_version(run: pl.DataFrame) -> str:
    """A data version that changes only when the ranking does (downstream stays fresh otherwise)."""
    digest = hashlib.sha256()
    for row in run.sort(["query_id", "rank"]).select("query_id", "doc_id", "rank", "score").iter_rows():
        digest.update(repr(row).encode())
    return digest.hexdigest()[:16]


@dg.asset(
    partitions_def=run_partitions,
    deps=list(READS),
    group_name="retrieval",
    kinds={"duckdb"},
    description="Top-k documents per query of one retrieval system on one dataset "
                "(systems: resources/retrievers.yaml), with each system's configuration hash.",
)
@reuse_when_current
def retrieval_run(context: dg.AssetExecutionContext, config: RetrievalRunConfig, store: DuckDBStore,
                  llm: LLMResource) -> dg.MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    dataset, retriever = keys["dataset"], keys["retriever"]
    settings = asset_config.for_run(context, config)
    config = settings.config
    registry = load_registry()
    with snapshots.inputs(store, dataset, READS) as con:
        if not all(table_exists(con, table) for table in READS):
            raise RetrievalError(f"{dataset}: no corpus or queries; materialize `ingest_dataset` first")
        corpus = con.execute("select doc_id, title, text from corpus order by doc_id").pl()
        queries = con.execute("select query_id, text from queries order by query_id").pl()
    if queries.is_empty():
        raise RetrievalError(f"{dataset}: no queries; materialize `queries` first")

    def stored_run(system: str) -> pl.DataFrame:
        """The lake's run of `system` on this dataset (none from before runs recorded their inputs)."""
        with store.connect() as con:
            found = one_row(con, "select count(*) from information_schema.columns where "
                                 "table_name = 'retrieval_run' and column_name = 'inputs_hash'")[0]
            if not found:
                return pl.DataFrame(schema=dict.fromkeys(STORED_COLUMNS, pl.String))
            return con.execute(f"select {', '.join(STORED_COLUMNS)} from retrieval_run where dataset = ? "
                               "and retriever = ?", [dataset, system]).pl()

    started = time.monotonic()
    result = run_retriever(dataset, retriever, corpus, queries, k=config.k or None, registry=registry,
                           lake=store.lake.folder, llm_client=llm.client, llm_context=context.run_id,
                           progress=context.log.info, stored_run=stored_run)
    problems = rank_problems(result.run, result.metadata["k"])
    if problems:  # never store a run that breaks the contract downstream relies on
        raise RetrievalError(f"{retriever} on {dataset}: " + "; ".join(problems))
    frame = result.run.with_columns(dataset=pl.lit(dataset), retriever=pl.lit(retriever),
                                    config_hash=pl.lit(result.config_hash),
                                    inputs_hash=pl.lit(result.inputs_hash)).select(RUN_COLUMNS)
    store.write_partitions({"retrieval_run": frame}, dataset=dataset, retriever=retriever)
    llm_stats = {name: stats.as_metadata() for name, stats in llm.stats().items()}
    spec = registry.system(retriever)
    return dg.MaterializeResult(
        metadata={
            **settings.metadata(),
            "dagster/row_count": frame.height, "kind": spec.kind, "config_hash": result.config_hash,
            "paper_name": spec.paper_name or "", "queries": queries.height,
            "queries_without_results": queries.height - result.run["query_id"].n_unique(),
            "seconds": round(time.monotonic() - started, 2), "details": result.metadata,
            **({"llm": llm_stats} if llm_stats else {}),
        },
        data_version=dg.DataVersion(run_version(result.run)),
    )


retrieval_job = dg.define_asset_job(
    "retrieval_job", selection=[retrieval_run],
    description="Run one retrieval system on one dataset (a dataset x retriever partition).")


@dg.asset_check(asset=retrieval_run, additional_deps=list(READS),
                description="Per (dataset, retriever, query): ranks are exactly 1..n, one row per "
                            "document; every document is in the corpus, every query known; scores set.")
def retrieval_run_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read(read_sql("retrieval_run_check"))
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "retriever", "query_id", "rank"]),
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "retriever", "query_id", "doc_id"]),
        expect.ExpectColumnValuesToBeBetween(column="rank", min_value=1),
        expect.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="ranked_in_query", column_B="rank", or_equal=True),
        expect.ExpectColumnValuesToBeInSet(column="doc_known", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="query_known", value_set=[True]),
        expect.ExpectColumnValuesToNotBeNull(column="score"),
    ], "retrieval_run")
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": frame.height, **outcome.failures})


def _rebenchmark_schedule() -> dg.ScheduleDefinition:
    settings = load_registry().rebenchmark

    # Stopped until switched on (Automation page): the registry and run-files sensors already
    # re-run every new or changed system, and automation refreshes what follows; this re-runs
    # every system on every dataset, for systems that change outside the registry (an index, a
    # hosted model behind a stable name).
    @dg.schedule(job=retrieval_job, cron_schedule=settings.cron, execution_timezone=settings.timezone,
                 name="retrieval_rebenchmark_schedule", default_status=dg.DefaultScheduleStatus.STOPPED,
                 description="Re-run every (dataset, retriever) partition; cron and timezone from "
                             "`rebenchmark:` in resources/retrievers.yaml.")
    def retrieval_rebenchmark_schedule(context: dg.ScheduleEvaluationContext
                                       ) -> dg.SkipReason | list[dg.RunRequest]:
        retrievers = context.instance.get_dynamic_partitions("retriever")
        if not retrievers:
            return dg.SkipReason("no retriever partitions yet (the registry sensor adds them)")
        stamp = context.scheduled_execution_time.isoformat()
        return [dg.RunRequest(run_key=f"rebenchmark:{stamp}:{dataset}:{retriever}",
                              partition_key=dg.MultiPartitionKey({"dataset": dataset, "retriever": retriever}))
                for dataset in dataset_partitions.get_partition_keys() for retriever in retrievers]

    return retrieval_rebenchmark_schedule


retrieval_rebenchmark_schedule = _rebenchmark_schedule()


@external_input("retrieval_run")
def _entry_or_run_file_changed(partition_key: dg.MultiPartitionKey, metadata: dict[str, Any],
                               resources: Mapping[str, Any]) -> str | None:
    retriever = partition_key.keys_by_dimension["retriever"]
    k = (metadata.get("details") or {}).get("k")  # a changed k is a settings change
    registry = load_registry()
    if metadata.get("config_hash") != registry.config_hash(retriever, k):
        return f"{retriever}'s registry entry changed"
    if registry.system(retriever).kind == "run_file":  # the file may change under its entry
        path = registry.run_file(retriever, partition_key.keys_by_dimension["dataset"])
        details = metadata.get("details")
        read = ((details.get("run_files") or {}) if isinstance(details, dict) else {}).get(retriever, {})
        if read.get("sha256") != (file_sha256(path) if path.exists() else None):
            return f"{retriever}'s run file changed"
    return None
