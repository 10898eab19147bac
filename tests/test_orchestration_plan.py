"""`orchestration.plan`: what `bridge materialize` runs for the assets asked."""

from __future__ import annotations

import dagster as dg

from bridge_assets.definitions import defs
from bridge_assets.orchestration import runs as orchestration


def test_a_missing_parent_from_a_multi_asset_brings_its_siblings(tmp_path):
    # retrieval_run needs corpus and queries; ingest makes them together with original_qrels
    # and cannot make them apart (this plan used to fail with DagsterInvalidSubsetError)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        steps = orchestration.plan(defs, ["corpus"], "demo", instance)
        assert {k.to_user_string() for k in steps[0].keys} == {"corpus", "queries", "original_qrels"}
        steps = orchestration.plan(defs, ["candidate_pool"], "demo", instance)
    # (no retriever partition exists yet; assets of one partitioning share a run, in order)
    assert [{k.to_user_string() for k in step.keys} for step in steps] == \
        [{"corpus", "queries", "original_qrels", "candidate_pool"}]
    assert steps[0].partition_keys == ["demo"]
