"""The server's ASGI middleware: the request body limit (413), the last-resort error guard (an
unhandled exception becomes a 500 with OpenAI's error body) and the response counter of
``/metrics`` (`genai_http_responses_total`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from genai.serve.metrics import ServerMetrics
from genai.serve.protocol import APIError, error_body

__all__ = ["BodyLimit", "CountResponses", "ErrorGuard"]

log = logging.getLogger("genai.serve")


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered with 413, from its
    ``Content-Length`` before any of it is read, or (a chunked body) as soon as the bytes read
    pass the limit; the server discards the rest and the connection stays usable."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> APIError:
        return APIError(
            f"the request body is larger than this server's limit of {self.max_bytes} bytes",
            413,
            code="request_too_large",
        )

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = -1
                if length > self.max_bytes:
                    error = self._error()
                    await JSONResponse(error.body(), status_code=413)(scope, receive, send)
                    return
        received = 0

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._error()
            return message

        await self.app(scope, limited, send)


class ErrorGuard:
    """ASGI middleware: an exception no handler took becomes a 500 with OpenAI's error body
    (Starlette's own last-resort handler re-raises it, and uvicorn then resets the
    connection). A response already under way cannot be changed: that one still ends the
    connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except ClientDisconnect:  # the client left while its body came: no one to answer
            log.debug("client disconnected before its request body was read")
        except Exception as exc:
            if started:
                raise
            log.exception("request failed")
            body = error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error")
            await JSONResponse(body, status_code=500)(scope, receive, send)


class CountResponses:
    """ASGI middleware (the outermost): counts every HTTP response by route and status in
    ``genai_http_responses_total``, the refusals made before a request reaches its endpoint
    (401, 404, 413, 400 validation errors) included."""

    def __init__(self, app: Any, metrics: ServerMetrics, routes: Sequence[Any]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # the app's routes (filled in once they are all added)

    def _route(self, scope: dict) -> str:
        """The path template of the route serving ``scope``: the one the router chose, or
        (a refusal made before routing, e.g. 413) the first whose path matches; "other"."""
        route = scope.get("route")  # the router sets it on a match
        if route is None:
            path, root = scope["path"], scope.get("root_path", "")
            if root and path.startswith(root):  # routes match the path below the root path
                path = path[len(root) :] or "/"
            route = next((r for r in self.routes if r.path_regex.match(path)), None)
        return getattr(route, "path", None) or "other"

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.metrics.response(self._route(scope), int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)
