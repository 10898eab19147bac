"""Sessions, CSRF tokens and the server secret.

A session lives in a signed, http-only, SameSite=Strict cookie (itsdangerous). It always holds
a CSRF token (anonymous visitors get one for the login form) and, once logged in, the annotator
id and a fingerprint of their token hash, so a rotated token ends old sessions. Every form post
must send the session's CSRF token back; the server compares them in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_COOKIE = "bridge_annotate_session"
SECRET_ENV = "BRIDGE_ANNOTATE_SECRET"


@dataclass(frozen=True)
class Session:
    csrf: str
    annotator_id: str | None = None
    fingerprint: str | None = None

    @property
    def logged_in(self) -> bool:
        return self.annotator_id is not None


def new_session() -> Session:
    return Session(csrf=secrets.token_urlsafe(32))


def logged_in_session(annotator_id: str, token_hash: str) -> Session:
    """A fresh session (new CSRF token too) for a successful login."""
    return replace(new_session(), annotator_id=annotator_id, fingerprint=fingerprint(token_hash))


def fingerprint(token_hash: str) -> str:
    return token_hash[:16]


class SessionSigner:
    def __init__(self, secret: str, max_age_seconds: int):
        self._serializer = URLSafeTimedSerializer(secret, salt="bridge-annotate-session")
        self.max_age_seconds = max_age_seconds

    def dump(self, session: Session) -> str:
        return self._serializer.dumps({"c": session.csrf, "a": session.annotator_id,
                                       "f": session.fingerprint})

    def load(self, cookie: str | None) -> Session | None:
        """The session in a cookie; None when absent, forged or expired."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.max_age_seconds)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("c"), str):
            return None
        return Session(csrf=data["c"], annotator_id=data.get("a"), fingerprint=data.get("f"))


def csrf_matches(session: Session, submitted: object) -> bool:
    return isinstance(submitted, str) and bool(submitted) and hmac.compare_digest(
        session.csrf.encode(), submitted.encode())


def load_secret(data_lake: Path) -> str:
    """$BRIDGE_ANNOTATE_SECRET, else a random secret kept in <data lake>/annotate.secret
    (created on first use, readable by its owner only) so sessions survive restarts."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    path = data_lake / "annotate.secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path.read_text().strip()
