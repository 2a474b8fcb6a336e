"""Serving: an OpenAI-compatible HTTP server with continuous batching (``genai serve``), and
its Ray Serve deployment (`genai.serve.ray_serve`). See docs/serving.md.

Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client); `batch_runner` and
`scheduler` need only numpy.
"""

from __future__ import annotations

__all__ = ["ServeEngine", "create_app", "run_server"]


def __getattr__(name: str):
    if name in ("ServeEngine", "create_app"):
        from genai.serve import app  # lazy: fastapi (the serve extra) is optional

        return getattr(app, name)
    if name == "run_server":
        from genai.serve.server import run_server  # lazy: uvicorn is optional

        return run_server
    raise AttributeError(name)
