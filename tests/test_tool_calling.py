"""Tool calling on any chat template: which templates show tools, the generic system-prompt
format for those that do not, the grammars' call counts and ends, and the reply read back.

Independent references: the chat templates themselves, rendered here with plain jinja2 set up
as Hugging Face ``apply_chat_template`` sets it up (not through genai); hand-written call texts
driven token by token through llguidance's matcher; and greedy generation on the real SmolLM2.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import genai
from genai.constraints.tools import (
    GENERIC,
    HERMES,
    ToolChat,
    prepare_tool_chat,
    render_chat_with_tools,
    tool_call_format,
    tool_call_guidance,
    tool_call_result,
)
from genai.text.chat_template import ChatTemplateError, template_supports_tools

pytest.importorskip("llguidance", reason="tool-call grammars need llguidance")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
QWEN3 = SHARED / "tokenizers" / "qwen3"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def hf_render(template: str, **variables) -> str:
    """``template`` rendered as transformers' ``apply_chat_template`` renders it."""

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**variables)


def turns(prompt: str) -> list[tuple[str, str]]:
    """``(role, content)`` of each ChatML turn of ``prompt``."""
    out = []
    for part in prompt.split("<|im_start|>")[1:]:
        role, _, rest = part.partition("\n")
        out.append((role, rest.split("<|im_end|>")[0]))
    return out


@pytest.fixture(scope="module")
def smol_template(smollm2_path) -> str:
    return (smollm2_path / "chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_path) -> genai.Tokenizer:
    return genai.Tokenizer(str(smollm2_path))


@pytest.fixture(scope="module")
def qwen3_template() -> str:
    if not (QWEN3 / "tokenizer_config.json").is_file():
        pytest.skip(f"Qwen3 tokenizer not found at {QWEN3}")
    return json.loads((QWEN3 / "tokenizer_config.json").read_text())["chat_template"]


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_template) -> genai.Tokenizer:
    return genai.Tokenizer(str(QWEN3))


# --- which templates show tools -------------------------------------------------------------------


def test_smollm2_template_ignores_tools(smol_template):
    # the independent fact: rendered as HF renders it, tools change nothing
    plain = hf_render(smol_template, messages=ASK, add_generation_prompt=True)
    assert hf_render(smol_template, messages=ASK, tools=[WEATHER], add_generation_prompt=True) == (
        plain
    )
    assert not template_supports_tools(smol_template)
    assert tool_call_format(smol_template) == GENERIC


def test_qwen3_template_renders_its_own_tools(qwen3_template, qwen3_tokenizer):
    assert template_supports_tools(qwen3_template)
    assert tool_call_format(qwen3_template) == HERMES
    want = hf_render(qwen3_template, messages=ASK, tools=[WEATHER, ADD], add_generation_prompt=True)
    assert "<tools>" in want and json.dumps(WEATHER) in want
    got = render_chat_with_tools(qwen3_template, ASK, [WEATHER, ADD])
    assert (got.text, got.tool_format) == (want, HERMES)
    chat = prepare_tool_chat(qwen3_tokenizer, ASK, [WEATHER, ADD])
    assert chat.prompt == want and chat.tool_format == HERMES
    # Qwen's vocabulary has <tool_call> as a token of its own: the grammar names it
    assert chat.guidance[0] == "lark_grammar" and "call: <tool_call> " in chat.guidance[1]
    # tool_choice "none": the tools are not shown
    none = prepare_tool_chat(qwen3_tokenizer, ASK, [WEATHER], tool_choice="none")
    assert none.prompt == hf_render(qwen3_template, messages=ASK, add_generation_prompt=True)
    assert none.guidance is None


def test_template_that_fails_with_tools_does_not_support_them():
    template = (
        "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    assert not template_supports_tools(template)
    prompt = render_chat_with_tools(template, ASK, [WEATHER])
    assert prompt.tool_format == GENERIC
    assert prompt.text.startswith("system: You can call tools") and '"get_weather"' in prompt.text


def test_template_with_its_own_call_syntax_gets_the_generic_format():
    # shows tools, but asks for a syntax other than <tool_call> tags: the template's tool
    # section is left out and the generic prompt (matching the generic grammar) goes in
    template = (
        "{% if tools %}TOOLS {{ tools | tojson }} answer as [CALL]...{% endif %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    )
    assert template_supports_tools(template)
    assert tool_call_format(template) == GENERIC
    text = render_chat_with_tools(template, ASK, [WEATHER]).text
    assert "TOOLS" not in text
    assert text.startswith("<system>You can call tools") and '"name":"get_weather"' in text


# --- the generic prompt ---------------------------------------------------------------------------


def test_generic_prompt_describes_the_tools_in_the_system_message(smol_tokenizer, smol_template):
    chat = prepare_tool_chat(smol_tokenizer, ASK, [WEATHER, ADD])
    assert chat.tool_format == GENERIC and chat.guidance[0] == "json_schema"
    (system_role, system), user, (assistant_role, empty) = turns(chat.prompt)
    assert system_role == "system" and user == ("user", ASK[0]["content"])
    assert (assistant_role, empty) == ("assistant", "")
    assert "SmolLM" not in system  # the template's default system message is replaced
    for tool in (WEATHER, ADD):
        function = tool["function"]
        line = json.dumps(
            {
                "name": function["name"],
                "description": function["description"],
                "parameters": function["parameters"],
            },
            separators=(",", ":"),
        )
        assert line in system.splitlines()
    assert '{"tool_call":{"name":' in system and '{"response":' in system
    # the prompt is the template's own rendering of a chat with that system message
    want = hf_render(
        smol_template,
        messages=[{"role": "system", "content": system}, *ASK],
        add_generation_prompt=True,
    )
    assert chat.prompt == want


def test_an_empty_template_str_means_the_models_template(smol_tokenizer):
    """As Tokenizer.apply_chat_template (and the reference's): "" is no template given."""
    own = prepare_tool_chat(smol_tokenizer, ASK, [WEATHER])
    assert prepare_tool_chat(smol_tokenizer, ASK, [WEATHER], template_str="").prompt == own.prompt


def test_generic_prompt_merges_with_an_existing_system_message(smol_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, *ASK]
    chat = prepare_tool_chat(smol_tokenizer, messages, [WEATHER], tool_choice="required")
    roles = [role for role, _ in turns(chat.prompt)]
    assert roles == ["system", "user", "assistant"]
    system = turns(chat.prompt)[0][1]
    assert system.startswith("Be brief.\n\nYou can call tools")
    assert "You must call a tool." in system and '{"response":' not in system
    named = prepare_tool_chat(
        smol_tokenizer,
        ASK,
        [WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    assert "You must call the tool add." in turns(named.prompt)[0][1]


def test_generic_prompt_only_when_tools_are_offered(smol_tokenizer, smol_template):
    plain = hf_render(smol_template, messages=ASK, add_generation_prompt=True)
    for tools, choice in (([WEATHER], "none"), (None, "auto"), ([], "auto")):
        chat = prepare_tool_chat(smol_tokenizer, ASK, tools, tool_choice=choice)
        assert chat.prompt == plain and chat.guidance is None
    # the tokenizer's own apply_chat_template stays the template's rendering (the reference's)
    assert smol_tokenizer.apply_chat_template(ASK, tools=[WEATHER]) == plain


def test_generic_history_of_calls_and_results(smol_tokenizer):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "3"},
    ]
    chat = prepare_tool_chat(smol_tokenizer, messages, [WEATHER, ADD])
    got = turns(chat.prompt)
    assert [role for role, _ in got] == ["system", "user", "assistant", "user", "assistant"]
    assert json.loads(got[2][1]) == {
        "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "add", "arguments": {"a": 1, "b": 2}},
        ]
    }
    results = [json.loads(line) for line in got[3][1].splitlines()]
    assert results == [
        {"tool_response": {"name": "get_weather", "content": "sunny, 21 C"}},
        {"tool_response": {"name": "add", "content": 3}},
    ]
    assert "None" not in chat.prompt


def test_generic_history_of_one_call_is_the_form_the_grammar_allows(smol_tokenizer):
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
    }
    messages = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]
    messages.append({"role": "tool", "tool_call_id": "c", "content": '{"sum": 1}'})
    chat = prepare_tool_chat(smol_tokenizer, messages, [ADD], parallel_tool_calls=True)
    assistant, result = turns(chat.prompt)[2:4]
    written = assistant[1]
    assert json.loads(written) == {"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    assert json.loads(result[1]) == {"tool_response": {"name": "add", "content": {"sum": 1}}}
    assert accepts(smol_tokenizer, chat.guidance, written)


def test_template_refusing_system_messages_gets_the_tools_in_the_first_user_message():
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ChatTemplateError):
        render_chat_with_tools(template, [{"role": "system", "content": "x"}, *ASK], [WEATHER])
    text = render_chat_with_tools(template, ASK, [WEATHER]).text
    assert text.startswith("<user>You can call tools")
    assert text.endswith("\n\nWhat is the weather in Paris?")


# --- the grammars ---------------------------------------------------------------------------------


def constraint_after(tokenizer, guidance, text):
    """The constraint after ``text``'s tokens, or None when the grammar refused one."""
    from genai.constraints.guidance import GuidanceError, TokenConstraint

    constraint = TokenConstraint.create(tokenizer, *guidance)
    try:
        for token in tokenizer.encode(text):
            constraint.advance(int(token))
    except GuidanceError:
        return None
    return constraint


def accepts(tokenizer, guidance, text) -> bool:
    constraint = constraint_after(tokenizer, guidance, text)
    return constraint is not None and constraint.is_accepting


def ends_after(tokenizer, guidance, text) -> bool:
    """The grammar is complete after ``text``: only EOS may follow (generation stops)."""
    constraint = constraint_after(tokenizer, guidance, text)
    assert constraint is not None, text
    return constraint.is_finished and list(constraint.allowed_tokens()) == [
        int(tokenizer.eos_token_ids[0])
    ]


def generic_call(name, arguments):
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


ONE = '{"tool_call":' + generic_call("get_weather", {"city": "Paris"}) + "}"
TWO = (
    '{"tool_calls":['
    + generic_call("get_weather", {"city": "Paris"})
    + ","
    + generic_call("add", {"a": 1, "b": 2})
    + "]}"
)


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_generic_single_call_grammar(smol_tokenizer, choice):
    guidance = tool_call_guidance(
        [WEATHER, ADD], choice, parallel_tool_calls=False, tool_format=GENERIC
    )
    assert guidance[0] == "json_schema"
    assert accepts(smol_tokenizer, guidance, ONE)
    assert ends_after(smol_tokenizer, guidance, ONE)  # stops after the call
    assert not accepts(smol_tokenizer, guidance, TWO)
    assert not accepts(smol_tokenizer, guidance, ONE + ONE)
    assert not accepts(smol_tokenizer, guidance, "It is sunny in Paris.")
    bad = '{"tool_call":' + generic_call("get_weather", {"city": "Paris", "x": 1}) + "}"
    assert not accepts(smol_tokenizer, guidance, bad)


def test_generic_parallel_grammar(smol_tokenizer):
    guidance = tool_call_guidance([WEATHER, ADD], "required", tool_format=GENERIC, max_calls=2)
    assert accepts(smol_tokenizer, guidance, ONE) and ends_after(smol_tokenizer, guidance, ONE)
    assert accepts(smol_tokenizer, guidance, TWO) and ends_after(smol_tokenizer, guidance, TWO)
    three = TWO[:-2] + "," + generic_call("add", {"a": 3, "b": 4}) + "]}"
    assert not accepts(smol_tokenizer, guidance, three)
    assert not accepts(smol_tokenizer, guidance, '{"response":"Sunny."}')


def test_generic_auto_and_named_grammar(smol_tokenizer):
    auto = tool_call_guidance([WEATHER, ADD], "auto", tool_format=GENERIC)
    answer = '{"response":"I can help with \\"weather\\"."}'
    assert accepts(smol_tokenizer, auto, answer) and ends_after(smol_tokenizer, auto, answer)
    assert accepts(smol_tokenizer, auto, ONE) and accepts(smol_tokenizer, auto, TWO)
    assert not accepts(smol_tokenizer, auto, "Sunny.")
    named = tool_call_guidance(
        [WEATHER, ADD], {"type": "function", "function": {"name": "add"}}, tool_format=GENERIC
    )
    assert not accepts(smol_tokenizer, named, ONE)
    assert accepts(
        smol_tokenizer, named, '{"tool_call":' + generic_call("add", {"a": 1, "b": 2}) + "}"
    )


def hermes_call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# parameters as pydantic writes them: a model inside a model goes to $defs, reached by $ref
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                    "required": ["city", "zip"],
                }
            },
            "type": "object",
            "properties": {"address": {"$ref": "#/$defs/Address"}},
            "required": ["address"],
        },
    },
}
# a recursive parameter: "#" is the parameters object itself
TREE = {
    "type": "function",
    "function": {
        "name": "tree",
        "parameters": {
            "type": "object",
            "properties": {"label": {"type": "string"}, "child": {"$ref": "#"}},
            "required": ["label"],
        },
    },
}


# a parameter named like a data keyword ("default") is a schema like any other
PICK = {
    "type": "function",
    "function": {
        "name": "pick",
        "parameters": {
            "$defs": {"Count": {"type": "integer"}},
            "type": "object",
            "properties": {"default": {"$ref": "#/$defs/Count"}},
            "required": ["default"],
        },
    },
}


@pytest.mark.parametrize("tool_format", [GENERIC, "hermes"])
def test_parameters_with_refs_keep_their_meaning(smol_tokenizer, tool_format):
    """$ref pointers in a tool's parameters point into the parameters (pydantic's $defs, "#"
    for recursion), not into the call object the grammar wraps them in: they were refused
    ("Pointer '/$defs/Address' does not exist") or, for "#", allowed a whole call object as an
    argument."""
    guidance = tool_call_guidance([LOOKUP, TREE, ADD, PICK], "required", tool_format=tool_format)

    def call(name, arguments):
        if tool_format == GENERIC:
            return '{"tool_call":' + generic_call(name, arguments) + "}"
        return hermes_call(name, arguments)

    assert accepts(
        smol_tokenizer, guidance, call("lookup", {"address": {"city": "Oslo", "zip": 1}})
    )
    assert not accepts(smol_tokenizer, guidance, call("lookup", {"address": {"city": "Oslo"}}))
    nested = {"label": "a", "child": {"label": "b", "child": {"label": "c"}}}
    assert accepts(smol_tokenizer, guidance, call("tree", nested))
    assert not accepts(smol_tokenizer, guidance, call("tree", {"label": "a", "child": {}}))
    wrapper = {"label": "a", "child": {"name": "tree", "arguments": {"label": "b"}}}
    assert not accepts(smol_tokenizer, guidance, call("tree", wrapper))
    assert accepts(smol_tokenizer, guidance, call("add", {"a": 1, "b": 2}))
    assert accepts(smol_tokenizer, guidance, call("pick", {"default": 3}))
    assert not accepts(smol_tokenizer, guidance, call("pick", {"default": "three"}))


def test_hermes_grammar_on_qwen3_tag_tokens(qwen3_tokenizer):
    one = hermes_call("get_weather", {"city": "Paris"})
    two = one + "\n" + hermes_call("add", {"a": 1, "b": 2})
    assert len(qwen3_tokenizer.encode("<tool_call>")) == 1
    # without tag_tokens the grammar refuses the token Qwen writes
    plain = tool_call_guidance([WEATHER, ADD], parallel_tool_calls=False)
    assert not accepts(qwen3_tokenizer, plain, one)
    single = tool_call_guidance([WEATHER, ADD], parallel_tool_calls=False, tag_tokens=True)
    assert accepts(qwen3_tokenizer, single, one) and ends_after(qwen3_tokenizer, single, one)
    assert not accepts(qwen3_tokenizer, single, two)
    parallel = tool_call_guidance([WEATHER, ADD], "required", tag_tokens=True, max_calls=2)
    assert accepts(qwen3_tokenizer, parallel, one)
    assert not ends_after(qwen3_tokenizer, parallel, one)  # a second call may follow
    assert accepts(qwen3_tokenizer, parallel, two) and ends_after(qwen3_tokenizer, parallel, two)
    auto = tool_call_guidance([WEATHER], "auto", tag_tokens=True)
    assert accepts(qwen3_tokenizer, auto, "It is sunny.") and accepts(qwen3_tokenizer, auto, one)


# --- reading the reply ----------------------------------------------------------------------------


def names_and_arguments(result):
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls
    ]


@pytest.mark.parametrize(
    ("text", "reason", "content", "calls", "finish"),
    [
        (ONE, "stop", None, [("get_weather", {"city": "Paris"})], "tool_calls"),
        (ONE, genai.FinishReason.EOS, None, [("get_weather", {"city": "Paris"})], "tool_calls"),
        (
            ONE,
            genai.FinishReason.STOP_STRING,
            None,
            [("get_weather", {"city": "Paris"})],
            "tool_calls",
        ),
        (
            ONE,
            genai.FinishReason.MAX_GENERATED_TOKENS,
            None,
            [("get_weather", {"city": "Paris"})],
            "length",
        ),
        # cut by max_tokens after a complete call: still "length" (OpenAI: the limit was hit)
        (ONE, "length", None, [("get_weather", {"city": "Paris"})], "length"),
        (TWO[:-30], "length", None, [("get_weather", {"city": "Paris"})], "length"),
        (
            TWO,
            "stop",
            None,
            [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})],
            "tool_calls",
        ),
        ('{"tool_call":{"name":"get_wea', "length", None, [], "length"),
        ('{"response":"Say \\"hi\\"\\n"}', "stop", 'Say "hi"\n', [], "stop"),
        ('{"response":"Paris is sun', "length", "Paris is sun", [], "length"),
        ('{"response":"caf\\u00', "length", "caf", [], "length"),
        ("not the format", "stop", "not the format", [], "stop"),
        (ONE, "timeout", None, [("get_weather", {"city": "Paris"})], "timeout"),
    ],
)
def test_generic_result(text, reason, content, calls, finish):
    result = tool_call_result(text, reason, tool_format=GENERIC)
    assert (result.content, names_and_arguments(result), result.finish_reason) == (
        content,
        calls,
        finish,
    )


def test_hermes_result_and_message():
    one = hermes_call("add", {"a": 1, "b": 2})
    result = tool_call_result(one + "\n" + one, "stop")
    assert result.finish_reason == "tool_calls" and result.content is None
    ids = [c["id"] for c in result.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert result.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": result.tool_calls,
    }
    assert tool_call_result(one, "length").finish_reason == "length"
    prose = tool_call_result("Sure.\n" + one, "stop")  # text before a call (no grammar)
    assert (prose.content, len(prose.tool_calls)) == ("Sure.", 1)
    text = tool_call_result("It is sunny.", "stop")
    assert text.message() == {"role": "assistant", "content": "It is sunny."}
    assert text.finish_reason == "stop"
    assert ToolChat("p", GENERIC, None).result(ONE, genai.FinishReason.EOS).finish_reason == "stop"


# --- the real model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_model(smollm2_path):
    model = genai.Model(str(smollm2_path))
    return model, genai.Tokenizer(model)


def generate(smol_model, chat: ToolChat, new_tokens: int) -> tuple[str, genai.FinishReason]:
    model, tokenizer = smol_model
    ids = tokenizer.encode(chat.prompt)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
    params.set_guidance(*chat.guidance)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    text = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    return text, generator.finish_reason(0)


@pytest.mark.slow
def test_smollm2_calls_the_tool_on_its_own(smol_model):
    _, tokenizer = smol_model
    chat = prepare_tool_chat(tokenizer, ASK, [WEATHER], tool_choice="auto")
    assert chat.tool_format == GENERIC
    text, reason = generate(smol_model, chat, 60)
    result = chat.result(text, reason)
    assert reason is genai.FinishReason.EOS, text  # the grammar ended the reply
    assert names_and_arguments(result) == [("get_weather", {"city": "Paris"})], text
    assert result.finish_reason == "tool_calls" and result.content is None


@pytest.mark.slow
def test_smollm2_required_single_call_stops_and_a_cut_says_length(smol_model):
    _, tokenizer = smol_model
    chat = prepare_tool_chat(
        tokenizer, ASK, [WEATHER, ADD], tool_choice="required", parallel_tool_calls=False
    )
    text, reason = generate(smol_model, chat, 100)
    assert reason is genai.FinishReason.EOS, text
    result = chat.result(text, reason)
    assert len(result.tool_calls) == 1 and result.finish_reason == "tool_calls"
    cut_text, cut_reason = generate(smol_model, chat, 6)
    assert cut_reason is genai.FinishReason.MAX_SESSION_TOKENS
    cut = chat.result(cut_text, cut_reason)
    assert cut.finish_reason == "length" and cut.tool_calls == []


def test_tag_tokens_follow_the_models_delimiter_ids(tmp_path):
    """Where the config names the tool-call delimiters (model.bot_token_id / eot_token_id, as
    the 0.18 builder writes them), they decide whether the tags are single tokens."""
    import json
    import shutil

    from genai.constraints.tools import tokenizer_has_tag_tokens
    from genai.text.tokenizer import Tokenizer
    from tests.conftest import TOKENIZERS

    if not (TOKENIZERS / "qwen3" / "tokenizer.json").is_file():
        pytest.skip("../shared/tokenizers/qwen3 is not beside the checkout")
    folder = tmp_path / "qwen3"
    shutil.copytree(TOKENIZERS / "qwen3", folder)
    base = {"model": {"type": "qwen3", "context_length": 64, "eos_token_id": 151645}}
    cases = {
        "the tags' ids": ({"bot_token_id": 151657, "eot_token_id": 151658}, True),
        "other ids": ({"bot_token_id": 151667, "eot_token_id": 151668}, False),
    }
    for what, (keys, expected) in cases.items():
        config = json.loads(json.dumps(base))
        config["model"].update(keys)
        (folder / "genai_config.json").write_text(json.dumps(config))
        assert tokenizer_has_tag_tokens(Tokenizer(folder)) is expected, what
