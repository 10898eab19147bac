"""Whether an asset partition is up to date, for every door alike.

`out_of_date` says why a partition must be materialized (missing; Dagster marks it stale: an
upstream data version changed; its settings changed; an input outside the lake changed: the
dataset's files or entry, a retriever's entry or run file, the votes, imported judgments; or
calls the automation cap deferred), or None when it is current. `bridge run` asks it before each
step. Inside a run, `reuse_when_current` asks it again as each asset is about to compute: in the
runs no person forced (automation, sensors, schedules, `bridge run`), an asset whose partition
another run brought up to date meanwhile, or whose inputs came out unchanged, is not computed
again: its latest materialization is reported once more, marked `reused_from_run`. A launch from
the UI or `bridge materialize` computes what it names whatever its state.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
from dagster._core.definitions.decorators.op_decorator import DecoratedOpFunction

from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.pipeline import asset_config

# The tag `bridge run` puts on its runs (it computes only what changed); with Dagster's tags on
# the runs automation, sensors and schedules start, the runs where a current asset is reused.
ONLY_WHAT_CHANGED_TAG = "bridge/only_what_changed"
AUTOMATIC_TAGS = ("dagster/from_automation_condition", "dagster/sensor_name", "dagster/schedule_name")
REUSED_KEY = "reused_from_run"


def latest_metadata(inst: dg.DagsterInstance, key: dg.AssetKey, partition_key: str | None
                     ) -> dict[str, Any] | None:
    """The metadata of the partition's latest materialization; None when it has none."""
    records = inst.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition_key] if partition_key else None),
        limit=1).records
    if not records:
        return None
    materialization = records[0].asset_materialization
    return {name: value.value for name, value in materialization.metadata.items()} if materialization else {}


def config_class_of(assets_def: dg.AssetsDefinition) -> type[dg.Config] | None:
    """The Config class of the op writing `assets_def`; None for an op without config."""
    compute = assets_def.op.compute_fn
    if not isinstance(compute, DecoratedOpFunction) or not compute.has_config_arg():
        return None
    annotation = compute.get_config_arg().annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, dg.Config) else None


def resolved_settings(assets_def: dg.AssetsDefinition, dataset: str,
                      overrides: dict[str, dict[str, Any]] | None) -> asset_config.Resolved | None:
    """The settings the op writing `assets_def` resolves for `dataset` under the explicit
    `overrides` (asset name -> fields); None for an op without config."""
    config_class = config_class_of(assets_def)
    if config_class is None:
        return None
    names = [k.to_user_string() for k in assets_def.keys]
    explicit = {field: value for name in names for field, value in (overrides or {}).get(name, {}).items()}
    return asset_config.resolve(config_class, dataset, names, explicit,
                                reads=asset_config.declared_reads(assets_def))


# What an asset reads from outside the lake's assets (a dataset's files, a retriever's entry or
# run file, the votes...), compared with what its last materialization recorded in its metadata.
# The stage that defines the asset declares the check (`@external_input("human_labels")`): this
# module sits below the stages and names none of them. A check reads the definitions' resources
# ("store": the lake, "votes": the votes store nested on it).
ExternalCheck = Callable[[Any, dict[str, Any], Mapping[str, Any]], "str | None"]
EXTERNAL_CHECKS: dict[str, list[ExternalCheck]] = {}


def external_input(*assets: str) -> Callable[[ExternalCheck], ExternalCheck]:
    """Declare `check(partition_key, metadata, resources) -> reason | None` for `assets`."""

    def declare(check: ExternalCheck) -> ExternalCheck:
        for asset in assets:
            EXTERNAL_CHECKS.setdefault(asset, []).append(check)
        return check

    return declare


# The whole asset graph and the resources, handed over by bridge_assets.definitions (above this
# module): a job's own graph mis-reads its partition-mapped deps' new partitions.
_whole_graph: Callable[[], BaseAssetGraph] | None = None
_resources: Mapping[str, Any] = {}


def use_definitions(graph: Callable[[], BaseAssetGraph], resources: Mapping[str, Any]) -> None:
    global _whole_graph, _resources
    _whole_graph, _resources = graph, resources


def external_change(key: dg.AssetKey, partition_key: Any, metadata: dict[str, Any],
                    store: DuckDBStore | None = None) -> str | None:
    """An input outside the lake's assets that changed since the materialization, or calls an
    automation run deferred (an explicit run makes them). `store`: another lake than the
    definitions' (a test's)."""
    if metadata.get("deferred_calls"):
        return f"{metadata['deferred_calls']} LLM calls were deferred by the automation cap"
    resources = {**_resources, "store": store or _resources.get("store") or DuckDBStore()}
    for check in EXTERNAL_CHECKS.get(key.to_user_string(), []):
        if (reason := check(partition_key, metadata, resources)) is not None:
            return reason
    return None


def out_of_date(graph: BaseAssetGraph, inst: dg.DagsterInstance, key: dg.AssetKey, partition_key: Any,
                overrides: dict[str, dict[str, Any]] | None = None,
                store: DuckDBStore | None = None) -> str | None:
    """Why the asset's partition must be materialized, or None when it is current."""
    # Dagster's own staleness, as the UI shows it (its resolver is not public API)
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._time import get_current_datetime

    metadata = latest_metadata(inst, key, partition_key)
    if metadata is None:
        return "missing"
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(),
                                                           last_event_id=None),
                          instance=inst, asset_graph=graph)
    resolver = CachingStaleStatusResolver(inst, graph, loading_context=view)
    if resolver.get_status(key, partition_key) == StaleStatus.STALE:
        causes = resolver.get_stale_root_causes(key, partition_key)
        return "stale: " + "; ".join(sorted({cause.reason for cause in causes})) if causes else "stale"
    if partition_key is not None:
        expected = resolved_settings(graph.get(key).assets_def, asset_config.dataset_of(partition_key), overrides)
        if expected is not None and metadata.get("settings_hash") != expected.hash:
            return "its settings changed"
    return external_change(key, partition_key, metadata, store or DuckDBStore())


def reuses(tags: Mapping[str, str]) -> bool:
    """Whether a run with `tags` reuses a current asset instead of computing it again."""
    return bool(tags.get(ONLY_WHAT_CHANGED_TAG)) or any(tags.get(tag) for tag in AUTOMATIC_TAGS)


def explicit_config(run_config: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """A run's explicit settings by asset (op) name, as `orchestration.run_config` wrote them."""
    found = {name: op["config"] for name, op in (run_config.get("ops") or {}).items()
             if isinstance(op, dict) and "config" in op}
    return found or None


def _reused(context: dg.AssetExecutionContext) -> list[dg.MaterializeResult] | None:
    """The latest materializations of the op's assets, to report again, when every one of them is
    current for this partition; None when one must be computed."""
    if not reuses(context.run.tags) or not context.has_partition_key:
        return None
    if _whole_graph is None:  # a run tagged to reuse always loads bridge_assets.definitions
        raise RuntimeError("the asset graph was not handed over (staleness.use_definitions)")
    graph = _whole_graph()
    partition_key = context.partition_key
    keys = sorted(context.selected_asset_keys, key=lambda k: k.to_user_string())
    config = explicit_config(context.run.run_config)
    if any(out_of_date(graph, context.instance, key, partition_key, config) for key in keys):
        return None
    results: list[dg.MaterializeResult] = []
    for key in keys:
        record = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition_key]), limit=1).records[0]
        materialization = record.asset_materialization
        metadata = {**materialization.metadata, REUSED_KEY: dg.MetadataValue.text(record.run_id)}
        results.append(dg.MaterializeResult(asset_key=key, metadata=metadata, data_version=dg.DataVersion(
            (materialization.tags or {})["dagster/data_version"])))
        context.log.info(f"{key.to_user_string()} [{partition_key}] is up to date (computed by run "
                         f"{record.run_id[:8]}): not computed again")
    return results


def reuse_when_current(compute: Callable[..., Any]) -> Callable[..., Iterator[dg.MaterializeResult]]:
    """Decorates an asset's compute function (under @dg.asset / @dg.multi_asset): in a run that
    reuses, when each of its assets is current for the partition, report their latest
    materializations again instead of computing (see the module's docstring)."""

    @functools.wraps(compute)
    def compute_unless_current(context: dg.AssetExecutionContext, *args: Any,
                               **kwargs: Any) -> Iterator[dg.MaterializeResult]:
        reused = _reused(context)
        if reused is not None:
            yield from reused
            return
        result = compute(context, *args, **kwargs)
        if inspect.isgenerator(result):
            yield from result
        else:
            yield result

    # a generator now: Dagster must not read the function's return annotation as its output's type
    compute_unless_current.__annotations__ = {name: kind for name, kind in compute.__annotations__.items()
                                              if name != "return"}
    return compute_unless_current
