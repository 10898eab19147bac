"""Retrievers trained on the labels (issue 25, item 3): the comparison table.

    .venv/bin/python scripts/trained_retriever.py --lake /work/run_demo/data_lake --dataset demo

Rows: the untrained MiniLM, MiniLM fine-tuned with positives from the original qrels (a), from
the refined qrels' verified labels (b) and, with --utility-profile, from UtilSel LLM labels (c)
and the curriculum (c then b). Columns: nDCG@10 and Recall@10 on the held-out queries (K-fold
over queries, seeded: every query scored once by a model that never saw it) against the
original and the refined qrels (pending pairs counted not relevant), mean [95% bootstrap
interval over queries]; then each row minus the untrained one, paired over queries.
The lake is opened read-only; nothing is written to it. See docs/trained-retriever.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the shipped weights only, never a download
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bridge_assets.lake import store  # noqa: E402
from bridge_assets.lake.location import lake_location  # noqa: E402
from bridge_assets.student.retriever import (  # noqa: E402
    Curriculum,
    format_differences,
    format_table,
    run_comparison,
)
from bridge_assets.student.retriever_data import (  # noqa: E402
    TrainSettings,
    load_lake_data,
    pool_pairs,
    sample_queries,
    utility_positives,
)
from bridge_assets.student.retriever_training import base_location  # noqa: E402


def lake_snapshot(con, location) -> int | str:
    """The DuckLake snapshot read ('n/a' on a plain DuckDB file, which keeps no history)."""
    from bridge_assets.lake import ducklake

    return ducklake.current_snapshot(con) if location.ducklake is not None else "n/a"


def utility_labels_for(lake: Path, ledger_lake: Path, dataset: str, query_ids: list[str], profile: str,
                       snapshot: int | None):
    """(c): UtilSel over every query's candidate pool, calls cached in `ledger_lake`'s ledger."""
    from bridge_assets.llm import LLMClient

    if ledger_lake.resolve() == lake.resolve():
        raise SystemExit("--ledger-lake must not be --lake: the lake read stays read-only")
    clients: dict[str, LLMClient] = {}

    def generate(name, requests):
        if name not in clients:
            clients[name] = LLMClient(name, lake=lake_location(ledger_lake))
        return clients[name].generate(requests, context=f"trained-retriever:{dataset}:utilsel")

    try:
        with store.connect_read_only(lake_location(lake), snapshot=snapshot) as con:
            pairs = pool_pairs(con, dataset, query_ids)
        return utility_positives(pairs, generate, profile)
    finally:
        for client in clients.values():
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", required=True, type=Path, help="the data lake folder (opened read-only)")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=TrainSettings.epochs)
    parser.add_argument("--folds", type=int, default=2, help="K-fold over queries (each query tested once)")
    parser.add_argument("--negatives", type=int, default=TrainSettings.negatives_per_query,
                        help="hard negatives per training query, from the stored runs")
    parser.add_argument("--learning-rate", type=float, default=TrainSettings.learning_rate)
    parser.add_argument("--threads", type=int, default=TrainSettings.threads,
                        help="torch threads (1: fastest beside other work on 2 cores, and reproducible)")
    parser.add_argument("--utility-profile", default=None,
                        help="an LLM profile of models.yaml (e.g. qwen-1.5b): adds (c) UtilSel labels and "
                             "the curriculum row (one LLM call per query)")
    parser.add_argument("--ledger-lake", type=Path, default=None,
                        help="with --utility-profile: a lake folder whose LLM ledger caches those calls "
                             "(never --lake, which stays read-only)")
    parser.add_argument("--snapshot", type=int, default=None,
                        help="read the DuckLake as of this snapshot (default: the current one, printed): "
                             "a lake others write to gives the same input again")
    parser.add_argument("--max-queries", type=int, default=None,
                        help="train and score on this many of the dataset's queries, drawn uniformly "
                             "(seeded by --seed); retrieval still searches the whole corpus")
    parser.add_argument("--base-model", default="all-minilm-l6-v2", help="a model of retrievers.yaml `models`")
    args = parser.parse_args()

    train_settings = TrainSettings(epochs=args.epochs, negatives_per_query=args.negatives,
                                   learning_rate=args.learning_rate, seed=args.seed,
                                   threads=args.threads)
    location = lake_location(args.lake)
    with store.connect_read_only(location, snapshot=args.snapshot) as con:
        snapshot = args.snapshot if args.snapshot is not None else lake_snapshot(con, location)
        data = load_lake_data(con, args.dataset)
    print(f"lake {args.lake}, snapshot {snapshot}")
    if args.max_queries is not None:
        total = len(data.queries)
        data = sample_queries(data, args.max_queries, args.seed)
        print(f"--max-queries {args.max_queries}: {len(data.queries)} of {total} queries (seed {args.seed})")
    if isinstance(snapshot, int):
        args.snapshot = snapshot  # every later read (UtilSel's pool, the check) sees the same lake
    pending = len(data.pending)
    refined_relevant = sum(len(v) for v in data.refined_positives.values())
    original_relevant = data.original_qrels.filter(data.original_qrels["relevance"] > 0).height
    print(f"dataset {args.dataset}: {len(data.queries)} queries, {len(data.corpus)} chunks, "
          f"{original_relevant} original relevant pairs, {refined_relevant} verified relevant refined pairs, "
          f"{pending} pending pairs (never a positive; counted not relevant in the refined qrels)")
    print(f"settings: {train_settings}, folds {args.folds}, base {args.base_model}")
    started = time.perf_counter()
    sources: list = ["original", "refined"]
    utility = None
    if args.utility_profile:
        if args.ledger_lake is None:
            raise SystemExit("--utility-profile needs --ledger-lake (a folder for the LLM call cache)")
        labels = utility_labels_for(args.lake, args.ledger_lake, args.dataset, sorted(data.queries),
                                    args.utility_profile, args.snapshot)
        utility = labels.positives
        print(f"(c) UtilSel with {args.utility_profile}: {labels.queries} queries (one call each), "
              f"{labels.candidates} candidate pairs, {sum(len(v) for v in utility.values())} selected useful, "
              f"{len(labels.failed)} replies unusable, {labels.seconds:.0f} s", flush=True)
        sources += ["utility", Curriculum("utility", "refined")]
    results = run_comparison(data, base_location(args.base_model), sources, settings=train_settings,
                             folds=args.folds, utility=utility,
                             progress=lambda text: print("  " + text, flush=True))
    print()
    print(format_table(results, args.seed))
    print()
    print(format_differences(results, args.seed))
    print()
    for result in results[1:]:
        print(f"{result.name}: weights sha256[:12] per fold {', '.join(result.digests)}; {result.seconds:.0f} s")
        if result.note:
            print(f"  note: {result.note.strip()}")
    stored_minilm_check(args.lake, args.snapshot, args.dataset, data, results[0], args.seed)
    print(f"total {time.perf_counter() - started:.0f} s")


def stored_minilm_check(lake: Path, snapshot: int | None, dataset: str, data, untrained, seed: int) -> None:
    """The registry's own untrained MiniLM run (system 'minilm', when stored) on the same
    qrels: the untrained row should come close to it (same weights; exact search here)."""
    from bridge_assets.student.retriever import SystemResult

    with store.connect_read_only(lake_location(lake), snapshot=snapshot) as con:
        run = con.execute("select query_id, doc_id, score from retrieval_run where dataset = ? and "
                          "retriever = 'minilm' and rank <= 10", [dataset]).pl()
    if run.is_empty():
        return
    stored = SystemResult("stored run 'minilm'")
    stored.add(run, data)
    cells = []
    for version in ("original", "refined"):
        ours, theirs = untrained.summary(version, "ndcg_cut_10", seed), stored.summary(version, "ndcg_cut_10", seed)
        cells.append(f"{version} {ours[0]:.3f} here vs {theirs[0]:.3f} stored")
    print("check, untrained MiniLM nDCG@10 against the pipeline's stored 'minilm' run: " + "; ".join(cells))


if __name__ == "__main__":
    main()
