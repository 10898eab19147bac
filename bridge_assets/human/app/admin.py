"""The admin pages: the overview of labels, activity and annotators, and unflagging one.
Every route here needs an admin (the router's dependency), whatever its own parameters say."""

import duckdb
from fastapi import APIRouter, Depends, Request

from bridge_assets.human import annotators
from bridge_assets.human.annotators import NAME_PATTERN
from bridge_assets.human.app.auth import CurrentAdmin, checked_form, current_admin
from bridge_assets.human.app.responses import BadRequest, redirect, render
from bridge_assets.human.app.state import State
from bridge_assets.human.labels import compute_human_labels, datasets_with_escalations
from bridge_assets.human.votes import annotator_activity

router = APIRouter(dependencies=[Depends(current_admin)])


def admin_overview(con: duckdb.DuckDBPyConnection):
    datasets = [compute_human_labels(con, d) for d in datasets_with_escalations(con)]
    return datasets, annotator_activity(con).to_dicts(), annotators.list_annotators(con)


@router.get("/admin")
async def admin_page(request: Request, viewer: CurrentAdmin, state: State):
    datasets, activity, people = await state.db.run(admin_overview)
    return render(request, "admin.html", viewer.session, viewer=viewer, datasets=datasets,
                  activity=activity, annotators=people, settings=state.settings)


@router.post("/admin/annotators/{annotator_id}/unflag")
async def unflag(request: Request, annotator_id: str, viewer: CurrentAdmin, state: State):
    await checked_form(request, viewer.session)
    if not NAME_PATTERN.match(annotator_id):
        raise BadRequest("not an annotator name", 404)
    if not await state.db.votes(annotators.unflag, annotator_id):
        raise BadRequest(f"no annotator {annotator_id!r}", 404)
    return redirect(request, "/admin", viewer.session)
