"""Simulation (issue 26, Targets): how many labels people must give until every rank change is
robust, when the queue serves the pending pairs in impact order, in its former plain order (by
query and chunk), or in random orders.

A dataset's pending pairs are answered by a stand-in for people: the known holes of the
dataset (`--answers holes`: a pair is relevant when its query's holes list it) or its reference
answers (`--answers reference`: relevant when the chunk contains one of the query's answers).
After each label the refined bounds are recomputed (nDCG@10, trec_eval's conventions, checked
against retrieval_metrics at the start); the count stops when the order of every two systems is
the same at both bounds, so every rank change holds whichever way the rest would go. Impact
order is pending_impact's at the start (a static order; with `--dynamic`, recomputed after each
label, as the automated pipeline would).

The pending pairs: the lake's (bridge_qrels with source pending) when it has them, else every
unjudged pair of the candidate pool (as if the debate had settled none). `--build` makes a lake
for the dataset first (ingest, the offline retrievers named, the candidate pool at `--depth`),
in a temporary folder, with no LLM call.

    .venv/bin/python scripts/simulate_annotation_order.py --dataset demo --build
    .venv/bin/python scripts/simulate_annotation_order.py --dataset nq_open_mini --build \
        --answers reference --query-limit 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path

import duckdb

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

DEFAULT_RETRIEVERS = ("bm25", "bm25_rm3", "splade_tiny", "minilm", "e5_small", "minilm_pca")
K = 10
Pair = tuple[str, str]


def build_lake(dataset: str, retrievers: list[str], depth: int, query_limit: int, lake: Path | None = None) -> Path:
    """A lake (a fresh one in a temporary folder, or `lake`, where what is stored is kept: the
    ingest and the retrieval runs it holds are not made again): ingest, the retrieval runs, the
    candidate pool."""
    import dagster as dg

    lake = lake or Path(tempfile.mkdtemp(prefix="bridge-sim-")) / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    os.environ["BRIDGE_DATA_LAKE"] = str(lake)
    from bridge_assets.definitions import defs
    from bridge_assets.ingest import assets as ingest_assets
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.llm.resource import LLMResource
    from bridge_assets.retrieval import assets as retrieval_assets

    where = DuckDBStore(data_lake=str(lake))
    resources = {"store": where, "llm": LLMResource(store=where)}  # no LLM retriever is run
    ingested, stored = False, set()
    if store.exists(where.lake):
        with store.connect(where.lake) as con:
            ingested = store.table_exists(con, "queries") and con.execute(
                "select count(*) > 0 from queries where dataset = ?", [dataset]).fetchone()[0]
            if store.table_exists(con, "retrieval_run"):
                stored = {r[0] for r in con.execute("select distinct retriever from retrieval_run "
                                                    "where dataset = ?", [dataset]).fetchall()}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("retriever", retrievers)
        if not ingested:
            assert dg.materialize([ingest_assets.ingest_dataset], partition_key=dataset, resources=resources,
                                  instance=instance).success
        for retriever in [r for r in retrievers if r not in stored]:
            started = time.monotonic()
            result = dg.materialize([retrieval_assets.retrieval_run], resources=resources, instance=instance,
                                    partition_key=dg.MultiPartitionKey({"dataset": dataset, "retriever": retriever}),
                                    raise_on_error=False)
            print(f"  {retriever}: {'ok' if result.success else 'FAILED (left out)'} "
                  f"({time.monotonic() - started:.0f}s)", file=sys.stderr)
        pool = defs.get_assets_def("candidate_pool")
        assert dg.materialize([pool], partition_key=dataset, resources=resources, instance=instance,
                              run_config={"ops": {pool.op.name: {"config": {"depth": depth,
                                                                            "query_limit": query_limit}}}}).success
    return lake


def snapshot(lake: Path, dataset: str) -> duckdb.DuckDBPyConnection:
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore

    return store.dataset_snapshot(DuckDBStore(data_lake=str(lake)).lake, dataset,
                                  ["retrieval_run", "original_qrels", "queries", "corpus", "candidate_pool",
                                   "bridge_qrels"])


def pending_pairs(con: duckdb.DuckDBPyConnection, dataset: str) -> list[Pair]:
    """The pending pairs, and the labels known besides them as the table sim_known: the lake's
    bridge_qrels when it has pending pairs, else the original qrels and every unjudged pair of
    the pool pending."""
    from bridge_assets.lake.store import table_exists

    if table_exists(con, "bridge_qrels"):
        rows = con.execute("select query_id, doc_id from bridge_qrels where dataset = ? and relevance is null "
                           "order by 1, 2", [dataset]).fetchall()
        if rows:
            con.execute("create or replace table sim_known as select dataset, query_id, doc_id, relevance "
                        "from bridge_qrels where dataset = ? and relevance is not null", [dataset])
            return [tuple(r) for r in rows]
    con.execute("create or replace table sim_known as select dataset, query_id, doc_id, relevance "
                "from original_qrels where dataset = ?", [dataset])
    return [tuple(r) for r in con.execute("""
        select distinct p.query_id, p.doc_id from candidate_pool p
        where p.dataset = $1 and not exists (select 1 from original_qrels o where o.dataset = $1
                                             and o.query_id = p.query_id and o.doc_id = p.doc_id)
        order by 1, 2""", [dataset]).fetchall()]


def stand_in_answers(con, dataset: str, pending: list[Pair], kind: str, holes_file: Path | None) -> dict[Pair, int]:
    if kind == "holes":
        holes = {}
        for line in holes_file.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                holes.update({(record["query_id"], d): 1 for d in record["doc_ids"]})
        return {pair: holes.get(pair, 0) for pair in pending}
    rows = con.execute("""select q.query_id, c.doc_id, q.answers, c.text from queries q join corpus c
                          on c.dataset = q.dataset where q.dataset = ?""", [dataset]).fetchall()
    wanted = set(pending)
    answers = {}
    for query_id, doc_id, golds, text in rows:
        if (query_id, doc_id) in wanted:
            lowered = text.lower()
            answers[(query_id, doc_id)] = int(any(g.strip() and g.strip().lower() in lowered for g in golds or []))
    return answers


def with_pending_tables(con, dataset: str, pending: list[Pair], labels: dict[Pair, int]) -> None:
    """bridge_qrels (original + the pending pairs, labelled ones with their label) and
    retrieval_metrics in `con`, as the pipeline would have them."""
    from bridge_assets.analysis.retrieval import compute_dataset_metrics

    con.execute("create or replace table bridge_qrels as select dataset, query_id, doc_id, relevance::integer "
                "as relevance, 'known' as source from sim_known where dataset = ?", [dataset])
    rows = [(dataset, q, d, labels.get((q, d)), "pending" if (q, d) not in labels else "human") for q, d in pending]
    con.executemany("insert into bridge_qrels values (?, ?, ?, ?, ?)", rows)
    metrics, _ = compute_dataset_metrics(con, dataset, scope="pooled")
    con.register("sim_metrics", metrics)
    con.execute("create or replace table retrieval_metrics as select * from sim_metrics")
    con.unregister("sim_metrics")


def impact_order(con, dataset: str, pending: list[Pair], labels: dict[Pair, int]) -> list[Pair]:
    from bridge_assets.analysis.impact import compute_pending_impact

    with_pending_tables(con, dataset, pending, labels)
    frame = compute_pending_impact(con, dataset)
    return list(zip(frame["query_id"], frame["doc_id"], strict=True))


class Bounds:
    """Each system's mean nDCG@10 with the pending pairs at 0 (lower) and at 1 (upper), updated
    one label at a time (only the labelled pair's query is recomputed)."""

    def __init__(self, con, dataset: str, pending: list[Pair]):
        evaluated = con.execute("""select retriever, query_id from retrieval_metrics where dataset = ?
            and measure = 'ndcg_cut_10' and qrels_version = 'refined' and query_id <> 'all'""", [dataset]).fetchall()
        self.queries_of: dict[str, list[str]] = defaultdict(list)
        for system, query in evaluated:
            self.queries_of[system].append(query)
        self.systems = sorted(self.queries_of)
        ranked = con.execute("""select retriever, query_id, list(doc_id order by score desc, doc_id desc)[:10]
                                from retrieval_run where dataset = ? group by all""", [dataset]).fetchall()
        self.top = {(s, q): docs for s, q, docs in ranked}
        self.known: dict[str, dict[str, int]] = defaultdict(dict)
        for q, d, r in con.execute("select query_id, doc_id, relevance from sim_known where dataset = ?",
                                   [dataset]).fetchall():
            self.known[q][d] = r
        self.pending: dict[str, set[str]] = defaultdict(set)
        for q, d in pending:
            self.pending[q].add(d)
        self.value = {(s, q): self._ndcg(s, q) for s in self.systems for q in self.queries_of[s]}
        self.original = {s: round(v, 12) for s, v in con.execute("""select retriever, value from retrieval_metrics
            where dataset = ? and measure = 'ndcg_cut_10' and query_id = 'all' and qrels_version = 'original'""",
            [dataset]).fetchall()}
        self.check(con, dataset)

    def _ndcg(self, system: str, query: str) -> tuple[float, float]:
        out = []
        for bound in (0, 1):
            gains = {**self.known[query], **{d: bound for d in self.pending[query]}}
            ideal = sorted((g for g in gains.values() if g > 0), reverse=True)[:K]
            idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
            dcg = sum(max(gains.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(self.top.get((system, query), [])))
            out.append(dcg / idcg if idcg > 0 else 0.0)
        return out[0], out[1]

    def label(self, pair: Pair, answer: int) -> None:
        query, doc = pair
        self.pending[query].discard(doc)
        self.known[query][doc] = answer
        for system in self.systems:
            if (system, query) in self.value:
                self.value[system, query] = self._ndcg(system, query)

    def means(self) -> tuple[dict[str, float], dict[str, float]]:
        low, high = {}, {}
        for s in self.systems:
            values = [self.value[s, q] for q in self.queries_of[s]]
            low[s] = round(sum(v[0] for v in values) / len(values), 12)
            high[s] = round(sum(v[1] for v in values) / len(values), 12)
        return low, high

    def robust(self, criterion: str = "sign") -> bool:
        """sign (ranking_shift's): every system's rank change from the original ranking goes the
        same way at both bounds (up, down or none: no system moves at one bound only); order:
        the order of every two systems is the same at both bounds (every rank change exact)."""
        low, high = self.means()
        if criterion == "order":
            return all((low[a] > low[b]) - (low[a] < low[b]) == (high[a] > high[b]) - (high[a] < high[b])
                       for a, b in combinations(self.systems, 2))

        def rank(means: dict[str, float], s: str) -> int:  # competition rank, as ranking_shift.sql
            return 1 + sum(means[o] > means[s] for o in self.systems)

        def sign(x: int) -> int:
            return (x > 0) - (x < 0)
        return all(sign(rank(self.original, s) - rank(low, s)) == sign(rank(self.original, s) - rank(high, s))
                   for s in self.systems)

    def check(self, con, dataset: str) -> None:
        """The means equal retrieval_metrics' (trec_eval conventions) at both bounds."""
        low, high = self.means()
        for system, version, value in con.execute("""select retriever, qrels_version, value from retrieval_metrics
                where dataset = ? and measure = 'ndcg_cut_10' and query_id = 'all'
                  and qrels_version in ('refined', 'refined_upper')""", [dataset]).fetchall():
            mine = low[system] if version == "refined" else high[system]
            assert abs(mine - value) < 1e-9, (system, version, mine, value)


CRITERION = "sign"  # set from --criterion


def labels_needed(con, dataset: str, pending: list[Pair], answers: dict[Pair, int], order: list[Pair]) -> int:
    bounds = Bounds(con, dataset, pending)
    for n, pair in enumerate(order):
        if bounds.robust(CRITERION):
            return n
        bounds.label(pair, answers[pair])
    return len(order)


def dynamic_labels_needed(con, dataset: str, pending: list[Pair], answers: dict[Pair, int]) -> int:
    """Impact order recomputed after every label (the pipeline re-materializing pending_impact)."""
    labels: dict[Pair, int] = {}
    bounds = Bounds(con, dataset, pending)
    while not bounds.robust(CRITERION):
        order = [p for p in impact_order(con, dataset, pending, labels) if p not in labels]
        pair = order[0]
        labels[pair] = answers[pair]
        bounds.label(pair, answers[pair])
    with_pending_tables(con, dataset, pending, {})  # the start again
    return len(labels)


def write_tables(lake: Path, con, dataset: str) -> None:
    """Write the simulated start (bridge_qrels with the pending pairs, retrieval_metrics,
    pending_impact) into the lake, so `bridge annotate plan` and the app can be tried on it."""
    from bridge_assets.analysis.impact import compute_pending_impact
    from bridge_assets.lake import store
    from bridge_assets.lake.resource import DuckDBStore

    tables = {"bridge_qrels": con.execute("select * from bridge_qrels").pl(),
              "retrieval_metrics": con.execute("select * from retrieval_metrics").pl()}
    tables["pending_impact"] = compute_pending_impact(con, dataset)
    store.write_partitions(tables, {"dataset": dataset}, DuckDBStore(data_lake=str(lake)).lake)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--lake", type=Path, help="An existing lake (default: $BRIDGE_DATA_LAKE, or --build); "
                        "with --build, the folder to build in (what it holds is kept).")
    parser.add_argument("--build", action="store_true", help="Build a lake for the dataset first (no LLM).")
    parser.add_argument("--retrievers", nargs="+", default=list(DEFAULT_RETRIEVERS))
    parser.add_argument("--depth", type=int, default=10, help="Candidate pool depth (with --build).")
    parser.add_argument("--query-limit", type=int, default=0, help="Pool queries (with --build; 0: all).")
    parser.add_argument("--answers", choices=("holes", "reference"), default="holes")
    parser.add_argument("--holes", type=Path, help="Known holes file (default: the registry's for the dataset).")
    parser.add_argument("--orders", type=int, default=100, help="Random orders.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dynamic", action="store_true", help="Also impact order recomputed after each label.")
    parser.add_argument("--write", action="store_true", help="Write the start's bridge_qrels, retrieval_metrics "
                        "and pending_impact into the lake (to try `bridge annotate plan` on it).")
    parser.add_argument("--criterion", choices=("sign", "order"), default="sign",
                        help="sign: every rank change goes the same way at both bounds (ranking_shift's "
                             "robust); order: every two systems in the same order at both bounds.")
    args = parser.parse_args(argv)
    global CRITERION
    CRITERION = args.criterion

    lake = build_lake(args.dataset, args.retrievers, args.depth, args.query_limit, args.lake) if args.build else \
        Path(args.lake or os.environ.get("BRIDGE_DATA_LAKE", PROJECT / "data_lake"))
    con = snapshot(lake, args.dataset)
    from bridge_assets.lake.store import table_exists
    if args.write and table_exists(con, "bridge_qrels"):
        parser.error("--write only on a lake without bridge_qrels (--build makes one): it would replace them")
    pending = pending_pairs(con, args.dataset)
    holes = args.holes
    if args.answers == "holes" and holes is None:
        from bridge_assets.registry.datasets import get_dataset
        spec = get_dataset(args.dataset)
        holes = spec.resolve(spec.known_holes, "known_holes")
    answers = stand_in_answers(con, args.dataset, pending, args.answers, holes)
    impact = impact_order(con, args.dataset, pending, {})
    if args.write:
        write_tables(lake, con, args.dataset)
        print(f"wrote bridge_qrels, retrieval_metrics, pending_impact: BRIDGE_DATA_LAKE={lake} "
              f"bridge annotate plan --dataset {args.dataset}", file=sys.stderr)
    plain = sorted(pending)
    rng = random.Random(args.seed)
    randoms = []
    for _ in range(args.orders):
        order = list(pending)
        rng.shuffle(order)
        randoms.append(labels_needed(con, args.dataset, pending, answers, order))
    figures = {"impact order": labels_needed(con, args.dataset, pending, answers, impact),
               "current order (query, chunk)": labels_needed(con, args.dataset, pending, answers, plain)}
    systems = Bounds(con, args.dataset, pending).systems
    print(f"{args.dataset}: {len(pending)} pending pairs ({sum(answers.values())} relevant by the stand-in: "
          f"{args.answers}), {len(systems)} systems ({', '.join(systems)}), nDCG@10")
    print(f"| order | labels until every rank change is robust ({args.criterion}) |")
    print("| --- | --- |")
    for name, value in figures.items():
        print(f"| {name} | {value} |")
    print(f"| random ({args.orders} orders, seed {args.seed}) | mean {statistics.mean(randoms):.1f}, "
          f"range {min(randoms)}-{max(randoms)} |", flush=True)
    if args.dynamic:
        dynamic = dynamic_labels_needed(con, args.dataset, pending, answers)
        print(f"| impact order, recomputed after each label | {dynamic} |")
    mean = statistics.mean(randoms)
    verdict = "met" if figures["impact order"] <= mean / 2 else "NOT met"
    print(f"target (impact order at most half the random mean, {mean / 2:.1f}): {verdict}")


if __name__ == "__main__":
    main()
