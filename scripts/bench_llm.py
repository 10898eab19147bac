"""LLM throughput on this machine: the in-process llama.cpp backend, then the HTTP backend
against llama-cpp-python's server at several concurrency levels.

    .venv/bin/python scripts/bench_llm.py --profile qwen-0.5b --prompts 4 --concurrency 1,2,4

Every measurement goes through LLMClient (ledger included) with a fresh, temporary ledger,
so nothing is answered from cache. Prints requests per minute, generated tokens per second,
mean latency and the share of wall time spent outside the model.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bridge_assets.lake import location
from bridge_assets.llm import LLMClient, get_profile, weights
from bridge_assets.llm.server import llama_cpp_server

SCHEMA = {"type": "object",
          "properties": {"reason": {"type": "string", "maxLength": 200},
                         "response": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["reason", "response"], "additionalProperties": False}
SYSTEM = ("You judge whether a passage answers a question. Reply in JSON with a short reason "
          'and "response": "yes" or "no".')
PAIRS = [
    ("who wrote the novel 1984", "Nineteen Eighty-Four is a dystopian novel by English writer George Orwell, published in 1949."),
    ("what is the boiling point of water at sea level", "At sea level, water boils at 100 degrees Celsius (212 degrees Fahrenheit)."),
    ("when did the berlin wall fall", "The Berlin Wall was a guarded concrete barrier that divided Berlin from 1961."),
    ("how many moons does mars have", "Mars has two small moons, Phobos and Deimos, discovered by Asaph Hall in 1877."),
    ("what is the capital of australia", "Sydney is the largest city in Australia and home to the famous Opera House."),
    ("who painted the mona lisa", "The Mona Lisa is a half-length portrait painting by Leonardo da Vinci."),
    ("what language is spoken in brazil", "Portuguese is the official and most widely spoken language of Brazil."),
    ("what is the speed of light", "Sound travels through air at about 343 metres per second at room temperature."),
]


def requests_for(client: LLMClient, n: int, max_tokens: int, tag: str):
    return [client.request([("system", SYSTEM), ("user", f"Question: {q}\nPassage: {p}")],
                           json_schema=SCHEMA, max_tokens=max_tokens, purpose=f"bench-{tag}")
            for q, p in (PAIRS * (n // len(PAIRS) + 1))[:n]]


def measure(label: str, client: LLMClient, requests) -> None:
    started = time.perf_counter()
    results = client.generate(requests, context="bench")
    wall = time.perf_counter() - started
    ok = sum(r.ok for r in results)
    tokens_out = sum(r.tokens_out for r in results)
    tokens_in = sum(r.tokens_in for r in results)
    model_s = sum(r.latency_s for r in results)
    # with concurrency, latencies overlap: the model-time share only means something at 1
    outside = f"{max(0.0, 1 - model_s / wall):.1%}" if client.profile.backend == "llama_cpp" else "-"
    print(f"{label:<28}{len(results):>4}{ok:>4}{wall:>8.1f}{60 * len(results) / wall:>9.1f}"
          f"{tokens_out / wall:>9.1f}{(tokens_in + tokens_out) / wall:>9.1f}"
          f"{model_s / len(results):>9.2f}{outside:>9}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="qwen-0.5b", help="a llama_cpp profile of models.yaml")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama.cpp threads (default: the profile's, i.e. every core)")
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()

    profile = get_profile(args.profile)
    if args.threads:
        profile = profile.model_copy(update={"threads": args.threads})
    started = time.perf_counter()
    model = weights.provision(profile)
    print(f"{profile.name}: {model.path} ({model.source}, {time.perf_counter() - started:.1f} s), "
          f"{os.cpu_count()} CPU cores, {profile.threads or os.cpu_count()} threads, {args.prompts} prompts, max_tokens {args.max_tokens}")
    print(f"{'run':<28}{'n':>4}{'ok':>4}{'wall s':>8}{'req/min':>9}{'out t/s':>9}{'all t/s':>9}"
          f"{'lat s':>9}{'outside':>9}")
    with tempfile.TemporaryDirectory() as scratch:
        scratch_dir = Path(scratch)
        if not args.skip_in_process:
            client = LLMClient(profile, lake=location.lake_location(scratch_dir / "in_process"))
            started = time.perf_counter()
            client.generate([client.request([("user", "Say OK.")], max_tokens=2)])  # load the model
            print(f"{'in-process: model load':<28}{time.perf_counter() - started:>16.1f} s")
            measure("in-process llama.cpp", client, requests_for(client, args.prompts, args.max_tokens, "local"))
        if not args.skip_http:
            http = get_profile("openai-local")
            with llama_cpp_server(model.path, alias=http.model, n_ctx=profile.context_size,
                                  threads=profile.threads) as url:
                for level in [int(c) for c in args.concurrency.split(",")]:
                    client = LLMClient(http.model_copy(update={"base_urls": (url,), "concurrency": level}),
                                       lake=location.lake_location(scratch_dir / f"http_{level}"))
                    measure(f"http llama.cpp server c={level}", client,
                            requests_for(client, args.prompts, args.max_tokens, f"http{level}"))


if __name__ == "__main__":
    main()
