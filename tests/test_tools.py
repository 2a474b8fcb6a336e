"""Tool calling: `genai.constraints.tools.tool_call_guidance` grammars and `parse_tool_calls`."""

from __future__ import annotations

import json

import pytest

import genai
from genai.constraints.tools import parse_tool_calls, tool_call_guidance

pytest.importorskip("llguidance", reason="tool-call grammars need llguidance")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def call_text(name, arguments):
    """A call as Hermes / Qwen templates write one (json.dumps' default separators)."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


# --- parsing -------------------------------------------------------------------------------------


def test_parse_one_call_openai_shape():
    (call,) = parse_tool_calls(call_text("add", {"a": 1, "b": 2}))
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert isinstance(call["function"]["arguments"], str)


def test_parse_several_calls_distinct_ids_and_text_around():
    text = (
        "Let me check.\n"
        + call_text("get_weather", {"city": "Paris", "unit": "c"})
        + "\n"
        + call_text("add", {"a": 3, "b": 4})
    )
    calls = parse_tool_calls(text)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert len({c["id"] for c in calls}) == 2


def test_parse_tolerates_truncation_and_skips_broken_blocks():
    text = (
        call_text("add", {"a": 1, "b": 2})
        + "\n<tool_call>\n{not json}\n</tool_call>"
        + '\n<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}'  # no closing tag
        + '\n<tool_call>\n{"name": "add", "argu'  # cut mid-JSON
    )
    calls = parse_tool_calls(text)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"a": 1, "b": 2},
        {"a": 5, "b": 6},
    ]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"name": "add", "arguments": {"a": 1, "b": 2}}', ["add"]),
        (
            '[{"name": "add", "arguments": {}}, {"name": "get_weather", "parameters": {}}]',
            ["add", "get_weather"],
        ),
        ('{"name": "add", "arguments": "{\\"a\\": 1}"}', ["add"]),  # arguments already a string
        ('{"type": "function", "function": {"name": "add", "arguments": "{}"}}', ["add"]),
        ("Paris is sunny.", []),
        ("", []),
        ('{"arguments": {}}', []),
    ],
)
def test_parse_bare_json(text, names):
    assert [c["function"]["name"] for c in parse_tool_calls(text)] == names


# --- the grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ([], "required", "non-empty"),
        ([WEATHER, WEATHER], "required", "duplicate"),
        ([{"type": "retrieval"}], "required", "only type 'function'"),
        ([{"type": "function", "function": {"name": "bad name"}}], "required", "name must"),
        ([WEATHER], "none", "forbids"),
        ([WEATHER], "sometimes", "tool_choice must"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "not one of the tools"),
        ([WEATHER], {"type": "function", "function": "get_weather"}, "tool_choice must be"),
        ([WEATHER], {"type": "retrieval", "function": {"name": "x"}}, "tool_choice must be"),
        ([WEATHER], {}, "tool_choice must be"),
    ],
)
def test_bad_tools_raise(tools, choice, message):
    with pytest.raises(ValueError, match=message):
        tool_call_guidance(tools, choice)


@pytest.mark.parametrize("max_calls", [0, -1, 1.5, True, "2"])
def test_bad_max_calls_raise(max_calls):
    with pytest.raises(ValueError, match="max_calls"):
        tool_call_guidance([WEATHER], max_calls=max_calls)
    with pytest.raises(ValueError, match="tool_format"):
        tool_call_guidance([WEATHER], tool_format="xml")


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return genai.Tokenizer(str(smollm2_path))


def accepts(tokenizer, guidance, text):
    """Whether the grammar allows ``text`` as a complete output."""
    from genai.constraints.guidance import GuidanceError, TokenConstraint

    constraint = TokenConstraint.create(tokenizer, *guidance)
    try:
        for token in tokenizer.encode(text):
            constraint.advance(int(token))
    except GuidanceError:
        return False
    return constraint.is_accepting


def test_required_grammar_accepts_only_well_formed_calls(tokenizer):
    guidance = tool_call_guidance([WEATHER, ADD])
    assert guidance[0] == "lark_grammar"
    good = call_text("get_weather", {"city": "Oslo", "unit": "f"})
    assert accepts(tokenizer, guidance, good)
    assert accepts(tokenizer, guidance, good + "\n" + call_text("add", {"a": 1, "b": -2}))
    for bad in [
        call_text("get_time", {}),  # unknown tool
        call_text("get_weather", {"city": "Oslo"}),  # missing required argument
        call_text("get_weather", {"city": "Oslo", "unit": "k"}),  # not in the enum
        call_text("get_weather", {"city": "Oslo", "unit": "c", "x": 1}),  # additional
        call_text("add", {"a": 1.5, "b": 2}),  # not an integer
        "Sure! " + good,  # text before the call
        good[:-3],  # incomplete
    ]:
        assert not accepts(tokenizer, guidance, bad), bad
    assert parse_tool_calls(good)[0]["function"]["name"] == "get_weather"


def test_single_call_and_named_choice(tokenizer):
    one = tool_call_guidance([WEATHER, ADD], parallel_tool_calls=False)
    two_calls = call_text("add", {"a": 1, "b": 2}) + "\n" + call_text("add", {"a": 3, "b": 4})
    assert accepts(tokenizer, one, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(tokenizer, one, two_calls)
    named = tool_call_guidance([WEATHER, ADD], {"type": "function", "function": {"name": "add"}})
    assert accepts(tokenizer, named, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(tokenizer, named, call_text("get_weather", {"city": "x", "unit": "c"}))


def test_auto_allows_plain_text_or_calls(tokenizer):
    auto = tool_call_guidance([WEATHER], "auto")
    assert accepts(tokenizer, auto, "It is sunny in Paris today.")
    assert accepts(tokenizer, auto, call_text("get_weather", {"city": "Paris", "unit": "c"}))
    assert not accepts(tokenizer, auto, "<tool_call>\n{}\n</tool_call>")


def test_parallel_calls_bounded_by_max_calls(tokenizer):
    three = "\n".join(call_text("add", {"a": i, "b": i}) for i in range(3))
    two = "\n".join(call_text("add", {"a": i, "b": i}) for i in range(2))
    bounded = tool_call_guidance([ADD], max_calls=2)
    assert accepts(tokenizer, bounded, two)
    assert not accepts(tokenizer, bounded, three)
    assert accepts(tokenizer, tool_call_guidance([ADD]), three)  # default bound: 8


def test_argument_objects_without_additional_properties_are_closed(tokenizer):
    # ADD's parameters say nothing of additionalProperties: made-up arguments are refused
    # (left open, a small model adds "type":"integer",... until max_tokens).
    guidance = tool_call_guidance([ADD])
    assert accepts(tokenizer, guidance, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(tokenizer, guidance, call_text("add", {"a": 1, "b": 2, "c": 3}))
    nested = {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "who": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "extra": {"type": "object", "additionalProperties": True},
                },
            },
        },
    }
    guidance = tool_call_guidance([nested])
    assert accepts(tokenizer, guidance, call_text("book", {"who": {"name": "Ada"}}))
    assert not accepts(tokenizer, guidance, call_text("book", {"who": {"name": "A", "x": 1}}))
    # an explicit additionalProperties stays as written
    assert accepts(tokenizer, guidance, call_text("book", {"extra": {"any": 1}}))


def test_compact_calls_refused_in_hermes_format(tokenizer):
    # whitespace is fixed: json.dumps' separators, as the templates show earlier calls
    compact = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
    assert not accepts(tokenizer, tool_call_guidance([ADD]), compact)


def test_parse_generic_format():
    one = '{"tool_call":{"name":"add","arguments":{"a":1,"b":2}}}'
    several = (
        '{"tool_calls":[{"name":"add","arguments":{"a":1,"b":2}},'
        '{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}]}'
    )
    assert [c["function"]["name"] for c in parse_tool_calls(one)] == ["add"]
    assert [c["function"]["name"] for c in parse_tool_calls(several)] == ["add", "get_weather"]
    assert parse_tool_calls('{"response":"Hi"}') == []
