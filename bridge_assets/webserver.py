"""The Dagster webserver as a child process, for scripts and tests that drive the UI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx

from bridge_assets.paths import PROJECT_ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def dagster_webserver(env: Mapping[str, str] | None = None, timeout_s: float = 180) -> Iterator[str]:
    """Serve workspace.yaml on a free 127.0.0.1 port (the instance of $DAGSTER_HOME in `env`,
    default this process's environment); yields the base URL once it answers, stops it after."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml", "-h", "127.0.0.1",
         "-p", str(port)], cwd=PROJECT_ROOT, env=dict(env or os.environ),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"the Dagster webserver exited with status {server.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Dagster webserver did not answer within {timeout_s:.0f} s")
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
