#!/usr/bin/env python
"""Dagster executors on one machine: wall time and memory per process (issue 15, item 4).

    python scripts/bench_executors.py [--executors in_process multiprocess dask] [--dataset demo]
                                      [--through retrieval|labels] [--sample N] [--retrievers A B ..]
                                      [--via api|cli] [--dask-workers N] [--keep DIR]

For each executor, in a fresh temporary data lake (BRIDGE_DATA_LAKE=<tmp>/<executor>, its own
DAGSTER_HOME) and with BRIDGE_EXECUTOR=<executor>, the same runs, one after the other:

    ingest_job          the dataset's partition (corpus, queries, original_qrels and their checks)
    retrieval_job       one run per retriever partition of the active profile
                        ($BRIDGE_RETRIEVER_PROFILE, else resources/retrievers.yaml's `profile:`),
                        or only those of --retrievers
    labels              (--through labels) candidate_pool, filter and debate for the dataset:
                        these call the local LLM (hours on the CPU; --sample N pools only a stable
                        sample of N queries, as `bridge run --sample`)

They run in one driver process (a subprocess of this script) that calls Dagster's
`execute_job` for each partition, as the UI's backfill would launch one run per partition
(--via api, the default), or that starts a real `dagster job execute` / `dagster asset
materialize` per partition (--via cli: one more process and its imports per run). With
in_process every step runs in the driver, so its models pile up there as in `bridge run`; with
multiprocess each step is a process of its own; with dask each run starts a LocalCluster of
--dask-workers worker processes (BRIDGE_DASK_WORKERS).

While the driver runs, its whole process tree is polled every 0.2 s (psutil): each process's
peak RSS, and the sum of the RSS of the processes alive at one poll. Per executor it prints the
wall time, the number of processes seen, the largest single-process peak RSS and the largest
concurrent sum. (RSS counts shared pages in each process, so the sum overstates a little.)

Then it checks that the lakes hold the same tables with the same row counts, and says whether
their contents (a hash per table over every row) are equal too. The last line is
machine-readable: `fastest=<executor> <executor>_s=N ... <executor>_mb=N ... tables_equal=yes|no`
(wall seconds, largest single-process peak RSS in MiB; `tables_equal=n/a` with one executor,
which has no other lake to compare with: it exits 0 when its runs succeeded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXECUTORS = ("in_process", "multiprocess", "dask")
POLL_SECONDS = 0.2
MIB = 1024 * 1024
PROGRESS = "@@bench@@ "  # the driver's progress lines on its stderr
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GX_ANALYTICS_ENABLED": "false",
               "DAGSTER_DISABLE_TELEMETRY": "1"}


# --- the driver: one executor's runs, in a process of its own -------------------------------

def _partition_tags(keys: dict[str, str]) -> dict[str, str]:
    key = "|".join(keys[d] for d in sorted(keys))  # a MultiPartitionKey's string: dimensions by name
    tags = {"dagster/partition": key}
    if len(keys) > 1:
        tags.update({f"dagster/partition/{d}": v for d, v in keys.items()})
    return tags


def _runs(args, instance) -> list[tuple[str, str, dict[str, str], dict]]:
    """(label, job, partition keys, run config) of every run, in order."""
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.retrieval.registry import load_registry
    from bridge_assets.retrieval.sensors import sync_partitions

    sync_partitions(instance, DuckDBStore())  # the retriever partitions of the active profile
    systems = args.retrievers or load_registry().profile_systems()
    runs = [("ingest", "ingest_job", {"dataset": args.dataset}, {})]
    runs += [(f"retrieval {s}", "retrieval_job", {"dataset": args.dataset, "retriever": s}, {})
             for s in systems]
    if args.through == "labels":
        config = {"ops": {"candidate_pool": {"config": {"query_limit": args.sample}}}} if args.sample else {}
        runs.append(("labels", "__ASSET_JOB", {"dataset": args.dataset}, config))
    return runs


def _label_keys():
    import dagster as dg

    from bridge_assets.definitions import defs
    from bridge_assets.labeling.assets import GROUP

    graph = defs.resolve_asset_graph()
    return sorted(dg.AssetSelection.groups(GROUP).resolve(graph), key=lambda k: k.to_user_string())


def _run_api(recon_repo, instance, job: str, keys: dict[str, str], config: dict) -> bool:
    import dagster as dg

    selection = _label_keys() if job == "__ASSET_JOB" else None
    recon = recon_repo.get_reconstructable_job(job)
    with dg.execute_job(recon, instance=instance, run_config=config or None, tags=_partition_tags(keys),
                        asset_selection=selection) as result:
        return result.success


def _run_cli(job: str, keys: dict[str, str], config: dict, log) -> bool:
    base = [sys.executable, "-m", "dagster"]
    if job == "__ASSET_JOB":
        command = [*base, "asset", "materialize", "-m", "bridge_assets.definitions",
                   "--select", "group:labeling", "--partition", keys["dataset"]]
        if config:
            command += ["--config-json", json.dumps(config)]
    else:
        command = [*base, "job", "execute", "-m", "bridge_assets.definitions", "-j", job,
                   "--tags", json.dumps(_partition_tags(keys))]
        if config:
            command += ["--config-json", json.dumps(config)]
    return subprocess.run(command, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT).returncode == 0


def _table_summary(path: Path) -> dict[str, list]:
    """{table: [rows, content hash]} of the lake (the hash: xor of every row's hash)."""
    from bridge_assets.lake.resource import DuckDBStore

    summary = {}
    with DuckDBStore().connect() as con:
        tables = [row[0] for row in con.execute(
            "select table_name from information_schema.tables where table_schema = current_schema() "
            "and table_type = 'BASE TABLE' order by 1").fetchall()]
        for table in tables:
            rows, digest = con.execute(f'select count(*), bit_xor(hash(t)) from "{table}" t').fetchone()
            summary[table] = [rows, str(digest)]
    path.write_text(json.dumps(summary, indent=1))
    return summary


def drive(args) -> int:
    """The runs of one executor (this process is the tree the parent polls)."""
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    timings = []
    with dg.DagsterInstance.get() as instance:
        recon_repo = ReconstructableRepository.for_module("bridge_assets.definitions", "defs",
                                                          working_directory=str(PROJECT_ROOT))
        with open(args.log, "a") as log:
            for label, job, keys, config in _runs(args, instance):
                started = time.monotonic()
                if args.via == "cli":
                    ok = _run_cli(job, keys, config, log)
                else:
                    ok = _run_api(recon_repo, instance, job, keys, config)
                timings.append([label, round(time.monotonic() - started, 2), ok])
                print(f"{PROGRESS}{label:<32} {timings[-1][1]:7.1f} s {'ok' if ok else 'FAILED'}", file=sys.stderr,
                      flush=True)
                if not ok:
                    Path(args.result).write_text(json.dumps({"runs": timings, "ok": False}))
                    return 1
    tables = _table_summary(Path(args.result).with_suffix(".tables.json"))
    Path(args.result).write_text(json.dumps({"runs": timings, "ok": True, "tables": tables}))
    return 0


# --- the parent: start a driver per executor, poll its process tree -------------------------

class TreeMonitor(threading.Thread):
    """Polls a process and its descendants every POLL_SECONDS: peak RSS per process, the peak
    of the sum over the processes alive at one poll."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.peaks: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.finished = 0  # runs the driver has reported done (set by the parent)
        self.run_of: dict[int, int] = {}  # pid -> index of the run in progress when it appeared
        self.peak_sum = 0
        self.peak_sum_count = 0
        self.stopping = threading.Event()

    @staticmethod
    def _label(proc) -> str:
        try:
            cmd = proc.cmdline()
        except Exception:
            return "?"
        text = " ".join(cmd)
        for marker, name in (("--drive", "driver"), ("dagster job execute", "dagster job execute"),
                             ("dagster asset materialize", "dagster asset materialize"),
                             ("multiprocessing.forkserver", "forkserver"),
                             ("multiprocessing.resource_tracker", "resource_tracker"),
                             ("from multiprocessing.spawn", "spawned child"),
                             ("api execute_step", "dagster step")):
            if marker in text:
                return name
        return Path(cmd[0]).name if cmd else "?"

    def poll(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except self.psutil.Error:
            return
        total = alive = 0
        for proc in procs:
            try:
                rss = proc.memory_info().rss
            except self.psutil.Error:
                continue
            alive += 1
            total += rss
            if proc.pid not in self.names:
                self.names[proc.pid] = self._label(proc)
                self.run_of[proc.pid] = self.finished
            self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), rss)
        if total > self.peak_sum:
            self.peak_sum, self.peak_sum_count = total, alive

    def run(self) -> None:
        while not self.stopping.is_set():
            self.poll()
            self.stopping.wait(POLL_SECONDS)

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def bench(executor: str, args, root: Path) -> dict:
    lake = root / executor
    home = lake / "dagster_home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    result, log = root / f"{executor}.json", root / f"{executor}.log"
    env = {**os.environ, **{k: v for k, v in OFFLINE_ENV.items() if k not in os.environ},
           "BRIDGE_EXECUTOR": executor, "BRIDGE_DATA_LAKE": str(lake), "DAGSTER_HOME": str(home),
           "BRIDGE_DASK_WORKERS": str(args.dask_workers)}
    env.pop("BRIDGE_DASK_SCHEDULER", None)  # a LocalCluster, on this machine
    command = [sys.executable, __file__, "--drive", "--result", str(result), "--log", str(log),
               "--dataset", args.dataset, "--through", args.through, "--sample", str(args.sample),
               "--via", args.via]
    if args.retrievers:
        command += ["--retrievers", *args.retrievers]
    print(f"{executor}: lake {lake}, log {log}", file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(log, "w") as log_file:
        driver = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=log_file,
                                  stderr=subprocess.PIPE, text=True)
        monitor = TreeMonitor(driver.pid)
        monitor.start()
        runs: list[str] = []  # the driver's runs, in the order they finished
        for line in driver.stderr:  # the driver's own progress lines; Dagster's log goes to the file
            if line.startswith(PROGRESS):
                print("  " + line[len(PROGRESS):], end="", file=sys.stderr, flush=True)
                runs.append(line[len(PROGRESS):].split("  ")[0].strip())
                monitor.finished = len(runs)
            else:
                log_file.write(line)
        driver.wait()
        monitor.stop()
    wall = time.monotonic() - started
    for pid, index in monitor.run_of.items():  # a step's process, named after its run
        if pid != driver.pid and index < len(runs):
            monitor.names[pid] = f"{monitor.names[pid]} ({runs[index]})"
    top = sorted(monitor.peaks.items(), key=lambda item: -item[1])[:6]
    print("  largest processes (peak RSS): " + ", ".join(
        f"{monitor.names.get(pid, '?')} {rss / MIB:.0f} MiB" for pid, rss in top), file=sys.stderr, flush=True)
    outcome = json.loads(result.read_text()) if result.exists() else {"ok": False, "runs": []}
    biggest = max(monitor.peaks, key=monitor.peaks.get) if monitor.peaks else None
    return {"executor": executor, "ok": driver.returncode == 0 and outcome["ok"], "wall_s": wall,
            "processes": len(monitor.peaks), "max_process_mb": monitor.peaks.get(biggest, 0) / MIB,
            "max_process": monitor.names.get(biggest, "?"), "sum_mb": monitor.peak_sum / MIB,
            "sum_processes": monitor.peak_sum_count, "runs": outcome["runs"],
            "tables": outcome.get("tables", {}), "log": str(log)}


def compare(results: list[dict]) -> tuple[bool | None, list[str]]:
    """Row counts per table equal across the executors' lakes? And notes on contents. None
    when only one executor ran: there is nothing to compare."""
    done = [r for r in results if r["ok"]]
    notes = []
    if len(results) == 1:
        return None, []
    if len(done) < 2:
        return False, ["fewer than two executors finished: nothing to compare"]
    first = done[0]
    equal = True
    for other in done[1:]:
        names = set(first["tables"]) | set(other["tables"])
        for table in sorted(names):
            a, b = first["tables"].get(table), other["tables"].get(table)
            if a is None or b is None or a[0] != b[0]:
                equal = False
                notes.append(f"{table}: {first['executor']} {a and a[0]} rows, {other['executor']} {b and b[0]} rows")
            elif a[1] != b[1]:
                notes.append(f"{table}: same {a[0]} rows, contents differ ({first['executor']} vs {other['executor']})")
    return equal, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executors", nargs="+", choices=EXECUTORS, default=list(EXECUTORS))
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--through", choices=("retrieval", "labels"), default="retrieval",
                        help="retrieval: ingest + the retrieval_run partitions; labels: also "
                             "candidate_pool, filter and debate (the local LLM: slow)")
    parser.add_argument("--sample", type=int, default=0,
                        help="with --through labels: pool only a stable sample of N queries")
    parser.add_argument("--retrievers", nargs="+", help="only these retriever partitions "
                                                        "(default: the active profile's)")
    parser.add_argument("--via", choices=("api", "cli"), default="api",
                        help="api: execute_job per run in one driver; cli: `dagster job execute` per run")
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the lakes and logs in this folder")
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        return drive(args)

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        root_dir, cleanup = Path(tempfile.mkdtemp(prefix="bench_executors_", dir=args.keep)), None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="bench_executors_")
        root_dir = Path(cleanup.name)
    profile = os.environ.get("BRIDGE_RETRIEVER_PROFILE", "(the registry's)")
    print(f"dataset {args.dataset}, through {args.through}, retriever profile {profile}, via {args.via}, "
          f"dask workers {args.dask_workers}", flush=True)
    results = [bench(executor, args, root_dir) for executor in args.executors]

    print()
    print(f"{'executor':<14}{'ok':>4}{'wall s':>9}{'procs':>7}{'max proc MiB':>14}  {'(which)':<22}"
          f"{'sum MiB':>9}{'(procs)':>8}")
    for r in results:
        print(f"{r['executor']:<14}{'yes' if r['ok'] else 'NO':>4}{r['wall_s']:9.1f}{r['processes']:7d}"
              f"{r['max_process_mb']:14.0f}  {r['max_process']:<22}{r['sum_mb']:9.0f}{r['sum_processes']:8d}")
    print()
    labels = [run[0] for run in results[0]["runs"]] if results else []
    if labels:
        print("seconds per run: " + "  ".join(f"{r['executor']}" for r in results))
        for i, label in enumerate(labels):
            cells = [f"{r['runs'][i][1]:.1f}" if i < len(r["runs"]) else "-" for r in results]
            print(f"  {label:<32} " + "  ".join(f"{c:>8}" for c in cells))
        print()
    equal, notes = compare(results)
    tables = results[0]["tables"] if results else {}
    if equal is None:
        print("one executor, no other lake to compare with; its tables (row counts): "
              + ", ".join(f"{t}={v[0]}" for t, v in tables.items()))
    elif equal:
        print("tables equal across executors (row counts): "
              + ", ".join(f"{t}={v[0]}" for t, v in tables.items()))
    else:
        print("tables NOT equal across executors")
    for note in notes:
        print(f"  {note}")
    if not notes and equal:
        print("  contents equal too (a hash over every row of every table)")
    for r in results:
        if not r["ok"]:
            print(f"{r['executor']} FAILED: see {r['log']}" + ("" if args.keep else " (removed: rerun with --keep)"))
    if cleanup:
        cleanup.cleanup()

    finished = [r for r in results if r["ok"]]
    fastest = min(finished, key=lambda r: r["wall_s"])["executor"] if finished else "none"
    print(f"fastest={fastest} " + " ".join(f"{r['executor']}_s={r['wall_s']:.1f}" for r in results) + " "
          + " ".join(f"{r['executor']}_mb={r['max_process_mb']:.0f}" for r in results)
          + f" tables_equal={'n/a' if equal is None else 'yes' if equal else 'no'}")
    return 0 if finished and len(finished) == len(results) and equal is not False else 1


if __name__ == "__main__":
    sys.exit(main())
