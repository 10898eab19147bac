"""The UI path: the Dagster webserver on 127.0.0.1 launches a materialization through its
GraphQL API (what the UI's Materialize button sends), and the run succeeds."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from bridge_assets import store
from bridge_assets.webserver import dagster_webserver

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
    with store.connect(data_lake / "bridge.duckdb") as con:
        assert con.execute("select count(*) from queries where dataset = 'demo'").fetchone()[0] == 12
