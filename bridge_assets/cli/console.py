"""What the commands that materialize assets (`bridge run`, `bridge materialize`, `bridge runs
import`, `bridge qrels import` and `remove`) print while they run: one line per partition
step, `[n/N] asset (partition) ... outcome`, and on the steps that ask a model the LLM
requests answered so far with the time left. Dagster's own log, and whatever else the process
prints meanwhile (Lucene's JVM, the model loading bars), goes to a log file under the lake
(`quiet_into`; the newest KEEP_LOGS are kept); `-v` shows Dagster's log instead, as it comes.
All of them run through `materialize` here.

On a terminal the running step's line is rewritten in place; elsewhere (a pipe, a CI log, a
test) each step prints its line when it ends, and a progress line at most every
PROGRESS_EVERY_S seconds."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from bridge_assets.errors import BridgeError
from bridge_assets.processes import alive

if TYPE_CHECKING:
    from bridge_assets.orchestration.runs import Materialized, Step

PROGRESS_EVERY_S = 10.0   # off a terminal: at most one progress line this often
REDRAW_EVERY_S = 0.25     # on a terminal: the step's line redrawn at most this often
OUTCOME_CHARS = 160       # a failure's message, cut to one line of about this length
CLEAR_LINE = "\r\033[K"   # back to the start of the line, and clear it
NAMED_ASSETS = 3          # a step of more assets names this many, then says how many more
KEEP_LOGS = 20            # log files kept under <lake>/logs: the newest; older ones are deleted
LOG_NAME = re.compile(r"\d{8}-\d{6}-\d+\.log")  # a log file log_path names (not one a person put there)

VERBOSE_HELP = "Show Dagster's log as it comes instead of writing it to a log file under the lake."


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= OUTCOME_CHARS else line[:OUTCOME_CHARS - 3] + "..."


def error_line(exc: Exception) -> str:
    """A command's error on one line: a BridgeError says what it is, anything else is named."""
    return str(exc) if isinstance(exc, BridgeError) else f"{type(exc).__name__}: {exc}"


def log_path(lake_folder: Path) -> Path:
    """A new log file of Dagster's log under the lake: logs/<date>-<time>-<process id>.log."""
    return lake_folder / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def prune_logs(folder: Path, keep: int) -> None:
    """Delete all but the `keep` newest log files in `folder` (their names start with the time
    they were opened); other files there are left alone, and so is the log of a command still
    running (its name ends with the process id)."""
    logs = sorted((path for path in folder.glob("*.log") if LOG_NAME.fullmatch(path.name)),
                  key=lambda path: path.name)
    for old in logs[:len(logs) - keep] if keep > 0 else logs:
        if not alive(int(old.stem.rsplit("-", 1)[1])):
            old.unlink(missing_ok=True)


class StepConsole:
    """The step lines, written to `out`. `live`: rewrite the running step's line in place (a
    terminal); `verbose`: Dagster's log comes between the lines, so each step also prints a
    line as it starts. `log_file` is named between two lines once something was written to it:
    a command whose steps log nothing (all up to date, a run at INFO that says nothing) leaves
    no file (quiet_into), so none is named."""

    def __init__(self, out: TextIO, *, live: bool = False, verbose: bool = False,
                 log_file: Path | None = None):
        self.out = out
        self.live = live
        self.verbose = verbose
        self.log_file = log_file
        self._log_named = False
        self.total = 0
        self.count = 0
        self._lock = threading.Lock()  # a model's answers may be reported from another thread
        self._step: str | None = None  # the running step's "[n/N] asset (partition)"
        self._started = 0.0
        self._first_asked: float | None = None
        self._asked = self._answered = self._from_ledger = 0
        self._shown = 0.0  # when its progress was last shown (0: not yet)

    def plan(self, total: int) -> None:
        self.total = total

    def _label(self, step: Step, partition_key: object) -> str:
        self.count += 1
        names = ", ".join(key.to_user_string() for key in step.keys[:NAMED_ASSETS])
        if len(step.keys) > NAMED_ASSETS:
            names += f" and {len(step.keys) - NAMED_ASSETS} more"
        where = f" ({partition_key})" if partition_key else ""
        return f"[{self.count}/{self.total}] {names}{where}"

    def start(self, step: Step, partition_key: object) -> None:
        with self._lock:
            self._name_log_file()
            self._step = self._label(step, partition_key)
            self._started = time.monotonic()
            self._first_asked = None
            self._asked = self._answered = self._from_ledger = 0
            self._shown = 0.0
            if self.live:
                self._draw(f"{self._step} ...")
            elif self.verbose:
                self._write(self._step)

    def llm(self, asked: int, answered: int, from_ledger: int) -> None:
        """A `bridge_assets.llm.progress` listener."""
        with self._lock:
            if self._step is None:
                return
            now = time.monotonic()
            if asked and self._first_asked is None:
                self._first_asked = now
            self._asked += asked
            self._answered += answered
            self._from_ledger += from_ledger
            if not self._answered:
                return
            if self.live and now - self._shown >= REDRAW_EVERY_S:
                self._draw(f"{self._step} ... {self._progress(now)}")
                self._shown = now
            elif not self.live and (not self._shown or now - self._shown >= PROGRESS_EVERY_S):
                self._write(f"{self._step} ... {self._progress(now)}")
                self._shown = now

    def _progress(self, now: float) -> str:
        text = f"{self._answered}/{self._asked} LLM requests answered"
        if self._from_ledger:
            text += f" ({self._from_ledger} from the ledger)"
        asked_now = self._answered - self._from_ledger  # answered by the model: they took the time
        left = self._asked - self._answered
        if left > 0 and asked_now > 0 and self._first_asked is not None:
            text += f", about {duration((now - self._first_asked) / asked_now * left)} left"
        return text

    def end(self, step: Step, partition_key: object, outcome: str) -> None:
        """The step's outcome: "done" (with its time), "up to date", "failed: ..."."""
        with self._lock:
            self._name_log_file()
            if outcome == "up to date":
                self._write(f"{self._label(step, partition_key)} ... up to date")
                return
            self._finish(outcome)

    def stop(self, outcome: str) -> None:
        """The running step, if any, ended with the command's error."""
        with self._lock:
            self._name_log_file()
            if self._step is not None:
                self._finish(outcome)

    def _name_log_file(self) -> None:
        if (self.log_file is not None and not self._log_named and self.log_file.exists()
                and self.log_file.stat().st_size):
            self._write(f"Dagster's log of this command: {self.log_file} (-v shows it here)")
            self._log_named = True

    def _finish(self, outcome: str) -> None:
        label = self._step or ""
        if outcome == "done":
            outcome = f"done in {duration(time.monotonic() - self._started)}"
            if self._asked:
                outcome += f" ({self._answered} LLM requests answered, {self._from_ledger} from the ledger)"
        self._write(f"{label} ... {one_line(outcome)}", fg="red" if outcome.startswith("failed") else None)
        self._step = None

    def say(self, line: str) -> None:
        """A line between the steps' (another command's turn waited for)."""
        with self._lock:
            self._write(line, fg="yellow")
            if self.live and self._step is not None:
                self._draw(f"{self._step} ...")

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be redrawn
        self.out.write(CLEAR_LINE)
        click.echo(click.style(text[:width], fg="cyan"), file=self.out, nl=False)
        self.out.flush()

    def _write(self, text: str, fg: str | None = None) -> None:
        if self.live:
            self.out.write(CLEAR_LINE)
        click.echo(click.style(text, fg=fg or "cyan"), file=self.out)
        self.out.flush()


@contextlib.contextmanager
def quiet_into(log_file: Path) -> Iterator[TextIO]:
    """For the block, send what the process prints to `log_file`: Python's sys.stdout and
    sys.stderr (Dagster's log, warnings, progress bars) and, where they are real files, file
    descriptors 1 and 2 (the JVM, llama.cpp, child processes). Yields the console as it was,
    for the step lines. A log file nothing was written to is not left behind."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        console_fd: int | None = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a test's captured stream has none
        console_fd = None
    try:
        with open(log_file, "a", buffering=1, encoding="utf-8", errors="replace") as log:
            console: TextIO = sys.stderr
            saved: list[tuple[int, int]] = []
            if console_fd is not None:
                console = os.fdopen(os.dup(console_fd), "w", buffering=1,
                                    encoding=sys.stderr.encoding or "utf-8", errors="replace")
                sys.stdout.flush()
                sys.stderr.flush()
                for fd in (1, 2):
                    saved.append((fd, os.dup(fd)))
                    os.dup2(log.fileno(), fd)
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield console
            finally:
                log.flush()
                for fd, copy in saved:
                    os.dup2(copy, fd)
                    os.close(copy)
                if console is not sys.stderr:
                    console.close()
    finally:
        if log_file.exists() and log_file.stat().st_size == 0:
            log_file.unlink()


def materialize(assets: list[str], dataset: str | None, *, verbose: bool = False,
                **options: Any) -> Materialized:
    """`orchestration.materialize(assets, dataset, **options)` as every command runs it: a line
    per step on the console (the running step's line ends with why, when it stops on an error
    or Ctrl-C), the LLM requests answered, Dagster's log in a new log file under the lake (the
    newest KEEP_LOGS kept) or, with `verbose`, on the console as it comes. Raises what
    orchestration.materialize raises."""
    from bridge_assets.lake.resource import DuckDBStore
    from bridge_assets.llm import progress as llm_progress
    from bridge_assets.llm.budget import BudgetExceeded
    from bridge_assets.orchestration import runs as orchestration

    log_file = None
    if not verbose:
        log_file = log_path(DuckDBStore().lake.folder)
        prune_logs(log_file.parent, KEEP_LOGS - 1)  # with this one, KEEP_LOGS
    with contextlib.ExitStack() as stack:
        out = sys.stderr if log_file is None else stack.enter_context(quiet_into(log_file))
        console = StepConsole(out, live=log_file is not None and out.isatty(), verbose=verbose,
                              log_file=log_file)
        stack.enter_context(llm_progress.listening(console.llm))
        try:
            return orchestration.materialize(assets, dataset, on_plan=console.plan, on_step=console.start,
                                             on_step_end=console.end, on_wait=console.say, **options)
        except BaseException as exc:  # the running step's line ends with why it stopped
            console.stop("stopped: the LLM budget is reached" if isinstance(exc, BudgetExceeded)
                         else f"failed: {error_line(exc)}" if isinstance(exc, Exception)
                         else "interrupted")
            raise
