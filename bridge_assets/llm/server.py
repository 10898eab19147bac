"""Start llama-cpp-python's OpenAI-compatible server on a local GGUF (tests, benchmarks).

In production the HTTP backend talks to whatever server the operator runs (`vllm serve`,
SGLang, llama.cpp); this helper only gives this machine a real one to talk to.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bridge_assets.processes import free_port, serve


@contextlib.contextmanager
def llama_cpp_server(model_path: Path, *, alias: str, n_ctx: int = 2048, threads: int | None = None,
                     port: int | None = None, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """Run `python -m llama_cpp.server` on 127.0.0.1; yields its base URL (…/v1); stops it after
    (processes.ServerFailed with its log's tail when it exits or does not answer in time)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/v1"
    threads_arg = str(threads or os.cpu_count() or 1)
    with serve([sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", alias,
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
                "--n_threads", threads_arg, "--n_threads_batch", threads_arg],
               f"{url}/models", name="llama.cpp server", timeout_s=startup_timeout_s):
        yield url
