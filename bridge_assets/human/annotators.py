"""Annotators and their personal tokens."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

import duckdb

from bridge_assets.errors import BridgeError
from bridge_assets.human.tables import ensure_schema, utc_now

# Names double as annotator ids in human_votes (readable in audits); e-mail addresses from
# Label Studio exports fit too.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")


class AnnotatorError(BridgeError, ValueError):
    """A bad annotator name, or adding one that exists without asking to rotate its token."""


@dataclass(frozen=True)
class Annotator:
    annotator_id: str
    is_admin: bool
    flagged_at: datetime | None
    flag_reason: str | None
    token_hash: str | None
    session_epoch: int

    @property
    def flagged(self) -> bool:
        return self.flagged_at is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise AnnotatorError(f"annotator name {name!r} is not valid: use 1-100 letters, digits "
                             "or _ . @ + -, starting with a letter or digit")
    return name


def add_annotator(con: duckdb.DuckDBPyConnection, name: str, *, admin: bool = False,
                  rotate: bool = False) -> str:
    """Create annotator NAME (or give an existing one a new token with rotate=True, which ends
    the sessions opened with the old one); returns the personal token, shown only once."""
    ensure_schema(con)
    check_name(name)
    token = secrets.token_urlsafe(32)
    existing = get_annotator(con, name)
    if existing and not rotate:
        raise AnnotatorError(f"annotator {name!r} exists; pass rotate to issue a new token")
    if existing:
        con.execute("update annotators set token_hash = ?, is_admin = ?, "
                    "session_epoch = session_epoch + 1 where annotator_id = ?",
                    [hash_token(token), admin or existing.is_admin, name])
    else:
        con.execute("insert into annotators (annotator_id, token_hash, is_admin, created_at) "
                    "values (?, ?, ?, ?)", [name, hash_token(token), admin, utc_now()])
    return token


def ensure_external_annotator(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """An annotator known only from imported votes: no token, so they cannot log in."""
    check_name(name)
    con.execute("insert into annotators (annotator_id, token_hash, is_admin, created_at) "
                "values (?, null, false, ?) on conflict do nothing", [name, utc_now()])


_COLUMNS = "annotator_id, is_admin, flagged_at, flag_reason, token_hash, session_epoch"


def get_annotator(con: duckdb.DuckDBPyConnection, annotator_id: str) -> Annotator | None:
    row = con.execute(f"select {_COLUMNS} from annotators where annotator_id = ?",
                      [annotator_id]).fetchone()
    return Annotator(*row) if row else None


def annotator_by_token(con: duckdb.DuckDBPyConnection, token: str) -> Annotator | None:
    if not token:
        return None
    row = con.execute(f"select {_COLUMNS} from annotators where token_hash = ?",
                      [hash_token(token)]).fetchone()
    return Annotator(*row) if row else None


def end_sessions(con: duckdb.DuckDBPyConnection, annotator_id: str) -> None:
    """Log `annotator_id` out everywhere: cookies of their current epoch stop working."""
    con.execute("update annotators set session_epoch = session_epoch + 1 where annotator_id = ?",
                [annotator_id])


def list_annotators(con: duckdb.DuckDBPyConnection) -> list[Annotator]:
    return [Annotator(*row) for row in con.execute(
        f"select {_COLUMNS} from annotators order by annotator_id").fetchall()]


def flag(con: duckdb.DuckDBPyConnection, annotator_id: str, reason: str) -> None:
    con.execute("update annotators set flagged_at = ?, flag_reason = ? where annotator_id = ?",
                [utc_now(), reason, annotator_id])


def unflag(con: duckdb.DuckDBPyConnection, annotator_id: str) -> bool:
    """Let a flagged annotator work again; the votes their failed check excluded stay excluded."""
    found = con.execute("update annotators set flagged_at = null, flag_reason = null "
                        "where annotator_id = ? returning annotator_id", [annotator_id]).fetchall()
    return bool(found)
