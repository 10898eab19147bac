"""Sessions, CSRF tokens and the server secret.

A session lives in a signed, http-only, SameSite=Strict cookie (itsdangerous). It always holds
a CSRF token (anonymous visitors get one for the login form) and the time it was issued; once
logged in, also the annotator id, a fingerprint of their token hash and their session epoch, so a
rotated token or a logout (both bump the epoch) ends old sessions although the cookie itself is
stateless. The cookie is re-signed on every response, but its issue time never moves: a session
ends a fixed lifetime after the login however active it is. Every form post must send the
session's CSRF token back; the server compares them in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from itsdangerous import BadData, URLSafeSerializer

from bridge_assets.settings import env

SESSION_COOKIE = "bridge_annotate_session"
SECRET_ENV = "BRIDGE_ANNOTATE_SECRET"


Clock = Callable[[], float]


@dataclass(frozen=True)
class Session:
    csrf: str
    issued_at: float                 # seconds since the epoch; fixed for the session's life
    annotator_id: str | None = None
    fingerprint: str | None = None
    epoch: int | None = None         # the annotator's session_epoch at login

    @property
    def logged_in(self) -> bool:
        return self.annotator_id is not None


def new_session(clock: Clock = time.time) -> Session:
    return Session(csrf=secrets.token_urlsafe(32), issued_at=clock())


def logged_in_session(annotator_id: str, token_hash: str, epoch: int,
                      clock: Clock = time.time) -> Session:
    """A fresh session (new CSRF token too) for a successful login."""
    return replace(new_session(clock), annotator_id=annotator_id,
                   fingerprint=fingerprint(token_hash), epoch=epoch)


def fingerprint(token_hash: str) -> str:
    return token_hash[:16]


class SessionSigner:
    def __init__(self, secret: str, lifetime_seconds: int, clock: Clock = time.time):
        self._serializer = URLSafeSerializer(secret, salt="bridge-annotate-session")
        self.lifetime_seconds = lifetime_seconds
        self.clock = clock

    def dump(self, session: Session) -> str:
        return self._serializer.dumps({"c": session.csrf, "i": session.issued_at,
                                       "a": session.annotator_id, "f": session.fingerprint,
                                       "e": session.epoch})

    def seconds_left(self, session: Session) -> int:
        return max(0, int(session.issued_at + self.lifetime_seconds - self.clock()))

    def load(self, cookie: str | None) -> Session | None:
        """The session in a cookie; None when absent, forged or past its lifetime."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie)
        except BadData:  # a bad signature, or a payload that is not ours
            return None
        if not isinstance(data, dict) or not isinstance(data.get("c"), str) or \
                not isinstance(data.get("i"), int | float):
            return None  # includes cookies from before issue times (they carried none)
        session = Session(csrf=data["c"], issued_at=data["i"], annotator_id=data.get("a"),
                          fingerprint=data.get("f"), epoch=data.get("e"))
        return session if self.seconds_left(session) > 0 else None


def csrf_matches(session: Session, submitted: object) -> bool:
    return isinstance(submitted, str) and bool(submitted) and hmac.compare_digest(
        session.csrf.encode(), submitted.encode())


def load_secret(data_lake: Path) -> str:
    """$BRIDGE_ANNOTATE_SECRET, else a random secret kept in <data lake>/annotate.secret
    (created on first use, readable by its owner only) so sessions survive restarts."""
    if secret := env.raw(SECRET_ENV):
        return secret
    path = data_lake / "annotate.secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path.read_text().strip()
