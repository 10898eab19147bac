"""The code location's contents, pinned: every asset key, asset check, job (and the assets it
selects), sensor, schedule and resource. Written against the definitions as they were before
each stage exported its own `defs`; the merged definitions must give exactly the same."""

from __future__ import annotations

import dagster as dg

from bridge_assets.definitions import defs, main_selection
from bridge_assets.pipeline import automation

ASSETS = {
    "bridge_qrels", "candidate_pool", "consensus_stability", "corpus", "debate_labels",
    "debate_turns", "filter_votes", "filtered_pool", "human_labels", "labeler_eval_items",
    "labeler_eval_plot", "labeler_eval_results", "original_qrels", "partial_annotation_study", "pending_impact",
    "pool_coverage", "pool_saturation", "queries", "rag_alignment", "rag_answers", "rag_judgments", "ranking_shift",
    "report", "retrieval_metrics", "retrieval_run", "review_sample", "significance", "student_annotator", "student_rerank_run",
    "student_scores",
}
CHECKS = {
    "bridge_qrels:bridge_qrels_escalations_resolved", "bridge_qrels:bridge_qrels_is_valid",
    "candidate_pool:candidate_pool_is_valid", "corpus:corpus_is_valid",
    "debate_labels:debate_labels_are_valid", "debate_labels:escalated_pairs_have_full_history",
    "original_qrels:original_qrels_are_valid", "queries:queries_are_valid",
    "retrieval_run:retrieval_run_is_valid",
}
GROUPS = {
    "ingest": {"corpus", "queries", "original_qrels"},
    "retrieval": {"retrieval_run"},
    "labeling": {"candidate_pool", "filter_votes", "filtered_pool", "debate_labels", "debate_turns",
                 "review_sample"},
    "human": {"human_labels"},
    "qrels": {"bridge_qrels"},
    "analysis": {"retrieval_metrics", "ranking_shift", "significance", "pool_saturation", "pool_coverage",
                 "partial_annotation_study", "pending_impact", "rag_answers", "rag_judgments", "rag_alignment"},
    "reports": {"report"},
    "student": {"student_annotator", "student_scores", "student_rerank_run"},
    "labeler_eval": {"labeler_eval_items", "labeler_eval_results", "labeler_eval_plot",
                     "consensus_stability"},
}
JOBS = {
    "ingest_job": {"corpus", "original_qrels", "queries"},
    "retrieval_job": {"retrieval_run"},
    "human_labels_job": {"human_labels", "bridge_qrels", "retrieval_metrics", "ranking_shift",
                         "significance", "pool_saturation", "pool_coverage", "partial_annotation_study",
                         "rag_alignment", "pending_impact", "report", "student_annotator", "student_scores",
                         "student_rerank_run"},
    "student_rerank_job": {"student_rerank_run", "retrieval_metrics", "ranking_shift", "significance",
                           "pending_impact", "rag_alignment", "report"},
}
SENSORS = {"retriever_registry_sensor": "retrieval_job", "run_files_sensor": "retrieval_job",
           "human_labels_sensor": "human_labels_job", "evaluation_systems_sensor": "student_rerank_job"}
SCHEDULES = {"retrieval_rebenchmark_schedule": ("retrieval_job", "0 3 * * 0")}


def names(keys) -> set[str]:
    return {key.to_user_string() for key in keys}


def test_the_code_location_holds_the_same_assets_checks_jobs_sensors_and_schedules():
    graph = defs.resolve_asset_graph()
    assert names(graph.get_all_asset_keys()) == ASSETS
    assert {f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys} == CHECKS
    groups: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        groups.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assert groups == GROUPS
    assert {job.name for job in defs.jobs} == set(JOBS)
    for name, selected in JOBS.items():
        assert names(defs.resolve_job_def(name).asset_layer.selected_asset_keys) == selected, name
    job_sensors = [s for s in defs.sensors if s.name != automation.SENSOR_NAME]
    assert {s.name: [t.job_name for t in s.targets] for s in job_sensors} == \
        {name: [job] for name, job in SENSORS.items()}
    # every sensor, the automation sensor too, runs as soon as the daemon does (make ui); the
    # weekly re-benchmark re-runs every system on every dataset, so it waits to be switched on
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in defs.sensors)
    assert {s.name: (s.job_name, s.cron_schedule) for s in defs.schedules} == SCHEDULES
    assert all(s.default_status == dg.DefaultScheduleStatus.STOPPED for s in defs.schedules)
    assert set(defs.resources) == {"store", "llm", "votes"}
    assert names(main_selection.resolve(graph)) == ASSETS - GROUPS["labeler_eval"]


def test_the_votes_store_is_one_resource_on_the_one_store_and_the_vote_readers_take_it():
    """human_labels and the votes sensor read votes through the definitions' `votes` resource
    (built once, nested on the `store` the other resources share), not a VotesStore of their
    own; bridge_qrels reads none (the ids of the counted votes come with human_labels)."""
    from bridge_assets.human.votes_resource import VotesStore

    resources = defs.resources or {}
    votes = resources["votes"]
    assert isinstance(votes, VotesStore) and votes.store is resources["store"] is resources["llm"].store
    graph = defs.resolve_asset_graph()
    assert {"store", "votes"} <= graph.get(dg.AssetKey("human_labels")).assets_def.required_resource_keys
    assert "votes" not in graph.get(dg.AssetKey("bridge_qrels")).assets_def.required_resource_keys
    sensor = defs.resolve_sensor_def("human_labels_sensor")
    assert "votes" in sensor.required_resource_keys


def test_loading_the_code_location_prints_no_warning():
    """Every `bridge run`, `dagster dev` and step process loads it: a warning there (Dagster's
    preview notice for map_resolved_asset_specs) would open every log a user reads. Deprecation
    warnings shown too (Python hides them outside __main__): an API on its way out of Dagster."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "default::DeprecationWarning", "-c",
                           "import bridge_assets.definitions"], capture_output=True, text=True, check=True)
    assert done.stderr == ""
