"""Hugging Face-compatible chat templates rendered with a sandboxed Jinja2 environment.

The rendering rules follow what ``transformers`` does for ``apply_chat_template``: an
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension (``{% break %}`` / ``{% continue %}``), a ``tojson`` filter that
does not HTML-escape and keeps non-ASCII text, the globals ``raise_exception`` and
``strftime_now``, and a no-op ``{% generation %}`` block tag.

The template text comes from ``tokenizer_config.json`` (key ``chat_template``: a string, or a
list of ``{"name": ..., "template": ...}``) or, failing that, from ``chat_template.jinja`` in the
model folder.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from genai.errors import ArgumentTypeError, GenaiError, InvalidArgumentError

__all__ = [
    "ChatTemplateError",
    "compile_chat_template",
    "load_chat_template",
    "load_tokenizer_config",
    "parse_messages",
    "parse_tools",
    "render_chat_template",
    "select_chat_template",
    "special_token_strings",
    "template_supports_tools",
]

#: File name of a stand-alone chat template next to ``tokenizer_config.json``.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: File name of the Hugging Face tokenizer configuration.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplateError(GenaiError, ValueError):
    """A chat template is missing, does not compile, or raised while rendering."""


class _GenerationBlock(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` and render its body unchanged.

    Hugging Face templates use the block to mark assistant text for training masks; for
    inference it has no effect.
    """

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the "generation" name token
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: object) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same arguments and defaults as transformers' filter: plain json.dumps, no HTML escaping.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


#: The longest string, list or rendered text a template may make (characters or items):
#: far above any real prompt, far below what exhausts memory.
MAX_TEMPLATE_OUTPUT = 1 << 26

#: The most bits an integer a template computes with ``**`` may have.
_MAX_POWER_BITS = 1 << 16


def _size_of(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*``, ``+`` and ``**`` refused where their result would exceed
    `MAX_TEMPLATE_OUTPUT` items (``"x" * 10**10``) or `_MAX_POWER_BITS` bits (``9**9**9``)."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        size: float = 0
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                n = _size_of(seq)
                if n is not None and isinstance(count, int):
                    size = n * count
        elif operator == "+":
            a, b = _size_of(left), _size_of(right)
            if a is not None and b is not None:
                size = a + b
        elif (
            isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and abs(left).bit_length() * right > _MAX_POWER_BITS
        ):
            raise jinja2.exceptions.SecurityError(f"{left} ** {right} is too large")
        if size > MAX_TEMPLATE_OUTPUT:
            raise jinja2.exceptions.SecurityError(
                f"the {operator!r} would make {size} items (at most {MAX_TEMPLATE_OUTPUT})"
            )
        return super().call_binop(context, operator, left, right)


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile (and cache) a chat template; raise :class:`ChatTemplateError` on a syntax error."""
    if not isinstance(source, str):
        raise ArgumentTypeError(f"chat template must be a str, not {type(source).__name__}")
    try:
        return _compile(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template does not compile: {exc.message} (template line {exc.lineno})"
        ) from exc


def parse_messages(messages: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return chat messages as a list of dicts.

    ``messages`` is either the JSON text the reference engine takes (an array of objects) or
    an already-built sequence of mappings.
    """
    if isinstance(messages, (bytes, bytearray)):
        messages = messages.decode("utf-8")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"messages is not valid JSON: {exc}") from exc
        if not isinstance(messages, list):
            raise ChatTemplateError(
                f"messages JSON must be an array of objects, not {type(messages).__name__}"
            )
    elif isinstance(messages, Mapping) or not isinstance(messages, Sequence):
        raise ArgumentTypeError(
            f"messages must be a JSON string or a list of dicts, not {type(messages).__name__}"
        )
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ArgumentTypeError(f"messages[{i}] must be a dict, not {type(message).__name__}")
        out.append(dict(message))
    return out


def parse_tools(tools: str | Sequence[Any] | None) -> list[Any] | None:
    """Return tool definitions as a list, or ``None`` when there are none.

    ``tools`` is JSON text (``""`` and ``"null"`` mean none), a sequence, or ``None``.
    """
    if tools is None:
        return None
    if isinstance(tools, (bytes, bytearray)):
        tools = tools.decode("utf-8")
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(f"tools is not valid JSON: {exc}") from exc
        if tools is None:
            return None
        if isinstance(tools, dict):
            tools = [tools]
        if not isinstance(tools, list):
            raise ChatTemplateError(
                f"tools JSON must be an array of objects, not {type(tools).__name__}"
            )
        return tools
    if isinstance(tools, Mapping):
        return [dict(tools)]
    if not isinstance(tools, Sequence):
        raise ArgumentTypeError(
            f"tools must be a JSON string or a list, not {type(tools).__name__}"
        )
    return list(tools)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a tokenizer folder's config files); an absent file gives
    ``{}``, an unreadable one or another JSON value an `InvalidArgumentError` naming it."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{path} must hold a JSON object")
    return data


def load_tokenizer_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``tokenizer_config.json`` from ``folder``; an absent file gives ``{}``."""
    return read_json_object(Path(folder) / TOKENIZER_CONFIG_FILE)


def _token_string(value: Any) -> str | None:
    # tokenizer_config values are a str or an AddedToken-like dict {"content": ...}.
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_token_strings(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """Return the ``bos_token``/``eos_token``/``unk_token``/``pad_token`` strings that are set.

    Unset tokens are left out (not ``None``) so a template sees them as undefined, which
    renders as an empty string, as with Hugging Face.
    """
    out: dict[str, str] = {}
    for key in _SPECIAL_TOKEN_KEYS:
        text = _token_string(tokenizer_config.get(key))
        if text is not None:
            out[key] = text
    return out


def select_chat_template(
    chat_template: str | Sequence[Mapping[str, Any]] | None,
    *,
    tools: Sequence[Any] | None = None,
    name: str | None = None,
) -> str | None:
    """Pick the template text from a ``chat_template`` config value.

    A list of ``{"name", "template"}`` entries yields the entry called ``name`` if given,
    else ``"tool_use"`` when ``tools`` is non-empty and such an entry exists, else
    ``"default"``. A plain string is returned as is.
    """
    if chat_template is None:
        return None
    if isinstance(chat_template, str):
        return chat_template
    if not isinstance(chat_template, Sequence):
        raise ChatTemplateError(
            "chat_template must be a string or a list of {'name', 'template'} objects, not "
            f"{type(chat_template).__name__}"
        )
    named: dict[str, str] = {}
    for entry in chat_template:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("template"), str):
            raise ChatTemplateError(
                "chat_template list entries must be objects with 'name' and 'template'"
            )
        named[str(entry.get("name"))] = entry["template"]
    if name is not None:
        if name not in named:
            raise ChatTemplateError(f"no chat template named {name!r}; available: {sorted(named)}")
        return named[name]
    if tools and "tool_use" in named:
        return named["tool_use"]
    if "default" in named:
        return named["default"]
    raise ChatTemplateError(
        f"chat_template list has no 'default' entry; available: {sorted(named)}"
    )


def load_chat_template(
    folder: str | os.PathLike[str],
    *,
    tools: Sequence[Any] | None = None,
    name: str | None = None,
    tokenizer_config: Mapping[str, Any] | None = None,
) -> str | None:
    """Return the chat template text for a model folder, or ``None`` when it has none.

    ``tokenizer_config.json``'s ``chat_template`` wins; ``chat_template.jinja`` is the
    fallback. Pass ``tokenizer_config`` to avoid reading the file again.
    """
    folder = Path(folder)
    config = load_tokenizer_config(folder) if tokenizer_config is None else tokenizer_config
    source = select_chat_template(config.get("chat_template"), tools=tools, name=name)
    if source:
        return source
    path = folder / CHAT_TEMPLATE_FILE
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ChatTemplateError(f"{path} is not UTF-8 text: {exc}") from exc
    return None


def render_chat_template(
    template: str,
    messages: str | Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: str | Sequence[Any] | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    **kwargs: Any,
) -> str:
    """Render ``template`` for ``messages`` the way Hugging Face ``apply_chat_template`` does.

    ``messages`` and ``tools`` may be JSON text or Python lists. Extra keyword arguments
    become template variables (e.g. ``enable_thinking=False``); ``None`` values for
    ``bos_token``/``eos_token`` are left undefined. Errors raise :class:`ChatTemplateError`.
    """
    if not template:
        raise ChatTemplateError("chat template is empty")
    compiled = compile_chat_template(template)
    variables: dict[str, Any] = dict(kwargs)
    if bos_token is not None:
        variables["bos_token"] = bos_token
    if eos_token is not None:
        variables["eos_token"] = eos_token
    variables["messages"] = parse_messages(messages)
    variables["tools"] = parse_tools(tools)
    variables["add_generation_prompt"] = bool(add_generation_prompt)
    try:
        return _render_bounded(compiled, variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template raised an error: {exc}") from exc
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ArithmeticError,
        RecursionError,
        MemoryError,
    ) as exc:
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def _render_bounded(compiled: jinja2.Template, variables: dict[str, Any]) -> str:
    """``compiled`` rendered, stopped once the text passes `MAX_TEMPLATE_OUTPUT` characters."""
    parts: list[str] = []
    total = 0
    for part in compiled.generate(**variables):
        total += len(part)
        if total > MAX_TEMPLATE_OUTPUT:
            raise jinja2.exceptions.SecurityError(
                f"the rendered text passes {MAX_TEMPLATE_OUTPUT} characters"
            )
        parts.append(part)
    return "".join(parts)


#: The tool a template is probed with by `template_supports_tools` (a name no real tool has).
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "genai_probe_tool_7f3a",
        "description": "genai probe",
        "parameters": {"type": "object", "properties": {}},
    },
}
_PROBE_MESSAGES = [{"role": "user", "content": "genai probe message"}]


@functools.lru_cache(maxsize=64)
def _supports_tools(template: str, variables: tuple[tuple[str, Any], ...]) -> bool:
    kwargs = dict(variables)
    try:
        without = render_chat_template(template, _PROBE_MESSAGES, tools=None, **kwargs)
    except ChatTemplateError:
        without = None
    try:
        with_tool = render_chat_template(template, _PROBE_MESSAGES, tools=[_PROBE_TOOL], **kwargs)
    except ChatTemplateError:
        return False  # a template that fails when given tools cannot take them
    name = _PROBE_TOOL["function"]["name"]
    return with_tool != without and name in with_tool


def template_supports_tools(template: str, **variables: Any) -> bool:
    """Whether ``template`` shows tool definitions to the model.

    The template is rendered for a one-message chat with and without a probe tool; it
    supports tools when the two renderings differ and the probe tool's name appears in the
    one with tools (SmolLM2's template ignores ``tools``: both renderings are the same).
    A template that raises when given tools does not support them. ``variables`` are extra
    template variables (e.g. ``bos_token``). The answer is cached per template.
    """
    try:
        key = tuple(sorted(variables.items()))
        hash(key)
    except TypeError:  # unhashable variable values: probe without the cache
        return _supports_tools.__wrapped__(template, tuple(variables.items()))
    return _supports_tools(template, key)
