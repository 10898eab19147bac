"""Benchmark the retrieval systems of a profile on a dataset: index build time, queries per
second, peak memory.

    python scripts/bench_retrieval.py --dataset scifact                 # the offline profile
    python scripts/bench_retrieval.py --systems bm25,minilm --lake /tmp/lake

Each system runs in its own process (so its peak memory is its own), twice: the first run
builds what is missing (indexes, embeddings: "build s" is their build time, or "reused" when an
earlier system of the same run built them) and loads the models; the second run is timed for
queries/s. For LLM systems the second run would be answered by the call ledger, so their
queries/s come from the first run (LLM calls included, index builds excluded), on a query
subset (--llm-queries) and a re-rank depth (--llm-rerank-depth) small enough for CPU; the
table says so. The data lake is a fresh temporary folder unless --lake is given (then
indexes already there count as reused).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))


def _load(dataset: str):
    from bridge_assets.ingest.loaders import load_dataset
    from bridge_assets.registry.datasets import get_dataset

    tables = load_dataset(get_dataset(dataset))
    return tables.corpus, tables.queries.sort("query_id")


def bench_one(dataset: str, system: str, llm_queries: int, llm_rerank_depth: int, lake: Path) -> dict:
    """Run in the child process: two runs of `system`, timings and this process's peak RSS."""
    import logging

    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.retrieval.systems import run_retriever

    logging.basicConfig(level=logging.INFO, format="  %(asctime)s %(message)s", stream=sys.stderr)
    registry = load_registry()
    uses_llm = any(registry.system(s).llm for s in [*registry.upstream(system), system])
    corpus, queries = _load(dataset)
    note = ""
    if uses_llm:
        queries = queries.head(llm_queries)
        spec = registry.system(system)
        if spec.kind == "rerank":
            spec = spec.model_copy(update={"parameters": {**spec.parameters, "depth": llm_rerank_depth}})
            registry = registry.model_copy(update={"systems": {**registry.systems, system: spec}})
            note = f"{llm_queries} queries, re-rank depth {llm_rerank_depth}"
        else:
            note = f"{llm_queries} queries"
    started = time.perf_counter()
    first = run_retriever(dataset, system, corpus, queries, registry=registry, lake=lake)
    cold = time.perf_counter() - started
    built = {family: item["build_seconds"] for family, item in first.metadata.get("indexes", {}).items()
             if item["built_now"]}
    if uses_llm:
        search_seconds = cold - sum(built.values())
    else:
        started = time.perf_counter()
        run_retriever(dataset, system, corpus, queries, registry=registry, lake=lake)
        search_seconds = time.perf_counter() - started
    return {
        "system": system, "kind": registry.system(system).kind, "queries": queries.height,
        "documents": corpus.height, "built": built, "cold_seconds": round(cold, 2),
        "queries_per_second": round(queries.height / max(search_seconds, 1e-9), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "note": note, "llm": {k: v for k, v in first.metadata.items()
                              if k in ("pairs", "unscored_pairs", "llm_requests", "queries_not_rewritten")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--profile", default=None, help="default: the registry's active profile")
    parser.add_argument("--systems", default="", help="comma-separated names (default: the profile's)")
    parser.add_argument("--lake", default="", help="data lake to use (default: a fresh temporary one)")
    parser.add_argument("--llm-queries", type=int, default=3)
    parser.add_argument("--llm-rerank-depth", type=int, default=10)
    parser.add_argument("--json", default="", help="also write the results to this file")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # child process mode
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

    if args.one:
        from bridge_assets.lake.location import lake_location

        lake_folder = lake_location().folder  # the child's lake: $BRIDGE_DATA_LAKE, set by the parent
        print(json.dumps(bench_one(args.dataset, args.one, args.llm_queries, args.llm_rerank_depth, lake_folder)))
        return

    from bridge_assets.retrieval.registry import load_registry

    registry = load_registry()
    systems = [s for s in args.systems.split(",") if s] or registry.profile_systems(args.profile)
    lake = Path(args.lake) if args.lake else Path(tempfile.mkdtemp(prefix="bridge_bench_lake_"))
    env = {**os.environ, "BRIDGE_DATA_LAKE": str(lake)}
    print(f"# {args.dataset}, data lake {lake}, {os.cpu_count()} CPUs", flush=True)
    results = []
    for system in systems:
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, __file__, "--one", system, "--dataset", args.dataset,
             "--llm-queries", str(args.llm_queries), "--llm-rerank-depth", str(args.llm_rerank_depth)],
            env=env, stdout=subprocess.PIPE, text=True)
        if child.returncode != 0:
            results.append({"system": system, "error": f"exit {child.returncode} (log above)"})
        else:
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"# {system} done in {time.perf_counter() - started:.0f}s: {results[-1]}", flush=True)
    print(f"\n{'system':<20}{'kind':<8}{'queries':>8}  {'build s':<38}{'queries/s':>10}{'peak MB':>9}  note")
    for r in results:
        if "error" in r:
            print(f"{r['system']:<20}{'':<8}{'':>8}  {'':<38}{'':>10}{'':>9}  FAILED: {r['error']}")
            continue
        build = ", ".join(f"{s:.1f} ({f})" for f, s in r["built"].items()) or "reused"
        print(f"{r['system']:<20}{r['kind']:<8}{r['queries']:>8}  {build:<38}{r['queries_per_second']:>10}"
              f"{r['peak_rss_mb']:>9}  {r['note']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
