"""The admin pages: the overview of labels, the queue's impact order and stopping point,
activity and annotators, and unflagging one.
Every route here needs an admin (the router's dependency), whatever its own parameters say."""

from typing import Any

import duckdb
import polars as pl
from fastapi import APIRouter, Depends, Request, Response

from bridge_assets.human import annotators
from bridge_assets.human.annotators import NAME_PATTERN
from bridge_assets.human.app.auth import CurrentAdmin, checked_form, current_admin
from bridge_assets.human.app.responses import BadRequest, redirect, render
from bridge_assets.human.app.state import State
from bridge_assets.human.known import known_accuracy
from bridge_assets.human.labels import HumanLabels, compute_human_labels, datasets_with_escalations
from bridge_assets.human.plan import impact_order, stopping_points
from bridge_assets.human.votes import annotator_activity, judgment_times
from bridge_assets.lake.store import table_exists

router = APIRouter(dependencies=[Depends(current_admin)])


QUEUE_SHOWN = 50  # pairs of the impact order on the admin page


def admin_overview(con: duckdb.DuckDBPyConnection
                   ) -> tuple[list[HumanLabels], list[dict[str, Any]], list[annotators.Annotator]]:
    datasets = [compute_human_labels(con, d) for d in datasets_with_escalations(con)]
    return datasets, annotator_activity(con).to_dicts(), annotators.list_annotators(con)


def queue_overview(con: duckdb.DuckDBPyConnection,
                   datasets: tuple[str, ...] | None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The open pending pairs in impact order (the first QUEUE_SHOWN), and per dataset the
    labels left to the stopping point."""
    order = impact_order(con).filter(~pl.col("completed")) if table_exists(con, "pending_impact") else None
    if order is None or order.is_empty():
        return [], {}
    if datasets is not None:
        order = order.filter(pl.col("dataset").is_in(list(datasets)))
    order = order.sort(pl.col("votes") > 0, "impact", descending=True, maintain_order=True)
    return order.head(QUEUE_SHOWN).to_dicts(), stopping_points(con, datasets)


@router.get("/admin")
async def admin_page(request: Request, viewer: CurrentAdmin, state: State) -> Response:
    datasets, activity, people = await state.db.page(admin_overview)
    queue, stopping = await state.db.page(queue_overview, state.settings.datasets)
    times = (await state.db.votes(judgment_times, None, state.settings.idle_cap_seconds)).to_dicts()
    accuracy = (await state.db.votes(known_accuracy)).to_dicts()
    return render(request, "admin.html", viewer.session, viewer=viewer, datasets=datasets,
                  activity=activity, annotators=people, settings=state.settings, queue=queue,
                  stopping=stopping, times=times, accuracy=accuracy)


@router.post("/admin/annotators/{annotator_id}/unflag")
async def unflag(request: Request, annotator_id: str, viewer: CurrentAdmin, state: State) -> Response:
    await checked_form(request, viewer.session)
    if not NAME_PATTERN.match(annotator_id):
        raise BadRequest("not an annotator name", 404)
    if not await state.db.votes(annotators.unflag, annotator_id):
        raise BadRequest(f"no annotator {annotator_id!r}", 404)
    return redirect(request, "/admin", viewer.session)
