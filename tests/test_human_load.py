"""The annotation app under load (issue 13, item 15): annotators voting at once against a real
uvicorn server on 127.0.0.1 while another process writes pipeline tables to the DuckDB file the
pages read (the votes go to the votes store). No vote is lost, no request fails, and the test
prints the latency it saw."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import duckdb
import httpx
import pytest

from bridge_assets.human.annotators import add_annotator
from bridge_assets.human.app import AppSettings, annotation_app
from bridge_assets.lake import store
from fixtures.escalated_pairs import write_escalated_pairs
from fixtures.human_app import served
from fixtures.paths import PROJECT_ROOT, annotations, location, votes_db

DATASET = "load"
# Another process rewriting one pipeline partition (a 20k-row retrieval run) again and again,
# pausing a little between writes as a pipeline does, until told to stop.
WRITER = """
import sys, time
from pathlib import Path
import polars as pl
from bridge_assets.lake import store
from bridge_assets import settings
from bridge_assets.lake import location
from bridge_assets.lake import store
stop, writes = Path(sys.argv[1]), 0
while not stop.exists():
    frame = pl.DataFrame({"dataset": "other", "retriever": "bm25", "query_id": [f"q{i % 500}" for i in range(20_000)],
                          "doc_id": [f"d{i}" for i in range(20_000)], "rank": list(range(20_000)),
                          "score": [float(writes)] * 20_000})
    store.write_partitions({"retrieval_run": frame}, {"dataset": "other", "retriever": "bm25"},
                           location.lake_location())
    writes += 1
    time.sleep(0.1)
print(writes)
"""


@dataclass
class Annotator:
    name: str
    token: str
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    voted: list[str] = field(default_factory=list)   # assignment ids whose vote was accepted

    def request(self, client: httpx.Client, method: str, url: str, **kwargs) -> httpx.Response:
        started = time.perf_counter()
        response = client.request(method, url, **kwargs)
        self.latencies.append(time.perf_counter() - started)
        self.statuses.append(response.status_code)
        return response

    def work(self, base: str, votes: int) -> None:
        with httpx.Client(base_url=base, timeout=120) as client:
            page = self.request(client, "GET", "/login").text
            self.request(client, "POST", "/login", data={"csrf_token": csrf(page), "token": self.token})
            for n in range(votes):
                page = self.request(client, "GET", "/annotate").text
                assignment = re.search(r'name="assignment_id" value="([0-9a-f]{32})"', page).group(1)
                response = self.request(client, "POST", "/annotate", data={
                    "csrf_token": csrf(page), "assignment_id": assignment, "label": str(n % 2)})
                if response.status_code == 303:
                    self.voted.append(assignment)


def csrf(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


@pytest.mark.parametrize("annotators, votes", [
    (2, 30), pytest.param(3, 200, marks=pytest.mark.slow)])
def test_votes_under_load_with_a_pipeline_writing_the_same_file(data_lake, tmp_path, capsys,
                                                                annotators, votes):
    pairs = write_escalated_pairs(DATASET, votes)
    with annotations() as con:
        people = [Annotator(f"a{i}", add_annotator(con, f"a{i}")) for i in range(annotators)]
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(stop)], cwd=PROJECT_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    app = annotation_app(AppSettings(lake=location(data_lake), secret="load-test-secret-0123",
                                     attention_rate=0.0))
    started = time.perf_counter()
    try:
        with served(app) as base:
            threads = [threading.Thread(target=p.work, args=(base, votes)) for p in people]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(600)
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=120)
    elapsed = time.perf_counter() - started
    assert writer.returncode == 0, err[-3000:]
    writes = int(out)

    statuses = [s for p in people for s in p.statuses]
    latencies = sorted(t for p in people for t in p.latencies)
    assert len(statuses) == annotators * (2 + 2 * votes)      # every thread ran to its end
    assert set(statuses) <= {200, 303}, sorted(set(statuses))  # no 500, no refusal
    with duckdb.connect(str(votes_db(data_lake))) as con:
        stored = con.execute("select annotator_id, query_id, doc_id from human_votes").fetchall()
        voted = con.execute("select a.annotator_id, a.assignment_id from annotation_assignments a "
                            "join human_votes v using (annotator_id, dataset, query_id, doc_id)"
                            ).fetchall()
    with store.connect(location(data_lake)) as con:
        last_write = con.execute("select count(*), min(score), max(score) from retrieval_run").fetchone()
    assert len(stored) == annotators * votes                  # no vote lost, none doubled
    for person in people:
        assert sorted(a for who, a in voted if who == person.name) == sorted(person.voted)
        assert sorted((q, d) for who, q, d in stored if who == person.name) == sorted(pairs)
    assert writes >= 1 and last_write == (20_000, writes - 1, writes - 1)
    p95 = statistics.quantiles(latencies, n=20)[-1]
    with capsys.disabled():
        print(f"\nload: {annotators} annotators x {votes} votes, {len(latencies)} requests in "
              f"{elapsed:.1f} s while a pipeline wrote {writes} partitions; latency p50 "
              f"{statistics.median(latencies) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
              f"max {latencies[-1] * 1000:.0f} ms")
