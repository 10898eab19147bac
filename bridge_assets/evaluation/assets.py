"""The `labeler_eval` asset group: every configured labeling method on every gold set.

Partitioned by gold set (resources/goldsets.yaml), not by dataset. Thin wiring: read the
gold set, run the methods with the LLM resource's cached clients, write each method's rows
as it finishes (so a long evaluation keeps what it has done), then draw the paper's Figure 2.
"""

# No `from __future__ import annotations`: Dagster resolves dg.Config annotations at runtime.
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import dagster as dg
from pydantic import Field

from bridge_assets.analysis.views import MissingInput
from bridge_assets.evaluation.goldsets import goldset_names, load_registry, read_goldset, stratified_head
from bridge_assets.evaluation.plots import plot_bacc_vs_escalation
from bridge_assets.evaluation.runner import MethodResult, evaluate, format_table, result_frames
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import table_exists
from bridge_assets.llm.resource import LLMResource
from bridge_assets.llm.types import LLMRequest, LLMResult

GROUP = "labeler_eval"
goldset_partitions = dg.StaticPartitionsDefinition(goldset_names())


class LabelerEvalConfig(dg.Config):
    methods: list[str] = Field(default_factory=list, description="Method names of goldsets.yaml "
                               "to run; empty: every method. Rows of other methods are kept.")
    limit: int = Field(0, ge=0, description="> 0: only the first N triplets (classes alternating).")


@dg.multi_asset(
    specs=[
        dg.AssetSpec("labeler_eval_results", description="Per gold set and method: recalls, bAcc "
                     "on decided pairs, escalation ratio, bAcc once escalations are resolved, "
                     "calibration / agreement where the method has them, and cost."),
        dg.AssetSpec("labeler_eval_items", description="Every triplet's label, escalation, "
                     "resolution and score under every method."),
        dg.AssetSpec("consensus_stability", description="DREAM runs: per round, pairs debating, "
                     "agreeing (and how accurately), answer changes and turns against the "
                     "opening stance (the paper's Table 12)."),
    ],
    partitions_def=goldset_partitions, group_name=GROUP, can_subset=False)
def labeler_eval(context: dg.AssetExecutionContext, config: LabelerEvalConfig, store: DuckDBStore,
                 llm: LLMResource) -> Iterator[dg.MaterializeResult]:
    goldset = context.partition_key
    registry = load_registry()
    specs = registry.select_methods(config.methods)
    triplets = stratified_head(read_goldset(registry.goldset(goldset).file), config.limit or None)
    started = time.monotonic()

    def generate(profile: str, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        return llm.client(profile).generate(requests, context=context.run_id)

    def save(result: MethodResult) -> None:
        store.write_partitions(result_frames(result, goldset), goldset=goldset, method=result.spec.name)
        m, cost = result.metrics, result.cost
        context.log.info(f"{goldset} / {result.spec.name}: bAcc {m.bacc}, escalated {m.escalation_ratio:.3f}, "
                         f"resolved bAcc {m.bacc_resolved}, {cost.calls} calls ({cost.new_calls} new)")

    results = evaluate(triplets, specs, generate, profiles_for=llm.profiles_for, on_result=save,
                       model_id=lambda name: llm.client(name).model_id)
    rows = [r.summary() for r in results]
    common = {"goldset": goldset, "triplets": len(triplets), "methods": len(results),
              "calls": sum(r.cost.calls for r in results),
              "new_calls": sum(r.cost.new_calls for r in results),
              "tokens": sum(r.cost.tokens_in + r.cost.tokens_out for r in results),
              "time_s": round(time.monotonic() - started, 2)}
    yield dg.MaterializeResult(asset_key="labeler_eval_results", metadata={
        **common, "dagster/row_count": len(rows), "table": dg.MetadataValue.md(f"```\n{format_table(rows)}\n```")})
    yield dg.MaterializeResult(asset_key="labeler_eval_items", metadata={
        "dagster/row_count": sum(len(r.items) for r in results), "goldset": goldset})
    yield dg.MaterializeResult(asset_key="consensus_stability", metadata={
        "dagster/row_count": sum(len(r.stability) for r in results), "goldset": goldset})


@dg.asset(partitions_def=goldset_partitions, group_name=GROUP, deps=["labeler_eval_results"],
          description="The paper's Figure 2 for the gold set: bAcc once escalations are resolved "
                      "against the escalation ratio, one point per evaluated method (PNG).")
def labeler_eval_plot(context: dg.AssetExecutionContext, store: DuckDBStore) -> dg.MaterializeResult:
    goldset = context.partition_key
    with store.connect() as con:
        if not table_exists(con, "labeler_eval_results"):
            raise MissingInput("labeler_eval_results is empty: materialize labeler_eval first")
        rows = con.execute("select * from labeler_eval_results where goldset = ? order by method",
                           [goldset]).pl().to_dicts()
    if not rows:
        raise MissingInput(f"labeler_eval_results has no row for gold set '{goldset}'")
    path = plot_bacc_vs_escalation(rows, Path(store.path).parent / "reports" / "labeler_eval" / f"{goldset}.png",
                                   f"{goldset}: labeling bAcc vs escalation ratio")
    return dg.MaterializeResult(metadata={"path": dg.MetadataValue.path(str(path)), "methods": len(rows)})
