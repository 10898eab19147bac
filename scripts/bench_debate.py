"""DREAM debate throughput on this machine, on a handful of real pairs of a dataset.

    .venv/bin/python scripts/bench_debate.py --dataset demo --pairs 4 [--profile qwen-0.5b]
        [--rounds 2] [--agents 2] [--reason-words 30] [--order round|pair|both] [--json]

Pairs: for the first queries with judgments, the judged (gold) passage and the unjudged
passage sharing the most words with the query (a hard negative), alternately. Every call goes
through LLMClient with a fresh, temporary ledger, so nothing is answered from the cache.
Prints pairs per minute, tokens per second, the prompt tokens the model computed and reused
(the ledger's measurement) and the share of wall time spent outside the model (prompt
rendering, parsing, the ledger, the debate's own bookkeeping). `--order both` runs the debate
round by round, then pair by pair (run_debate's `pair_major`, what an in-process model gets),
one after the other in this process, each on its own fresh ledger, and says whether every
turn's reply is the same in both.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time

from bridge_assets.ingest.loaders import DatasetTables, load_dataset
from bridge_assets.labeling.calls import MeteredGenerate
from bridge_assets.labeling.debate import run_debate
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.labeling.pairs import Pair, chunk_text
from bridge_assets.lake import location, store
from bridge_assets.llm import LLMClient, role_profiles
from bridge_assets.registry.datasets import get_dataset

WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return {w.lower() for w in WORD.findall(text) if len(w) > 2}


def judgments(tables: DatasetTables) -> dict[str, set[str]]:
    judged: dict[str, set[str]] = {}
    for row in tables.qrels.iter_rows(named=True):
        judged.setdefault(row["query_id"], set()).add(row["doc_id"])
    return judged


def bench_pairs(tables: DatasetTables, count: int) -> list[Pair]:
    docs = {row["doc_id"]: row for row in tables.corpus.iter_rows(named=True)}
    judged = judgments(tables)
    pairs: list[Pair] = []
    for query in tables.queries.sort("query_id").iter_rows(named=True):
        gold = sorted(judged.get(query["query_id"], ()))
        if not gold:
            continue
        query_words = words(query["text"])
        negative = max((d for d in docs if d not in judged[query["query_id"]]),
                       key=lambda d: (len(query_words & words(docs[d]["text"])), d))
        for doc_id in (gold[0], negative):
            doc = docs[doc_id]
            pairs.append(Pair(query["query_id"], doc_id, query["text"], tuple(query["answers"]),
                              chunk_text(doc["title"], doc["text"])))
        if len(pairs) >= count:
            break
    return pairs[:count]


def debate_once(profile: str, pairs: list[Pair], args: argparse.Namespace, pair_major: bool) -> dict:
    """One debate of `pairs` on a fresh temporary ledger: its figures, and its turns' replies."""
    with tempfile.TemporaryDirectory() as folder:
        ledger_lake = location.lake_location(folder)  # a scratch lake: its ledger only
        client = LLMClient(profile, lake=ledger_lake)
        client.backend  # noqa: B018 - load the model before the clock starts
        generate = MeteredGenerate(lambda _, requests: client.generate(requests, context="bench"))
        started = time.perf_counter()
        outcome = run_debate(pairs, debate_agents([profile], args.agents), generate,
                             rounds=args.rounds, reason_words=args.reason_words, pair_major=pair_major)
        wall = time.perf_counter() - started
        client.close()
        with store.connect_read_only(ledger_lake) as con:
            computed, reused, decoded = con.execute(
                "select sum(prompt_tokens_computed), sum(prompt_tokens_reused), sum(decode_tokens) "
                "from llm_calls").fetchone()
    stats = client.stats
    return {"order": "pair" if pair_major else "round", "calls": stats.calls, "call_failures": stats.failures,
            "tokens_in": stats.tokens_in, "prompt_tokens_computed": computed, "prompt_tokens_reused": reused,
            "decode_tokens": decoded, "tokens_out": stats.tokens_out,
            "wall_s": round(wall, 2), "model_s": round(stats.model_seconds, 2),
            "pairs_per_min": round(len(pairs) / wall * 60, 2),
            "generated_tokens_per_s": round(stats.tokens_out / stats.model_seconds, 2) if stats.model_seconds else 0.0,
            "share_outside_model": round(1 - stats.model_seconds / wall, 4) if wall else 0.0,
            "consensus_by_round": outcome.consensus_by_round(),
            "escalated": outcome.count("escalated"), "failed": outcome.count("failed"),
            "outcomes": [(l.query_id, l.doc_id, l.outcome, l.label) for l in outcome.labels],
            "replies": [(t.query_id, t.doc_id, t.round, t.agent, t.response, t.reason, t.reference)
                        for t in outcome.turns]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="demo")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--profile", default=None, help="default: models.yaml defaults.debate")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--reason-words", type=int, default=30, help="each turn's reason (the demo's 30)")
    parser.add_argument("--order", choices=("round", "pair", "both"), default="round")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    profile = args.profile or role_profiles("debate")[0]
    tables = load_dataset(get_dataset(args.dataset))
    pairs = bench_pairs(tables, args.pairs)
    orders = {"round": [False], "pair": [True], "both": [False, True]}[args.order]
    arms = [debate_once(profile, pairs, args, pair_major) for pair_major in orders]
    figures = {"dataset": args.dataset, "profile": profile, "pairs": len(pairs), "rounds": args.rounds,
               "agents": args.agents, "reason_words": args.reason_words, "arms": arms}
    if len(arms) == 2:
        same = sum(a == b for a, b in zip(arms[0]["replies"], arms[1]["replies"], strict=True))
        figures["replies_identical"] = f"{same}/{len(arms[0]['replies'])}"
        figures["labels_identical"] = arms[0]["outcomes"] == arms[1]["outcomes"]
    if args.json:
        print(json.dumps(figures, default=str))
        return
    for name, value in figures.items():
        if name != "arms":
            print(f"{name:>24}  {value}")
    for arm in arms:
        print()
        for name, value in arm.items():
            if name != "replies":
                print(f"{name:>24}  {value}")


if __name__ == "__main__":
    main()
