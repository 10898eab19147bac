"""Start llama-cpp-python's OpenAI-compatible server on a local GGUF (tests, benchmarks).

In production the HTTP backend talks to whatever server the operator runs (`vllm serve`,
SGLang, llama.cpp); this helper only gives this machine a real one to talk to.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bridge_assets.errors import BridgeError


class ServerFailed(BridgeError, RuntimeError):
    """The server exited or did not answer in time; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def llama_cpp_server(model_path: Path, *, alias: str, n_ctx: int = 2048, threads: int | None = None,
                     port: int | None = None, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """Run `python -m llama_cpp.server` on 127.0.0.1; yields its base URL (…/v1); stops it after."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", alias,
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
             "--n_threads", str(threads or os.cpu_count() or 1),
             "--n_threads_batch", str(threads or os.cpu_count() or 1)],
            stdout=log, stderr=subprocess.STDOUT)

        def log_tail() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")[-2000:]

        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if process.poll() is not None:
                    raise ServerFailed(f"llama.cpp server exited with {process.returncode}:\n{log_tail()}")
                try:
                    if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise ServerFailed(f"llama.cpp server did not answer in {startup_timeout_s:.0f} s:\n{log_tail()}")
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
