"""Reading users' text files: UTF-8 (a byte order mark on the first line dropped), gzip when
the name ends in `.gz`, lines ending with \n, \r\n or \r, and two caps that stop a broken file (a
missing line break, a binary blob) from passing for data:
  MAX_LINE_BYTES  one line, its line break excluded: 8 MiB
  MAX_TEXT_CHARS  one text (a document's text or title, a query, an id): 1,000,000 characters
A dataset entry overrides them with `max_line_bytes` / `max_text_chars`, else the environment
with BRIDGE_MAX_LINE_BYTES / BRIDGE_MAX_TEXT_CHARS. Problems are DatasetErrors naming the file
and the line. Shared by the dataset loaders (bridge_assets.ingest.loaders) and the TREC files
(bridge_assets.trec_io).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from bridge_assets.errors import DatasetError
from bridge_assets.settings import BY_NAME, env

MAX_LINE_BYTES = int(BY_NAME["BRIDGE_MAX_LINE_BYTES"].default)
MAX_TEXT_CHARS = int(BY_NAME["BRIDGE_MAX_TEXT_CHARS"].default)


# --- size caps -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """Caps on one line (bytes, its line break excluded) and on one text (characters)."""

    line_bytes: int
    text_chars: int


def env_cap(name: str, default: int) -> int:
    raw = env.raw(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise DatasetError(f"{name}={raw!r} is not a positive whole number", field=name)
    return value


def limits_for(spec: Any = None) -> Limits:
    """The dataset entry's caps (a DatasetSpec's max_line_bytes / max_text_chars), else the
    environment's, else the module's defaults."""
    line_bytes = env_cap("BRIDGE_MAX_LINE_BYTES", MAX_LINE_BYTES)
    text_chars = env_cap("BRIDGE_MAX_TEXT_CHARS", MAX_TEXT_CHARS)
    if spec is not None:
        line_bytes = spec.max_line_bytes or line_bytes
        text_chars = spec.max_text_chars or text_chars
    return Limits(line_bytes, text_chars)


# Set by the dataset loaders for the dataset being loaded, so every reader sees its caps
# without each loader passing them through.
_LIMITS: ContextVar[Limits | None] = ContextVar("bridge_ingest_limits", default=None)


@contextlib.contextmanager
def using_limits(limits: Limits) -> Iterator[None]:
    token = _LIMITS.set(limits)
    try:
        yield
    finally:
        _LIMITS.reset(token)


def current_limits() -> Limits:
    return _LIMITS.get() or limits_for()


P = ParamSpec("P")
T = TypeVar("T")


def capped(loader: Callable[P, T]) -> Callable[P, T]:
    """Fix the caps for one call of `loader` (the environment's, unless load_dataset set the
    dataset's), so each text checked does not read the environment again."""
    @functools.wraps(loader)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        if _LIMITS.get() is not None:
            return loader(*args, **kwargs)
        with using_limits(limits_for()):
            return loader(*args, **kwargs)
    return run


# --- reading lines -----------------------------------------------------------------------

def decode(raw: str, path: Path, line: int) -> str:
    """`raw` is the line's bytes as latin-1 characters (see lines()); UTF-8 decode them."""
    data = raw.encode("latin-1")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at byte {exc.start + 1} "
                           f"of the line): save the file as UTF-8", path, line) from None
    return text.removeprefix("\ufeff") if line == 1 else text


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line break) of each line of a UTF-8 file, gzip or not.

    Read as latin-1, which maps each byte to one character: lines split where text mode would
    split them (UTF-8 never has \n or \r inside a character), the cap counts bytes, and a byte
    that is not UTF-8 is found on its own line instead of somewhere in a decoded block.
    """
    if not path.is_file():
        raise DatasetError("file not found", path)
    limit = current_limits().line_bytes
    number = 0
    try:
        with (gzip.open(path, "rt", encoding="latin-1") if path.suffix == ".gz"
              else path.open(encoding="latin-1")) as handle:
            while raw := handle.readline(limit + 1):
                number += 1
                body = raw.removesuffix("\n")
                if len(body) > limit:
                    raise DatasetError(f"line longer than {limit:,} bytes (raise the cap with "
                                       f"max_line_bytes or BRIDGE_MAX_LINE_BYTES)", path, number)
                yield number, decode(body, path, number)
    except (OSError, EOFError, zlib.error) as exc:  # e.g. a damaged or truncated gzip file
        raise DatasetError(f"cannot read the file ({exc})", path, number + 1) from None
