"""The admin's votes files: export (CSV or JSON) and import. Every route here needs an admin
(the router's dependency)."""

from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import UploadFile

from bridge_assets.human.app.auth import CurrentAdmin, checked_form, current_admin
from bridge_assets.human.app.config import IMPORT_PATH
from bridge_assets.human.app.responses import BadRequest, render, validated
from bridge_assets.human.app.state import AppState, State
from bridge_assets.human.transfer import ImportFailed, ImportFormat, export_votes, import_votes

router = APIRouter(dependencies=[Depends(current_admin)])


class ImportForm(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: ImportFormat = "auto"
    override: bool = False  # accept votes under the names of annotators who log in to the app


class ExportQuery(BaseModel):
    dataset: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")


async def export(fmt: Literal["csv", "json"], request: Request, state: AppState) -> Response:
    query = validated(ExportQuery, request.query_params)
    body = await state.db.votes(export_votes, fmt, query.dataset)
    media = "text/csv" if fmt == "csv" else "application/json"
    return Response(body, media_type=f"{media}; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="human_votes.{fmt}"'})


@router.get("/admin/export.csv")
async def export_csv(request: Request, state: State) -> Response:
    return await export("csv", request, state)


@router.get("/admin/export.json")
async def export_json(request: Request, state: State) -> Response:
    return await export("json", request, state)


@router.post(IMPORT_PATH)
async def import_page(request: Request, viewer: CurrentAdmin, state: State) -> Response:
    form = await checked_form(request, viewer.session)
    options = validated(ImportForm, form)
    upload = form.get("file")
    if not isinstance(upload, UploadFile) or not upload.filename:
        raise BadRequest("choose a votes file to import")
    limit = state.settings.max_upload_bytes
    content = await upload.read(limit + 1)
    if len(content) > limit:
        raise BadRequest(f"the file is larger than {limit} bytes", 413)
    name = Path(upload.filename).name
    try:
        added = await state.db.run(import_votes, content, name, options.format,
                                   override=options.override, graded=state.settings.graded)
    except ImportFailed as exc:
        return render(request, "import_result.html", viewer.session, status=400, viewer=viewer,
                      source=name, errors=exc.errors, added=0, token_holders=exc.token_holders)
    return render(request, "import_result.html", viewer.session, viewer=viewer, source=name,
                  errors=[], added=added)
