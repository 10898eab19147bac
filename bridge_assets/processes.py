"""Local processes: whether one still lives (a killed run worker, a killed unpacker), and a
server started as a child process and polled until it answers (the llama.cpp server for tests
and benchmarks, the Dagster webserver for the UI's tests and screenshots)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from bridge_assets.errors import BridgeError


class ServerFailed(BridgeError, RuntimeError):
    """A server exited or did not answer in time; the message carries its log's tail."""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(command: Sequence[str], ready_url: str, *, name: str, timeout_s: float,
          env: Mapping[str, str] | None = None, cwd: Path | None = None,
          poll_s: float = 0.5) -> Iterator[None]:
    """Run `command` for the block once `ready_url` answers 200; ServerFailed (with the tail of
    its output) when it exits first or does not answer within `timeout_s`. Stopped after."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(list(command), cwd=cwd, env=dict(env) if env is not None else None,
                                   stdout=log, stderr=subprocess.STDOUT)

        def log_tail() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")[-2000:]

        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    raise ServerFailed(f"{name} exited with {process.returncode}:\n{log_tail()}")
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise ServerFailed(f"{name} did not answer in {timeout_s:.0f} s:\n{log_tail()}")
                time.sleep(poll_s)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
