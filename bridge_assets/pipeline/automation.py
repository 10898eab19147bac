"""Declarative automation: the benchmark keeps itself current under the Dagster daemon.

Every asset downstream of `retrieval_run` in the main job (pool, filter, debate, human labels,
qrels, metrics, ranking shift, significance, saturation, the partial-annotation study, the RAG
tables, the report) carries Dagster's `eager` condition: a dataset partition re-materializes
once any of its upstream partitions was updated, after none of them is missing or in
progress. So a new or changed retriever run (the registry and run-files sensors launch those),
new votes (the votes sensor runs `human_labels`) or an imported run file bring that dataset's
tables up to date with no further action, and nothing happens to the other datasets.

`bridge_automation_sensor` evaluates the conditions; it is RUNNING by default, so `make ui`
(which starts the daemon) automates at once; stop it on the Automation page to pause.

LLM spending under automation is capped per run by the dataset's `automation:
{llm_calls_per_run: N}` (default 0): the calls past the cap are not sent, their pairs stay
pending (never labels; the metrics bound them), and the benchmark tables still refresh with the
new system. Calls the ledger already answered are free. Explicit runs (`bridge run`, the UI's
Materialize) are not capped.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg

from bridge_assets.llm import budget as llm_budget
from bridge_assets.llm import coordination
from bridge_assets.pipeline.asset_config import dataset_of
from bridge_assets.settings import env

if TYPE_CHECKING:
    from bridge_assets.paths import LakeLocation

SENSOR_NAME = "bridge_automation_sensor"
# Dagster's own tag on the runs its automation sensors launch.
AUTOMATION_TAG = "dagster/from_automation_condition"

# Dagster's eager condition, except that a retrieval_run partition whose latest run failed (a
# malformed run file) does not hold its dataset back: the pool and all after it go on without
# that system (as `bridge run` does) instead of waiting for it forever. A partition never run
# yet still holds them back, as under plain eager.
_MISSING = dg.AutomationCondition.missing() & ~dg.AutomationCondition.will_be_requested()
_RUNS = dg.AssetSelection.assets("retrieval_run")
CONDITION = dg.AutomationCondition.eager().replace("any_deps_missing", (
    dg.AutomationCondition.any_deps_match(_MISSING).ignore(_RUNS)
    | dg.AutomationCondition.any_deps_match(_MISSING & ~dg.AutomationCondition.execution_failed()).allow(_RUNS)
).with_label("any_deps_missing"))


def automated(selection: dg.AssetSelection) -> dg.AssetSelection:
    """The assets of `selection` that automation keeps current: those after retrieval_run."""
    return selection & dg.AssetSelection.assets("retrieval_run").downstream(include_self=False)


def with_condition(spec: dg.AssetSpec) -> dg.AssetSpec:
    return spec.replace_attributes(automation_condition=CONDITION)


def sensor(selection: dg.AssetSelection) -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        SENSOR_NAME, target=selection, default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=env.sensor_interval(30),
        description="Re-materializes a dataset's pool, labels, qrels, metrics and report when "
                    "anything upstream of them changed (eager automation conditions); LLM "
                    "calls capped per run by the dataset's automation.llm_calls_per_run.")


def is_automation_run(context: dg.AssetExecutionContext) -> bool:
    return context.run.tags.get(AUTOMATION_TAG) == "true"


@contextlib.contextmanager
def llm_cap(context: dg.AssetExecutionContext, lake: LakeLocation) -> Iterator[dict[str, Any]]:
    """Inside an automation run, cap the LLM calls of the block at the dataset's
    `llm_calls_per_run` for the whole run: each chunk's calls are reserved against the run's
    count in the lake's coordination file before they are sent, so parallel step processes
    never pass the cap together. Yields the metadata to report (filled on exit)."""
    metadata: dict[str, Any] = {}
    if not is_automation_run(context):
        yield metadata
        return
    from bridge_assets.registry.datasets import get_dataset

    cap = get_dataset(dataset_of(context.partition_key)).automation.llm_calls_per_run
    shared = coordination.for_store(lake)
    limit = llm_budget.Budget(calls=cap, reserve_calls=functools.partial(shared.reserve_calls, context.run_id, cap))
    with llm_budget.enforce(limit):
        yield metadata
    metadata.update({"automation_llm_calls_per_run": cap,
                     "automation_calls_reserved": shared.calls_reserved(context.run_id),
                     "deferred_calls": limit.deferred_calls})
    if limit.deferred_calls:
        context.log.warning(f"{limit.deferred_calls} LLM call(s) deferred by the automation cap "
                            f"({cap} per run): their pairs stay pending until an explicit run "
                            "(bridge run) or people label them")
