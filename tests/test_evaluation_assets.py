"""The labeler_eval assets over the real LLM clients and call ledger, with no model run: the
ledger is first filled with a scripted oracle's replies under the real clients' cache keys,
so the assets answer every call from it (as a re-materialization does)."""

from __future__ import annotations

import dagster as dg

from bridge_assets.evaluation import assets as eval_assets
from bridge_assets.evaluation.goldsets import load_registry, read_goldset, stratified_head
from bridge_assets.evaluation.runner import run_method
from bridge_assets.lake.resource import DuckDBStore
from bridge_assets.lake.store import read_frame
from bridge_assets.llm import LLMClient, ledger
from bridge_assets.llm.profiles import role_profiles
from bridge_assets.llm.resource import LLMResource
from fixtures.oracle_model import OracleModel
from fixtures.paths import lake_resources, location

GOLDSET = "nq_scifact_mini"
METHODS = ["judge-0.5b", "lara-0.5b-25", "dream-0.5b-r2", "utilrank-0.5b"]
LIMIT = 4


def prefill_ledger(db, methods):
    """Record the oracle's reply to every call the methods make, keyed as the real clients key."""
    registry = load_registry()
    triplets = stratified_head(read_goldset(registry.goldset(GOLDSET).file), LIMIT)
    gold = {t.chunk: t.label for t in triplets}
    clients: dict[str, LLMClient] = {}

    def client(profile):
        return clients.setdefault(profile, LLMClient(profile, lake=db))

    oracle = OracleModel(is_relevant=lambda chunk: gold[chunk] == 1,
                         key=lambda profile, request: client(profile).key(request))

    def record(profile, requests):
        results = oracle(profile, requests)
        ledger.append([ledger.CallRecord(q, r, 1) for q, r in zip(requests, results)],
                      profile=profile, backend=client(profile).profile.backend,
                      model=client(profile).model_id, context="prefill", lake=db)
        return results

    for name in methods:
        run_method(registry.methods[name], triplets, record, profiles_for=role_profiles)
    return len(oracle.calls)


def materialize(lake, methods):
    resources = lake_resources(lake, llm=LLMResource(store=DuckDBStore(data_lake=str(lake))))
    return dg.materialize([eval_assets.labeler_eval, eval_assets.labeler_eval_plot],
                          partition_key=GOLDSET, resources=resources,
                          run_config={"ops": {"labeler_eval": {"config": {"methods": methods, "limit": LIMIT}}}})


def metadata(result, key):
    [event] = [e for e in result.get_asset_materialization_events()
               if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_labeler_eval_tables_and_plot_come_from_the_ledger(data_lake):
    db = location(data_lake)
    made = prefill_ledger(db, METHODS)
    result = materialize(data_lake, METHODS)
    assert result.success
    assert ledger.read_calls(db).height == made  # not one model call
    summary = metadata(result, "labeler_eval_results")
    assert (summary["methods"], summary["triplets"], summary["new_calls"]) == (4, LIMIT, 0)
    assert summary["calls"] > 0 and "judge-0.5b" in summary["table"]

    rows = {r["method"]: r for r in read_frame(
        "select * from labeler_eval_results where goldset = ?", [GOLDSET], db).to_dicts()}
    assert set(rows) == set(METHODS)
    assert rows["judge-0.5b"]["bacc"] == 1.0 and rows["judge-0.5b"]["calls"] == LIMIT
    assert rows["lara-0.5b-25"]["escalated"] == 1 and rows["lara-0.5b-25"]["auroc"] == 1.0
    assert rows["utilrank-0.5b"]["kappa"] == 1.0
    assert rows["dream-0.5b-r2"]["bacc"] == 1.0 and rows["dream-0.5b-r2"]["escalation_ratio"] == 0.0
    items = read_frame("select * from labeler_eval_items where goldset = ?", [GOLDSET], db)
    assert items.height == 4 * LIMIT
    stability = read_frame("select * from consensus_stability where goldset = ? order by round", [GOLDSET], db)
    assert stability["method"].unique().to_list() == ["dream-0.5b-r2"]
    assert stability["agreed"].sum() == LIMIT

    plot = metadata(result, "labeler_eval_plot")
    png = data_lake / "reports" / "labeler_eval" / f"{GOLDSET}.png"
    assert plot["path"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_method_subset_replaces_only_its_own_rows(data_lake):
    db = location(data_lake)
    prefill_ledger(db, METHODS)
    assert materialize(data_lake, METHODS).success
    assert materialize(data_lake, ["judge-0.5b"]).success
    counts = dict(read_frame("select method, count(*) from labeler_eval_items group by method", None, db).rows())
    assert counts == {name: LIMIT for name in METHODS}


def test_the_plot_asks_for_results_first(data_lake):
    result = dg.materialize([eval_assets.labeler_eval_plot], partition_key=GOLDSET, raise_on_error=False,
                            resources=lake_resources(data_lake))
    [failure] = result.get_step_failure_events()
    assert "materialize labeler_eval first" in str(failure.event_specific_data.error.to_string())
