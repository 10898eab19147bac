"""Where the model's time goes: per stage of a lake's LLM call ledger (`llm_calls`), the calls,
prompt tokens computed (prefill evaluated) and reused (taken from the KV cache), decode tokens
and seconds, with totals. Reads the lake read-only.

    .venv/bin/python scripts/llm_time_by_stage.py                      # the environment's lake
    .venv/bin/python scripts/llm_time_by_stage.py --lake /tmp/demo_lake [--context RUN_ID]
    .venv/bin/python scripts/llm_time_by_stage.py --by purpose,profile
    # the first 60 recorded calls again, through the in-process llama.cpp backend of a profile,
    # with its KV state cache off then on (docs/llm-time.md): same calls, side by side
    .venv/bin/python scripts/llm_time_by_stage.py --lake /tmp/demo_lake --replay 60 --profile qwen-0.5b

A stage is the ledger's `purpose` (filter, debate, debate_paper, judge, rerank, hyde, rag_answer,
rag_judgment, adjudicator, relevance_score, ...). Every recorded model call counts, failed ones
included (their time was spent); a key answered from the ledger made no call and has no row.
Calls recorded before the ledger measured prefill (or by a backend that does not report it, such
as llama-cpp-python's HTTP server) have NULL there: the table says how many, and its computed /
reused / decode sums cover only the calls that have them, never an estimate for the others.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import duckdb

from bridge_assets.lake import store
from bridge_assets.lake.location import lake_location
from bridge_assets.llm.ledger import ADDED_COLUMNS, TABLE

GROUPS = ("purpose", "profile", "model", "backend", "context")


def stage_table(con: duckdb.DuckDBPyConnection, by: list[str], context: str | None = None) -> tuple[list[tuple], bool]:
    """One row per group (then a total row): group values, calls, failed, calls measured,
    prompt tokens, computed, reused, decode tokens, seconds, whether it is the total row. The
    flag says whether the ledger has the prefill columns at all."""
    columns = {row[0] for row in con.execute(f"describe {TABLE}").fetchall()}
    measured = all(name in columns for name in ADDED_COLUMNS)
    # a call is measured when the backend gave both halves of its prompt
    known = "prompt_tokens_computed is not null and prompt_tokens_reused is not null" if measured else "false"
    when = "where context = ?" if context else ""
    null = "cast(null as bigint)"
    computed = f"sum(prompt_tokens_computed) filter (where {known})" if measured else null
    reused = f"sum(prompt_tokens_reused) filter (where {known})" if measured else null
    decoded = "sum(decode_tokens)" if measured else null
    keys = ", ".join(by)
    rows = con.execute(f"""
        select {keys}, count(*), count(*) filter (where error is not null), count(*) filter (where {known}),
               coalesce(sum(tokens_in), 0), {computed}, {reused}, {decoded}, coalesce(sum(latency_s), 0),
               grouping({keys}) > 0
        from {TABLE} {when}
        group by grouping sets (({keys}), ())
        order by grouping({keys}), sum(latency_s) desc nulls last, {keys}""",
                       [context] if context else []).fetchall()
    return rows, measured


def _n(value) -> str:
    return "-" if value is None else f"{value:,}"


def markdown(rows: list[tuple], by: list[str]) -> str:
    total_s = rows[-1][-2] if rows else 0.0
    lines = ["| " + " | ".join(by) + " | calls | failed | measured | prompt tokens | computed | reused "
             "(share) | decode tokens | seconds (share) | s/call |",
             "|" + "---|" * (len(by) + 9)]
    for row in rows:
        names, (calls, failed, measured, prompt, computed, reused, decoded, seconds, total) = \
            row[:len(by)], row[len(by):]
        label = ["**total**"] + [""] * (len(by) - 1) if total else [str(name) for name in names]
        share = "" if computed is None or not (computed + reused) else f" ({reused / (computed + reused):.0%})"
        lines.append(
            "| " + " | ".join(label) + f" | {calls:,} | {failed:,} | {measured:,} | {_n(prompt)} | {_n(computed)} | "
            f"{_n(reused)}{share} | {_n(decoded)} | {seconds:,.1f} ({seconds / total_s if total_s else 0:.0%}) | "
            f"{seconds / calls if calls else 0:.2f} |")
    return "\n".join(lines)


def recorded_requests(con: duckdb.DuckDBPyConnection, limit: int, purposes: list[str], context: str | None):
    """The requests of the ledger's calls that got a reply, in the order they were made."""
    from bridge_assets.llm.types import LLMRequest

    where = ["coalesce(raw_reply, '') <> ''"]
    params: list = []
    if purposes:
        where.append("purpose in (select unnest(?::VARCHAR[]))")
        params.append(purposes)
    if context:
        where.append("context = ?")
        params.append(context)
    rows = con.execute(f"select request_json from {TABLE} where {' and '.join(where)} "
                       f"order by created_at, rowid limit {int(limit)}", params).fetchall()
    return [LLMRequest.model_validate_json(text) for (text,) in rows]


def replay(requests, profile_name: str, cache_bytes: int, repeat: int, max_tokens: int = 0) -> None:
    """The same calls through the in-process backend, KV state cache off then on, from an
    empty KV cache each time; prints each arm's per-stage table and the side-by-side totals."""
    import time

    from bridge_assets.llm import get_profile
    from bridge_assets.llm import llama_backend as backends

    if max_tokens:  # prefill is what a state cache saves: shorter replies measure it sooner
        requests = [r.model_copy(update={"max_tokens": min(r.max_tokens, max_tokens)}) for r in requests]
    profile = get_profile(profile_name)
    if profile.backend != "llama_cpp":
        sys.exit(f"--replay runs an in-process llama_cpp profile; {profile_name} is {profile.backend}")
    arms = {"off": backends.LlamaCppBackend(profile.model_copy(update={"engine_args": {"state_cache_bytes": 0}})),
            "on": backends.LlamaCppBackend(profile.model_copy(
                update={"engine_args": {**profile.engine_args, "state_cache_bytes": cache_bytes}}))}
    with backends._LLAMA_LOCK:
        model = arms["off"]._model(logits_all=False)  # loaded before any clock starts
    print(f"replay: {len(requests)} recorded calls through {profile_name} ({model.model_path}), "
          f"{profile.threads or os.cpu_count()} threads, max_tokens {max_tokens or 'as recorded'}; "
          f"state cache {cache_bytes / 2**20:g} MiB when on\n")
    replies: dict[str, list] = {}
    totals: dict[str, list] = {}
    for round_ in range(repeat):
        for arm, backend in arms.items():
            with backends._LLAMA_LOCK:  # both arms start from an empty KV cache
                for loaded in backends._LLAMA_MODELS.values():
                    loaded.reset()
                    if getattr(loaded, "_bridge_state_cache", None) is not None:
                        loaded._bridge_state_cache.clear()
            started, cpu_started = time.perf_counter(), time.process_time()
            results = [backend.generate([request])[0] for request in requests]
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            memory = duckdb.connect()
            memory.execute(f"create table {TABLE} (purpose VARCHAR, error VARCHAR, tokens_in INTEGER, "
                           "prompt_tokens_computed INTEGER, prompt_tokens_reused INTEGER, decode_tokens INTEGER, "
                           "latency_s DOUBLE, context VARCHAR, profile VARCHAR, model VARCHAR, backend VARCHAR)")
            memory.executemany(f"insert into {TABLE} values (?, ?, ?, ?, ?, ?, ?, null, null, null, null)",
                               [(q.purpose, r.error, r.tokens_in, r.prompt_computed, r.prompt_reused,
                                 r.decode_tokens, r.latency_s) for q, r in zip(requests, results)])
            rows, _ = stage_table(memory, ["purpose"])
            states = getattr(model, "_bridge_state_cache", None) if arm == "on" else None
            extra = (f"; {states.restored} calls continued from a kept state, {len(states)} states "
                     f"({states.size / 2**20:.1f} MiB) kept, {states.evicted} evicted") if states else ""
            print(f"### state cache {arm} (run {round_ + 1}): {wall:.1f} s wall, {cpu:.1f} s CPU{extra}\n")
            print(markdown(rows, ["purpose"]) + "\n")
            replies.setdefault(arm, results)
            totals.setdefault(arm, []).append((wall, cpu, rows[-1][5]))
    same_text = sum(a.text == b.text for a, b in zip(replies["off"], replies["on"]))
    with_logprobs = [(a, b) for a, b in zip(replies["off"], replies["on"]) if a.logprobs is not None]
    same_logprobs = sum(a.logprobs == b.logprobs for a, b in with_logprobs)
    print("| state cache | wall s (each run) | CPU s (each run) | prompt tokens computed | replies identical to off |")
    print("|---|---|---|---|---|")
    for arm in arms:
        walls = ", ".join(f"{wall:.1f}" for wall, _, _ in totals[arm])
        cpus = ", ".join(f"{cpu:.1f}" for _, cpu, _ in totals[arm])
        print(f"| {arm} | {walls} | {cpus} | {totals[arm][0][2]:,} | "
              f"{'-' if arm == 'off' else f'{same_text}/{len(requests)} texts, {same_logprobs}/{len(with_logprobs)} log-prob lists'} |")


def simulate(requests, profile_name: str, capacities_mb: list[float]) -> None:
    """Prompt tokens computed for these calls, in this order, by the llama.cpp backend without
    and with a KV state cache of each capacity: token counts only, from the profile's tokenizer
    and chat template (no model run; a reply's own tokens, which no later prompt repeats at
    the same position, are left out of the kept states; the bytes per token are the KV rows
    of the model's layers in f16, as llama_state_seq_get_data writes them)."""
    from llama_cpp import Llama

    from bridge_assets.llm import get_profile, weights
    from bridge_assets.llm.llama_greedy import prompt_tokens
    from bridge_assets.llm.llama_states import common_prefix

    profile = get_profile(profile_name)
    vocab = Llama(model_path=str(weights.provision(profile).path), vocab_only=True, verbose=False)
    meta = vocab.metadata
    arch = meta["general.architecture"]
    layers, heads = int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", int(meta[f"{arch}.embedding_length"]) // heads))
    per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, f16
    prompts = [tuple(prompt_tokens(vocab, request)) for request in requests]
    purposes = [request.purpose for request in requests]
    print(f"simulated: {len(prompts)} recorded calls, {profile_name}'s tokenizer; a kept state "
          f"{per_token:,} bytes per token ({layers} layers x {kv_heads} KV heads x {head_dim} x K,V f16)\n")

    def run(capacity: int) -> dict[str, int]:
        states: dict[tuple[int, ...], int] = {}
        live: tuple[int, ...] = ()
        computed: dict[str, int] = {}
        size = 0
        for purpose, tokens in zip(purposes, prompts):
            shared = common_prefix(live, tokens)
            if capacity:
                best = max(states, key=lambda key: common_prefix(key, tokens), default=None)
                if best is not None and common_prefix(best, tokens) > shared:
                    shared = common_prefix(best, tokens)
                    states[best] = states.pop(best)
            computed[purpose] = computed.get(purpose, 0) + len(tokens) - min(shared, len(tokens) - 1)
            live = tokens
            if capacity and len(tokens) * per_token <= capacity and tokens not in states:
                for older in [k for k in states if len(k) < len(tokens) and tokens[:len(k)] == k]:
                    size -= states.pop(older)
                states[tokens] = len(tokens) * per_token
                size += states[tokens]
                while size > capacity:
                    size -= states.pop(next(iter(states)))
        return computed

    arms = {"off": run(0), **{f"{mb:g} MiB": run(int(mb * 2**20)) for mb in capacities_mb}}
    stages = sorted(set(purposes), key=lambda p: -arms["off"][p])
    totals = {p: sum(len(t) for q, t in zip(purposes, prompts) if q == p) for p in stages}
    print("| purpose | calls | prompt tokens | computed, cache off | " + " | ".join(
        f"computed, {arm}" for arm in list(arms)[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(arms) - 1))
    for purpose in [*stages, None]:
        row = (lambda arm: sum(arms[arm].values())) if purpose is None else (lambda arm: arms[arm][purpose])
        calls = len(purposes) if purpose is None else purposes.count(purpose)
        prompt = sum(totals.values()) if purpose is None else totals[purpose]
        off = row("off")
        cells = [f"{row(arm):,} ({row(arm) / off - 1:+.0%})" if off else f"{row(arm):,}" for arm in list(arms)[1:]]
        print(f"| {'**total**' if purpose is None else purpose} | {calls:,} | {prompt:,} | {off:,} | "
              + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, help="the lake folder (default: BRIDGE_DATA_LAKE, else the project's data_lake/)")
    parser.add_argument("--context", help="only the calls recorded under this context (a Dagster run id)")
    parser.add_argument("--by", default="purpose", help=f"group by these ledger columns, comma-separated ({', '.join(GROUPS)})")
    parser.add_argument("--replay", type=int, default=0, metavar="N",
                        help="replay the first N recorded calls through --profile, KV state cache off then on")
    parser.add_argument("--stages", default="", help="with --replay: only these purposes, comma-separated")
    parser.add_argument("--profile", default="qwen-0.5b", help="with --replay: an in-process llama_cpp profile")
    parser.add_argument("--state-cache-mb", type=float, default=256, help="with --replay: the cache's bound when on")
    parser.add_argument("--repeat", type=int, default=1, help="with --replay: run both arms this many times")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="with --replay: cap each reply at this many tokens (0: as recorded)")
    parser.add_argument("--simulate", default="", metavar="MIB[,MIB...]",
                        help="prompt tokens computed for the recorded calls (--stages, --replay N limit), cache off "
                             "and at these capacities: token counts from --profile's tokenizer, no model run")
    args = parser.parse_args()
    by = [name.strip() for name in args.by.split(",") if name.strip()]
    if not by or any(name not in GROUPS for name in by):
        parser.error(f"--by takes some of {', '.join(GROUPS)}")
    location = lake_location(args.lake or "")
    where = store.describe(location)
    try:
        with store.connect_read_only(location, wait_seconds=5) as con:
            if not store.table_exists(con, TABLE):
                print(f"{where}: no LLM call was ever recorded ({TABLE} does not exist)")
                return
            rows, measured = stage_table(con, by, args.context)
            requests = recorded_requests(con, args.replay or 10**9, [p for p in args.stages.split(",") if p],
                                         args.context) if args.replay or args.simulate else []
    except store.StoreBusy as exc:
        sys.exit(f"{where} is busy ({exc}); copy the lake folder elsewhere and point --lake at the copy")
    scope = f" (context {args.context})" if args.context else ""
    print(f"LLM calls by {', '.join(by)} in {where}{scope}\n")
    if len(rows) <= 1 and (not rows or rows[0][len(by)] == 0):
        print("no calls")
        return
    print(markdown(rows, by))
    total = rows[-1][len(by):]
    calls, measured_calls = total[0], total[2]
    if not measured:
        print(f"\nThis ledger predates the prefill columns ({', '.join(ADDED_COLUMNS)}): prompt tokens "
              "computed / reused and decode tokens are unknown (NULL) for all its calls. Run the stages "
              "again with the current code on a fresh lake to measure them.")
    elif measured_calls < calls:
        print(f"\n{calls - measured_calls:,} of {calls:,} calls have no prefill measurement (NULL: recorded "
              "before the ledger measured it, or by a backend that does not report it); the computed, "
              "reused and decode sums cover only the calls that have them.")
    if args.simulate:
        print()
        simulate(requests, args.profile, [float(mb) for mb in args.simulate.split(",")])
    if args.replay:
        print()
        replay(requests, args.profile, int(args.state_cache_mb * 2**20), args.repeat, args.max_tokens)


if __name__ == "__main__":
    main()
