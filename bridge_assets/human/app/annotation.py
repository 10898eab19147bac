"""The annotator's pages: the next item to judge, and the vote on it."""

import logging
from typing import Annotated, Literal

import duckdb
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from bridge_assets.human.app.auth import CurrentViewer, Viewer, checked_form, current_viewer
from bridge_assets.human.app.responses import BadRequest, busy_headers, redirect, render, session_of, validated
from bridge_assets.human.app.state import AppState, State
from bridge_assets.human.items import ItemNotFound, ItemView, load_item
from bridge_assets.human.queue import Progress, close_assignment, progress, serve
from bridge_assets.human.security import Session
from bridge_assets.human.transfer import MAX_COMMENT
from bridge_assets.human.votes import VoteRejected, record_vote
from bridge_assets.lake.store import StoreBusy
from bridge_assets.registry.datasets import LabelScale

log = logging.getLogger(__name__)
router = APIRouter()


class VoteForm(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)
    assignment_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    label: Literal["0", "1", "2", "3"]  # 2 and 3 on graded datasets only (record_vote checks)
    comment: str = Field("", max_length=MAX_COMMENT)


@router.get("/")
async def home(request: Request, viewer: CurrentViewer) -> Response:
    return redirect(request, "/annotate", viewer.session)


def annotation_page(con: duckdb.DuckDBPyConnection, state: AppState,
                    annotator_id: str) -> tuple[ItemView | None, Progress]:
    while (served := serve(con, annotator_id, state.queue, state.rng)).assignment is not None:
        assignment = served.assignment
        try:
            scale: LabelScale = "graded" if assignment.dataset in state.settings.graded else "binary"
            return load_item(con, assignment, scale), progress(con, annotator_id, state.queue,
                                                               open_pairs=served.open_after)
        except ItemNotFound as exc:
            # the queue would serve this item again and again: drop it, serve the next one
            # (never the same: nobody is served a pair twice)
            log.warning("dropped assignment %s of %s: %s", assignment.assignment_id,
                        annotator_id, exc)
            close_assignment(con, assignment.assignment_id, "dropped")
    return None, progress(con, annotator_id, state.queue, open_pairs=served.open_after)


@router.get("/annotate")
async def annotate_page(request: Request, viewer: CurrentViewer, state: State) -> Response:
    if viewer.annotator.flagged:
        return render(request, "flagged.html", viewer.session, viewer=viewer)
    item, prog = await state.db.page(annotation_page, state, viewer.annotator.annotator_id)
    if item is None:
        return render(request, "done.html", viewer.session, viewer=viewer, progress=prog)
    return render(request, "annotate.html", viewer.session, viewer=viewer, item=item,
                  progress=prog)


async def voter(request: Request, state: State) -> Viewer | None:
    """The viewer, or None while the votes store is busy (the vote's form is then kept)."""
    try:
        return await current_viewer(request, state)
    except StoreBusy as exc:
        log.warning("503 on a vote: %s", exc)
        return None


def kept_vote(request: Request, session: Session, answer: VoteForm, scale: str) -> Response:
    """The vote's form again, its choice and comment kept, with a 503: submit it again."""
    return busy_headers(request, render(
        request, "busy_vote.html", session, status=503, answer=answer,
        scale="graded" if scale == "graded" or answer.label in "23" else "binary"))


@router.post("/annotate")
async def vote(request: Request, viewer: Annotated[Viewer | None, Depends(voter)], state: State) -> Response:
    session = viewer.session if viewer else session_of(request)
    form = await checked_form(request, session)
    assert session is not None  # checked_form refuses a form without one
    answer = validated(VoteForm, form)
    if viewer is None:
        return kept_vote(request, session, answer, str(form.get("scale", "")))
    try:
        await state.db.votes(record_vote, assignment_id=answer.assignment_id,
                             annotator_id=viewer.annotator.annotator_id,
                             label=int(answer.label), comment=answer.comment or None,
                             graded=state.settings.graded, idle_cap=state.settings.idle_cap_seconds)
    except VoteRejected as exc:
        raise BadRequest(str(exc), exc.status) from None
    except StoreBusy as exc:
        log.warning("503 on a vote: %s", exc)
        return kept_vote(request, viewer.session, answer, str(form.get("scale", "")))
    # the next item, or the paused page after a failed attention check
    return redirect(request, "/annotate", viewer.session)
