"""Batched decoding on the in-process llama.cpp model: several independent calls decoded side
by side, one token of each per llama.cpp step, instead of one call after the other.

    .venv/bin/python scripts/bench_batched_decode.py widths --profile qwen-1.5b --tokens 40 [--kv split]
    .venv/bin/python scripts/bench_batched_decode.py debate --dataset demo --pairs 12 --width 4

`widths`: the first 8 round-1 debate prompts `run_debate` builds for the demo (bench_kv_cache's
pairs), each computed in its own sequence of one multi-sequence llama.cpp context, then decoded
greedily (argmax, no grammar) in batches of width 1, 2, 4 and 8, prompt 0 in slot 0, and at
width 4 with other neighbours, in the last slot, and beside copies of itself. Prints each arm's
seconds, whether prompt 0's tokens equal those it gets alone (width 1), the largest logit
difference before they part, and whether its logits equal those of the first width-4 arm.
`--kv split` gives each sequence its own KV buffer (llama.cpp's kv_unified off).
`--prompt-tokens N` keeps only each prompt's last N tokens (the end of the passage, the debate
so far and the reply's start; default: whole prompts): a smoke test's size.

`debate`: a real DREAM debate of N demo pairs (bench_debate's pairs) twice, each on a fresh
ledger through LLMClient: as the pipeline runs it in process (pair by pair, one call at a time),
then round by round with every call of a round decoded in `--width` lanes (the profile with
`engine_args: {decode_lanes: W}`, llm.llama_lanes.DecodeLanes: each lane its own KV buffer, a
lane's calls reuse the prefix they share with its previous one, every step W rows wide
whatever is left, so a call's reply does not depend on its neighbours). Prints both arms' seconds and tokens, and how many replies and
labels are the same.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from bench_debate import bench_pairs
from bench_kv_cache import debate_requests, demo_pairs

from bridge_assets.ingest.loaders import load_dataset
from bridge_assets.labeling.calls import MeteredGenerate
from bridge_assets.labeling.debate import run_debate
from bridge_assets.labeling.debate_turns import debate_agents
from bridge_assets.lake import location
from bridge_assets.llm import LLMClient
from bridge_assets.llm import llama_backend as backends
from bridge_assets.llm.llama_greedy import prompt_tokens
from bridge_assets.llm.profiles import get_profile
from bridge_assets.registry.datasets import get_dataset


def multi_sequence_context(model, sequences: int, per_sequence: int, threads: int, unified: bool,
                           batch: int = 512):
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = sequences * per_sequence, batch, 512
    params.n_seq_max, params.kv_unified = sequences, unified
    params.n_threads = params.n_threads_batch = threads
    return _internals.LlamaContext(model=model._model, params=params, verbose=False)


def widths(args: argparse.Namespace) -> None:
    from llama_cpp import _internals

    backend = backends.LlamaCppBackend(get_profile(args.profile))
    model = backend._model(logits_all=False)
    prompts = [prompt_tokens(model, r) for r in debate_requests(demo_pairs(8), args.profile, 30)[:8]]
    if args.prompt_tokens:
        prompts = [p[-args.prompt_tokens:] for p in prompts]
    n_vocab = model.n_vocab()
    context = multi_sequence_context(model, 8, 1024 if args.kv == "unified" else 2048,
                                     backend.profile.threads or 2, args.kv == "unified", batch=2048)
    batch = _internals.LlamaBatch(n_tokens=2048, embd=0, n_seq_max=8, verbose=False)

    def logits(i: int) -> np.ndarray:
        return np.ctypeslib.as_array(context.get_logits_ith(i), shape=(n_vocab,)).copy()

    def decode(order: list[int]) -> tuple[float, float, list[list[int]], list[list[np.ndarray]]]:
        """Prompts `order` in slots 0..n-1: (prefill s, decode s, tokens, logits per step)."""
        context.kv_cache_clear()
        started = time.perf_counter()
        last, position = [], []
        for slot, k in enumerate(order):
            batch.reset()
            batch.set_batch(prompts[k], n_past=0, logits_all=False)
            for i in range(batch.batch.n_tokens):
                batch.batch.seq_id[i][0] = slot
            context.decode(batch)
            last.append(logits(batch.batch.n_tokens - 1))
            position.append(len(prompts[k]))
        prefilled = time.perf_counter()
        tokens: list[list[int]] = [[] for _ in order]
        seen: list[list[np.ndarray]] = [[] for _ in order]
        for _ in range(args.tokens):
            batch.reset()
            batch.batch.n_tokens = len(order)
            for slot in range(len(order)):
                token = int(last[slot].argmax())
                tokens[slot].append(token)
                seen[slot].append(last[slot])
                b = batch.batch
                b.token[slot], b.pos[slot], b.n_seq_id[slot], b.logits[slot] = token, position[slot], 1, True
                b.seq_id[slot][0] = slot
                position[slot] += 1
            context.decode(batch)
            last = [logits(slot) for slot in range(len(order))]
        return prefilled - started, time.perf_counter() - prefilled, tokens, seen

    print(f"{args.profile}, KV {args.kv}, {args.tokens} tokens per sequence, prompts of "
          f"{[len(p) for p in prompts]} tokens\n")
    print("| arm | prefill s | decode s | decode s per sequence | prompt 0's tokens as alone "
          "| largest logit difference before they part | prompt 0's logits as in `width 4` |")
    print("|---|---|---|---|---|---|---|")
    alone = width_4 = None
    for name, order in [("width 1", [0]), ("width 2", [0, 1]), ("width 4", [0, 1, 2, 3]),
                        ("width 4, other neighbours", [0, 4, 5, 6]), ("width 4, prompt 0 last", [4, 5, 6, 0]),
                        ("width 4, prompt 0 twice", [0, 0, 0, 0]), ("width 8", list(range(8)))]:
        prefill_s, decode_s, tokens, seen = decode(order)
        slot = order.index(0)
        if alone is None:
            alone = tokens[slot], seen[slot]
        parted = next((i for i, (a, b) in enumerate(zip(tokens[slot], alone[0])) if a != b), args.tokens)
        difference = max((float(np.abs(seen[slot][i] - alone[1][i]).max()) for i in range(parted)), default=0.0)
        same = "yes" if parted == args.tokens else f"no, from token {parted}"
        if name == "width 4":
            width_4 = seen[slot]
        as_width_4 = "-" if width_4 is None else \
            "bit for bit" if all(np.array_equal(a, b) for a, b in zip(seen[slot], width_4)) else "no"
        print(f"| {name} | {prefill_s:.1f} | {decode_s:.1f} | {decode_s / len(order):.2f} | {same} "
              f"| {difference:.3f} | {as_width_4} |")


def debate(args: argparse.Namespace) -> None:
    pairs = bench_pairs(load_dataset(get_dataset(args.dataset)), args.pairs)
    arms = {}
    profile = get_profile(args.profile)
    for arm in ("one at a time, pair by pair", f"{args.width} lanes, round by round"):
        with tempfile.TemporaryDirectory() as folder:
            lanes = args.width if "lanes" in arm else 1
            client = LLMClient(profile.model_copy(update={"engine_args": {**profile.engine_args,
                                                                          "decode_lanes": lanes}}),
                               lake=location.lake_location(folder))
            client.backend  # noqa: B018 - the model is loaded before the clock starts
            with backends._LLAMA_LOCK:
                for loaded in backends._LLAMA_MODELS.values():
                    loaded.reset()
            generate = MeteredGenerate(lambda _, requests: client.generate(requests, context="bench"))
            started = time.perf_counter()
            outcome = run_debate(pairs, debate_agents([args.profile], 2), generate, rounds=2,
                                 reason_words=args.reason_words, pair_major="lanes" not in arm)
            wall = time.perf_counter() - started
            client.close()
        s = client.stats
        arms[arm] = {"wall": wall, "model": s.model_seconds, "calls": s.calls, "out": s.tokens_out,
                     "labels": [(l.query_id, l.doc_id, l.outcome, l.label) for l in outcome.labels],
                     "replies": [(t.query_id, t.doc_id, t.round, t.agent, t.response, t.reason, t.reference)
                                 for t in outcome.turns]}
    print(f"{args.profile}, {len(pairs)} pairs of {args.dataset}, 2 agents, 2 rounds\n")
    print("| arm | wall s | model s | calls | tokens out | debated pairs per minute |")
    print("|---|---|---|---|---|---|")
    for arm, a in arms.items():
        print(f"| {arm} | {a['wall']:.1f} | {a['model']:.1f} | {a['calls']} | {a['out']} | {len(pairs) / a['wall'] * 60:.2f} |")
    first, second = ({turn[:4]: turn[4:] for turn in a["replies"]} for a in arms.values())
    both = first.keys() & second.keys()
    same_turns = sum(first[t] == second[t] for t in both)
    same_answers = sum(first[t][0] == second[t][0] for t in both)
    labels = [a["labels"] for a in arms.values()]
    same_labels = sum(x == y for x, y in zip(*labels))
    print(f"\nturns: {len(first)} / {len(second)}, {len(both)} in both (same pair, round and agent): the "
          f"same reply {same_turns}, the same answer {same_answers}; pairs with the same outcome and "
          f"label: {same_labels} of {len(pairs)}")
    for x, y in zip(*labels):
        if x != y:
            print(f"  {x[0]} {x[1]}: {x[2]} {x[3]} -> {y[2]} {y[3]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    w = commands.add_parser("widths")
    w.add_argument("--profile", default="qwen-1.5b")
    w.add_argument("--tokens", type=int, default=40, help="tokens decoded per sequence")
    w.add_argument("--kv", choices=["unified", "split"], default="unified",
                   help="one KV buffer for all sequences, or one per sequence")
    w.add_argument("--prompt-tokens", type=int, default=0,
                   help="keep only each prompt's last N tokens (0: whole prompts)")
    d = commands.add_parser("debate")
    d.add_argument("--profile", default="qwen-1.5b")
    d.add_argument("--dataset", default="demo")
    d.add_argument("--pairs", type=int, default=12)
    d.add_argument("--width", type=int, default=4)
    d.add_argument("--reason-words", type=int, default=30, help="each turn's reason (the demo's 30)")
    args = parser.parse_args()
    {"widths": widths, "debate": debate}[args.command](args)


if __name__ == "__main__":
    main()
