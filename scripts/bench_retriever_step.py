"""One training step of the trained retriever (bridge_assets/student/retriever.py) on synthetic
texts: its time and the process's peak memory. A batch of `--queries` queries, each with
`--positives` positives and `--negatives` hard negatives of about `--max-length` tokens.

    .venv/bin/python scripts/bench_retriever_step.py --positives 5 --encode-chunk 8

Run each setting in its own process (the peak is the process's): docs/trained-retriever.md.
"""

from __future__ import annotations

import argparse
import resource
import time

from bridge_assets.student.retriever_data import TrainingQuery, TrainSettings
from bridge_assets.student.retriever_training import base_location, load_encoder, train_retriever


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--positives", type=int, default=5)
    parser.add_argument("--negatives", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--encode-chunk", type=int, default=TrainSettings.encode_chunk)
    args = parser.parse_args()

    def text(n: int) -> str:  # long enough to fill max_length
        return " ".join(f"word{n}x{j}" for j in range(2 * args.max_length))

    queries = [TrainingQuery(f"q{q}", f"question {q}", tuple(text(q * 1000 + p) for p in range(args.positives)),
                                tuple(text(q * 1000 + 500 + n) for n in range(args.negatives)))
               for q in range(args.queries)]
    model = load_encoder(base_location(), args.max_length)
    settings = TrainSettings(epochs=1, batch_queries=args.queries, max_length=args.max_length,
                                encode_chunk=args.encode_chunk)
    started = time.perf_counter()
    log = train_retriever(model, queries, settings)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print(f"{args.queries} queries x ({args.positives} positives + {args.negatives} negatives), "
          f"{args.max_length} tokens, encode_chunk {args.encode_chunk}: {log.steps} step in "
          f"{time.perf_counter() - started:.1f} s, peak {peak:.2f} GiB")


if __name__ == "__main__":
    main()
