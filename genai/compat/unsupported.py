"""Names of the reference's API for features genai does not run yet.

They exist, with the reference's members, so ``import genai as og`` scripts import and
``hasattr`` checks pass; creating one or calling any of its members raises
NotImplementedError naming the feature, the issue that plans it, and docs/differences.md.

* multimodal vision (`Images`): issue 19.

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
    "Feature",
    "Images",
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
