"""Tool calling on any chat model: OpenAI-style tool definitions shown to the model, a grammar
that forces well-formed calls, and the calls read back into OpenAI-shaped objects.

Two call formats, picked from the chat template (`tool_call_format`):

``"hermes"``: the template shows the tools to the model itself and asks for Hermes / Qwen tags
(Qwen2.5, Qwen3, Hermes templates). The template renders the tools; a call is written::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``"generic"``: every other template (SmolLM2's ignores ``tools``, so the model would never see
them; others ask for a syntax of their own). The tool definitions and the reply format are
written into the system message (`generic_tool_prompt`), and the whole reply is one JSON object:
``{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}``, or
``{"tool_calls":[...]}`` when several calls are allowed, or ``{"response":"..."}`` for an answer
in words under ``tool_choice="auto"``.

`render_chat_with_tools` picks the format and renders the prompt, `tool_call_guidance` builds the
grammar of that format (for `GeneratorParams.set_guidance` or `TokenConstraint.create`), and
`tool_call_result` turns the generated text and the finish reason into content, calls and an
OpenAI ``finish_reason``. `prepare_tool_chat` does the first two for a `Tokenizer` and keeps the
format for the third (what a server needs).
"""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genai.compat.engine_enums import FinishReason
from genai.errors import ArgumentTypeError, InvalidArgumentError
from genai.text.chat_template import (
    ChatTemplateError,
    load_chat_template,
    load_tokenizer_config,
    parse_messages,
    parse_tools,
    render_chat_template,
    special_token_strings,
    template_supports_tools,
)

if TYPE_CHECKING:
    from genai.text.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MAX_CALLS",
    "GENERIC",
    "HERMES",
    "OPENAI_FINISH_REASONS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_FORMATS",
    "ToolCallResult",
    "ToolChat",
    "ToolPrompt",
    "generic_tool_prompt",
    "openai_finish_reason",
    "parse_tool_calls",
    "prepare_tool_chat",
    "render_chat_with_tools",
    "tokenizer_has_tag_tokens",
    "tool_call_format",
    "tool_call_guidance",
    "tool_call_result",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

#: Calls written in ``<tool_call>`` tags, the tools shown by the chat template itself.
HERMES = "hermes"
#: One JSON object per reply, the tools described in the system message by genai.
GENERIC = "generic"
TOOL_FORMATS = (HERMES, GENERIC)

#: Most calls one reply may hold when parallel calls are allowed. OpenAI sets no number; the
#: bound ends the reply of a model that would repeat the same call until ``max_tokens``.
DEFAULT_MAX_CALLS = 8

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_COMPACT = (",", ":")


def _functions(tools: Any) -> list[dict[str, Any]]:
    """The ``function`` objects of OpenAI tool definitions, checked."""
    if not isinstance(tools, list) or not tools:
        raise InvalidArgumentError("tools must be a non-empty list of OpenAI tool definitions")
    functions, names = [], set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ArgumentTypeError(f"tools[{i}] must be a dict, got {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise InvalidArgumentError(
                f"tools[{i}]: only type 'function' is supported, got {tool['type']!r}"
            )
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError(
                f"tools[{i}]: function name must match [A-Za-z0-9_.-]{{1,64}}, got {name!r}"
            )
        if name in names:
            raise InvalidArgumentError(f"tools[{i}]: duplicate function name {name!r}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidArgumentError(
                f"tools[{i}] ({name}): parameters must be a JSON schema object"
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidArgumentError(f"tools[{i}] ({name}): description must be a string")
        names.add(name)
        functions.append({"name": name, "description": description, "parameters": parameters})
    return functions


def _chosen(functions: list[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]], str]:
    """The functions the model may call and the mode (``"auto"`` or ``"required"``)."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type", "function") != "function" or not isinstance(name, str):
            raise InvalidArgumentError(
                'tool_choice must be {"type": "function", "function": {"name": ...}}, '
                f"got {dict(tool_choice)!r}"
            )
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise InvalidArgumentError(f"tool_choice names {name!r}, which is not one of the tools")
        return chosen, "required"
    if tool_choice == "none":
        raise InvalidArgumentError(
            "tool_choice 'none' forbids tool calls: generate without guidance"
        )
    if tool_choice not in ("required", "auto"):
        raise InvalidArgumentError(
            f"tool_choice must be 'auto', 'required', 'none' or a function choice, "
            f"got {tool_choice!r}"
        )
    return functions, tool_choice


def _call_limit(parallel_tool_calls: bool, max_calls: int | None) -> int:
    if not parallel_tool_calls:
        return 1
    if max_calls is None:
        return DEFAULT_MAX_CALLS
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise InvalidArgumentError(f"max_calls must be a positive integer, got {max_calls!r}")
    return max_calls


def _check_format(tool_format: str) -> str:
    if tool_format not in TOOL_FORMATS:
        raise InvalidArgumentError(
            f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}"
        )
    return tool_format


def _closed(schema: Any) -> Any:
    """``schema`` with every object schema that lists ``properties`` and says nothing of
    ``additionalProperties`` closed (``additionalProperties: false``), as OpenAI's strict mode
    requires them to be: left open, a grammar lets a small model add made-up arguments
    without end. ``allOf`` branches are left as they are (closing one would reject the
    properties of the others)."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if (
        isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and "patternProperties" not in out
        and "allOf" not in out
    ):
        out["additionalProperties"] = False
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(value) for name, value in out[key].items()}
    for key in ("items", "prefixItems", "anyOf", "oneOf"):
        if key in out:
            out[key] = _closed(out[key])
    return out


# schema keywords whose values are data, not schemas: no "$ref" in them is a pointer
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# schema keywords whose values map names (any names, "default" too) to schemas
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _subschemas(schema: dict[str, Any]) -> Any:
    """``(key, value, is_map)`` for each keyword of ``schema`` that holds schemas."""
    for key, value in schema.items():
        if key in _DATA_KEYWORDS:
            continue
        yield key, value, key in _SCHEMA_MAPS and isinstance(value, dict)


def _has_ref(schema: Any) -> bool:
    """Whether ``schema`` holds a ``$ref`` anywhere (outside data keywords)."""
    if isinstance(schema, list):
        return any(_has_ref(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    return isinstance(schema.get("$ref"), str) or any(
        any(_has_ref(sub) for sub in value.values()) if is_map else _has_ref(value)
        for _, value, is_map in _subschemas(schema)
    )


def _rebased(schema: Any, base: str) -> Any:
    """``schema`` with every local ``$ref`` (``#``, ``#/...``) pointing under ``base`` (a JSON
    pointer fragment), for a schema moved from a document's root to there."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key, value, is_map in _subschemas(schema):
        if is_map:
            out[key] = {name: _rebased(sub, base) for name, sub in value.items()}
        else:
            out[key] = _rebased(value, base)
    ref = out.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = base + ref[1:]
    return out


def _call_schemas(functions: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each function's call object schema, and the ``$defs`` the grammar's root schema must
    carry: parameters that use ``$ref`` (pydantic's ``$defs``, ``"#"`` for recursion) are
    moved whole under ``#/$defs/`` and their pointers rewritten to point there (nested under
    the call object, they pointed at the wrong root)."""
    calls, defs = [], {}
    for index, function in enumerate(functions):
        arguments = _closed(function["parameters"])
        if _has_ref(arguments):
            key = f"tool_arguments_{index}"
            defs[key] = _rebased(arguments, f"#/$defs/{key}")
            arguments = {"$ref": f"#/$defs/{key}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return calls, defs


def _object(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: value},
        "required": [key],
        "additionalProperties": False,
    }


def tool_call_guidance(
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any] = "required",
    *,
    parallel_tool_calls: bool = True,
    tool_format: str = HERMES,
    max_calls: int | None = None,
    tag_tokens: bool = False,
) -> tuple[str, str]:
    """Guidance ``(kind, data)`` that makes the model call the given tools.

    ``tools``: OpenAI tool definitions (``{"type": "function", "function": {"name",
    "description", "parameters"}}``). ``tool_choice``: ``"required"`` (one or more calls to any
    of the tools), ``"auto"`` (an answer in words, or calls) or ``{"type": "function",
    "function": {"name": ...}}`` (calls to that tool only). ``"none"`` needs no guidance and
    raises `ValueError`. ``parallel_tool_calls=False`` allows exactly one call, as OpenAI's
    option of that name; True allows one to ``max_calls`` (default `DEFAULT_MAX_CALLS`). Once the
    call(s) are written the grammar is complete, so generation ends with EOS.

    ``tool_format`` (`tool_call_format` of the chat template): `HERMES` gives a Lark grammar of
    ``<tool_call>`` blocks, one per line (``"auto"``: or text not starting with ``<``); `GENERIC`
    a JSON schema for the one-object reply described by `generic_tool_prompt`: ``{"tool_call":
    {...}}``, or ``{"tool_calls": [...]}`` with 2 to ``max_calls`` calls when parallel calls are
    allowed, or (``"auto"``) ``{"response": "..."}``. JSON whitespace is fixed, with no room for
    a small model to wander into: `HERMES` calls are written as ``json.dumps`` writes them
    (``", "`` and ``": "``, as Hermes / Qwen templates show earlier calls), `GENERIC` replies
    compact, as `generic_tool_prompt` shows them. ``tag_tokens``: the vocabulary has
    ``<tool_call>`` and ``</tool_call>`` as tokens of their own (Qwen2.5, Qwen3), which the
    model writes and llguidance only matches as such (`tokenizer_has_tag_tokens`).

    Argument schemas that list ``properties`` without saying ``additionalProperties`` are
    closed (see `_closed`).
    """
    _check_format(tool_format)
    functions, mode = _chosen(_functions(tools), tool_choice)
    limit = _call_limit(parallel_tool_calls, max_calls)
    schemas, defs = _call_schemas(functions)
    call: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if tool_format == GENERIC:
        shapes = [_object("tool_call", call)]
        if limit > 1:
            array = {"type": "array", "items": call, "minItems": 2, "maxItems": limit}
            shapes.append(_object("tool_calls", array))
        if mode == "auto":
            shapes.append(_object("response", {"type": "string"}))
        schema: dict[str, Any] = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
        schema["x-guidance"] = {"whitespace_flexible": False}
        if defs:
            schema["$defs"] = defs
        return "json_schema", json.dumps(schema, ensure_ascii=False)
    # the separators json.dumps and the templates' tojson write: calls as the model saw them
    layout = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    call = dict(call, **{"x-guidance": layout})
    if defs:
        call["$defs"] = defs
    if tag_tokens:  # llguidance's syntax for a special token: the bare <...> name
        open_tag, close_tag = f'{TOOL_CALL_OPEN} "\\n"', f'"\\n" {TOOL_CALL_CLOSE}'
    else:
        open_tag = json.dumps(TOOL_CALL_OPEN + "\n")
        close_tag = json.dumps("\n" + TOOL_CALL_CLOSE)
    lines = [
        f'calls: call ("\\n" call){{0,{limit - 1}}}' if limit > 1 else "calls: call",
        f"call: {open_tag} body {close_tag}",
        f"body: %json {json.dumps(call, ensure_ascii=False)}",
    ]
    if mode == "auto":
        lines.insert(0, "start: calls | TEXT")
        lines.append(r"TEXT: /[^<][\s\S]*/")
    else:
        lines.insert(0, "start: calls")
    return "lark_grammar", "\n".join(lines) + "\n"


# --- the prompt ---------------------------------------------------------------------------------


def generic_tool_prompt(
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any] = "auto",
    *,
    parallel_tool_calls: bool = True,
) -> str:
    """The system-message text that describes ``tools`` and the `GENERIC` reply format (for
    chat templates that do not show tools themselves). ``tool_choice`` and
    ``parallel_tool_calls`` as in `tool_call_guidance`; the text asks for what its grammar
    allows."""
    functions = _functions(tools)
    chosen, mode = _chosen(functions, tool_choice)
    lines = [
        "You can call tools (functions). Each line below describes one tool: its name, what it "
        "does and its parameters as a JSON schema.",
    ]
    for f in functions:
        entry: dict[str, Any] = {"name": f["name"]}
        if f["description"]:
            entry["description"] = f["description"]
        entry["parameters"] = f["parameters"]
        lines.append(json.dumps(entry, ensure_ascii=False, separators=_COMPACT))
    lines.append("")
    lines.append(
        "To call a tool, reply with only this JSON object:\n"
        '{"tool_call":{"name":"<tool name>","arguments":{<argument values>}}}'
    )
    if parallel_tool_calls:
        lines.append(
            'To make several calls in one reply, use {"tool_calls":[{"name":...,"arguments":'
            '{...}},{"name":...,"arguments":{...}}]}.'
        )
    if mode == "auto":
        lines.append(
            'To answer without a tool, reply with only {"response":"..."} holding your answer.'
        )
    elif len(chosen) == 1 and isinstance(tool_choice, Mapping):
        lines.append(f"You must call the tool {chosen[0]['name']}.")
    else:
        lines.append("You must call a tool.")
    lines.append(
        'The results of your calls come back as {"tool_response":{"name":...,"content":...}}.'
    )
    return "\n".join(lines)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return {} if value is None else value


def _generic_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat with tool calls and tool results written as the `GENERIC` format has them, in
    roles any template knows: an assistant turn with ``tool_calls`` gets the JSON object the
    grammar would have let it write (``tool_call`` for one call, ``tool_calls`` for several),
    and ``tool`` messages become user messages (consecutive ones merged)."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    last_was_tool = False
    for message in messages:
        role = message.get("role")
        new = dict(message)
        if new.get("content") is None:
            new["content"] = ""
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function", call) if isinstance(call, Mapping) else {}
                name = function.get("name")
                calls.append({"name": name, "arguments": _arguments(function.get("arguments"))})
                if isinstance(call, Mapping) and call.get("id"):
                    names[str(call["id"])] = name
            body = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
            text = json.dumps(body, ensure_ascii=False, separators=_COMPACT)
            new.pop("tool_calls")
            new["content"] = f"{new['content']}\n{text}" if new["content"] else text
        elif role == "tool":
            response: dict[str, Any] = {}
            name = names.get(str(message.get("tool_call_id"))) or message.get("name")
            if name:
                response["name"] = name
            response["content"] = _arguments(message.get("content"))
            text = json.dumps({"tool_response": response}, ensure_ascii=False, separators=_COMPACT)
            if last_was_tool:
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
            last_was_tool = True
            continue
        last_was_tool = False
        out.append(new)
    return out


def tool_call_format(template: str, **variables: Any) -> str:
    """`HERMES` when ``template`` shows tools to the model and asks for ``<tool_call>`` tags,
    else `GENERIC` (the template ignores tools, or wants a call syntax of its own)."""
    if TOOL_CALL_OPEN in template and template_supports_tools(template, **variables):
        return HERMES
    return GENERIC


@dataclass(frozen=True)
class ToolPrompt:
    """A chat rendered with tools: the prompt ``text`` and the `tool_format` it asks for."""

    text: str
    tool_format: str


def render_chat_with_tools(
    template: str,
    messages: str | Sequence[Mapping[str, Any]],
    tools: str | Sequence[Any] | None,
    *,
    tool_choice: str | dict[str, Any] = "auto",
    parallel_tool_calls: bool = True,
    add_generation_prompt: bool = True,
    tool_format: str | None = None,
    **variables: Any,
) -> ToolPrompt:
    """Render a chat so that the model sees ``tools``, whatever the chat template.

    A template that shows tools and asks for ``<tool_call>`` tags (`HERMES`) renders them
    itself: the text is exactly `render_chat_template` with ``tools``. Any other template
    (`GENERIC`) is rendered without ``tools``; `generic_tool_prompt` is appended to the system
    message (or becomes one; when the template refuses a system message, it goes before the
    first user message), and earlier tool calls and ``tool`` results are rewritten in the
    generic format (see `_generic_history`). ``tool_choice="none"`` shows no tools.
    ``tool_format`` forces a format; ``variables`` are template variables (``bos_token``...).
    Raises `ChatTemplateError` when the template fails, `ValueError` for bad tools.
    """
    chat = parse_messages(messages)
    tool_list = parse_tools(tools)
    fmt = _check_format(tool_format) if tool_format else tool_call_format(template, **variables)
    show = bool(tool_list) and tool_choice != "none"

    def render(chat: list[dict[str, Any]], with_tools: bool) -> str:
        return render_chat_template(
            template,
            chat,
            add_generation_prompt=add_generation_prompt,
            tools=tool_list if with_tools else None,
            **variables,
        )

    if fmt == HERMES:
        if show:
            _chosen(_functions(tool_list), tool_choice)  # the same errors as the other format
        return ToolPrompt(render(chat, show), HERMES)
    chat = _generic_history(chat)
    if not show:
        return ToolPrompt(render(chat, False), GENERIC)
    instructions = generic_tool_prompt(
        tool_list, tool_choice, parallel_tool_calls=parallel_tool_calls
    )
    if chat and chat[0].get("role") in ("system", "developer") and chat[0]["content"]:
        first = dict(chat[0], content=f"{chat[0]['content']}\n\n{instructions}")
        return ToolPrompt(render([first, *chat[1:]], False), GENERIC)
    if chat and chat[0].get("role") in ("system", "developer"):
        chat = chat[1:]  # an empty system message: replaced
    try:
        return ToolPrompt(
            render([{"role": "system", "content": instructions}, *chat], False), GENERIC
        )
    except ChatTemplateError:  # e.g. Gemma's template raises on a system message
        for i, message in enumerate(chat):
            if message.get("role") == "user":
                chat[i] = dict(message, content=f"{instructions}\n\n{message['content']}")
                break
        else:
            chat.insert(0, {"role": "user", "content": instructions})
        return ToolPrompt(render(chat, False), GENERIC)


# --- reading the reply --------------------------------------------------------------------------


def _call(name: Any, arguments: Any) -> dict[str, Any] | None:
    if not isinstance(name, str):
        return None
    if isinstance(arguments, str):  # already serialised
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _from_object(value: Any) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "tool_calls" in item or "tool_call" in item:  # the generic format's wrapper
            calls.extend(_from_object(item.get("tool_calls", item.get("tool_call"))))
            continue
        if isinstance(item.get("function"), dict):  # already OpenAI-shaped
            item = item["function"]
        call = _call(item.get("name"), item.get("arguments", item.get("parameters")))
        if call is not None:
            calls.append(call)
    return calls


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The tool calls in ``text``, OpenAI-shaped:
    ``[{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}]``.

    Reads each ``<tool_call> {...} </tool_call>`` block (a final block whose closing tag is
    missing, e.g. cut by max_length, is read when its JSON is complete). Text without tags is
    read as one JSON call object or a list of them, or a generic-format reply
    (``{"tool_call": {...}}`` / ``{"tool_calls": [...]}``). Blocks that are not valid JSON
    calls are skipped; no calls gives ``[]``.
    """
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    if TOOL_CALL_OPEN in text:
        for part in text.split(TOOL_CALL_OPEN)[1:]:
            body = part.split(TOOL_CALL_CLOSE, 1)[0].strip()
            try:
                value, _ = decoder.raw_decode(body)
            except json.JSONDecodeError:
                continue
            calls.extend(_from_object(value))
        return calls
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            value, _ = decoder.raw_decode(stripped)
        except json.JSONDecodeError:
            return []
        return _from_object(value)
    return []


_GENERIC_HEAD = re.compile(r'\s*\{\s*"(tool_calls|tool_call|response)"\s*:\s*')


def _partial_string(text: str) -> str | None:
    """The value of a JSON string literal that starts ``text`` (its opening quote), even when
    the text was cut before the closing quote; None when ``text`` is not one."""
    if not text.startswith('"'):
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
        return value if isinstance(value, str) else None
    except json.JSONDecodeError:
        pass
    for cut in range(len(text), max(len(text) - 7, 0), -1):  # a cut escape is <= 6 chars
        try:
            return json.loads(text[:cut] + '"')
        except json.JSONDecodeError:
            continue
    return None


def _complete_items(text: str) -> list[Any]:
    """The complete values of a JSON array that starts ``text``, even when it was cut."""
    decoder = json.JSONDecoder()
    items: list[Any] = []
    if not text.startswith("["):
        return items
    i = 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return items
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return items
        items.append(value)


def _read_generic(text: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """Content and calls of a generic-format reply (also one cut short), or None when
    ``text`` is not one."""
    head = _GENERIC_HEAD.match(text)
    if head is None:
        return None
    key, rest = head.group(1), text[head.end() :]
    if key == "response":
        content = _partial_string(rest)
        if content is None:
            try:  # a response that is not a string (a schema-free reply)
                value, _ = json.JSONDecoder().raw_decode(rest)
            except json.JSONDecodeError:
                return None
            content = json.dumps(value, ensure_ascii=False)
        return content, []
    if key == "tool_calls":
        return None, _from_object(_complete_items(rest))
    try:
        value, _ = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError:
        return None, []
    return None, _from_object(value)


@dataclass(frozen=True)
class ToolCallResult:
    """What a reply to a chat with tools says: ``content`` (text, or None when there is
    none), ``tool_calls`` (OpenAI-shaped, with ids) and the OpenAI ``finish_reason``."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message: ``{"role", "content"[, "tool_calls"]}``."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


#: OpenAI's ``finish_reason`` for each `FinishReason` a generator reports.
OPENAI_FINISH_REASONS: dict[FinishReason, str | None] = {
    FinishReason.NONE: None,
    FinishReason.EOS: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.MAX_GENERATED_TOKENS: "length",
    FinishReason.MAX_SESSION_TOKENS: "length",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.FAILED: "error",
}


def openai_finish_reason(reason: FinishReason | str | None) -> str | None:
    """OpenAI's ``finish_reason`` for ``reason``: a `FinishReason` (what
    `genai.Generator.finish_reason` returns) through `OPENAI_FINISH_REASONS`; a string (a
    server's own, ``"stop"``, ``"length"``, ``"timeout"``, ...) as it is."""
    if isinstance(reason, FinishReason):
        return OPENAI_FINISH_REASONS[reason]
    return reason


def tool_call_result(
    text: str, finish_reason: FinishReason | str | None, *, tool_format: str = HERMES
) -> ToolCallResult:
    """Read a generated reply: its content, its tool calls and the OpenAI finish reason.

    ``finish_reason`` is how generation ended: a `FinishReason` (`genai.Generator.finish_reason`)
    or OpenAI's string: ``"stop"`` (the model, a stop string or the completed grammar ended
    it), ``"length"`` (max_tokens / max_length), or another reason (``"timeout"``,
    ``"cancelled"``, ``"error"``), which is passed on as is.
    The result says ``"tool_calls"`` when the reply holds calls and generation ended by
    itself, ``"stop"`` when it ended by itself without calls, and ``"length"`` whenever the
    token limit cut it, even when complete calls were read before the cut: as OpenAI documents
    ``finish_reason``, ``"length"`` means the limit was reached and the reply may be incomplete
    (here: calls after the cut are missing). The complete calls read are returned either way.

    ``tool_format`` as the prompt asked (`ToolPrompt.tool_format`). `GENERIC` replies give
    ``{"response": ...}``'s text as content (the part written before a cut, too); text that is
    not in the format is content, and calls found in it anyway are read. `HERMES`: content is
    the text before the first call (None when empty).
    """
    _check_format(tool_format)
    content: str | None
    read = _read_generic(text) if tool_format == GENERIC else None
    if read is not None:
        content, calls = read
    else:
        calls = parse_tool_calls(text)
        if not calls:
            content = text
        else:
            before = text.split(TOOL_CALL_OPEN, 1)[0].strip() if TOOL_CALL_OPEN in text else ""
            content = before or None
    finish = openai_finish_reason(finish_reason)
    if finish == "stop":
        finish = "tool_calls" if calls else "stop"
    return ToolCallResult(content, calls, finish)


# --- for a server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolChat:
    """A chat prepared for generation with tools (see `prepare_tool_chat`)."""

    #: the rendered prompt, to encode
    prompt: str
    #: `HERMES` or `GENERIC`: the format the prompt asks for
    tool_format: str
    #: ``(kind, data)`` for the constraint, or None (no tools, or ``tool_choice="none"``)
    guidance: tuple[str, str] | None

    def result(self, text: str, finish_reason: FinishReason | str | None) -> ToolCallResult:
        """The generated ``text`` read as `tool_call_result` does (plain content when no
        tools were offered)."""
        if self.guidance is None:
            return ToolCallResult(text, [], openai_finish_reason(finish_reason))
        return tool_call_result(text, finish_reason, tool_format=self.tool_format)


def tokenizer_has_tag_tokens(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` writes ``<tool_call>`` and ``</tool_call>`` as one token each
    (added tokens, as in Qwen2.5 / Qwen3), so the grammar must name those tokens. The model's
    delimiter ids decide when its config names them (``model.bot_token_id`` /
    ``eot_token_id``, written by the reference's builder; `Tokenizer.bot_token_id`): the tags
    are those tokens or not. Otherwise the vocabulary does."""
    try:
        ids = (tokenizer.bot_token_id, tokenizer.eot_token_id)
    except RuntimeError:  # the model defines no tool-call delimiters
        return all(len(tokenizer.encode(tag)) == 1 for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE))
    return ids == (tokenizer.to_token_id(TOOL_CALL_OPEN), tokenizer.to_token_id(TOOL_CALL_CLOSE))


@functools.lru_cache(maxsize=16)
def _tokenizer_config(path: str, mtime_ns: int) -> dict[str, Any]:
    return load_tokenizer_config(path)


def _config_of(folder: Path) -> dict[str, Any]:
    file = folder / "tokenizer_config.json"
    try:
        mtime = os.stat(file).st_mtime_ns
    except OSError:
        return {}
    return _tokenizer_config(str(folder), mtime)


def prepare_tool_chat(
    tokenizer: Tokenizer,
    messages: str | Sequence[Mapping[str, Any]],
    tools: str | Sequence[Any] | None,
    *,
    tool_choice: str | dict[str, Any] | None = "auto",
    parallel_tool_calls: bool | None = True,
    max_calls: int | None = None,
    add_generation_prompt: bool = True,
    template_str: str | None = None,
    **template_kwargs: Any,
) -> ToolChat:
    """Render a chat with tools for ``tokenizer``'s model and build the matching guidance.

    The chat template comes from the tokenizer's folder (a ``"tool_use"`` entry when the
    config lists named templates) unless a non-empty ``template_str`` is given; ``bos_token``
    etc. come from its ``tokenizer_config.json``. ``tool_choice`` None means ``"auto"``,
    ``parallel_tool_calls`` None means True (the OpenAI defaults). Then: the prompt as
    `render_chat_with_tools` makes it, and `tool_call_guidance` for its format (None when
    there are no tools or ``tool_choice`` is ``"none"``). ``ToolChat.result`` reads the reply.
    Raises `ChatTemplateError` (no template, template failed) or `ValueError` (bad tools or
    tool_choice).
    """
    choice = "auto" if tool_choice is None else tool_choice
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    tool_list = parse_tools(tools)
    folder = Path(tokenizer.path)
    config = _config_of(folder)
    if template_str:  # None or "": the model's own, as Tokenizer.apply_chat_template
        source: str | None = template_str
    else:
        source = load_chat_template(folder, tools=tool_list, tokenizer_config=config)
    if not source:
        raise ChatTemplateError(
            f"no chat template: {folder} has no 'chat_template' in tokenizer_config.json "
            "and no chat_template.jinja"
        )
    variables = {**special_token_strings(config), **template_kwargs}
    prompt = render_chat_with_tools(
        source,
        messages,
        tool_list,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    guidance = None
    if tool_list and choice != "none":
        guidance = tool_call_guidance(
            tool_list,
            choice,
            parallel_tool_calls=parallel,
            tool_format=prompt.tool_format,
            max_calls=max_calls,
            tag_tokens=prompt.tool_format == HERMES and tokenizer_has_tag_tokens(tokenizer),
        )
    return ToolChat(prompt.text, prompt.tool_format, guidance)
