"""What `bridge materialize` and `bridge run` print (bridge_assets.cli.console): a line per
partition step with its outcome, the LLM requests answered on the steps that ask a model, and
the path of the log file that holds Dagster's log; `-v` shows Dagster's log instead. On the
demo with the scripted model of tests/fixtures/scripted_demo.py (HyDE and an LLM re-ranker ask
it in the retrieval step)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bridge_assets.cli.console import KEEP_LOGS, PROGRESS_EVERY_S, StepConsole
from bridge_assets.cli.main import app
from fixtures.scripted_demo import scripted_demo_env

PROJECT_ROOT = Path(__file__).parent.parent
# a line of Dagster's log: `<time> - dagster - INFO - <job> - <run id> - ...`
RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
STEP_LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S.*?) \.\.\. (.+)$")


@pytest.fixture
def scripted_demo(data_lake, tmp_path, monkeypatch):
    with scripted_demo_env(tmp_path, monkeypatch):
        yield data_lake


def bridge(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def step_outcomes(console: str) -> list[tuple[int, int, str, str]]:
    """(n, N, assets and partition, outcome) of each step's line that is not a progress line."""
    lines = [STEP_LINE.match(line) for line in console.splitlines()]
    return [(int(m[1]), int(m[2]), m[3], m[4]) for m in lines
            if m and not re.match(r"\d+/\d+ LLM requests answered", m[4])]


def test_a_line_per_step_llm_progress_and_dagsters_log_in_a_file(scripted_demo):
    # an error before any step: nothing in its log file, which is not left behind
    unknown = CliRunner().invoke(app, ["materialize", "-d", "demo", "no_such_asset"])
    assert unknown.exit_code == 2 and "no_such_asset" in unknown.output, unknown.output
    assert "Dagster's log of this command" not in unknown.output
    assert not (scripted_demo / "logs").exists() or list((scripted_demo / "logs").iterdir()) == []
    # the log files of earlier commands (their processes gone: no pid is that high): the newest
    # KEEP_LOGS are kept, a file of someone else's too, and the oldest, whose command still runs
    earlier = [scripted_demo / "logs" / f"202601{day:02d}-120000-{99_000_000 + day}.log" for day in range(1, 26)]
    for path in earlier:
        path.parent.mkdir(exist_ok=True)
        path.write_text("an earlier command's log\n")
    (scripted_demo / "logs" / "notes.log").write_text("mine\n")
    running = scripted_demo / "logs" / f"20251231-120000-{os.getpid()}.log"
    running.write_text("a command still writing\n")

    result = bridge("materialize", "-d", "demo", "retrieval_run")
    console = result.stderr
    assert not RUN_ID.search(result.output), result.output  # no line of Dagster's log
    assert " - dagster - " not in result.output
    log_file = Path(re.search(r"^Dagster's log of this command: (\S+) \(-v shows it here\)$", console,
                              re.MULTILINE)[1])
    assert log_file.parent == scripted_demo / "logs"
    log = log_file.read_text()
    assert re.search(r" - dagster - INFO - __ASSET_JOB - [0-9a-f-]{36} - retrieval_run - hyde: 12/12 LLM "
                     r"requests answered", log), log

    steps = step_outcomes(console)
    total = steps[0][1]
    assert [n for n, *_ in steps] == list(range(1, total + 1))  # one line per step, every step
    assert all(re.fullmatch(r"done in \d+ s( \(\d+ LLM requests answered, \d+ from the ledger\))?", o)
               for *_, o in steps), console
    assert sorted(s[2] for s in steps if s[2].startswith("retrieval_run")) == [
        "retrieval_run (demo|bm25)", "retrieval_run (demo|hyde)", "retrieval_run (demo|llm_rerank_bm25)"]
    # the steps that ask the model: a progress line (answered / asked), and the count at the end
    assert re.search(r"^\[\d+/\d+\] retrieval_run \(demo\|hyde\) \.\.\. 12/12 LLM requests answered$",
                     console, re.MULTILINE), console
    assert re.search(r"retrieval_run \(demo\|llm_rerank_bm25\) \.\.\. done in \d+ s \(36 LLM requests "
                     r"answered, 0 from the ledger\)", console), console
    progress = [line for line in console.splitlines() if re.search(r"\.\.\. \d+/\d+ LLM requests", line)]
    assert len(progress) == 2, console  # each of the two LLM steps: one

    again = bridge("materialize", "-d", "demo", "retrieval_run", "-v")
    assert re.search(r" - dagster - INFO - __ASSET_JOB - [0-9a-f-]{36} - retrieval_run - hyde: 12/12 LLM "
                     r"requests answered \(12 from the ledger\)", again.output), again.output  # Dagster's log, live
    assert "Dagster's log of this command" not in again.output
    assert re.search(r"^\[\d+/\d+\] retrieval_run \(demo\|hyde\) \.\.\. done in \d+ s \(12 LLM requests "
                     r"answered, 12 from the ledger\)$", again.output, re.MULTILINE), again.output
    assert KEEP_LOGS == 20
    assert sorted((scripted_demo / "logs").iterdir()) == sorted([*earlier[-19:], log_file, running,
                                                                  scripted_demo / "logs" / "notes.log"])


def test_off_a_terminal_progress_is_printed_at_most_every_few_seconds(monkeypatch):
    import dagster as dg

    from bridge_assets.cli import console as console_module
    from bridge_assets.orchestration.runs import Step

    clock = [100.0]
    monkeypatch.setattr(console_module.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    steps = StepConsole(out)
    steps.plan(2)
    step = Step([dg.AssetKey("filtered_pool")], ["demo"])
    steps.start(step, "demo")
    steps.llm(400, 0, 0)
    for _ in range(400 // 16):  # a chunk every 0.5 s, a quarter from the ledger
        clock[0] += 0.5
        steps.llm(0, 16, 4)
    steps.end(step, "demo", "done")
    lines = out.getvalue().splitlines()
    # the first answers, then a line PROGRESS_EVERY_S later, then the step's outcome; the time
    # left is the seconds per request the model answered (the ledger's cost none) times those left
    assert PROGRESS_EVERY_S == 10
    assert lines == [
        "[1/2] filtered_pool (demo) ... 16/400 LLM requests answered (4 from the ledger), about 16 s left",
        "[1/2] filtered_pool (demo) ... 336/400 LLM requests answered (84 from the ledger), about 3 s left",
        "[1/2] filtered_pool (demo) ... done in 12 s (400 LLM requests answered, 100 from the ledger)"]


def test_on_a_terminal_the_step_line_is_rewritten_in_place(tmp_path):
    import dagster as dg

    from bridge_assets.orchestration.runs import Step

    out = io.StringIO()
    log_file = tmp_path / "x.log"
    steps = StepConsole(out, live=True, log_file=log_file)
    steps.plan(2)
    step = Step([dg.AssetKey(name) for name in ("a", "b", "c", "d", "e")], ["demo"])
    steps.start(step, "demo")  # nothing in the log file yet: it is not named
    log_file.write_text("a line of Dagster's log\n")
    steps.llm(4, 0, 0)
    steps.llm(0, 4, 0)
    steps.end(step, "demo", "done")  # now it is, once
    steps.end(Step([dg.AssetKey("report")], ["demo"]), "demo", "up to date")
    assert out.getvalue().split("\r\x1b[K") == [
        "", "[1/2] a, b, c and 2 more (demo) ...",
        "[1/2] a, b, c and 2 more (demo) ... 4/4 LLM requests answered",
        f"Dagster's log of this command: {log_file} (-v shows it here)\n",
        "[1/2] a, b, c and 2 more (demo) ... done in 0 s (4 LLM requests answered, 0 from the ledger)\n",
        "[2/2] report (demo) ... up to date\n"]


def test_the_log_file_takes_what_the_process_writes_to_its_file_descriptors(tmp_path):
    """What the JVM of Lucene or llama.cpp print (file descriptors 1 and 2, below Python) and
    what Python prints go to the log file; the step lines to the console."""
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from bridge_assets.cli.console import StepConsole, quiet_into

        with quiet_into(Path({str(tmp_path / "x.log")!r})) as console:
            os.write(1, b"INFO lucene says\\n")
            os.write(2, b"Loading weights 100%\\n")
            print("a print")
            print("a warning", file=sys.stderr)
            StepConsole(console).say("a step line")
        print("after: on the console again")
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "a step line\n" and done.stdout == "after: on the console again\n"
    assert (tmp_path / "x.log").read_text() == "INFO lucene says\nLoading weights 100%\na print\na warning\n"


def test_bridge_run_prints_a_line_per_step_then_the_summary(scripted_demo):
    first = bridge("run", "-d", "demo")
    steps = step_outcomes(first.stderr)
    total = steps[0][1]
    assert [n for n, *_ in steps] == list(range(1, total + 1)), first.stderr
    assert not RUN_ID.search(first.output) and " - dagster - " not in first.output, first.output
    # a step of many assets names the first three; the LLM requests of all its assets add up
    assert re.search(r"\] bridge_qrels, candidate_pool, debate_labels and \d+ more \(demo\) \.\.\. done in \d+ s "
                     r"\([1-9]\d* LLM requests answered, 0 from the ledger\)", first.stderr), first.stderr
    assert "holes found" in first.stdout  # the summary, on stdout as before

    logs = sorted((scripted_demo / "logs").iterdir())
    assert len(logs) == 1 and f"Dagster's log of this command: {logs[0]} " in first.stderr

    again = bridge("run", "-d", "demo")
    assert [o for *_, o in step_outcomes(again.stderr)] == ["up to date"] * total, again.stderr
    assert f"nothing changed: every asset of demo is up to date ({total} partition steps checked)" in again.stderr
    # nothing ran, Dagster said nothing: no log file is left behind, none is named
    assert "Dagster's log of this command" not in again.stderr
    assert sorted((scripted_demo / "logs").iterdir()) == logs
