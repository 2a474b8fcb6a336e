"""`GeneratorParams`: search options for a generator, as onnxruntime-genai exposes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .search import SearchOptions

if TYPE_CHECKING:
    from .model import Model

__all__ = ["GeneratorParams"]


class GeneratorParams:
    """Search options for `Generator`, starting from the model's ``search`` section.

    Names, defaults and types follow the reference; see `genai.search.SearchOptions`.
    Ranges are checked when the `Generator` is created (they depend on the model).
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.search = SearchOptions()
        self.search.update(**(model.config.get("search", {}) or {}))
        self.guidance: tuple[str, str] | None = None
        self.logit_bias: dict[int, float] = {}

    def set_search_options(self, **options: Any) -> None:
        """Set search options by name (unknown names and wrong types raise)."""
        self.search.update(**options)

    def get_search_options(self) -> dict[str, float | bool]:
        """All options; numbers as floats, as the reference returns them."""
        return self.search.as_reference_dict()

    def set_logit_bias(self, bias: dict[int, float]) -> None:
        """Add ``bias[id]`` to token ``id``'s logit every step (OpenAI's ``logit_bias``;
        beyond the reference). An empty dict clears it."""
        checked = {}
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int | np.integer):
                raise TypeError(f"logit_bias keys must be token ids, got {token!r}")
            if not 0 <= int(token) < self.model.io.vocab_size:
                raise ValueError(
                    f"logit_bias token id {token} is outside [0, {self.model.io.vocab_size})"
                )
            if not np.isfinite(value):
                raise ValueError(f"logit_bias for token {token} must be finite, got {value!r}")
            checked[int(token)] = float(value)
        self.logit_bias = checked

    def set_guidance(self, kind: str, data: str) -> None:
        """Constrained decoding (json_schema | regex | lark_grammar). Not available yet."""
        raise NotImplementedError("guidance (constrained decoding) is not implemented yet")
