"""The reference's enumerations, with its names and values: why a generation finished
(`FinishReason`: the scheduler's events and `genai.engine`'s) and the engine's event flags and
error codes (`EngineEventFlags`, `EngineErrorCode`). Plain data, importable from any layer."""

from __future__ import annotations

from enum import Enum, EnumMeta, Flag, IntEnum, IntFlag
from typing import Any

__all__ = ["EngineErrorCode", "EngineEventFlags", "FinishReason"]


class _ListedEnumType(EnumMeta):
    """Lists every member (a flag's zero ``NONE`` too) and the members' ``name``/``value`` in
    ``dir()`` of the class, as the reference's enumerations do."""

    def __dir__(cls) -> list[str]:
        members: Any = cls.__members__
        return sorted({*super().__dir__(), *members, "name", "value"})


class FinishReason(IntEnum, metaclass=_ListedEnumType):
    """Why a sequence stopped generating (the reference's ``og.FinishReason``)."""

    __str__ = Enum.__str__  # "FinishReason.EOS", as the reference prints it

    NONE = 0
    EOS = 1
    STOP_STRING = 2
    MAX_GENERATED_TOKENS = 3
    MAX_SESSION_TOKENS = 4
    CANCELLED = 5
    FAILED = 6


class EngineEventFlags(IntFlag, metaclass=_ListedEnumType):
    """What an engine event carries (the reference's ``og.EngineEventFlags``; combinable)."""

    __str__ = Flag.__str__

    NONE = 0
    TOKEN = 1
    TURN_FINISHED = 2
    CAPACITY_BLOCKED = 4
    FAILED = 8
    RETRYABLE = 16


class EngineErrorCode(IntEnum, metaclass=_ListedEnumType):
    """Why an engine request failed or was deferred (the reference's ``og.EngineErrorCode``)."""

    __str__ = Enum.__str__

    NONE = 0
    CAPACITY_DEFERRED = 1
    EXECUTION_CAPACITY_EXCEEDED = 2
    RETRYABLE_EXECUTION = 3
    REQUEST_UNSERVICEABLE = 4
    ENGINE_CONTRACT_FAILURE = 5
    ENGINE_EXECUTION_FAILURE = 6
