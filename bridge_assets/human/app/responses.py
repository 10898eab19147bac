"""The app's answers: pages (with their session cookie and CSP), redirects, and the refusals
any route may raise, each answered by its handler with the message page."""

import logging
import secrets
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ValidationError

from bridge_assets.errors import BridgeError
from bridge_assets.human.app.state import state_of
from bridge_assets.human.security import SESSION_COOKIE, Session, new_session
from bridge_assets.lake.store import StoreBusy

TEMPLATES_DIR = Path(__file__).parent.parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=Response)
log = logging.getLogger(__name__)


# The refusals a route raises; their handlers (below) answer the browser.
class LoginRequired(BridgeError):
    def __init__(self, message: str = "login required"):
        super().__init__(message)


class Forbidden(BridgeError):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(BridgeError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def validated(model: type[M], data: Any) -> M:
    """`data` as `model`, or a 400 naming each wrong field."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise BadRequest("; ".join(f"{'.'.join(map(str, e['loc'])) or 'form'}: {e['msg']}"
                                   for e in exc.errors())) from None


def session_of(request: Request) -> Session | None:
    return state_of(request).signer.load(request.cookies.get(SESSION_COOKIE))


def new_session_for(request: Request) -> Session:
    return new_session(state_of(request).clock)


def with_cookie(request: Request, response: R, session: Session) -> R:
    state = state_of(request)
    response.set_cookie(SESSION_COOKIE, state.signer.dump(session),
                        max_age=state.signer.seconds_left(session), httponly=True,
                        samesite="strict", secure=state.settings.secure_cookies, path="/")
    return response


def render(request: Request, name: str, session: Session, status: int = 200,
           viewer: Any = None, **context: Any) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    response = templates.TemplateResponse(request, name, {
        "nonce": nonce, "csrf": session.csrf, "viewer": viewer, **context}, status_code=status)
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    return with_cookie(request, response, session)


def redirect(request: Request, url: str, session: Session) -> Response:
    return with_cookie(request, RedirectResponse(url, status_code=303), session)


def busy_headers(request: Request, response: Response) -> Response:
    response.headers["Retry-After"] = str(max(1, round(state_of(request).settings.busy_seconds)))
    return response


async def login_required(request: Request, _: LoginRequired) -> Response:
    session = new_session_for(request)
    if request.method == "GET":
        return redirect(request, "/login", session)
    return render(request, "message.html", session, status=401, title="Login required",
                  message="Log in with your personal token first.")


async def forbidden(request: Request, exc: Forbidden) -> Response:
    return render(request, "message.html", session_of(request) or new_session_for(request),
                  status=403, title="Forbidden", message=exc.message)


async def bad_request(request: Request, exc: BadRequest) -> Response:
    return render(request, "message.html", session_of(request) or new_session_for(request),
                  status=exc.status, title="Not accepted", message=exc.message)


async def busy(request: Request, exc: StoreBusy) -> Response:
    log.warning("503 on %s %s: %s", request.method, request.url.path, exc)
    return busy_headers(request, render(
        request, "message.html", session_of(request) or new_session_for(request), status=503,
        title="Busy, try again", message="The data store is busy for a moment; nothing was "
        "lost. Reload the page in a few seconds."))


def add_refusal_handlers(app: FastAPI) -> None:
    # starlette types a handler as taking any Exception; it is given the class it is added for
    app.add_exception_handler(LoginRequired, login_required)  # type: ignore[arg-type]
    app.add_exception_handler(Forbidden, forbidden)  # type: ignore[arg-type]
    app.add_exception_handler(BadRequest, bad_request)  # type: ignore[arg-type]
    app.add_exception_handler(StoreBusy, busy)  # type: ignore[arg-type]
