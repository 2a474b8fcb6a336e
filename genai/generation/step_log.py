"""The reference's per-step log lines (``og.set_log_options``): what the generator writes for
``generate_next_token``, ``append_next_tokens``, ``hit_eos``, ``hit_max_length`` and
``model_logits`` (with ``value_stats``), in onnxruntime-genai 0.18's words, number formats
and order. The generator calls these only when `genai.compat.logging_options.step_logging`
says an item is on."""

from __future__ import annotations

from typing import Any

import numpy as np

from genai.compat.logging_options import is_logging, log_event, sgr

__all__ = ["dump_span", "log_appended", "log_step", "log_values", "step_message", "value_stats"]

#: Values shown of a long span: the first and the last half of this many, "..." between.
VALUE_COUNT = 10


def _number(value: Any) -> str:
    """A value as C++'s ``ostream`` writes it: integers in full, floats as ``%g``."""
    if isinstance(value, (float, np.floating)):
        return format(float(value), "g")
    return str(int(value))


def dump_span(values: np.ndarray) -> str:
    """The reference's ``DumpSpan``: each value and a space; past `VALUE_COUNT` values, the
    first and last five around ``"... "``."""
    flat = np.asarray(values).ravel()
    if flat.size > VALUE_COUNT:
        half = VALUE_COUNT // 2
        head = "".join(f"{_number(v)} " for v in flat[:half].tolist())
        tail = "".join(f"{_number(v)} " for v in flat[-half:].tolist())
        return f"{head}... {tail}"
    return "".join(f"{_number(v)} " for v in flat.tolist())


def value_stats(values: np.ndarray) -> str:
    """The reference's ``value_stats`` line: minimum and maximum with their first index, mean
    and standard deviation, computed as it does (float32, summed in order), and the first
    non-finite value (its 1-based position, as the reference counts) if any."""
    x = np.asarray(values, dtype=np.float32).ravel()
    count = np.float32(x.size)
    finite_or_inf = np.where(np.isnan(x), np.float32(np.inf), x)
    low = int(np.argmin(finite_or_inf))
    high = int(np.argmax(np.where(np.isnan(x), np.float32(-np.inf), x)))
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.cumsum(x, dtype=np.float32)[-1]
        squares = np.cumsum(x * x, dtype=np.float32)[-1]
        mean = total / count
        variance = (squares - total * total / count) / count
        deviation = np.sqrt(variance)
    c, r = sgr(36), sgr(0)
    line = (
        f"{c} Min: {r}{_number(x[low])} at index[{low}]"
        f"{c} Max: {r}{_number(x[high])} at index[{high}]"
        f"{c} Mean: {r}{_number(mean)}"
        f"{c} StdDev: {r}{_number(deviation)}"
    )
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        line += (
            f" {sgr(41)}First non-finite value at index {int(bad[0]) + 1}: "
            f"{_number(x[bad[0]])} Count of non-finite values: {bad.size}{r}"
        )
    return line


def log_values(item: str, values: np.ndarray) -> None:
    """``item``'s ``Values[ ... ]`` line, the ``value_stats`` line (float values, when that
    option is on) and the empty line the reference ends a logits dump with."""
    if not is_logging(item):
        return
    g, r = sgr(32), sgr(0)
    log_event(item, f"{g}Values[ {r}{dump_span(values)}{g}]{r}")
    if is_logging("value_stats") and np.asarray(values).dtype.kind == "f":
        log_event("value_stats", value_stats(values))
    log_event(item, "", raw=True)


def log_appended(tokens: np.ndarray, eos: np.ndarray) -> None:
    """``append_next_tokens`` for appended prompt tokens ([rows, length]): a line per
    position, with every row's token at it, as the reference appends them one by one (and,
    as it does, ``hit_eos`` before the line for each row whose token there is an EOS id)."""
    eos_lines = is_logging("hit_eos")
    for column in np.asarray(tokens).T:
        if eos_lines:
            for row in np.flatnonzero(np.isin(column, eos)).tolist():
                log_event("hit_eos", f"EOS seen on batch {row}")
        log_event("append_next_tokens", dump_span(column))


def step_message(search: Any, length: int) -> str:
    """The ``generate_next_token`` line for a step from a sequence of ``length`` tokens."""
    g, c, r = sgr(32), sgr(36), sgr(0)
    return (
        f"{g}do_sample: {r}{int(bool(search.do_sample))} {g}top_k: {r}{int(search.top_k)} "
        f"{g}top_p: {r}{_number(np.float32(search.top_p))} "
        f"{g}temperature: {r}{_number(np.float32(search.temperature))} "
        f"{c}sequence length: {r}{length}"
    )


def log_step(
    message: str,
    tokens: np.ndarray,
    ended: np.ndarray,
    eos: np.ndarray,
    length: int,
    max_length: int,
    beams: bool,
) -> None:
    """The lines of one `generate_next_token`, after it: ``generate_next_token`` (``message``,
    made before the step), ``hit_eos`` for each row the step ended with an EOS token
    (``ended``: rows not ended before it), ``append_next_tokens`` and, when the sequence
    reached ``max_length``, ``hit_max_length``."""
    log_event("generate_next_token", message)
    if is_logging("hit_eos") and not beams:
        for row in np.flatnonzero(ended & np.isin(tokens, eos)).tolist():
            log_event("hit_eos", f"EOS seen on batch {row}")
    log_event("append_next_tokens", dump_span(tokens))
    if length >= max_length:
        log_event("hit_max_length", "beam cpu hit" if beams else "greedy cpu hit")
