"""Who hears, in this process, how the LLM requests of the assets it runs are answered: the
command line's step line (bridge_assets.cli.console) shows "answered / asked" and the time left.

The callers that batch requests report them: `asked(n)` when a batch is handed over, then
`answered(results)` as each of its chunks comes back. With no listener (under the daemon, in
the UI's runs) a report costs nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from bridge_assets.llm.types import LLMResult

# (requests asked, requests answered, of those answered from the ledger): increments
Listener = Callable[[int, int, int], None]

_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def asked(requests: int) -> None:
    for listener in list(_listeners):
        listener(requests, 0, 0)


def answered(results: Sequence[LLMResult]) -> None:
    for listener in list(_listeners):
        listener(0, len(results), sum(1 for r in results if r.cached))
