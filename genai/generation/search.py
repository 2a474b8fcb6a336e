"""Search options: the reference's names, defaults and types, validated once.

``SearchOptions`` is a plain dataclass; `GeneratorParams` (in :mod:`.generator_params`)
wraps it with the reference's ``set_search_options`` / ``get_search_options`` API.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from genai.constraints.stop import check_stop_strings
from genai.errors import SearchOptionError

__all__ = ["MAX_BATCH_SIZE", "SearchOptions"]

MAX_BATCH_SIZE = 32


@dataclass
class SearchOptions:
    """Every search option with the reference's default.

    ``max_length`` 0 means the model's context length. ``top_p`` is active only for
    0 < p < 1. Greedy decoding is used when ``do_sample`` is false, ``top_k == 1`` or
    ``temperature == 0``.
    """

    do_sample: bool = False
    min_length: int = 0
    max_length: int = 0
    batch_size: int = 1
    num_beams: int = 1
    num_return_sequences: int = 1
    top_k: int = 50
    top_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    length_penalty: float = 1.0
    early_stopping: bool = True
    no_repeat_ngram_size: int = 0
    diversity_penalty: float = 0.0
    past_present_share_buffer: bool = False
    random_seed: int = -1
    #: a first batch-1 prompt longer than this runs in runs of this many tokens (<= 0: whole,
    #: the reference's -1 included; see `genai.generation.drivers.native.NativeDriver.run`)
    chunk_size: int = 0
    # --- beyond the reference (opt-in; see docs/sampling.md) ---
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: record the chosen token's log-probability each step (`Generator.get_next_logprobs`)
    logprobs: bool = False
    #: ... and this many most likely alternatives
    top_logprobs: int = 0
    #: shared-buffer KV cache: tokens allocated up front (0 = max_length at once, as the
    #: reference); it grows on demand, by `kv_growth_factor`, in blocks of this many tokens
    kv_initial_capacity: int = 128
    kv_growth_factor: float = 1.5
    #: stop after this many generated tokens (counted from the last append_tokens; 0 = no
    #: limit beyond max_length); `Generator.finish_reason` then says MAX_GENERATED_TOKENS
    max_new_tokens: int = 0
    #: stop strings: a row stops once its decoded text contains one (matched across token
    #: boundaries, see `genai.constraints.stop`); `Generator.finish_reason` then says STOP_STRING
    stop: tuple[str, ...] = ()

    #: Options the reference does not have: left out of `as_reference_dict` while at default.
    EXTENSIONS = (
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "kv_initial_capacity",
        "kv_growth_factor",
        "max_new_tokens",
        "stop",
    )

    @classmethod
    def from_openai(
        cls,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        logprobs: int | None = None,
    ) -> SearchOptions:
        """Options from OpenAI-style sampling parameters (the server's requests; defaults
        are OpenAI's): greedy when ``temperature == 0`` or ``top_k == 1``, else sampling;
        ``top_p`` outside (0, 1) and ``top_k == 0`` mean no nucleus / no top-k; ``seed``
        None draws a random seed; ``logprobs`` None: none, N >= 0: the chosen token's and
        N alternatives. Values are range-checked at the HTTP edge (`genai.serve.protocol`)."""
        greedy = temperature == 0.0 or top_k == 1
        return cls(
            do_sample=not greedy,
            temperature=float(temperature) if temperature > 0 else 1.0,
            top_k=int(top_k),
            top_p=float(top_p) if 0.0 < top_p < 1.0 else 0.0,
            min_p=float(min_p),
            presence_penalty=float(presence_penalty),
            frequency_penalty=float(frequency_penalty),
            repetition_penalty=float(repetition_penalty),
            random_seed=-1 if seed is None else int(seed),
            logprobs=logprobs is not None,
            top_logprobs=int(logprobs or 0),
        )

    @classmethod
    def names(cls) -> list[str]:
        """All option names."""
        return [f.name for f in fields(cls)]

    def update(self, **options: Any) -> None:
        """Set options by name, checking each name and type; ranges are checked by `validate`."""
        types = {f.name: f.type for f in fields(self)}
        for name, value in options.items():
            if name not in types:
                raise SearchOptionError(
                    f"unknown search option {name!r}; known options: {', '.join(types)}"
                )
            setattr(self, name, _coerce(name, value, types[name]))

    def as_reference_dict(self) -> dict[str, float | bool | list[str]]:
        """Options as the reference's ``get_search_options`` returns them: numbers as floats,
        float options as the reference stores them (float32: 0.7 reads 0.699999988...);
        extensions only when changed; ``stop`` as a list of str."""
        defaults = SearchOptions()
        return {
            name: _reference_value(value, name in _FLOAT_OPTIONS)
            for name, value in sorted(dataclasses.asdict(self).items())
            if name not in self.EXTENSIONS or value != getattr(defaults, name)
        }

    def validate(self, context_length: int, vocab_size: int | None = None) -> None:
        """Check ranges against the model (its context length and, when given, its vocabulary
        size); raise `SearchOptionError` naming the option."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise SearchOptionError(message)

        if self.max_length == 0:
            self.max_length = context_length
        need(self.max_length >= 1, f"max_length ({self.max_length}) must be >= 1")
        need(
            self.max_length <= context_length,
            f"max_length ({self.max_length}) cannot be greater than model context_length "
            f"({context_length})",
        )
        need(
            1 <= self.batch_size <= MAX_BATCH_SIZE,
            f"batch_size ({self.batch_size}) must be in [1, {MAX_BATCH_SIZE}]",
        )
        need(1 <= self.num_beams <= 32, f"num_beams ({self.num_beams}) must be in [1, 32]")
        need(
            1 <= self.num_return_sequences <= self.num_beams,
            f"num_return_sequences ({self.num_return_sequences}) must be in [1, {self.num_beams}]",
        )
        need(self.min_length >= 0, f"min_length ({self.min_length}) must be >= 0")
        need(0 <= self.top_k <= 2**31 - 1, f"top_k ({self.top_k}) must be in [0, 2147483647]")
        need(0.0 <= self.top_p <= 1.0, f"top_p ({self.top_p}) must be in [0, 1]")
        need(self.temperature >= 0.0, f"temperature ({self.temperature}) must be >= 0")
        need(
            np.float32(self.repetition_penalty) > 0.0,  # (the sampler's float32: 1e-50 is 0)
            f"repetition_penalty ({self.repetition_penalty}) must be > 0",
        )
        need(
            self.no_repeat_ngram_size >= 0,
            f"no_repeat_ngram_size ({self.no_repeat_ngram_size}) must be >= 0",
        )
        need(self.random_seed >= -1, f"random_seed ({self.random_seed}) must be >= -1")
        need(0.0 <= self.min_p <= 1.0, f"min_p ({self.min_p}) must be in [0, 1]")
        need(self.top_logprobs >= 0, f"top_logprobs ({self.top_logprobs}) must be >= 0")
        if vocab_size is not None:
            need(
                self.top_logprobs <= vocab_size,
                f"top_logprobs ({self.top_logprobs}) cannot exceed the vocabulary ({vocab_size})",
            )
        need(
            self.kv_initial_capacity >= 0,
            f"kv_initial_capacity ({self.kv_initial_capacity}) must be >= 0",
        )
        need(self.max_new_tokens >= 0, f"max_new_tokens ({self.max_new_tokens}) must be >= 0")
        need(
            self.kv_growth_factor > 1.0,
            f"kv_growth_factor ({self.kv_growth_factor}) must be > 1",
        )

    @property
    def needs_processing(self) -> bool:
        """True when the logits-processing chain can change the choice (else plain argmax)."""
        return (
            not self.is_greedy
            or self.repetition_penalty != 1.0
            or self.min_length > 0
            or self.no_repeat_ngram_size > 0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.logprobs
            or self.top_logprobs > 0
        )

    def sampler_options(self) -> dict[str, float | int | bool]:
        """The options the sampling kernels take, by their names."""
        return {
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
            "min_length": self.min_length,
        }

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax (the reference's rule)."""
        return not self.do_sample or self.top_k == 1 or self.temperature == 0.0


#: The options whose values are real numbers (the reference keeps them as float32).
_FLOAT_OPTIONS = frozenset(f.name for f in fields(SearchOptions) if f.type in ("float", float))

#: Integer options' ranges: the reference's Python binding casts an int to a C int (anything
#: else is its RuntimeError); genai's seeds are 64-bit (``validate`` checks the low end).
_INT_RANGES = {"random_seed": (-(2**31), 2**64 - 1)}
_C_INT = (-(2**31), 2**31 - 1)
_WIDE = (-(2**63), 2**63 - 1)  # genai's own options (the reference has none of them)


def _reference_value(value: Any, float32: bool = False) -> float | bool | list[str]:
    if isinstance(value, bool):
        return value
    if isinstance(value, tuple):
        return list(value)
    return float(np.float32(value)) if float32 else float(value)


def _coerce(name: str, value: Any, kind: Any) -> Any:
    if name == "stop":
        try:
            return check_stop_strings(value)
        except (TypeError, ValueError) as exc:
            raise SearchOptionError(f"stop: {exc}") from None
    kind = {"bool": bool, "int": int, "float": float}.get(kind, kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise SearchOptionError(f"{name} expects a bool, got {type(value).__name__} {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SearchOptionError(f"{name} expects a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise SearchOptionError(f"{name} must be finite, got {value!r}")
    if kind is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise SearchOptionError(f"{name} must be an integer, got {value!r}")
            value = int(value)
        low, high = _INT_RANGES.get(name, _WIDE if name in SearchOptions.EXTENSIONS else _C_INT)
        if not low <= value <= high:
            raise SearchOptionError(f"{name} ({value}) must be in [{low}, {high}]")
        return int(value)
    return float(value)
