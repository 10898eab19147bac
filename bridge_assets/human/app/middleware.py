"""What wraps every request: the body limit and the security headers."""

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import Headers
from starlette.middleware.base import RequestResponseEndpoint
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge_assets.human.app.responses import BadRequest


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


async def security_headers(request: Request, call_next: RequestResponseEndpoint) -> Response:
    response = await call_next(request)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def add_middleware(app: FastAPI, limit_for: Callable[[str], int]) -> None:
    # the body limit first, so the security headers (added after, so outside it) wrap its 413 too
    app.add_middleware(BodyLimit, limit_for=limit_for)
    app.middleware("http")(security_headers)
