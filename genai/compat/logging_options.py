"""The reference's log switches (``og.set_log_options``, ``og.set_log_callback``) on top of
the standard library's `logging`.

genai logs through the ``genai`` logger. Without a call here it follows the usual library
conventions: nothing is configured, warnings reach whatever handlers the application set up.
``set_log_options(enabled=True, ...)`` does what the reference does: the ``genai`` logger
writes each enabled item, formatted as the reference formats it (``"  label   message"``,
with ANSI colour tags unless ``ansi_tags=False``), to standard error, to ``filename``, or to
the callback given to `set_log_callback` (one call per line, newline included).

Items (booleans, as in the reference): ``enabled`` (all logging), ``ansi_tags``, ``warning``,
``generate_next_token``, ``append_next_tokens``, ``hit_eos``, ``hit_max_length``,
``model_input_values``, ``model_output_shapes``, ``model_output_values``, ``model_logits``,
``ort_lib`` (also turns onnxruntime's own session logging to verbose: `ort_log_severity`),
``value_stats``; and ``filename`` (a string; ``""`` goes back to standard error).

Engine code asks `is_logging` before building a message and emits with `log_event`. The
generator writes the per-step items (``generate_next_token``, ``append_next_tokens``,
``hit_eos``, ``hit_max_length``, ``model_logits`` with ``value_stats``) in the reference's
words and order (`genai.generation.step_log`); it checks `step_logging` once a step.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from genai.errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "BOOL_OPTIONS",
    "LOGGER",
    "STEP_ITEMS",
    "format_entry",
    "is_logging",
    "log_event",
    "log_options",
    "ort_log_severity",
    "set_log_callback",
    "set_log_options",
    "sgr",
    "step_logging",
]

#: The ``genai`` logger every genai message goes through.
LOGGER = logging.getLogger("genai")

#: Boolean options and their defaults (the reference's).
BOOL_OPTIONS: dict[str, bool] = {
    "enabled": False,
    "ansi_tags": True,
    "warning": True,
    "generate_next_token": False,
    "append_next_tokens": False,
    "hit_eos": False,
    "hit_max_length": False,
    "model_input_values": False,
    "model_output_shapes": False,
    "model_output_values": False,
    "model_logits": False,
    "ort_lib": False,
    "value_stats": True,
}
_STRING_OPTIONS = ("filename",)

#: The items the generator writes at each step and prompt run.
STEP_ITEMS = (
    "generate_next_token",
    "append_next_tokens",
    "hit_eos",
    "hit_max_length",
    "model_logits",
)

#: onnxruntime's verbose log severity (ORT_LOGGING_LEVEL_VERBOSE).
ORT_SEVERITY_VERBOSE = 0

_lock = threading.RLock()
_options: dict[str, Any] = {**BOOL_OPTIONS, "filename": ""}
#: ``enabled`` and any of `STEP_ITEMS` on (read once a generator step).
_step_logging = False
_callback: Callable[[str], Any] | None = None
_handler: logging.Handler | None = None
_handler_destination: tuple[Any, ...] | None = None
_saved_propagate: bool | None = None
_saved_level: int | None = None

# ANSI SGR codes, as the reference colours its labels.
_BOLD, _RESET, _BG_BLUE, _BG_YELLOW = "\x1b[1m", "\x1b[0m", "\x1b[44m", "\x1b[43m"


def format_entry(label: str, message: str, *, ansi_tags: bool | None = None) -> str:
    """One log line as the reference writes it, without the newline: the label between two
    spaces each side (bold on blue, or on yellow for ``warning``, when ANSI tags are on), a
    space, the message."""
    tags = _options["ansi_tags"] if ansi_tags is None else ansi_tags
    if not tags:
        return f"  {label}   {message}"
    background = _BG_YELLOW if label == "warning" else _BG_BLUE
    return f"{_BOLD}{background}  {label}  {_RESET} {message}"


def sgr(code: int) -> str:
    """The ANSI SGR escape ``code`` (32 green, 36 cyan, 41 red background, 0 reset) inside a
    message, or "" when ``ansi_tags`` is off (as the reference's ``SGR`` stream codes)."""
    return f"\x1b[{code}m" if _options["ansi_tags"] else ""


class _ReferenceFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "genai_raw", False):  # a line of its own, without a label
            return record.getMessage()
        label = getattr(record, "genai_item", None) or record.levelname.lower()
        return format_entry(label, record.getMessage())


class _CallbackHandler(logging.Handler):
    """Hands each formatted line (newline included) to the user's callback."""

    def __init__(self, callback: Callable[[str], Any]) -> None:
        super().__init__()
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.callback(line + "\n")


class _ItemFilter(logging.Filter):
    """Drops records of items that are switched off, and warnings when ``warning`` is off."""

    def filter(self, record: logging.LogRecord) -> bool:
        item = getattr(record, "genai_item", None)
        if item is not None and item != "warning" and not _options.get(item, False):
            return False
        return not (record.levelno == logging.WARNING and not _options["warning"])


_filter = _ItemFilter()


def _destination() -> tuple[Any, ...]:
    if _callback is not None:
        return ("callback", _callback)
    if _options["filename"]:
        return ("file", _options["filename"])
    return ("stderr",)


def _new_handler(destination: tuple[Any, ...]) -> logging.Handler:
    handler: logging.Handler
    if destination[0] == "callback":
        handler = _CallbackHandler(destination[1])
    elif destination[0] == "file":
        handler = logging.FileHandler(destination[1], mode="w", encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ReferenceFormatter())
    return handler


def _install() -> None:
    """Make the ``genai`` logger match the options (called with the lock held). The handler
    is replaced only when the destination changes (a log file is opened, and emptied, once)."""
    global _handler, _handler_destination, _saved_propagate, _saved_level, _step_logging
    _step_logging = bool(_options["enabled"]) and any(_options[item] for item in STEP_ITEMS)
    if _filter not in LOGGER.filters:
        LOGGER.addFilter(_filter)
    wanted = _destination() if _options["enabled"] else None
    if _handler is not None and wanted != _handler_destination:
        LOGGER.removeHandler(_handler)
        _handler.close()
        _handler, _handler_destination = None, None
    if wanted is None:
        if _saved_level is not None:  # the level the application (or `genai -v`) had set
            LOGGER.setLevel(_saved_level)
            _saved_level = None
        if _saved_propagate is not None:
            LOGGER.propagate = _saved_propagate
            _saved_propagate = None
        return
    if _handler is None:
        _handler = _new_handler(wanted)
        _handler_destination = wanted
        LOGGER.addHandler(_handler)
    if _saved_level is None:
        _saved_level = LOGGER.level
    LOGGER.setLevel(logging.DEBUG)
    if _saved_propagate is None:
        # One destination, as in the reference: not also the application's root handlers.
        _saved_propagate = LOGGER.propagate
        LOGGER.propagate = False


def set_log_options(**options: bool | str) -> None:
    """Set log options by name (see the module docstring). Unknown names raise ValueError
    listing the known ones; a value of the wrong type raises TypeError. Nothing changes when
    any option is invalid."""
    for name, value in options.items():
        if name in BOOL_OPTIONS:
            if not isinstance(value, bool):
                raise ArgumentTypeError(
                    f"log option {name!r} takes a bool, not {type(value).__name__}"
                )
        elif name in _STRING_OPTIONS:
            if not isinstance(value, str):
                raise ArgumentTypeError(
                    f"log option {name!r} takes a str, not {type(value).__name__}"
                )
        else:
            known = ", ".join([*BOOL_OPTIONS, *_STRING_OPTIONS])
            raise InvalidArgumentError(f"unknown log option {name!r}; known options: {known}")
    global _callback
    with _lock:
        saved = (dict(_options), _callback)
        _options.update(options)
        if options.get("filename"):
            _callback = None  # a file replaces the callback, as in the reference
        try:
            _install()
        except OSError:  # the log file cannot be opened: keep the previous options
            _options.clear()
            _options.update(saved[0])
            _callback = saved[1]
            _install()
            raise


def set_log_callback(callback: Callable[[str], Any] | None) -> None:
    """Send log lines to ``callback`` (called with each line, newline included) instead of
    standard error or the log file; None goes back to standard error."""
    if callback is not None and not callable(callback):
        raise ArgumentTypeError(
            f"set_log_callback takes a callable or None, not {type(callback).__name__}"
        )
    global _callback
    with _lock:
        _callback = callback
        if callback is not None:
            _options["filename"] = ""  # a callback replaces the file, as in the reference
        _install()


def log_options() -> dict[str, Any]:
    """The current options (a copy)."""
    with _lock:
        return dict(_options)


def is_logging(item: str) -> bool:
    """Whether a message for ``item`` (e.g. ``"generate_next_token"``) would be written: it
    is switched on and the ``genai`` logger takes DEBUG records."""
    return bool(_options.get(item)) and LOGGER.isEnabledFor(logging.DEBUG)


def step_logging() -> bool:
    """Whether any of the generator's per-step items (`STEP_ITEMS`) would be written."""
    return _step_logging and LOGGER.isEnabledFor(logging.DEBUG)


def log_event(item: str, message: str, *, raw: bool = False) -> None:
    """Write ``message`` for ``item`` through the ``genai`` logger when that item is on
    (``"warning"``: a WARNING record whenever ``warning`` is on); ``raw``: the message alone
    on its line, without the label (the reference's bare line ends)."""
    if item == "warning":
        LOGGER.warning(message, extra={"genai_item": item})
    elif is_logging(item):
        LOGGER.debug(message, extra={"genai_item": item, "genai_raw": raw})


def ort_log_severity() -> int | None:
    """The onnxruntime session log severity the options ask for: verbose when ``enabled`` and
    ``ort_lib`` are on, else None (the session's own setting or onnxruntime's default)."""
    if _options["enabled"] and _options["ort_lib"]:
        return ORT_SEVERITY_VERBOSE
    return None
