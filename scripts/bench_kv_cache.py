"""The KV state cache (llm.llama_states.KVStateCache) on the debate's own call sequence: the
prompts `run_debate` sends for N demo pairs over 2 rounds (2 agents, every pair to round 2),
through the in-process llama.cpp backend with the cache off and on, side by side.

    .venv/bin/python scripts/bench_kv_cache.py --pairs 4 --max-tokens 8 --state-cache-mb 64
    .venv/bin/python scripts/bench_kv_cache.py --pairs 12 --simulate-only

The round-2 prompts are built from canned round-1 replies (the same for both arms), so the
sequence is the stage's real prompt structure without a first model pass; --max-tokens caps
each reply (prefill is what the cache saves). Prints the simulated token counts for several
capacities, then (unless --simulate-only) both measured arms: per-stage table, wall time,
replies compared (llm_time_by_stage.replay).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llm_time_by_stage import replay, simulate

from bridge_assets.labeling.debate import run_debate
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.labeling.pairs import Pair
from bridge_assets.llm.types import LLMResult

DEMO = Path(__file__).resolve().parents[1] / "resources" / "data" / "demo"


def demo_pairs(n: int) -> list[Pair]:
    """N (query, chunk) pairs of the demo: each query's relevant passage, then the next
    query's, so half the pairs are relevant and the chunks are real passages."""
    queries = [json.loads(line) for line in (DEMO / "queries.jsonl").read_text().splitlines() if line.strip()]
    corpus = {row["_id"]: row for row in map(json.loads, (DEMO / "corpus.jsonl").read_text().splitlines())}
    qrels = [line.split("\t") for line in (DEMO / "qrels" / "test.tsv").read_text().splitlines()[1:] if line.strip()]
    relevant = {}
    for query_id, doc_id, _ in qrels:
        relevant.setdefault(query_id, doc_id)
    docs = [relevant[q["_id"]] for q in queries if q["_id"] in relevant]
    pairs = []
    for i, query in enumerate(q for q in queries if q["_id"] in relevant):
        for doc_id in (relevant[query["_id"]], docs[(i + 1) % len(docs)]):
            doc = corpus[doc_id]
            pairs.append(Pair(query["_id"], doc_id, query["text"], tuple(query.get("answers", ())),
                              f"{doc.get('title', '')}\n{doc['text']}".strip()))
    return pairs[:n]


def debate_requests(pairs: list[Pair], model: str, reason_words: int) -> list:
    """The requests run_debate makes, in order, answering each turn with a canned reply."""
    asked = []

    def canned(profile: str, requests):
        asked.extend(requests)
        return [LLMResult(key=str(len(asked)) + str(i), text=json.dumps(reply), parsed=reply)
                for i, reply in enumerate({"reference": [], "reason": "The chunk does not state the answer.",
                                           "response": "no"} for _ in requests)]

    run_debate(pairs, debate_agents([model]), canned, rounds=2, reason_words=reason_words, persistence=2)
    return asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--profile", default="qwen-0.5b")
    parser.add_argument("--reason-words", type=int, default=30, help="the demo's debate_labels setting")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--state-cache-mb", type=float, default=64)
    parser.add_argument("--simulate", default="16,64,256", help="capacities (MiB) to simulate")
    parser.add_argument("--simulate-only", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    requests = debate_requests(demo_pairs(args.pairs), args.profile, args.reason_words)
    print(f"{args.pairs} demo pairs, 2 agents, 2 rounds: {len(requests)} debate calls\n")
    simulate(requests, args.profile, [float(mb) for mb in args.simulate.split(",")])
    if not args.simulate_only:
        print()
        replay(requests, args.profile, int(args.state_cache_mb * 2**20), args.repeat, args.max_tokens)


if __name__ == "__main__":
    main()
