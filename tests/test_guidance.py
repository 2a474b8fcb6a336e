"""Constrained decoding: `GeneratorParams.set_guidance` and
`genai.constraints.guidance.TokenConstraint`.

Fast tests run on the tiny fixture model (its tokenizer.json goes through the `tokenizers`
fallback: llguidance cannot read its decoder) and on the real model's tokenizer alone; tests
marked slow generate with the real SmolLM2 model and compare with onnxruntime-genai.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import genai
from genai.constraints.guidance import LOWEST, GuidanceError, TokenConstraint, apply_bitmask
from genai.errors import SearchOptionError

pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")
jsonschema = pytest.importorskip("jsonschema")

PROMPT = "the cat sat on the mat"


# --- the mask kernel -----------------------------------------------------------------------------


def brute_force_mask(row: np.ndarray, bits: np.ndarray) -> np.ndarray:
    out = row.copy()
    for i in range(row.shape[0]):
        if not (int(bits[i // 32]) >> (i % 32)) & 1:
            out[i] = LOWEST
    return out


@pytest.mark.parametrize("vocab", [32, 50, 64, 96, 1000, 4096])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_apply_bitmask_matches_brute_force(vocab, density):
    rng = np.random.default_rng(vocab + int(density * 1000))
    words = (vocab + 31) // 32
    for layout in ("bits", "words"):
        if layout == "bits":
            allowed = rng.random(words * 32) < density
        else:  # runs of whole words, as grammar masks mostly are
            allowed = np.repeat(rng.random(words) < density, 32)
            allowed[rng.integers(0, words * 32, 3)] ^= True
        bits = np.packbits(allowed.astype(np.uint8), bitorder="little").view(np.int32).copy()
        row = rng.standard_normal(vocab).astype(np.float32)
        want = brute_force_mask(row, bits)
        apply_bitmask(row, bits)
        np.testing.assert_array_equal(row, want)


# --- errors --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


def params_for(model, **options):
    params = genai.GeneratorParams(model)
    params.set_search_options(**{"max_length": 40, **options})
    return params


@pytest.mark.parametrize(
    ("kind", "data", "message"),
    [
        ("xml", "<a/>", "unsupported guidance type 'xml'"),
        ("JSON_SCHEMA", "{}", "unsupported guidance type"),
        ("regex", "a(b", "unclosed group"),
        ("lark_grammar", "start: foo", 'unknown name: "foo"'),
        ("json_schema", '{"type": "foo"}', "Invalid type: foo"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be a JSON object"),
        ("regex", "", "non-empty"),
    ],
)
def test_bad_guidance_raises_with_llguidance_message(fixture_model, kind, data, message):
    params = params_for(fixture_model)
    with pytest.raises(GuidanceError, match=re.escape(message)):
        params.set_guidance(kind, data)
    assert params.guidance is None
    assert issubclass(GuidanceError, ValueError)


def test_set_guidance_stores_and_clears(fixture_model):
    params = params_for(fixture_model)
    params.set_guidance("regex", "[a-z]+", enable_ff_tokens=True)
    assert params.guidance == ("regex", "[a-z]+") and params.guidance_ff_tokens
    params.set_guidance("", "")
    assert params.guidance is None and not params.guidance_ff_tokens
    params.set_guidance("regex", b"[a-z]+")  # UTF-8 bytes, as the reference's binding takes
    assert params.guidance == ("regex", "[a-z]+")
    with pytest.raises(TypeError):
        params.set_guidance("regex", 3)


def test_guidance_refuses_beam_search(fixture_model):
    params = params_for(fixture_model, num_beams=2)
    params.set_guidance("regex", "[a-z]+")
    with pytest.raises(SearchOptionError, match="beam search"):
        genai.Generator(fixture_model, params)


def test_grammar_the_vocabulary_cannot_spell_raises(fixture_model):
    params = params_for(fixture_model)
    params.set_guidance("json_schema", '{"type": "object"}')  # no "{" in the fixture vocabulary
    generator = genai.Generator(fixture_model, params)
    generator.append_tokens(genai.Tokenizer(fixture_model).encode(PROMPT))
    # (llguidance may let through the <unk> that the tokenizer makes of "{", then rejects it)
    with pytest.raises(GuidanceError, match="allows no token|not allowed"):
        generator.generate_next_token()


# --- generation on the fixture model -------------------------------------------------------------

REGEX = r"[a-z]{2,6}( [a-z]{2,6}){1,3}[.!?]"


def guided_run(model, kind, data, prompts=(PROMPT,), ff=False, **options):
    tokenizer = genai.Tokenizer(model)
    params = params_for(model, batch_size=len(prompts), **options)
    params.set_guidance(kind, data, enable_ff_tokens=ff)
    generator = genai.Generator(model, params)
    ids = (
        tokenizer.encode_batch(list(prompts)) if len(prompts) > 1 else tokenizer.encode(prompts[0])
    )
    generator.append_tokens(ids)
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    width = ids.shape[-1]
    outputs = [generator.get_sequence(r)[width:] for r in range(len(prompts))]
    return generator, tokenizer, outputs, steps


def strip_eos(tokens, eos=2, pad=None):
    tokens = list(map(int, tokens))
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def test_regex_output_fullmatches_and_ends_with_eos(fixture_model):
    generator, tokenizer, (out,), _ = guided_run(fixture_model, "regex", REGEX)
    text = tokenizer.decode(out)
    assert re.fullmatch(REGEX, text), text
    assert generator.finish_reason(0) is genai.FinishReason.EOS  # the grammar completed: EOS forced


def test_lark_grammar_output_parses(fixture_model):
    grammar = 'start: word " " word " " word "."\nword: "cat" | "dog" | "sat" | "mat"'
    generator, tokenizer, (out,), _ = guided_run(fixture_model, "lark_grammar", grammar)
    text = tokenizer.decode(out)
    assert re.fullmatch(r"(cat|dog|sat|mat)( (cat|dog|sat|mat)){2}\.", text), text
    assert generator.finish_reason(0) is genai.FinishReason.EOS


def test_one_constraint_per_row_at_batch_3(fixture_model):
    prompts = ("the cat sat on the mat", "a dog", "is it")
    generator, tokenizer, outs, _ = guided_run(fixture_model, "regex", REGEX, prompts)
    assert len({tuple(o) for o in outs}) > 1  # rows really differ
    for row, out in enumerate(outs):
        text = tokenizer.decode(out)
        assert re.fullmatch(REGEX, text), (row, text)
        assert generator.finish_reason(row) is genai.FinishReason.EOS
        tokens = list(map(int, out))
        if 2 in tokens:  # after EOS the row holds pad tokens
            end = tokens.index(2)
            assert set(tokens[end + 1 :]) <= {fixture_model.config.get("model.pad_token_id")}


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "top_k": 0, "temperature": 2.0}])
def test_mask_comes_before_the_choice(fixture_model, options):
    """set_logits pushes a disallowed token to the top: the choice still obeys the grammar,
    greedy or sampling (the mask is stage 1 of the chain)."""
    tokenizer = genai.Tokenizer(fixture_model)
    params = params_for(fixture_model, random_seed=3, **options)
    params.set_guidance("regex", "(cat|dog) [a-z]{1,8}\\.")
    generator = genai.Generator(fixture_model, params)
    generator.append_tokens(tokenizer.encode(PROMPT))
    banned = tokenizer.encode(" zebra")[0]
    while not generator.is_done():
        logits = generator.get_logits().reshape(1, -1).copy()
        logits[0, banned] = 1e6
        logits[0, 2] = 1e6  # EOS, allowed only once the text is complete
        generator.set_logits(logits)
        generator.generate_next_token()
    text = tokenizer.decode(generator.get_sequence(0)[len(tokenizer.encode(PROMPT)) :])
    assert re.fullmatch(r"(cat|dog) [a-z]{1,8}\.", text), text


def test_unconstrained_generator_takes_the_native_path(fixture_model):
    tokenizer = genai.Tokenizer(fixture_model)
    ids = tokenizer.encode(PROMPT)
    plain = genai.Generator(fixture_model, params_for(fixture_model))
    assert not plain._python_stage
    plain.append_tokens(ids)
    plain.generate_until_done()
    # a grammar that allows any text changes no token (the fixture never picks EOS)
    generator, _, (out,), _ = guided_run(fixture_model, "regex", r"[\s\S]*")
    assert generator._python_stage
    np.testing.assert_array_equal(out, plain.get_sequence(0)[len(ids) :])
    assert (
        generator.finish_reason(0)
        == plain.finish_reason(0)
        == genai.FinishReason.MAX_SESSION_TOKENS
    )


def test_fast_forward_appends_forced_tokens(fixture_model):
    regex = "the (cat|dog) sat on the mat and the dog sat on the cat\\."
    _, tokenizer, (plain,), plain_steps = guided_run(fixture_model, "regex", regex, max_length=64)
    generator, _, (fast,), fast_steps = guided_run(
        fixture_model, "regex", regex, ff=True, max_length=64
    )
    for out in (plain, fast):
        assert re.fullmatch(regex, tokenizer.decode(out)), tokenizer.decode(out)
    assert fast_steps < plain_steps / 4  # forced text costs no model step per token
    assert generator.finish_reason(0) is genai.FinishReason.EOS


def test_rewind_replays_the_constraint(fixture_model):
    _, tokenizer, (whole,), _ = guided_run(fixture_model, "regex", REGEX)
    params = params_for(fixture_model)
    params.set_guidance("regex", REGEX)
    generator = genai.Generator(fixture_model, params)
    ids = tokenizer.encode(PROMPT)
    generator.append_tokens(ids)
    for _ in range(4):
        generator.generate_next_token()
    generator.rewind_to(len(ids) + 2)
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0)[len(ids) :], whole)


@pytest.mark.parametrize("how", ["rewind_to", "truncate"])
def test_a_rewind_into_a_forced_span_gives_the_rest_back(fixture_model, how):
    """With fast-forward, the grammar consumed a forced span with the token before it; a rewind
    to inside the span replays the kept part and gives the rest back to the grammar, so the
    output is the grammar's text again (before, the grammar stayed past the span)."""
    regex = "the (cat|dog) sat on the mat and the dog sat on the cat\\."
    _, tokenizer, (whole,), _ = guided_run(fixture_model, "regex", regex, ff=True, max_length=64)
    params = params_for(fixture_model, max_length=64)
    params.set_guidance("regex", regex, True)
    generator = genai.Generator(fixture_model, params)
    ids = tokenizer.encode(PROMPT)
    generator.append_tokens(ids)
    while not generator.is_done():
        before = generator.token_count()
        generator.generate_next_token()
        if generator.token_count() - before > 2:  # a forced span joined in this step
            break
    else:
        pytest.fail("no forced span: the test checks nothing")
    getattr(generator, how)(before + 1)  # one token into the span
    while not generator.is_done():
        generator.generate_next_token()
    out = generator.get_sequence(0)[len(ids) :]
    assert re.fullmatch(regex, tokenizer.decode(out)), tokenizer.decode(out)
    np.testing.assert_array_equal(out, whole)


# --- TokenConstraint over the real tokenizer (no model run) ---------------------------------------


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_path):
    return genai.Tokenizer(str(smollm2_path))


def test_constraint_masks_follow_the_regex(smol_tokenizer):
    constraint = TokenConstraint.create(smol_tokenizer, "regex", "[0-9]{3}-[0-9]{4}")
    assert constraint.vocab_size == 49152 and constraint.eos_token_id == 2
    typed = ""
    for piece in ["5", "5", "5", "-", "1", "2", "3", "4"]:
        allowed = constraint.allowed_tokens()
        assert 2 not in allowed  # not complete yet
        for token in allowed[:: max(1, len(allowed) // 50)]:
            candidate = typed + smol_tokenizer.decode([int(token)])
            assert re.fullmatch(r"[0-9]{0,3}(-[0-9]{0,4})?", candidate), candidate
        token = smol_tokenizer.to_token_id(piece)
        assert token in allowed
        assert constraint.advance(token) == []
        typed += piece
    assert constraint.is_finished and constraint.is_accepting
    np.testing.assert_array_equal(constraint.allowed_tokens(), [2])  # only EOS, as the reference
    with pytest.raises(GuidanceError, match="not allowed"):
        TokenConstraint.create(smol_tokenizer, "regex", "[0-9]+").advance(
            smol_tokenizer.to_token_id("a")
        )
    constraint.advance(2)
    with pytest.raises(GuidanceError, match="ended"):
        constraint.fill_mask(np.zeros(49152, np.float32))


def test_constraint_fast_forward_tokens(smol_tokenizer):
    constraint = TokenConstraint.create(
        smol_tokenizer, "regex", "(yes|no), because it is [a-z]+", enable_ff_tokens=True
    )
    forced = constraint.advance(smol_tokenizer.to_token_id("yes"))
    assert smol_tokenizer.decode(forced).startswith(", because it is")
    slow = TokenConstraint.create(smol_tokenizer, "regex", "(yes|no), because it is [a-z]+")
    assert slow.advance(smol_tokenizer.to_token_id("yes")) == []


def test_json_schema_mask_only_allows_valid_prefixes(smol_tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    constraint = TokenConstraint.create(smol_tokenizer, "json_schema", json.dumps(schema))
    row = np.random.default_rng(0).standard_normal(49152).astype(np.float32)
    constraint.fill_mask(row)
    allowed = np.flatnonzero(row != LOWEST)
    assert 0 < len(allowed) < 100
    assert all(smol_tokenizer.decode([int(t)]).lstrip().startswith("{") for t in allowed)
    with pytest.raises(ValueError, match="shape"):
        constraint.fill_mask(np.zeros(10, np.float32))


# --- the real model ------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}

SUBJECTS = [
    "a doctor from Paris",
    "a retired teacher",
    "a young football player",
    "a chef who loves Italian food",
    "a programmer in Berlin",
    "a famous painter",
    "a student in Tokyo",
    "a farmer from Kansas",
    "a pilot",
    "a musician who plays jazz",
    "a nurse in London",
    "an astronaut",
    "a writer of mystery novels",
    "a child who likes dinosaurs",
    "a scientist studying bees",
    "a baker in Lyon",
    "a marathon runner",
    "a librarian",
    "a photographer from Cairo",
    "a gardener",
]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    model = genai.Model(str(smollm2_path))
    return model, genai.Tokenizer(model)


def chat_ids(tokenizer, text):
    messages = json.dumps([{"role": "user", "content": text}])
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


@pytest.mark.slow
def test_json_schema_outputs_validate_for_20_prompts(smol):
    model, tokenizer = smol
    prompts = [
        tokenizer.apply_chat_template(
            json.dumps([{"role": "user", "content": f"Describe {s} as a JSON object."}]),
            add_generation_prompt=True,
        )
        for s in SUBJECTS
    ]
    ids = tokenizer.encode_batch(prompts)
    params = genai.GeneratorParams(model)
    params.set_search_options(batch_size=len(prompts), max_length=ids.shape[1] + 220)
    params.set_guidance("json_schema", json.dumps(PERSON))
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    names = set()
    for row in range(len(prompts)):
        assert generator.finish_reason(row) is genai.FinishReason.EOS, row
        text = tokenizer.decode(generator.get_sequence(row)[ids.shape[1] :])
        value = json.loads(text)
        jsonschema.validate(value, PERSON)
        names.add(value["name"])
    assert len(names) > 3  # the prompts shaped the answers


REGEXES = [
    ("What is 12 times 12? Answer with the number only.", r"[0-9]{1,4}"),
    ("Give me a phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("When did World War II end? Give the date.", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    ("Is Paris the capital of France?", r"(Yes|No), [a-z ,]{5,60}\."),
    ("Write an email address for John Smith.", r"[a-z]{1,12}\.[a-z]{1,12}@[a-z]{2,10}\.(com|org)"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("question", "regex"), REGEXES)
def test_regex_outputs_fullmatch(smol, question, regex):
    model, tokenizer = smol
    ids = chat_ids(tokenizer, question)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 96)
    params.set_guidance("regex", regex)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    text = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    assert re.fullmatch(regex, text), text
    assert generator.finish_reason(0) is genai.FinishReason.EOS


@pytest.mark.slow
def test_grammar_forced_tool_call_parses(smol):
    from genai.constraints.tools import parse_tool_calls, tool_call_guidance

    model, tokenizer = smol
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 30},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["city", "unit"],
                    "additionalProperties": False,
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                    "additionalProperties": False,
                },
            },
        },
    ]
    system = (
        "You can call tools. To call one, write <tool_call>{json}</tool_call>. Tools: "
        + json.dumps(tools)
    )
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is the weather in Paris, in celsius?"},
    ]
    ids = tokenizer.encode(
        tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    )
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 120)
    params.set_guidance(*tool_call_guidance(tools, parallel_tool_calls=False))
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.finish_reason(0) is genai.FinishReason.EOS
    text = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    calls = parse_tool_calls(text)
    assert len(calls) == 1, text
    assert calls[0]["function"]["name"] == "get_weather"
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, by_name[call["function"]["name"]])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("json_schema", json.dumps(PERSON)),
        ("regex", r"(yes|no|maybe), because [a-z ]{1,40}\."),
        ("lark_grammar", 'start: "The answer is " ANSWER "."\nANSWER: /[A-Z][a-z]{1,12}/'),
    ],
)
@pytest.mark.parametrize("ff", [False, True], ids=["plain", "fast-forward"])
def test_guided_tokens_identical_to_reference(smol, smollm2_path, kind, data, ff):
    """Step by step as the reference: the chosen token, and the sequence's length after each
    step. With fast-forward the forced tokens join the sequence at the next step and run
    after the chosen token's own run (one run for both gave other logits on int4)."""
    og = pytest.importorskip("onnxruntime_genai")
    model, tokenizer = smol
    ids = chat_ids(tokenizer, "Who is the most famous person in Paris? Answer as JSON.")
    runs = []
    for engine, m in ((genai, model), (og, og.Model(str(smollm2_path)))):
        params = engine.GeneratorParams(m)
        params.set_search_options(max_length=len(ids) + 160)
        params.set_guidance(kind, data, ff)
        generator = engine.Generator(m, params)
        generator.append_tokens(ids)
        tokens = []
        while not generator.is_done():
            generator.generate_next_token()
            tokens.append((int(generator.get_next_tokens()[0]), generator.token_count()))
        runs.append((tokens, np.asarray(generator.get_sequence(0))))
    assert runs[0][0] == runs[1][0]
    if ff:  # forced spans: fewer steps than tokens
        assert len(runs[0][0]) < len(runs[0][1]) - len(ids)
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert runs[0][0][-1][0] == 2  # EOS forced once the grammar completed


@pytest.mark.slow
def test_permissive_grammar_changes_no_token(smol):
    """Unguided vs a grammar that allows any text: the same greedy tokens."""
    model, tokenizer = smol
    ids = chat_ids(tokenizer, "What is the capital of France?")
    outs = []
    for guidance in (None, ("regex", r"[\s\S]*")):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 48)
        if guidance:
            params.set_guidance(*guidance)
        generator = genai.Generator(model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        outs.append(generator.get_sequence(0))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert "Paris" in tokenizer.decode(outs[0][len(ids) :])


@pytest.mark.slow
def test_docs_guidance_examples_run(smollm2_path):
    """docs/guidance.md's Python blocks, run in order as one script."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "guidance.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```python\n(.*?)```", doc, flags=re.S))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "'city': 'Paris'" in result.stdout and "get_weather" in result.stdout
