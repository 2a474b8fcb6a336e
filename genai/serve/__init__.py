"""Serving: an OpenAI-compatible HTTP server with continuous batching (``genai serve``), and
its Ray Serve deployment (`genai.serve.ray_serve`). See docs/serving.md.

Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client); `batch_runner` and
`scheduler` need only numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # served lazily by __getattr__ below; checkers see the real objects
    from genai.serve.app import ServeEngine as ServeEngine
    from genai.serve.app import create_app as create_app
    from genai.serve.server import run_server as run_server

__all__ = ["ServeEngine", "create_app", "run_server"]


def __getattr__(name: str) -> Any:
    if name in ("ServeEngine", "create_app"):
        from genai.serve import app  # lazy: fastapi (the serve extra) is optional

        return getattr(app, name)
    if name == "run_server":
        from genai.serve.server import run_server  # lazy: uvicorn is optional

        return run_server
    raise AttributeError(name)
