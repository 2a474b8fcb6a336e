"""The chat page ``genai serve`` serves at ``/`` (``--no-webui`` turns it off).

Static files beside this module (``index.html``, ``app.js``, ``markdown.js``, ``style.css``;
written for genai, no build step, no CDN): the page talks to the same OpenAI endpoints as any
client (``/v1/models``, ``/v1/chat/completions`` with ``stream: true``) and sends the API key
the user enters when the server has one. ``/webui/config.json`` tells the page whether a key is
needed and whether the model takes images (`accepts_images`: the hook vision models set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse

__all__ = ["ASSETS", "WEBUI_DIR", "accepts_images", "mount_webui"]

WEBUI_DIR = Path(__file__).resolve().parent

#: The files served under ``/webui/``: name -> media type (nothing else in the folder is).
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

#: The page runs only its own scripts and styles and talks only to this server.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def accepts_images(engine: Any) -> bool:
    """Whether the served model takes images (the page then offers an image upload): the
    engine's ``accepts_images`` attribute, which vision-language serving sets; false
    without it."""
    return bool(getattr(engine, "accepts_images", False))


def mount_webui(app: FastAPI, engine: Any, *, api_key_required: bool) -> None:
    """Add ``GET /`` (the page), ``/webui/config.json`` and the page's assets to ``app``."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(WEBUI_DIR / "index.html", media_type="text/html", headers=_HEADERS)

    @app.get("/webui/config.json", include_in_schema=False)
    async def config() -> JSONResponse:
        return JSONResponse(
            {"api_key_required": api_key_required, "vision": accepts_images(engine)},
            headers={"Cache-Control": "no-store"},
        )

    for name, media_type in ASSETS.items():
        app.add_api_route(
            f"/webui/{name}",
            _asset(name, media_type),
            methods=["GET"],
            include_in_schema=False,
        )


def _asset(name: str, media_type: str) -> Any:
    async def asset() -> FileResponse:
        return FileResponse(WEBUI_DIR / name, media_type=media_type, headers=_HEADERS)

    asset.__name__ = f"webui_{name.replace('.', '_')}"
    return asset
