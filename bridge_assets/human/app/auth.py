"""Who is asking: the dependencies a route declares to need a login (`CurrentViewer`) or an
admin (`CurrentAdmin`), the CSRF check of posted forms, and the login and logout pages."""

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import FormData

from bridge_assets.human import annotators
from bridge_assets.human.annotators import Annotator
from bridge_assets.human.app.responses import (
    Forbidden,
    LoginRequired,
    new_session_for,
    redirect,
    render,
    session_of,
    validated,
)
from bridge_assets.human.app.state import State
from bridge_assets.human.security import Session, csrf_matches, fingerprint, logged_in_session


@dataclass(frozen=True)
class Viewer:
    annotator: Annotator
    session: Session


class LoginForm(BaseModel):
    model_config = ConfigDict(extra="ignore")
    token: str = Field(min_length=1, max_length=200)


async def current_viewer(request: Request, state: State) -> Viewer:
    session = session_of(request)
    if session is None or not session.logged_in:
        raise LoginRequired()
    annotator = await state.db.votes(annotators.get_annotator, session.annotator_id)
    if annotator is None or annotator.token_hash is None or \
            fingerprint(annotator.token_hash) != session.fingerprint or \
            annotator.session_epoch != session.epoch:
        raise LoginRequired()  # unknown annotator, a rotated token, or a logout since
    return Viewer(annotator, session)


CurrentViewer = Annotated[Viewer, Depends(current_viewer)]


async def current_admin(viewer: CurrentViewer) -> Viewer:
    if not viewer.annotator.is_admin:
        raise Forbidden("this page needs an admin token")
    return viewer


CurrentAdmin = Annotated[Viewer, Depends(current_admin)]


async def checked_form(request: Request, session: Session | None) -> FormData:
    """The posted form, once its CSRF token matches the session's."""
    form = await request.form(max_files=1, max_fields=20)
    if session is None or not csrf_matches(session, form.get("csrf_token")):
        raise Forbidden("the form's CSRF token is missing or wrong; reload the page and retry")
    return form


router = APIRouter()


@router.get("/login")
async def login_page(request: Request) -> Response:
    session = session_of(request) or new_session_for(request)
    if session.logged_in:
        return redirect(request, "/annotate", session)
    return render(request, "login.html", session)


@router.post("/login")
async def login(request: Request, state: State) -> Response:
    session = session_of(request)
    form = await checked_form(request, session)
    assert session is not None  # checked_form refuses a form without one
    token = validated(LoginForm, form).token
    annotator = await state.db.votes(annotators.annotator_by_token, token)
    if annotator is None:
        return render(request, "login.html", session, status=401, error="Unknown token.")
    assert annotator.token_hash is not None  # found by its token
    return redirect(request, "/annotate", logged_in_session(
        annotator.annotator_id, annotator.token_hash, annotator.session_epoch, state.clock))


@router.post("/logout")
async def logout(request: Request, viewer: CurrentViewer, state: State) -> Response:
    await checked_form(request, viewer.session)
    # the cookie is stateless: a copy of it works until the epoch moves on
    await state.db.votes(annotators.end_sessions, viewer.annotator.annotator_id)
    return redirect(request, "/login", new_session_for(request))
