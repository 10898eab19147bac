"""processes.serve: a server started as a child process is polled until it answers, and a
server that exits or stays silent is an error carrying its output's tail. Real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from bridge_assets.processes import ServerFailed, alive, free_port, serve


def test_a_server_is_yielded_once_it_answers_and_stopped_after(tmp_path):
    (tmp_path / "ready").write_text("yes")
    port = free_port()
    url = f"http://127.0.0.1:{port}/ready"
    with serve([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], url,
               name="http.server", timeout_s=30, cwd=tmp_path):
        assert httpx.get(url).text == "yes"
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)


def test_a_server_that_exits_or_stays_silent_fails_with_its_output():
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(ServerFailed, match=r"(?s)crasher exited with 3:.*model file missing"), \
            serve([sys.executable, "-c", "print('model file missing', flush=True); raise SystemExit(3)"], url,
                  name="crasher", timeout_s=30):
        pass
    with pytest.raises(ServerFailed, match=r"(?s)sleeper did not answer in 1 s:.*loading"), \
            serve([sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"], url,
                  name="sleeper", timeout_s=1):
        pass


def test_alive_tells_a_finished_process_from_this_one():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not alive(int(done.stdout)) and alive(os.getpid())
