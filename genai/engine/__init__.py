"""The reference's multi-request, multi-turn `Engine` API on genai's continuous-batching
scheduler (`genai.serve.scheduler`, the one ``genai serve`` uses). See docs/engine.md."""

from __future__ import annotations

from genai.engine.engine import (
    Engine,
    EngineCapabilities,
    EngineEvent,
    EngineEventBuffer,
    Request,
    RequestOptions,
    TurnOptions,
    TurnUsage,
)

__all__ = [
    "Engine",
    "EngineCapabilities",
    "EngineEvent",
    "EngineEventBuffer",
    "Request",
    "RequestOptions",
    "TurnOptions",
    "TurnUsage",
]
