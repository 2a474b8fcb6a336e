"""The reference's telemetry switches. genai collects and sends no telemetry of any kind, so
both are no-ops, kept so scripts that call them run unchanged."""

from __future__ import annotations

__all__ = ["disable_telemetry_events", "enable_telemetry_events"]


def enable_telemetry_events() -> None:
    """No-op: genai sends no telemetry events (the reference's switch for its own)."""


def disable_telemetry_events() -> None:
    """No-op: genai sends no telemetry events, so there is nothing to switch off."""
