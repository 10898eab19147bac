"""The UI path: the Dagster webserver on 127.0.0.1 launches a materialization through its
GraphQL API (what the UI's Materialize button sends), and the run succeeds."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from bridge_assets.lake import store
from bridge_assets.orchestration.webserver import dagster_webserver
from fixtures.paths import location

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUN_STATUS = 'query Status($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }'
REPOSITORIES = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"
ASSET_NODES = "{ assetNodes { assetKey { path } groupName } }"


@pytest.fixture
def webserver(tmp_path, data_lake):
    home = tmp_path / "dagster_home"
    home.mkdir()
    # No daemon in this test (its sensors would start every retriever's runs): launch at once
    # instead of queueing for the daemon.
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nrun_coordinator:\n"
        "  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n")
    with dagster_webserver({**os.environ, "DAGSTER_HOME": str(home)}) as url:
        yield url


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    response = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables or {}},
                          timeout=60)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


def test_materialize_button_path_runs_the_ingest_of_a_dataset(webserver, data_lake):
    nodes = graphql(webserver, ASSET_NODES)["assetNodes"]
    groups = {node["groupName"] for node in nodes}
    assert {"ingest", "retrieval", "labeling", "human", "qrels", "analysis", "reports"} <= groups
    repository = graphql(webserver, REPOSITORIES)["repositoriesOrError"]["nodes"][0]
    params = {
        "selector": {"repositoryLocationName": repository["location"]["name"],
                     "repositoryName": repository["name"], "pipelineName": "__ASSET_JOB",
                     "assetSelection": [{"path": ["corpus"]}, {"path": ["queries"]},
                                        {"path": ["original_qrels"]}]},
        "mode": "default",
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "demo"}]},
        "runConfigData": {},
    }
    launched = graphql(webserver, LAUNCH, {"params": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline, status = time.monotonic() + 300, None
    while time.monotonic() < deadline:
        status = graphql(webserver, RUN_STATUS, {"id": run_id})["runOrError"]["status"]
        if status in {"SUCCESS", "FAILURE", "CANCELED"}:
            break
        time.sleep(2)
    assert status == "SUCCESS"
    with store.connect(location(data_lake)) as con:
        assert con.execute("select count(*) from queries where dataset = 'demo'").fetchone()[0] == 12


def wait_for_run(url: str, run_id: str, timeout_s: float = 300) -> str:
    deadline, status = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        status = graphql(url, RUN_STATUS, {"id": run_id})["runOrError"]["status"]
        if status in {"SUCCESS", "FAILURE", "CANCELED"}:
            break
        time.sleep(2)
    return status


@pytest.fixture
def depth_one(tmp_path, data_lake, monkeypatch):
    """A registry folder with dataset `depth_one` (the demo's files) whose `pipeline:` entry
    pools each system's first document, and a retriever profile of BM25 alone; its runs made
    from the command line on a fresh instance."""
    import subprocess
    import sys

    import yaml

    from bridge_assets.paths import PROJECT_ROOT, RESOURCES_DIR

    registry_dir = tmp_path / "registry"
    registry_dir.mkdir()
    (registry_dir / "datasets.yaml").write_text(yaml.safe_dump({"datasets": {"depth_one": {
        "kind": "beir", "path": str(RESOURCES_DIR / "data" / "demo"), "split": "test",
        "pipeline": {"candidate_pool": {"depth": 1}}}}}))
    retrievers = yaml.safe_load((RESOURCES_DIR / "retrievers.yaml").read_text())
    retrievers.update(profile="one", systems={"bm25": {**retrievers["systems"]["bm25"], "profiles": ["one"]}})
    (tmp_path / "retrievers.yaml").write_text(yaml.safe_dump(retrievers))
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nrun_coordinator:\n"
        "  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n")
    for name, value in {"BRIDGE_REGISTRY_DIR": str(registry_dir), "DAGSTER_HOME": str(home),
                        "BRIDGE_RETRIEVERS": str(tmp_path / "retrievers.yaml")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BRIDGE_RETRIEVER_PROFILE", raising=False)
    subprocess.run([sys.executable, "-m", "bridge_assets.cli", "materialize", "--dataset", "depth_one",
                    "retrieval_run"], cwd=PROJECT_ROOT, check=True, capture_output=True)
    return home


def test_materialize_from_the_ui_uses_the_datasets_pipeline_settings(depth_one, data_lake):
    import dagster as dg

    with dagster_webserver() as url:
        repository = graphql(url, REPOSITORIES)["repositoriesOrError"]["nodes"][0]
        params = {
            "selector": {"repositoryLocationName": repository["location"]["name"],
                         "repositoryName": repository["name"], "pipelineName": "__ASSET_JOB",
                         "assetSelection": [{"path": ["candidate_pool"]}]},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "depth_one"}]},
            "runConfigData": {},  # what the Materialize button sends
        }
        launched = graphql(url, LAUNCH, {"params": params})["launchPipelineExecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        assert wait_for_run(url, launched["run"]["runId"]) == "SUCCESS"
    with store.connect(location(data_lake)) as con:
        pool = con.execute("select count(*) from candidate_pool where dataset = 'depth_one'").fetchone()[0]
        first_documents = con.execute("select count(distinct (query_id, doc_id)) from retrieval_run "
                                      "where dataset = 'depth_one' and rank = 1").fetchone()[0]
        top_ten = con.execute("select count(distinct (query_id, doc_id)) from retrieval_run "
                              "where dataset = 'depth_one' and rank <= 10").fetchone()[0]
    assert pool == first_documents == 12 and top_ten > pool  # depth 1, not the default 10
    instance = dg.DagsterInstance.get()
    [record] = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey("candidate_pool"), asset_partitions=["depth_one"]), limit=1).records
    metadata = record.asset_materialization.metadata
    assert metadata["depth"].value == 1
    assert metadata["settings_from_dataset"].value == "depth"
    assert metadata["settings_from_run_config"].value == "none"
    assert "| depth | 1 | dataset |" in metadata["settings"].value
