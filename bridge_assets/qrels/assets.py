"""Dagster wiring of `bridge_qrels` (per dataset) and its asset checks."""

# No `from __future__ import annotations`: Dagster reads the context annotation at import.
import contextlib
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import polars as pl

from bridge_assets.lake import snapshots
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import one_row, table_exists
from bridge_assets.pipeline.partitions import dataset_partitions
from bridge_assets.pipeline.staleness import external_input, reuse_when_current
from bridge_assets.qrels.merge import BridgeQrels, add_missing_columns, build_bridge_qrels, stand_ins
from bridge_assets.qrels.sources import IMPORT_TABLES, SOURCES, precedence_order
from bridge_assets.qrels.trust import DebateTrust
from bridge_assets.quality import expectations, validate
from bridge_assets.registry.datasets import get_dataset
from bridge_assets.trec_io import write_trec_qrels

PENDING_SHOWN = 20
# The pipeline tables bridge_qrels reads: its deps. It also reads what `bridge qrels import`
# stored (IMPORT_TABLES, not assets); the ids of the votes a human label counted come with
# human_labels (the votes store is copied once per run, by human_labels).
READS = ("original_qrels", "human_labels", "debate_labels", "debate_turns", "filtered_pool", "filter_votes",
         "review_sample")


def qrels_inputs(store: DuckDBStore, dataset: str) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
    """`with qrels_inputs(store, dataset) as con:` an in-memory snapshot of everything
    bridge_qrels reads for `dataset`."""
    return snapshots.inputs(store, dataset, (*READS, *IMPORT_TABLES))


def qrels_version(qrels: pl.DataFrame) -> str:
    """A data version that changes only when a judgment or its source does."""
    digest = hashlib.sha256()
    for row in qrels.sort("query_id", "doc_id").select("query_id", "doc_id", "relevance", "source").iter_rows():
        digest.update(repr(row).encode())
    # the drops the upper bound counts (relevance.drops_in_bounds): only where there are some,
    # so that the versions stored before the column existed stay
    if "estimated_hole" in qrels.columns:
        for row in qrels.filter(pl.col("estimated_hole").fill_null(False)).sort("query_id", "doc_id") \
                .select("query_id", "doc_id").iter_rows():
            digest.update(repr(("estimated_hole", *row)).encode())
    return digest.hexdigest()[:16]


def imports_version(store: DuckDBStore, dataset: str) -> str:
    """A hash of what `bridge qrels import` stored for `dataset` (judgments and sources): the
    input of bridge_qrels that is not an asset."""
    digest = hashlib.sha256()
    with store.connect() as con:
        for table in IMPORT_TABLES:
            if table_exists(con, table):
                digest.update(one_row(
                    con, f"select coalesce(string_agg(cast(t as varchar), chr(10) order by cast(t as varchar)), '') "
                         f"from {table} t where dataset = ?", [dataset])[0].encode())
    return digest.hexdigest()[:16]


def _pending_table(pairs: pl.DataFrame) -> str:
    lines = ["| query_id | doc_id | unverified guess |", "| --- | --- | --- |"]
    lines += [f"| {q} | {d} | {'' if s is None else f'{s}: {label}'} |" for q, d, label, s in
              pairs.head(PENDING_SHOWN).select("query_id", "doc_id", "unverified_label",
                                               "unverified_source").iter_rows()]
    if pairs.height > PENDING_SHOWN:
        lines.append(f"| ... {pairs.height - PENDING_SHOWN} more | | |")
    return "\n".join(lines)


def _corrections_table(corrections: pl.DataFrame) -> str:
    lines = ["| query_id | doc_id | original | corrected | source | file:line |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {q} | {d} | {o} | {r} | {s} | {f}:{n} |" for q, d, o, r, s, f, n in corrections.iter_rows()]
    return "\n".join(lines)


def _sources_table(sources: pl.DataFrame) -> str:
    lines = ["| source | precedence | verified | corrects original | judgments kept / read | file |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {s} | {p:g} | {v} | {c} | {k} / {n} | {f} |" for s, p, v, c, k, n, f in sources.select(
        "source", "precedence", "verified", "corrects_original", "stored", "lines", "file").iter_rows()]
    return "\n".join(lines)


def trust_table(trust: DebateTrust) -> str:
    """The debate's consensus classes on this dataset: measured precision, and whether each
    counts as labels (bridge_assets.qrels.trust)."""
    lines = ["| debate consensus | people agreed (95% CI) | counted as labels | why |", "| --- | --- | --- | --- |"]
    lines += [f"| {'yes' if c.label else 'no'} | {c.precision.describe()} | {c.trusted} | {c.reason} |"
              for c in (trust.yes, trust.no)]
    return "\n".join(lines)


def _metadata(result: BridgeQrels, trec_path: Path) -> dict:
    metadata = {"dagster/row_count": result.qrels.height, **result.counts(),
                "trec_qrels": dg.MetadataValue.path(str(trec_path)),
                "precedence": precedence_order(result.sources),
                "not_materialized_inputs": ", ".join(result.missing_inputs) or "none"}
    if result.pending.height:
        metadata["pending_sample"] = dg.MetadataValue.md(_pending_table(result.pending))
    if result.sources.height:
        metadata["imported_sources"] = dg.MetadataValue.md(_sources_table(result.sources))
    if result.corrections.height:  # never a silent overwrite of the gold
        metadata["corrections_of_original"] = dg.MetadataValue.md(_corrections_table(result.corrections))
    metadata["debate_trust"] = dg.MetadataValue.md(trust_table(result.trust))
    metadata["debate_yes_counted"] = result.trust.yes.trusted
    metadata["debate_no_counted"] = result.trust.no.trusted
    return metadata


@dg.asset(
    partitions_def=dataset_partitions,
    deps=list(READS),
    group_name="qrels",
    code_version="2",
    description="Refined qrels: the original gold plus every pair judged by humans, by DREAM "
                "consensus that passed its checks (where trusted on the dataset: qrels/trust.py), "
                "or dropped by the filter (relevance 0, unverified; where the dataset's "
                "relevance.drops_in_bounds asks, the drops the audit estimates to be holes are "
                "marked estimated_hole, relevant at the metrics' upper bound), and the escalated pairs "
                "awaiting people and the provisional consensus labels as 'pending' (relevance "
                "NULL: not a label; a model's guess on them is kept apart as unverified_label), "
                "and the judgments "
                "imported with `bridge qrels import` (imported_qrels, ranked by qrels_sources; "
                "only a correction source may change an original judgment). One row per pair with "
                "its source (precedence original > human > debate > pending > filter, imported "
                "sources where they were placed), its original relevance and provenance keys. The "
                "labels are also written as TREC qrels under <data lake>/exports/<dataset>/.",
)
@reuse_when_current
def bridge_qrels(context: dg.AssetExecutionContext, store: DuckDBStore) -> dg.MaterializeResult:
    dataset = context.partition_key
    relevance = get_dataset(dataset).relevance
    bar = relevance.min_precision
    with qrels_inputs(store, dataset) as con:
        result = build_bridge_qrels(con, dataset, bar, relevance.drops_in_bounds)
    with store.connect() as con:
        add_missing_columns(con)
    store.write_partitions({"bridge_qrels": result.qrels}, dataset=dataset)
    trec_path = write_trec_qrels(result.qrels.filter(pl.col("source") != "pending"),
                                 store.lake.exports(dataset) / f"{dataset}.bridge.qrels")
    counts = result.counts()
    if counts["awaiting_people"]:
        context.log.warning(f"{dataset}: {counts['awaiting_people']} escalated pair(s) await people "
                            f"(pending, not labels): bridge annotate serve --dataset {dataset}")
    provisional = counts["unverified_provisional_relevant"] + counts["unverified_provisional_irrelevant"]
    if provisional:
        context.log.warning(f"{dataset}: {provisional} debate consensus label(s) are provisional (not "
                            "yet measured right on this dataset: not labels, the metrics bound them); "
                            f"people's votes on its calibration sample decide: bridge annotate serve "
                            f"--dataset {dataset}")
    if result.corrections.height:
        context.log.warning(f"{dataset}: {result.corrections.height} original judgment(s) changed by "
                            f"correction sources: {', '.join(sorted(set(result.corrections['source'])))}")
    return dg.MaterializeResult(metadata={**_metadata(result, trec_path),
                                          "imports_version": imports_version(store, dataset),
                                          "min_precision": bar,
                                          "drops_in_bounds": relevance.drops_in_bounds,
                                          "dropped_holes": result.dropped.describe(relevance.drops_in_bounds)},
                                data_version=dg.DataVersion(qrels_version(result.qrels)))


@dg.asset_check(asset=bridge_qrels, additional_deps=["corpus", "queries", "original_qrels"],
                description="one row per (query, doc); relevance a non-negative integer, NULL "
                            "exactly for pending pairs; a known source (built-in, or imported for "
                            "the dataset); unverified guesses only on pending pairs; the filter's "
                            "drops never verified; an original "
                            "judgment changed only by a correction source; every pair points into "
                            "the corpus and the queries.")
def bridge_qrels_is_valid(store: DuckDBStore) -> dg.AssetCheckResult:
    builtins = ", ".join(f"'{s}'" for s in SOURCES)
    with store.connect() as con, stand_ins(con, IMPORT_TABLES):
        add_missing_columns(con)  # a lake written before the columns existed
        frame = con.execute(f"""
            select b.dataset, b.query_id, b.doc_id, b.relevance, b.source,
                   (b.relevance is null) = (b.source = 'pending') as null_exactly_when_pending,
                   b.unverified_label is null or b.source = 'pending' as guess_only_when_pending,
                   -- a model's "no" is a guess: the filter's drops are never verified
                   b.source <> 'filter' or not coalesce(b.verified, false) as filter_drop_unverified,
                   b.source in ({builtins}) or s.source is not null as source_known,
                   -- (verified is NULL only on rows built before the column existed)
                   b.verified is null or (o.relevance is null or b.relevance = o.relevance
                                          or coalesce(s.corrects_original, false))
                       and b.original_relevance is not distinct from o.relevance
                       as original_changed_only_by_correction,
                   c.doc_id is not null as doc_known, q.query_id is not null as query_known
            from bridge_qrels b
            left join qrels_sources s on s.dataset = b.dataset and s.source = b.source
            left join original_qrels o
                   on o.dataset = b.dataset and o.query_id = b.query_id and o.doc_id = b.doc_id
            left join corpus c on c.dataset = b.dataset and c.doc_id = b.doc_id
            left join queries q on q.dataset = b.dataset and q.query_id = b.query_id""").pl()
    expect = expectations()
    outcome = validate(frame, [
        expect.ExpectCompoundColumnsToBeUnique(column_list=["dataset", "query_id", "doc_id"]),
        expect.ExpectColumnValuesToBeBetween(column="relevance", min_value=0),
        expect.ExpectColumnValuesToBeInSet(column="source_known", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="null_exactly_when_pending", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="guess_only_when_pending", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="filter_drop_unverified", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="original_changed_only_by_correction",
                                           value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="doc_known", value_set=[True]),
        expect.ExpectColumnValuesToBeInSet(column="query_known", value_set=[True]),
    ], "bridge_qrels")
    return dg.AssetCheckResult(passed=outcome.success, metadata={"rows": frame.height, **outcome.failures})


@dg.asset_check(asset=bridge_qrels, additional_deps=["debate_labels", "human_labels"],
                description="every escalated pair is decided by people before the refined qrels "
                            "are final; a warning while some are pending.")
def bridge_qrels_escalations_resolved(store: DuckDBStore) -> dg.AssetCheckResult:
    with store.connect() as con:
        rows = con.execute("select dataset, count(*) filter (where source = 'pending') from bridge_qrels "
                           "group by dataset order by dataset").fetchall() \
            if table_exists(con, "bridge_qrels") else []
    total = sum(n for _, n in rows)
    return dg.AssetCheckResult(passed=total == 0, severity=dg.AssetCheckSeverity.WARN,
                               metadata={"pending": total, **{f"pending_{d}": n for d, n in rows}})


@external_input("bridge_qrels")
def _imports_or_relevance_changed(dataset: str, metadata: dict[str, Any],
                   resources: Mapping[str, Any]) -> str | None:
    if metadata.get("imports_version") != imports_version(resources["store"], dataset):
        return "imported judgments changed (bridge qrels import / remove)"
    relevance = get_dataset(dataset).relevance
    if metadata.get("min_precision") != relevance.min_precision:
        return "the dataset's relevance.min_precision changed"
    # (absent before the setting existed: off, as its default)
    if metadata.get("drops_in_bounds", False) != relevance.drops_in_bounds:
        return "the dataset's relevance.drops_in_bounds changed"
    return None
