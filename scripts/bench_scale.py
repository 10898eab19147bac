#!/usr/bin/env python
"""BRIDGE-scale figures for everything that is not the model (issue 15, item 5).

    python scripts/bench_scale.py --fraction F [--storage duckdb|ducklake] [--no-growth]

The paper's shape, synthetic: 3,657 queries x 25 systems x top-100 runs (9.1 M rows at F=1),
150 candidate documents per query whose scores the systems see through their own noise, so
that pooling each system's top-10 gives ~81 candidates a query (~296k in all). Then the real
assets, through Dagster as a run would call them, on the configured store:

    write    the ingest tables and the 25 retrieval_run partitions (store.write_partitions)
    pool     candidate_pool (depth 10)
    filter   filtered_pool: one LLM call per candidate    } against an instant OpenAI-compatible
    debate   debate_labels: 2 agents, up to 2 rounds      } server on 127.0.0.1 (another process)
    human    human_labels (no votes: escalated pairs stay pending)
    qrels    bridge_qrels
    metrics  retrieval_metrics (original, refined, refined_upper)
    shift    ranking_shift
    signif   significance (t-test and randomization test, every system pair)
    saturation, partial (the D-MERIT partial-annotation study), report

The fake server answers every chat completion at once with JSON valid for the request's schema
(yes/no picked by a hash of the request), so the filter and debate stages measure our own
overhead per call: prompt rendering, the HTTP client, parsing, the call ledger, bookkeeping.

Each stage prints its wall time and peak memory (RSS of this process during the stage). Unless
--no-growth, the same runs first at F/10 in another process, and the growth of each stage from
F/10 to F is printed (time ratio / 10: 1.0 is linear). The last line is machine-readable:
`calls_per_s=N total_s=N peak_mb=N` (LLM calls per second over the filter and debate stages,
total wall time of the run at F, peak RSS). Targets (README): >= 500 calls/s, every non-LLM
stage under 60 s at F=1, growth no worse than linear.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

QUERIES = 3657
SYSTEMS = 25
TOP_K = 100
DEPTH = 10
DOCS_PER_QUERY = 150
NOISE = 1.4
DATASET = "bench"
LLM_STAGES = ("filter", "debate")
PROJECT_ROOT = Path(__file__).resolve().parents[1]


# --- the instant OpenAI-compatible server ---------------------------------------------------

def _instance(schema: dict, seed: int):
    """A minimal value valid for `schema` (the JSON schemas our prompts send)."""
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _instance(schema[key][0], seed)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: _instance(sub, seed >> 1) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_instance(schema.get("items", {}), seed) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        text = "The passage states it."
        return text[:schema["maxLength"]] if "maxLength" in schema else text
    if kind == "boolean":
        return seed % 5 < 2  # the filter keeps ~40%, as in the paper (116,622 of 296,053)
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    return None


async def fake_openai(scope, receive, send):
    """A raw ASGI app: POST /v1/chat/completions answered at once."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    seed = zlib.crc32(body)
    request = json.loads(body) if body else {}
    fmt = request.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema")
    content = json.dumps(_instance(schema, seed)) if schema else "yes"
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if request.get("logprobs"):
        token = "yes" if '"yes"' in content else "no"
        choice["logprobs"] = {"content": [{"token": token, "logprob": -0.05, "top_logprobs": [
            {"token": token, "logprob": -0.05}, {"token": "no" if token == "yes" else "yes", "logprob": -3.0}]}]}
    reply = json.dumps({"id": "fake", "object": "chat.completion", "model": request.get("model", "fake"),
                        "choices": [choice],
                        "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": len(content) // 4}}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
    await send({"type": "http.response.body", "body": reply})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(fake_openai, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="on", backlog=2048)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.2)
    server.kill()
    raise RuntimeError("the fake OpenAI server did not start")


# --- one run at one fraction (a process of its own) ------------------------------------------

class PeakRSS:
    """Peak resident memory of this process while a stage runs (sampled every 20 ms)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRSS:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def write_registry(folder: Path, port: int) -> None:
    """datasets.yaml (the bench dataset) and models.yaml (every role on the fake server)."""
    stub = folder / "stub"
    (stub / "qrels").mkdir(parents=True, exist_ok=True)
    (stub / "corpus.jsonl").write_text('{"_id": "d", "text": "stub"}\n')
    (stub / "queries.jsonl").write_text('{"_id": "q", "text": "stub"}\n')
    (stub / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    (folder / "datasets.yaml").write_text(
        f"datasets:\n  {DATASET}:\n    kind: beir\n    path: {stub}\n"
        "    description: synthetic, written by scripts/bench_scale.py\n")
    (folder / "models.yaml").write_text(
        "defaults:\n  filter: [fake]\n  debate: fake\n  adjudicator: fake\n  judge: fake\n  rewrite: fake\n"
        "profiles:\n  fake:\n    backend: openai\n    model: fake\n"
        f"    base_urls: [http://127.0.0.1:{port}/v1]\n    structured_output: json_schema\n"
        "    concurrency: 64\n    timeout_s: 60\n")


def synthetic_tables(fraction: float):
    """corpus, queries, original_qrels and the 25 systems' runs (polars frames)."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(0)
    n_queries = max(2, round(QUERIES * fraction))
    query_ids = [f"q{q:05d}" for q in range(n_queries)]
    words = [f"w{i}" for i in range(2000)]
    base = rng.normal(size=(n_queries, DOCS_PER_QUERY))
    doc_q = np.repeat(np.arange(n_queries), DOCS_PER_QUERY)
    doc_j = np.tile(np.arange(DOCS_PER_QUERY), n_queries)
    doc_ids = pl.Series([f"d{q:05d}_{j:03d}" for q, j in zip(doc_q.tolist(), doc_j.tolist())])
    picks = rng.integers(0, len(words), size=(len(doc_ids), 40))
    texts = [" ".join(words[i] for i in row) for row in picks.tolist()]
    best = base.argmax(axis=1)
    answers = [f"answer{q}" for q in range(n_queries)]
    texts = [f"{answers[q]} is stated here. {t}" if j == best[q] else t
             for q, j, t in zip(doc_q.tolist(), doc_j.tolist(), texts)]
    corpus = pl.DataFrame({"doc_id": doc_ids, "title": [f"Title {d}" for d in doc_ids], "text": texts,
                           "dataset": DATASET})
    queries = pl.DataFrame({"query_id": query_ids,
                            "text": [f"what does topic {q} say about {words[q % len(words)]}?" for q in range(n_queries)],
                            "answers": [[a] for a in answers], "dataset": DATASET},
                           schema_overrides={"answers": pl.List(pl.Utf8)})
    qrels = pl.DataFrame({"query_id": query_ids,
                          "doc_id": [f"d{q:05d}_{j:03d}" for q, j in enumerate(best.tolist())],
                          "relevance": pl.Series([1] * n_queries, dtype=pl.Int32), "dataset": DATASET})
    runs = {}
    for s in range(SYSTEMS):
        scores = base + rng.normal(size=base.shape) * NOISE * (0.5 + rng.random())
        top = np.argsort(-scores, axis=1)[:, :TOP_K]
        q_idx = np.repeat(np.arange(n_queries), TOP_K)
        j_idx = top.reshape(-1)
        runs[f"sys{s:02d}"] = pl.DataFrame({
            "dataset": DATASET, "retriever": f"sys{s:02d}",
            "query_id": pl.Series(query_ids)[q_idx],
            "doc_id": doc_ids[q_idx * DOCS_PER_QUERY + j_idx],
            "rank": pl.Series(np.tile(np.arange(1, TOP_K + 1), n_queries), dtype=pl.Int32),
            "score": np.take_along_axis(scores, top, axis=1).reshape(-1),
            "config_hash": f"synthetic-{s}"})
    return corpus, queries, qrels, runs


def run_child(fraction: float, lake: Path, port: int, out: Path, skip: set[str]) -> None:
    lake.mkdir(parents=True, exist_ok=True)
    registry = lake / "registry"
    registry.mkdir(exist_ok=True)
    write_registry(registry, port)
    os.environ.update(BRIDGE_DATA_LAKE=str(lake), BRIDGE_REGISTRY_DIR=str(registry),
                      GX_ANALYTICS_ENABLED="false", HF_HUB_OFFLINE="1")
    os.environ.pop("BRIDGE_DATASETS", None)
    os.environ.pop("BRIDGE_MODELS", None)

    import dagster as dg

    from bridge_assets.analysis import assets as analysis
    from bridge_assets.human.assets import human_labels
    from bridge_assets.human.votes_resource import VotesStore
    from bridge_assets.labeling import assets as labeling
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.llm.resource import LLMResource
    from bridge_assets.qrels.assets import bridge_qrels
    from bridge_assets.reports.assets import report

    lake_store = DuckDBStore(data_lake=str(lake))
    resources = {"store": lake_store, "llm": LLMResource(data_lake=str(lake)), "votes": VotesStore(store=lake_store)}
    location = resources["store"].lake  # every store call is handed the run's lake
    results: list[dict] = []

    def stage(name: str, fn) -> None:
        if name in skip:
            print(f"  {name:<11}  skipped", flush=True)
            return
        calls_before = ledger_rows()
        with PeakRSS() as rss:
            started = time.perf_counter()
            detail = fn() or {}
            seconds = time.perf_counter() - started
        calls = ledger_rows() - calls_before
        row = {"stage": name, "seconds": round(seconds, 2), "peak_mb": round(rss.peak / 2**20),
               "llm_calls": calls, **detail}
        results.append(row)
        print(f"  {name:<11}{seconds:>9.2f} s {rss.peak / 2**20:>8.0f} MB"
              + (f"  {calls} calls, {calls / seconds:.0f}/s" if calls else "")
              + (f"  {detail}" if detail else ""), flush=True)

    def ledger_rows() -> int:
        if not store.exists(location):
            return 0
        with store.connect(location) as con:
            return con.execute("select count(*) from llm_calls").fetchone()[0] \
                if store.table_exists(con, "llm_calls") else 0

    def materialize(assets, config: dict | None = None) -> dg.ExecuteInProcessResult:
        # Dagster's console logger at WARNING: the stage lines are the benchmark's output
        result = dg.materialize(assets, partition_key=DATASET, resources=resources,
                                run_config={"ops": config or {},
                                            "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
                                raise_on_error=True)
        return result

    tables = {}

    def generate():
        tables["all"] = synthetic_tables(fraction)
        corpus, queries, _, runs = tables["all"]
        return {"queries": queries.height, "documents": corpus.height,
                "run_rows": sum(r.height for r in runs.values())}

    def write():
        corpus, queries, qrels, runs = tables.pop("all")
        store.write_partitions({"corpus": corpus, "queries": queries, "original_qrels": qrels},
                               {"dataset": DATASET}, location)
        for system, run in runs.items():
            store.write_partitions({"retrieval_run": run}, {"dataset": DATASET, "retriever": system}, location)

    def pool():
        materialize([labeling.candidate_pool], {"candidate_pool": {"config": {"depth": DEPTH}}})
        with store.connect(location) as con:
            return {"candidates": con.execute("select count(*) from candidate_pool").fetchone()[0]}

    def filter_():
        materialize([labeling.filter_pool])
        with store.connect(location) as con:
            return {"kept": con.execute("select count(*) from filtered_pool where kept").fetchone()[0]}

    def debate():
        materialize([labeling.debate])
        with store.connect(location) as con:
            return dict(con.execute("select outcome, count(*) from debate_labels group by all").fetchall())

    print(f"fraction {fraction}: {store.describe(location)}", flush=True)
    stage("generate", generate)
    stage("write", write)
    stage("pool", pool)
    stage("filter", filter_)
    stage("debate", debate)
    stage("human", lambda: materialize([human_labels], {"human_labels": {"config": {"allow_partial": True}}}) and None)
    stage("qrels", lambda: materialize([bridge_qrels]) and None)
    stage("metrics", lambda: materialize([analysis.retrieval_metrics]) and None)
    stage("shift", lambda: materialize([analysis.ranking_shift]) and None)
    stage("signif", lambda: materialize([analysis.significance]) and None)
    stage("saturation", lambda: materialize([analysis.pool_saturation]) and None)
    stage("partial", lambda: materialize([analysis.partial_annotation_study]) and None)
    stage("report", lambda: materialize([report]) and None)
    out.write_text(json.dumps({"fraction": fraction, "stages": results}))


# --- the parent: both fractions, the table, the last line ------------------------------------

def child(fraction: float, lake: Path, port: int, storage: str | None, skip: list[str]) -> dict:
    out = lake.with_suffix(".json")
    env = {**os.environ, **({"BRIDGE_STORAGE": storage} if storage else {})}
    subprocess.run([sys.executable, __file__, "--child", str(fraction), "--lake", str(lake),
                    "--port", str(port), "--out", str(out), *(f"--skip={s}" for s in skip)],
                   check=True, env=env, cwd=PROJECT_ROOT)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fraction", type=float, default=0.1, help="Share of the 3,657 queries (1 = the paper).")
    parser.add_argument("--storage", choices=["duckdb", "ducklake"], default=None,
                        help="The store (default: BRIDGE_STORAGE, else ducklake).")
    parser.add_argument("--no-growth", action="store_true", help="Skip the run at fraction/10.")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the lakes in this folder.")
    parser.add_argument("--skip", action="append", default=[], metavar="STAGE",
                        help="Leave a stage out (repeatable), e.g. --skip signif (the report "
                             "then has no significance section).")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--lake", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.child is not None:
        run_child(args.child, args.lake, args.port, args.out, set(args.skip))
        return

    port = free_port()
    server = start_server(port)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        small = None if args.no_growth else child(args.fraction / 10, folder / "small", port, args.storage, args.skip)
        big = child(args.fraction, folder / "big", port, args.storage, args.skip)
    finally:
        server.terminate()
        server.wait(10)
    rows = {r["stage"]: r for r in big["stages"]}
    print()
    print(f"{'stage':<11}{'seconds':>9}{'peak MB':>9}" + ("" if small is None else
          f"{'s @F/10':>9}{'growth':>8}{'MB @F/10':>10}") + "   (growth: time ratio / 10; 1.0 = linear)")
    for name, row in rows.items():
        line = f"{name:<11}{row['seconds']:>9.2f}{row['peak_mb']:>9}"
        if small is not None:
            before = next(r for r in small["stages"] if r["stage"] == name)
            growth = row["seconds"] / max(before["seconds"], 0.01) / 10
            line += f"{before['seconds']:>9.2f}{growth:>8.2f}{before['peak_mb']:>10}"
        print(line)
    llm_seconds = sum(rows[s]["seconds"] for s in LLM_STAGES)
    calls = sum(rows[s]["llm_calls"] for s in LLM_STAGES)
    slow = [n for n, r in rows.items() if n not in LLM_STAGES and n != "generate" and r["seconds"] > 60]
    print(f"LLM calls: {calls} in {llm_seconds:.1f} s; non-LLM stages over 60 s: {', '.join(slow) or 'none'}")
    total = sum(r["seconds"] for r in rows.values())
    peak = max(r["peak_mb"] for r in rows.values())
    print(f"calls_per_s={calls / llm_seconds:.0f} total_s={total:.0f} peak_mb={peak}")


if __name__ == "__main__":
    main()
