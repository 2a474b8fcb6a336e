"""The chat page ``genai serve`` serves at ``/`` (``--no-webui`` turns it off).

Static files beside this module (``index.html``, ``app.js``, ``markdown.js``, ``style.css``;
written for genai, no build step, no CDN): the page talks to the same OpenAI endpoints as any
client (``/v1/models``, ``/v1/chat/completions`` with ``stream: true``) and sends the API key
the user enters when the server has one. ``/webui/config.json`` tells the page whether a key is
needed, whether the model takes images (`accepts_images`) and the server's limits on them, so
the page refuses an image the server would refuse before sending it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse

from genai.multimodal.images import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE
from genai.serve.images import MAX_IMAGE_BYTES, MAX_IMAGES

__all__ = ["ASSETS", "WEBUI_DIR", "accepts_images", "mount_webui", "page_config"]

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
    engine's ``accepts_images`` (`ServeEngine.accepts_images`: its model's multimodal processor
    takes images); false for an engine without it."""
    return bool(getattr(engine, "accepts_images", False))


def page_config(engine: Any, *, api_key_required: bool, max_body_bytes: int) -> dict[str, Any]:
    """What ``/webui/config.json`` tells the page: whether a key is needed, whether the model
    takes images, and the limits the server holds image parts to (`genai.serve.images`, the
    decoder's `MAX_IMAGE_SIDE` / `MAX_IMAGE_PIXELS`, the request body's ``max_body_bytes``)."""
    return {
        "api_key_required": api_key_required,
        "accepts_images": accepts_images(engine),
        "max_body_bytes": int(max_body_bytes),
        "max_image_bytes": MAX_IMAGE_BYTES,
        "max_images": MAX_IMAGES,
        "max_image_side": MAX_IMAGE_SIDE,
        "max_image_pixels": MAX_IMAGE_PIXELS,
        "image_types": ["image/png", "image/jpeg"],
    }


def mount_webui(
    app: FastAPI, engine: Any, *, api_key_required: bool, max_body_bytes: int = 4 << 20
) -> None:
    """Add ``GET /`` (the page), ``/webui/config.json`` and the page's assets to ``app``
    (``max_body_bytes``: the app's request body limit, which the page checks before sending)."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(WEBUI_DIR / "index.html", media_type="text/html", headers=_HEADERS)

    @app.get("/webui/config.json", include_in_schema=False)
    async def config() -> JSONResponse:
        settings = page_config(
            engine, api_key_required=api_key_required, max_body_bytes=max_body_bytes
        )
        return JSONResponse(settings, headers={"Cache-Control": "no-store"})

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
