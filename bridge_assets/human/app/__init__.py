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

Where things are: a page goes in the router of its audience, auth.py (login, logout),
annotation.py (the annotator's pages), admin.py and import_export.py (admins only: their
routers refuse anyone else). A route asks for the login it needs with `CurrentViewer` or
`CurrentAdmin` (auth.py) and for the app's shared state with `State` (state.py: the settings,
the database). responses.py renders pages and answers the refusals; middleware.py wraps every
request; settings.py holds what the app is built with.
"""

import logging
import time

from fastapi import FastAPI

from bridge_assets.human import votes_store
from bridge_assets.human.app import admin, annotation, auth, import_export
from bridge_assets.human.app.config import AppSettings
from bridge_assets.human.app.middleware import add_middleware
from bridge_assets.human.app.responses import add_refusal_handlers
from bridge_assets.human.app.state import AppState
from bridge_assets.human.security import Clock

__all__ = ["AppSettings", "annotation_app"]
log = logging.getLogger(__name__)


def annotation_app(settings: AppSettings, clock: Clock = time.time) -> FastAPI:
    """The app; `clock` (seconds since the epoch) dates sessions, replaced in tests."""
    app = FastAPI(title="BRIDGE annotation", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.bridge = AppState(settings, clock)

    moved = votes_store.prepare(settings.lake)  # an old lake's votes move
    if moved:
        log.warning("moved %d votes from %s to the votes store %s", moved, settings.lake.duckdb,
                    settings.lake.votes_db)

    add_middleware(app, limit_for=settings.body_limit)
    add_refusal_handlers(app)
    for module in (auth, annotation, admin, import_export):
        app.include_router(module.router)
    return app
