"""Names of the reference's API for features genai does not run yet.

They exist, with the reference's members, so ``import genai as og`` scripts import and
``hasattr`` checks pass; creating one or calling any of its members raises
NotImplementedError naming the feature, the issue that plans it, and docs/differences.md.

* multimodal vision (`Images`): issue 19;
* streaming speech feature extraction (`StreamingProcessor`: Moonshine / Nemotron): issue 18;
* speculative decoding (`MtpGenerator`): issue 20;
* the reference's continuous-batching `Engine` and its request, turn and event classes:
  issue 21 (``genai serve`` batches requests today).

Other modules raise the same errors for the reference's methods of these features on
classes genai does implement (e.g. ``Model.create_multimodal_processor``): use
`not_implemented`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from genai.errors import UnsupportedFeatureError

__all__ = [
    "FEATURES",
    "Engine",
    "EngineCapabilities",
    "EngineEvent",
    "EngineEventBuffer",
    "Feature",
    "Images",
    "MtpGenerator",
    "Request",
    "RequestOptions",
    "StreamingProcessor",
    "TurnOptions",
    "TurnUsage",
    "not_implemented",
]


@dataclass(frozen=True)
class Feature:
    """A reference feature genai does not run yet, and the plan for it."""

    name: str
    plan: str

    def error(self, what: str) -> UnsupportedFeatureError:
        """The error to raise for ``what`` (e.g. ``"Images.open"``)."""
        return UnsupportedFeatureError(
            f"{what} is not supported by genai yet: {self.name} ({self.plan}); "
            "see docs/differences.md"
        )


#: The features, by key.
FEATURES: dict[str, Feature] = {
    "vision": Feature("multimodal vision models (image inputs)", "planned in issue 19"),
    "speech": Feature("speech models (Whisper, audio inputs)", "planned in issue 18"),
    "multimodal": Feature(
        "multimodal models (image and audio inputs)",
        "planned in issues 19 (vision) and 18 (speech)",
    ),
    "speculative": Feature("speculative decoding (draft models, MTP heads)", "planned in issue 20"),
    "engine": Feature(
        "the reference's continuous-batching Engine API",
        "planned in issue 21; `genai serve` batches requests today",
    ),
}


def not_implemented(what: str, feature: str) -> NotImplementedError:
    """The NotImplementedError for ``what`` of the feature keyed ``feature`` in `FEATURES`."""
    return FEATURES[feature].error(what)


_C = TypeVar("_C", bound=type)


def _unsupported(
    feature: str,
    *,
    methods: tuple[str, ...] = (),
    properties: tuple[str, ...] = (),
    staticmethods: tuple[str, ...] = (),
) -> Callable[[_C], _C]:
    """Class decorator: the class cannot be created, and each named member (an instance
    method, a read-only property or a static method, as in the reference) raises."""
    info = FEATURES[feature]

    def decorate(cls: _C) -> _C:
        name = cls.__name__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
            raise info.error(name)

        cls.__init__ = __init__  # type: ignore[misc]
        for member in methods:
            setattr(cls, member, _function(info, f"{name}.{member}"))
        for member in properties:
            setattr(cls, member, property(_function(info, f"{name}.{member}")))
        for member in staticmethods:
            setattr(cls, member, staticmethod(_function(info, f"{name}.{member}")))
        return cls

    return decorate


def _function(info: Feature, what: str) -> Callable[..., NoReturn]:
    """A function that raises ``info``'s error for ``what`` whatever its arguments (so it
    serves as an instance method, a property getter and a static method alike)."""

    def function(*args: Any, **kwargs: Any) -> NoReturn:
        raise info.error(what)

    function.__name__ = what.rsplit(".", 1)[1]
    function.__doc__ = f"Not supported yet: {info.name} ({info.plan})."
    return function


# --- multimodal ----------------------------------------------------------------------------


@_unsupported("vision", staticmethods=("open", "open_bytes"))
class Images:
    """Images for a vision model's prompt (the reference's ``og.Images``; not supported yet)."""


@_unsupported("speech", methods=("flush", "get_option", "process", "set_option"))
class StreamingProcessor:
    """Streaming audio feature extraction for speech models (the reference's
    ``og.StreamingProcessor``; not supported yet)."""


# --- speculative decoding --------------------------------------------------------------------


@_unsupported(
    "speculative",
    methods=(
        "append_tokens",
        "generate_next_token",
        "get_sequence",
        "get_stats",
        "is_done",
        "reset",
    ),
)
class MtpGenerator:
    """A generator drafting tokens with a multi-token-prediction head (the reference's
    ``og.MtpGenerator``; not supported yet)."""


# --- the reference's Engine ---------------------------------------------------------------------


@_unsupported(
    "engine",
    methods=(
        "create_event_buffer",
        "create_request",
        "get_capabilities",
        "get_speculative_stats",
        "has_pending_requests",
        "max_draft_tokens_per_proposal",
        "run",
    ),
)
class Engine:
    """The reference's continuous-batching engine (``og.Engine``; not supported yet)."""


@_unsupported(
    "engine",
    properties=("configured_max_batch_size", "max_request_length", "max_scheduled_tokens"),
)
class EngineCapabilities:
    """Limits of an `Engine` (not supported yet)."""


@_unsupported(
    "engine",
    properties=(
        "error_code",
        "finish_reason",
        "flags",
        "matched_stop_string_index",
        "request",
        "token",
        "turn_id",
        "usage",
    ),
)
class EngineEvent:
    """One event from `Engine.run` (not supported yet)."""


@_unsupported("engine")
class EngineEventBuffer:
    """Where `Engine.run` writes its events (not supported yet)."""


@_unsupported(
    "engine",
    methods=("begin_turn", "cancel_turn", "close", "rewind_to_start_of_turn", "set_draft_tokens"),
)
class Request:
    """One conversation in an `Engine` (not supported yet)."""


@_unsupported("engine", methods=("set_max_session_tokens",))
class RequestOptions:
    """Options of an engine `Request` (not supported yet)."""


@_unsupported(
    "engine",
    methods=(
        "clear_guidance",
        "clear_seed",
        "reset",
        "set_do_sample",
        "set_guidance",
        "set_max_generated_tokens",
        "set_min_generated_tokens",
        "set_no_repeat_ngram_size",
        "set_repetition_penalty",
        "set_seed",
        "set_stop_strings",
        "set_temperature",
        "set_top_k",
        "set_top_p",
    ),
)
class TurnOptions:
    """Search options of one turn of an engine `Request` (not supported yet)."""


@_unsupported("engine", properties=("cached_prompt_tokens", "generated_tokens", "prompt_tokens"))
class TurnUsage:
    """Token counts of one turn of an engine `Request` (not supported yet)."""
