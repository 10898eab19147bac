"""The annotation web app (FastAPI + Jinja2 templates, no front-end build).

Every page needs a valid session (a login with a personal token); admin pages need an admin
token. Every form post carries the session's CSRF token. Request bodies are limited before
anything parses them (small for forms, the upload limit on the import route only). Input is
validated with pydantic, SQL is parameterized, and database work runs one request at a time on
short DuckDB connections (DuckDB has one writer per file), off the event loop.

The app writes only the votes store (human/votes_store.py); the pipeline's bridge.duckdb is
attached read-only for the pages that show its tables. Recording a vote touches the votes store
alone, so it never waits on a pipeline write. When a file stays locked longer than
`busy_seconds` the app answers 503 (Retry-After); a vote refused so comes back as its form,
the choice and the comment kept, to submit again.
"""

# No `from __future__ import annotations`: FastAPI must see the real Depends() annotations of
# the routes defined inside create_app.

import functools
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
import duckdb
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData, Headers, UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge_assets.human import annotators, votes_store
from bridge_assets.human.annotators import NAME_PATTERN, Annotator
from bridge_assets.human.items import ItemNotFound, ItemView, load_item
from bridge_assets.human.labels import compute_human_labels, datasets_with_escalations
from bridge_assets.human.queue import (Progress, QueueSettings, close_assignment, next_assignment,
                                       progress)
from bridge_assets.human.security import (SESSION_COOKIE, Clock, Session, SessionSigner,
                                          csrf_matches, fingerprint, logged_in_session, new_session)
from bridge_assets.human.transfer import (MAX_COMMENT, ImportFailed, ImportFormat, export_votes,
                                          import_votes)
from bridge_assets.human.votes import VoteRejected, annotator_activity, record_vote
from bridge_assets.paths import Lake
from bridge_assets.store import StoreBusy

TEMPLATES_DIR = Path(__file__).parent / "templates"
IMPORT_PATH = "/admin/import"
T = TypeVar("T")
log = logging.getLogger(__name__)


class AppSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    db_path: Path                         # the pipeline's bridge.duckdb (read only)
    votes_path: Path | None = None        # the votes store; None: where the lake's config puts it
    secret: str = Field(min_length=16, repr=False)
    with_history: bool = True
    attention_rate: float = Field(0.1, ge=0.0, le=1.0)
    datasets: tuple[str, ...] | None = None
    graded: tuple[str, ...] = ()          # datasets voted on the grades 0-3 (label_scale: graded)
    lease_minutes: int = Field(30, ge=1)
    session_hours: int = Field(12, ge=1)  # a session ends this long after its login, active or not
    secure_cookies: bool = False          # set when served over HTTPS
    seed: int | None = None               # attention-check draws; fixed in tests
    max_upload_bytes: int = 10 * 2**20
    max_form_bytes: int = 64 * 2**10      # every other body (a vote's comment is 2,000 chars at most)
    busy_seconds: float = Field(3.0, gt=0)  # longest wait for a locked file before answering 503

    @property
    def votes_db(self) -> Path:
        return self.votes_path or Lake.locate(self.db_path.parent).votes_db

    def body_limit(self, path: str) -> int:
        return self.max_upload_bytes + self.max_form_bytes if path == IMPORT_PATH else self.max_form_bytes

    @property
    def queue(self) -> QueueSettings:
        return QueueSettings(with_history=self.with_history, attention_rate=self.attention_rate,
                             datasets=self.datasets, lease=timedelta(minutes=self.lease_minutes))


class LoginForm(BaseModel):
    model_config = ConfigDict(extra="ignore")
    token: str = Field(min_length=1, max_length=200)


class VoteForm(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    assignment_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    label: Literal["0", "1", "2", "3"]  # 2 and 3 on graded datasets only (record_vote checks)
    comment: str = Field("", max_length=MAX_COMMENT)


class ImportForm(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: ImportFormat = "auto"
    override: bool = False  # accept votes under the names of annotators who log in to the app


class ExportQuery(BaseModel):
    dataset: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")


class LoginRequired(Exception):
    pass


class Forbidden(Exception):
    def __init__(self, message: str):
        self.message = message


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        self.message, self.status = message, status


@dataclass(frozen=True)
class Viewer:
    annotator: Annotator
    session: Session


class BodyLimit:
    """Refuses a request body over its route's limit before anything parses it (the CSRF check
    included): at once when its Content-Length says so, else as soon as the bytes received
    exceed it (a chunked body)."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]):
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        message = f"The request body is larger than {limit} bytes, the most this page accepts."
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await PlainTextResponse(message, 413)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            event = await receive()
            received += len(event.get("body", b""))
            if received > limit:
                raise BadRequest(message, 413)  # inside the route: answered by its handler
            return event

        await self.app(scope, counted, send)


class Database:
    """Runs database work in a worker thread, one call at a time, each on a short connection
    to the votes store: `votes` on it alone, `run` with the pipeline's tables readable too.
    A file locked for longer than `busy_seconds` raises StoreBusy."""

    def __init__(self, votes_path: Path, lake_path: Path, busy_seconds: float):
        self.votes_path, self.lake_path, self.busy_seconds = votes_path, lake_path, busy_seconds
        self._lock = threading.Lock()

    def _call(self, lake: bool, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock, votes_store.connect(self.votes_path, lake_db=self.lake_path if lake else None,
                                             wait_seconds=self.busy_seconds) as con:
            return fn(con, *args, **kwargs)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._call, True, fn, *args, **kwargs))

    async def votes(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(functools.partial(self._call, False, fn, *args, **kwargs))


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'form'}: {e['msg']}" for e in exc.errors())


def create_app(settings: AppSettings, clock: Clock = time.time) -> FastAPI:
    """The app; `clock` (seconds since the epoch) dates sessions, replaced in tests."""
    app = FastAPI(title="BRIDGE annotation", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    signer = SessionSigner(settings.secret, settings.session_hours * 3600, clock)
    db = Database(settings.votes_db, settings.db_path, settings.busy_seconds)
    rng = random.Random(settings.seed)
    queue_settings = settings.queue

    moved = votes_store.prepare(settings.db_path, settings.votes_db)  # an old lake's votes move
    if moved:
        log.warning("moved %d votes from %s to the votes store %s", moved, settings.db_path,
                    settings.votes_db)

    def with_cookie(response: Response, session: Session) -> Response:
        response.set_cookie(SESSION_COOKIE, signer.dump(session), max_age=signer.seconds_left(session),
                            httponly=True, samesite="strict", secure=settings.secure_cookies,
                            path="/")
        return response

    def render(request: Request, name: str, session: Session, status: int = 200,
               viewer: Viewer | None = None, **context: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        response = templates.TemplateResponse(request, name, {
            "nonce": nonce, "csrf": session.csrf, "viewer": viewer, **context}, status_code=status)
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
            "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
        return with_cookie(response, session)

    def redirect(url: str, session: Session) -> Response:
        return with_cookie(RedirectResponse(url, status_code=303), session)

    def session_of(request: Request) -> Session | None:
        return signer.load(request.cookies.get(SESSION_COOKIE))

    async def current_viewer(request: Request) -> Viewer:
        session = session_of(request)
        if session is None or not session.logged_in:
            raise LoginRequired()
        annotator = await db.votes(annotators.get_annotator, session.annotator_id)
        if annotator is None or annotator.token_hash is None or \
                fingerprint(annotator.token_hash) != session.fingerprint or \
                annotator.session_epoch != session.epoch:
            raise LoginRequired()  # unknown annotator, a rotated token, or a logout since
        return Viewer(annotator, session)

    async def current_admin(viewer: Annotated[Viewer, Depends(current_viewer)]) -> Viewer:
        if not viewer.annotator.is_admin:
            raise Forbidden("this page needs an admin token")
        return viewer

    async def checked_form(request: Request, session: Session | None) -> FormData:
        """The posted form, once its CSRF token matches the session's."""
        form = await request.form(max_files=1, max_fields=20)
        if session is None or not csrf_matches(session, form.get("csrf_token")):
            raise Forbidden("the form's CSRF token is missing or wrong; reload the page and retry")
        return form

    # added first, so the security headers below wrap its 413 too
    app.add_middleware(BodyLimit, limit_for=settings.body_limit)

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, _: LoginRequired):
        session = new_session(clock)
        if request.method == "GET":
            return redirect("/login", session)
        return render(request, "message.html", session, status=401, title="Login required",
                      message="Log in with your personal token first.")

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Forbidden):
        return render(request, "message.html", session_of(request) or new_session(clock), status=403,
                      title="Forbidden", message=exc.message)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return render(request, "message.html", session_of(request) or new_session(clock),
                      status=exc.status, title="Not accepted", message=exc.message)

    def busy_headers(response: Response) -> Response:
        response.headers["Retry-After"] = str(max(1, round(settings.busy_seconds)))
        return response

    @app.exception_handler(StoreBusy)
    async def busy(request: Request, exc: StoreBusy):
        log.warning("503 on %s %s: %s", request.method, request.url.path, exc)
        return busy_headers(render(
            request, "message.html", session_of(request) or new_session(clock), status=503,
            title="Busy, try again", message="The data store is busy for a moment; nothing was "
            "lost. Reload the page in a few seconds."))

    # --- login -----------------------------------------------------------------------------

    @app.get("/login")
    async def login_page(request: Request):
        session = session_of(request) or new_session(clock)
        if session.logged_in:
            return redirect("/annotate", session)
        return render(request, "login.html", session)

    @app.post("/login")
    async def login(request: Request):
        session = session_of(request)
        form = await checked_form(request, session)
        try:
            token = LoginForm.model_validate(dict(form)).token
        except ValidationError as exc:
            raise BadRequest(_validation_message(exc)) from None
        annotator = await db.votes(annotators.annotator_by_token, token)
        if annotator is None:
            return render(request, "login.html", session, status=401, error="Unknown token.")
        return redirect("/annotate", logged_in_session(annotator.annotator_id, annotator.token_hash,
                                                       annotator.session_epoch, clock))

    @app.post("/logout")
    async def logout(request: Request, viewer: Annotated[Viewer, Depends(current_viewer)]):
        await checked_form(request, viewer.session)
        # the cookie is stateless: a copy of it works until the epoch moves on
        await db.votes(annotators.end_sessions, viewer.annotator.annotator_id)
        return redirect("/login", new_session(clock))

    # --- annotation ------------------------------------------------------------------------

    @app.get("/")
    async def home(viewer: Annotated[Viewer, Depends(current_viewer)]):
        return redirect("/annotate", viewer.session)

    def annotation_page(con: duckdb.DuckDBPyConnection,
                        annotator_id: str) -> tuple[ItemView | None, Progress]:
        while (assignment := next_assignment(con, annotator_id, queue_settings, rng)) is not None:
            try:
                scale = "graded" if assignment.dataset in settings.graded else "binary"
                return load_item(con, assignment, scale), progress(con, annotator_id, queue_settings)
            except ItemNotFound as exc:
                # the queue would serve this item again and again: drop it, serve the next one
                # (never the same: nobody is served a pair twice)
                log.warning("dropped assignment %s of %s: %s", assignment.assignment_id,
                            annotator_id, exc)
                close_assignment(con, assignment.assignment_id, "dropped")
        return None, progress(con, annotator_id, queue_settings)

    @app.get("/annotate")
    async def annotate_page(request: Request, viewer: Annotated[Viewer, Depends(current_viewer)]):
        if viewer.annotator.flagged:
            return render(request, "flagged.html", viewer.session, viewer=viewer)
        item, prog = await db.run(annotation_page, viewer.annotator.annotator_id)
        if item is None:
            return render(request, "done.html", viewer.session, viewer=viewer, progress=prog)
        return render(request, "annotate.html", viewer.session, viewer=viewer, item=item,
                      progress=prog)

    async def voter(request: Request) -> Viewer | None:
        """The viewer, or None while the votes store is busy (the vote's form is then kept)."""
        try:
            return await current_viewer(request)
        except StoreBusy as exc:
            log.warning("503 on a vote: %s", exc)
            return None

    def kept_vote(request: Request, session: Session, answer: VoteForm, scale: str) -> Response:
        """The vote's form again, its choice and comment kept, with a 503: submit it again."""
        return busy_headers(render(request, "busy_vote.html", session, status=503, answer=answer,
                                   scale="graded" if scale == "graded" or answer.label in "23" else "binary"))

    @app.post("/annotate")
    async def vote(request: Request, viewer: Annotated[Viewer | None, Depends(voter)]):
        session = viewer.session if viewer else session_of(request)
        form = await checked_form(request, session)
        try:
            answer = VoteForm.model_validate(dict(form))
        except ValidationError as exc:
            raise BadRequest(_validation_message(exc)) from None
        if viewer is None:
            return kept_vote(request, session, answer, str(form.get("scale", "")))
        try:
            await db.votes(record_vote, assignment_id=answer.assignment_id,
                           annotator_id=viewer.annotator.annotator_id,
                           label=int(answer.label), comment=answer.comment or None,
                           graded=settings.graded)
        except VoteRejected as exc:
            raise BadRequest(str(exc), exc.status) from None
        except StoreBusy as exc:
            log.warning("503 on a vote: %s", exc)
            return kept_vote(request, viewer.session, answer, str(form.get("scale", "")))
        # the next item, or the paused page after a failed attention check
        return redirect("/annotate", viewer.session)

    # --- admin -----------------------------------------------------------------------------

    def admin_overview(con: duckdb.DuckDBPyConnection):
        datasets = [compute_human_labels(con, d) for d in datasets_with_escalations(con)]
        return datasets, annotator_activity(con).to_dicts(), annotators.list_annotators(con)

    @app.get("/admin")
    async def admin_page(request: Request, viewer: Annotated[Viewer, Depends(current_admin)]):
        datasets, activity, people = await db.run(admin_overview)
        return render(request, "admin.html", viewer.session, viewer=viewer, datasets=datasets,
                      activity=activity, annotators=people, settings=settings)

    async def export(fmt: Literal["csv", "json"], request: Request) -> Response:
        try:
            query = ExportQuery.model_validate(dict(request.query_params))
        except ValidationError as exc:
            raise BadRequest(_validation_message(exc)) from None
        body = await db.votes(export_votes, fmt, query.dataset)
        media = "text/csv" if fmt == "csv" else "application/json"
        return Response(body, media_type=f"{media}; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="human_votes.{fmt}"'})

    @app.get("/admin/export.csv")
    async def export_csv(request: Request, _: Annotated[Viewer, Depends(current_admin)]):
        return await export("csv", request)

    @app.get("/admin/export.json")
    async def export_json(request: Request, _: Annotated[Viewer, Depends(current_admin)]):
        return await export("json", request)

    @app.post(IMPORT_PATH)
    async def import_page(request: Request, viewer: Annotated[Viewer, Depends(current_admin)]):
        form = await checked_form(request, viewer.session)
        try:
            options = ImportForm.model_validate(dict(form))
        except ValidationError as exc:
            raise BadRequest(_validation_message(exc)) from None
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or not upload.filename:
            raise BadRequest("choose a votes file to import")
        content = await upload.read(settings.max_upload_bytes + 1)
        if len(content) > settings.max_upload_bytes:
            raise BadRequest(f"the file is larger than {settings.max_upload_bytes} bytes", 413)
        name = Path(upload.filename).name
        try:
            added = await db.run(import_votes, content, name, options.format,
                                 override=options.override, graded=settings.graded)
        except ImportFailed as exc:
            return render(request, "import_result.html", viewer.session, status=400, viewer=viewer,
                          source=name, errors=exc.errors, added=0,
                          token_holders=exc.token_holders)
        return render(request, "import_result.html", viewer.session, viewer=viewer, source=name,
                      errors=[], added=added)

    @app.post("/admin/annotators/{annotator_id}/unflag")
    async def unflag(request: Request, annotator_id: str,
                     viewer: Annotated[Viewer, Depends(current_admin)]):
        await checked_form(request, viewer.session)
        if not NAME_PATTERN.match(annotator_id):
            raise BadRequest("not an annotator name", 404)
        if not await db.votes(annotators.unflag, annotator_id):
            raise BadRequest(f"no annotator {annotator_id!r}", 404)
        return redirect("/admin", viewer.session)

    return app
