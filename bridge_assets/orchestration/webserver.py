"""The Dagster webserver as a child process, for scripts and tests that drive the UI."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from bridge_assets.paths import PROJECT_ROOT
from bridge_assets.processes import free_port, serve


@contextmanager
def dagster_webserver(env: Mapping[str, str] | None = None, timeout_s: float = 180) -> Iterator[str]:
    """Serve workspace.yaml on a free 127.0.0.1 port (the instance of $DAGSTER_HOME in `env`,
    default this process's environment); yields the base URL once it answers, stops it after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serve([sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml", "-h", "127.0.0.1",
                "-p", str(port)], f"{url}/server_info", name="the Dagster webserver", timeout_s=timeout_s,
               env=env, cwd=PROJECT_ROOT, poll_s=1):
        yield url
