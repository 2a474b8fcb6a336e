"""Tool calling: OpenAI-style tool definitions -> a grammar that forces well-formed calls, and
the calls parsed back into OpenAI-shaped objects.

A call is written as the Hermes / Qwen convention has it::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tool_call_guidance` returns ``("lark_grammar", grammar)`` for `GeneratorParams.set_guidance`
(or `genai.guidance.TokenConstraint.create`): the JSON inside each call must name one of the
tools and match that tool's ``parameters`` schema. `parse_tool_calls` reads the calls out of
the generated text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "parse_tool_calls", "tool_call_guidance"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _functions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function`` objects of OpenAI tool definitions, checked."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list of OpenAI tool definitions")
    functions, names = [], set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise TypeError(f"tools[{i}] must be a dict, got {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise ValueError(f"tools[{i}]: only type 'function' is supported, got {tool['type']!r}")
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"tools[{i}]: function name must match [A-Za-z0-9_.-]{{1,64}}, got {name!r}"
            )
        if name in names:
            raise ValueError(f"tools[{i}]: duplicate function name {name!r}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}] ({name}): parameters must be a JSON schema object")
        names.add(name)
        functions.append({"name": name, "parameters": parameters})
    return functions


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": function["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_guidance(
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any] = "required",
    *,
    parallel_tool_calls: bool = True,
) -> tuple[str, str]:
    """Guidance ``(kind, data)`` that makes the model call the given tools.

    ``tools``: OpenAI tool definitions (``{"type": "function", "function": {"name", "description",
    "parameters"}}``). ``tool_choice``: ``"required"`` (one or more calls to any of the tools),
    ``"auto"`` (plain text not starting with ``<``, or calls), or
    ``{"type": "function", "function": {"name": ...}}`` (calls to that tool only). ``"none"``
    needs no guidance and raises `ValueError`. ``parallel_tool_calls`` False allows exactly one
    call (then EOS), as OpenAI's option of that name; True allows one or more, one per line.
    """
    functions = _functions(tools)
    mode = tool_choice
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        functions, mode = chosen, "required"
    elif tool_choice == "none":
        raise ValueError("tool_choice 'none' forbids tool calls: generate without guidance")
    elif tool_choice not in ("required", "auto"):
        raise ValueError(
            f"tool_choice must be 'auto', 'required', 'none' or a function choice, "
            f"got {tool_choice!r}"
        )
    schemas = [_call_schema(f) for f in functions]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    # compact JSON: a small model cannot wander off into endless whitespace
    schema["x-guidance"] = {"whitespace_flexible": False}
    open_tag, close_tag = json.dumps(TOOL_CALL_OPEN + "\n"), json.dumps("\n" + TOOL_CALL_CLOSE)
    lines = [
        'calls: call ("\\n" call)*' if parallel_tool_calls else "calls: call",
        f"call: {open_tag} body {close_tag}",
        f"body: %json {json.dumps(schema)}",
    ]
    if mode == "auto":
        lines.insert(0, "start: calls | TEXT")
        lines.append(r"TEXT: /[^<][\s\S]*/")
    else:
        lines.insert(0, "start: calls")
    return "lark_grammar", "\n".join(lines) + "\n"


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
    read as one JSON call object or a list of them. Blocks that are not valid JSON calls are
    skipped; no calls gives ``[]``.
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
