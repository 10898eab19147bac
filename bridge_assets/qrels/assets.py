"""Dagster wiring of `bridge_qrels` (per dataset) and its asset checks."""

# No `from __future__ import annotations`: Dagster reads the context annotation at import.
import hashlib

import dagster as dg
import great_expectations as gx
import polars as pl

from bridge_assets.partitions import dataset_partitions
from bridge_assets.qrels.exports import write_trec_qrels
from bridge_assets.qrels.merge import SOURCES, BridgeQrels, build_bridge_qrels, open_pairs
from bridge_assets.quality import validate
from bridge_assets.resources import DuckDBStore
from bridge_assets.store import table_exists

OPEN_PAIRS_SHOWN = 20


def qrels_version(qrels: pl.DataFrame) -> str:
    """A data version that changes only when a judgment or its source does."""
    digest = hashlib.sha256()
    for row in qrels.sort("query_id", "doc_id").select("query_id", "doc_id", "relevance", "source").iter_rows():
        digest.update(repr(row).encode())
    return digest.hexdigest()[:16]


def _open_pairs_table(pairs: pl.DataFrame) -> str:
    lines = ["| query_id | doc_id | outcome |", "| --- | --- | --- |"]
    lines += [f"| {q} | {d} | {o} |" for q, d, o in
              pairs.head(OPEN_PAIRS_SHOWN).select("query_id", "doc_id", "outcome").iter_rows()]
    if pairs.height > OPEN_PAIRS_SHOWN:
        lines.append(f"| ... {pairs.height - OPEN_PAIRS_SHOWN} more | | |")
    return "\n".join(lines)


def _metadata(result: BridgeQrels, trec_path) -> dict:
    metadata = {"dagster/row_count": result.qrels.height, **result.counts(),
                "trec_qrels": dg.MetadataValue.path(str(trec_path)),
                "precedence": " > ".join(SOURCES),
                "not_materialized_inputs": ", ".join(result.missing_inputs) or "none"}
    if result.open_pairs.height:
        metadata["open_pairs_sample"] = dg.MetadataValue.md(_open_pairs_table(result.open_pairs))
    return metadata


@dg.asset(
    partitions_def=dataset_partitions,
    deps=["original_qrels", "human_labels", "debate_labels", "debate_turns", "filtered_pool",
          "filter_votes"],
    group_name="qrels",
    code_version="1",
    description="Refined qrels: the original gold plus every pair judged by humans, by DREAM "
                "consensus, by the LLM adjudicator (provisional) or dropped by the filter "
                "(relevance 0). One row per pair with its source (precedence original > human > "
                "debate > adjudicator > filter) and provenance keys. Escalated pairs nobody decided "
                "stay out and are counted as open. Also written as TREC qrels under "
                "<data lake>/exports/<dataset>/.",
)
def bridge_qrels(context: dg.AssetExecutionContext, store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    with store.connect() as con:
        result = build_bridge_qrels(con, dataset)
    store.write_partitions({"bridge_qrels": result.qrels}, dataset=dataset)
    trec_path = write_trec_qrels(result.qrels, store.path.parent / "exports" / dataset /
                                 f"{dataset}.bridge.qrels")
    if result.open_pairs.height:
        context.log.warning(f"{dataset}: {result.open_pairs.height} escalated pair(s) still open "
                            "(no human label, no adjudicator): they stay unjudged")
    return dg.MaterializeResult(metadata=_metadata(result, trec_path),
                                data_version=dg.DataVersion(qrels_version(result.qrels)))


@dg.asset_check(asset=bridge_qrels, additional_deps=["corpus", "queries"],
                description="one row per (query, doc); relevance a non-negative integer; known "
                            "source; only adjudicator labels provisional; every pair points into "
                            "the corpus and the queries.")
def bridge_qrels_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    frame = store.read("""
        select b.dataset, b.query_id, b.doc_id, b.relevance, b.source,
               b.provisional = (b.source = 'adjudicator') as provisional_matches_source,
               c.doc_id is not null as doc_known, q.query_id is not null as query_known
        from bridge_qrels b
        left join corpus c on c.dataset = b.dataset and c.doc_id = b.doc_id
        left join queries q on q.dataset = b.dataset and q.query_id = b.query_id""")
    outcome = validate(frame, [
        gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id", "doc_id"]),
        gx.expectations.ExpectColumnValuesToBeBetween(column="relevance", min_value=0),
        gx.expectations.ExpectColumnValuesToBeInSet(column="source", value_set=list(SOURCES)),
        gx.expectations.ExpectColumnValuesToBeInSet(column="provisional_matches_source", value_set=[True]),
        gx.expectations.ExpectColumnValuesToBeInSet(column="doc_known", value_set=[True]),
        gx.expectations.ExpectColumnValuesToBeInSet(column="query_known", value_set=[True]),
    ], "bridge_qrels")
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": frame.height, **outcome.failures})


@dg.asset_check(asset=bridge_qrels, additional_deps=["debate_labels", "human_labels"],
                description="every escalated pair is decided (by people or the adjudicator) before "
                            "the refined qrels are final; a warning while some are open.")
def bridge_qrels_escalations_resolved(store: DuckDBStore) -> dg.AssetCheckResult:
    open_by_dataset: dict[str, int] = {}
    with store.connect() as con:
        datasets = [r[0] for r in con.execute("select distinct dataset from bridge_qrels order by 1")
                    .fetchall()] if table_exists(con, "bridge_qrels") else []
        for dataset in datasets:
            open_by_dataset[dataset] = open_pairs(con, dataset).height
    total = sum(open_by_dataset.values())
    return dg.AssetCheckResult(passed=total == 0, severity=dg.AssetCheckSeverity.WARN,
                               metadata={"open_pairs": total, **{f"open_pairs_{d}": n
                                                                 for d, n in open_by_dataset.items()}})
