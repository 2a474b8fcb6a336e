"""The reference's features genai does not run yet, and the errors that say so.

`FEATURES` names each (the model kinds and options beyond what genai runs: speech models other
than Whisper, vision-language kinds beyond Phi-3 Vision, Qwen-VL and Gemma 3, speculative kinds
beyond prompt lookup, draft models and one-step MTP); `not_implemented` makes the
`UnsupportedFeatureError` (a NotImplementedError) a method raises for one, naming the feature
and docs/differences.md. `genai.runtime.config` refuses the configuration keys of such models
with the same features.
"""

from __future__ import annotations

from dataclasses import dataclass

from genai.errors import UnsupportedFeatureError

__all__ = ["FEATURES", "Feature", "not_implemented"]


@dataclass(frozen=True)
class Feature:
    """A reference feature genai does not run yet, and the plan for it."""

    name: str
    plan: str

    def error(self, what: str) -> UnsupportedFeatureError:
        """The error to raise for ``what`` (e.g. ``"StreamingProcessor.process"``)."""
        return UnsupportedFeatureError(
            f"{what} is not supported by genai yet: {self.name} ({self.plan}); "
            "see docs/differences.md"
        )


#: The features, by key.
FEATURES: dict[str, Feature] = {
    "vision": Feature(
        "vision-language kinds beyond phi3v, the Qwen-VL family and gemma3 (video inputs, "
        "phi4mm, mistral3)",
        "not planned yet",
    ),
    "speech": Feature(
        "speech models beyond Whisper (transducers, streaming recognition, audio output)",
        "not planned yet",
    ),
    "speculative": Feature(
        "speculative decoding beyond prompt lookup, draft models and one-step MTP heads "
        "(DFlash, DSpark)",
        "not planned yet",
    ),
}


def not_implemented(what: str, feature: str) -> NotImplementedError:
    """The NotImplementedError for ``what`` of the feature keyed ``feature`` in `FEATURES`."""
    return FEATURES[feature].error(what)
