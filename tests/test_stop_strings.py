"""Stop strings (`genai.constraints.stop.StopStringMatcher`, search option ``stop``) and
``max_new_tokens``,
with `Generator.finish_reason`."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import genai
from genai.constraints.stop import StopStringMatcher, check_stop_strings
from genai.errors import GenerationError, SearchOptionError

# --- the matcher against a brute-force reference ---------------------------------------------

ALPHABET = "ab c\n€é😀"  # 1-, 2-, 3- and 4-byte UTF-8 characters


def expected_output(text: str, stops: list[str]) -> tuple[str, bool]:
    """Brute force: the text before the earliest occurrence of any stop string."""
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
        return text, False
    return text[: min(hits)], True


def longest_partial(text: str, stops: list[str]) -> int:
    """Brute force: the longest tail of ``text`` that is a proper prefix of a stop string."""
    return max(
        [k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])] or [0],
    )


def random_splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if text else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("seed", range(300))
def test_matcher_matches_brute_force_on_random_splits(seed):
    rng = random.Random(seed)
    stops = [
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4)))
        for _ in range(rng.randint(1, 3))
    ]
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
    if seed % 3 == 0:  # make sure many cases do stop, some with overlapping candidates
        at = rng.randint(0, len(text))
        text = text[:at] + rng.choice(stops) + text[at:]
    want, want_stopped = expected_output(text, stops)

    matcher = StopStringMatcher(stops)
    emitted, fed, stopped = "", "", False
    for piece in random_splits(text, rng):
        fed += piece
        out, stopped = matcher.push(piece)
        emitted += out
        # never emits text that could still belong to a stop string
        assert want.startswith(emitted)
        if stopped:
            break
        # holds back exactly the longest tail that could start a stop string
        assert emitted + matcher._held == fed
        assert len(matcher._held) == longest_partial(fed, stops)
    if not stopped:
        emitted += matcher.flush()
    assert (emitted, stopped) == (want, want_stopped)
    if stopped:
        assert matcher.matched in stops and matcher.push("more") == ("", True)
        assert matcher.flush() == ""


def test_matcher_earliest_stop_wins_and_overlaps():
    matcher = StopStringMatcher(["world", "lo w"])
    assert matcher.push("hel") == ("he", False)  # "l" may start "lo w"
    assert matcher.push("lo wor") == ("l", True)  # "lo w" starts before "world"
    assert matcher.matched == "lo w"

    matcher = StopStringMatcher(["aab"])
    assert matcher.push("aaa") == ("a", False)  # "aa" may still start "aab"
    assert matcher.push("ab") == ("a", True)  # "aaaab": the text before "aab" is "aa"


def test_matcher_reset_and_held_text():
    matcher = StopStringMatcher(["</s>"])
    assert matcher.push("answer </") == ("answer ", False)
    assert matcher.flush() == "</"
    assert matcher.push("x") == ("x", False)
    matcher.push("</s>")
    matcher.reset()
    assert matcher.push("ok") == ("ok", False)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("", ValueError),
        ([""], ValueError),
        (["ok", ""], ValueError),
        ([3], TypeError),
        (5, TypeError),
    ],
)
def test_bad_stop_strings_raise(bad, error):
    with pytest.raises(error):
        check_stop_strings(bad)
    with pytest.raises(error):
        StopStringMatcher(bad)


def test_matcher_needs_a_stop_string():
    with pytest.raises(ValueError, match="at least one"):
        StopStringMatcher([])
    assert check_stop_strings("x") == ("x",)
    assert check_stop_strings(["x", "y", "x"]) == ("x", "y")


def test_matcher_on_token_stream_with_split_characters(smollm2_path):
    """Tokens decoded through TokenizerStream (multi-byte characters split across tokens)."""
    tokenizer = genai.Tokenizer(str(smollm2_path))
    text = "Prix: 12€ — café 😀😀 fin. Ünïcödé 🎉 done"
    ids = [int(t) for t in tokenizer.encode(text)]
    # the emoji and € take byte-level tokens that decode to nothing on their own
    assert len(ids) > len(text.split())
    for stop in ["😀😀", "é 😀", "€ —", "🎉", " done", "Ü", "not there"]:
        if True:
            stream = tokenizer.create_stream()
            matcher = StopStringMatcher([stop, "zzz"])
            emitted, stopped = "", False
            for token in ids:
                piece = stream.decode(token)
                out, stopped = matcher.push(piece)
                emitted += out
                assert "\ufffd" not in emitted  # never half a character
                if stopped:
                    break
            if not stopped:
                emitted += matcher.flush()
            assert (emitted, stopped) == expected_output(text, [stop, "zzz"])


# --- the generator: stop strings, max_new_tokens, finish_reason --------------------------------

PROMPT = "the cat sat on the mat"


def generate(folder, prompt=PROMPT, batch=1, **options):
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    params = genai.GeneratorParams(model)
    params.set_search_options(batch_size=batch, **options)
    generator = genai.Generator(model, params)
    ids = tokenizer.encode_batch([prompt] * batch) if batch > 1 else tokenizer.encode(prompt)
    generator.append_tokens(ids)
    return model, tokenizer, generator, ids


def run_to_end(generator):
    steps = 0
    while not generator.is_done():
        assert generator.finish_reason(0) is genai.FinishReason.NONE or generator.batch_size > 1
        generator.generate_next_token()
        steps += 1
    return steps


def test_stop_string_across_tokens_finishes_the_row(fixture_folders):
    folder = fixture_folders["gqa"]
    _, tokenizer, plain, ids = generate(folder, max_length=48)
    run_to_end(plain)
    assert plain.finish_reason(0) == genai.FinishReason.MAX_SESSION_TOKENS
    free = plain.get_sequence(0)[len(ids) :]
    text = tokenizer.decode(free)
    prefixes = [tokenizer.decode(free[:i]) for i in range(len(free) + 1)]
    # a two-character stop string straddling the boundary before token j (0-based), whose
    # first occurrence is there: it completes with the (j + 1)-th generated token
    j = next(
        i
        for i in range(3, len(free))
        if len(prefixes[i + 1]) > len(prefixes[i]) > 0
        and text.find(text[len(prefixes[i]) - 1 : len(prefixes[i]) + 1]) == len(prefixes[i]) - 1
    )
    boundary = len(prefixes[j])
    stop = text[boundary - 1 : boundary + 1]

    _, _, gen, _ = generate(folder, max_length=48, stop=[stop, "qqqqqq"])
    steps = run_to_end(gen)
    assert gen.finish_reason(0) is genai.FinishReason.STOP_STRING and gen.is_done()
    got = gen.get_sequence(0)[len(ids) :]
    # same tokens as the free run, up to the token that completed the stop string
    assert steps == j + 1
    np.testing.assert_array_equal(got, free[: j + 1])
    assert stop in tokenizer.decode(got) and stop not in tokenizer.decode(got[:-1])


def test_stop_strings_that_never_match_leave_tokens_unchanged(fixture_folders):
    folder = fixture_folders["gqa"]
    _, _, plain, _ = generate(folder, max_length=40)
    run_to_end(plain)
    _, _, stopped, _ = generate(folder, max_length=40, stop=["QQ", "zzzzzz"])
    assert stopped._python_stage and not plain._python_stage
    run_to_end(stopped)
    np.testing.assert_array_equal(stopped.get_sequence(0), plain.get_sequence(0))
    assert (
        stopped.finish_reason(0) == plain.finish_reason(0) == genai.FinishReason.MAX_SESSION_TOKENS
    )


def test_stop_string_at_batch_2_pads_the_stopped_row(fixture_folders):
    folder = fixture_folders["gqa"]
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    prompts = ["the cat sat on the mat", "a dog"]
    ids = tokenizer.encode_batch(prompts)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, batch_size=2)
    free = genai.Generator(model, params)
    free.append_tokens(ids)
    run_to_end(free)
    row0 = free.get_sequence(0)[ids.shape[1] :]
    stop = tokenizer.decode(row0[:6])[-3:]
    assert stop and stop not in tokenizer.decode(free.get_sequence(1)[ids.shape[1] :])

    params.set_search_options(stop=[stop])
    gen = genai.Generator(model, params)
    gen.append_tokens(ids)
    run_to_end(gen)
    assert (
        gen.finish_reason(0) is genai.FinishReason.STOP_STRING
        and gen.finish_reason(1) is genai.FinishReason.MAX_SESSION_TOKENS
    )
    seq0 = gen.get_sequence(0)[ids.shape[1] :]
    k = next(i for i in range(1, len(row0) + 1) if stop in tokenizer.decode(row0[:i]))
    np.testing.assert_array_equal(seq0[:k], row0[:k])
    assert (seq0[k:] == model.config.get("model.pad_token_id", 0)).all()  # padded as after EOS
    # the other row is not disturbed
    np.testing.assert_array_equal(gen.get_sequence(1), free.get_sequence(1))


def test_max_new_tokens(fixture_folders):
    folder = fixture_folders["gqa"]
    _, _, gen, ids = generate(folder, max_length=48, max_new_tokens=5)
    assert not gen._python_stage  # no per-token Python work for a length limit
    assert run_to_end(gen) == 5
    assert gen.finish_reason(0) == genai.FinishReason.MAX_GENERATED_TOKENS and gen.is_done()
    assert gen.token_count() == len(ids) + 5
    with pytest.raises(GenerationError, match="max_new_tokens"):
        gen.generate_next_token()
    # counted from the last append: continuing gives 5 more
    gen.append_tokens([4, 5])
    assert gen.finish_reason(0) is genai.FinishReason.NONE
    assert gen.generate_until_done() == 5
    assert gen.token_count() == len(ids) + 12

    _, _, plain, _ = generate(folder, max_length=48)
    plain.generate_until_done(5)
    _, _, fast, _ = generate(folder, max_length=48, max_new_tokens=5)
    assert fast.generate_until_done() == 5
    np.testing.assert_array_equal(fast.get_sequence(0), plain.get_sequence(0))


def test_max_length_reason_and_eos_reason(fixture_folders):
    folder = fixture_folders["gqa"]
    _, _, gen, _ = generate(folder, max_length=20)
    gen.generate_until_done()
    assert gen.finish_reason(0) == genai.FinishReason.MAX_SESSION_TOKENS
    with pytest.raises(IndexError):
        gen.finish_reason(1)
    # EOS through set_logits (the fixture's lm_head never picks EOS by itself)
    _, _, gen, _ = generate(folder, max_length=20, stop=["zz"])
    logits = np.zeros((1, 64), np.float32)
    logits[0, 2] = 10.0  # EOS id 2
    gen.set_logits(logits)
    gen.generate_next_token()
    assert gen.is_done() and gen.finish_reason(0) is genai.FinishReason.EOS


def test_stop_and_max_new_tokens_options():
    from genai.generation.search import SearchOptions

    options = SearchOptions()
    assert "stop" not in options.as_reference_dict()
    assert "max_new_tokens" not in options.as_reference_dict()
    options.update(stop="###", max_new_tokens=7)
    shown = options.as_reference_dict()
    assert shown["stop"] == ["###"] and shown["max_new_tokens"] == 7.0
    options.update(stop=[])
    assert "stop" not in options.as_reference_dict()
    for bad in ("", [""], [1], 3):
        with pytest.raises(SearchOptionError, match="stop"):
            options.update(stop=bad)
    options.update(max_new_tokens=-1)
    with pytest.raises(SearchOptionError, match="max_new_tokens"):
        options.validate(64)


def test_stop_strings_refuse_beam_search(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(num_beams=2, stop=["x"], max_length=20)
    with pytest.raises(SearchOptionError, match="beam search"):
        genai.Generator(model, params)


def test_rewind_replays_stop_matching(fixture_folders):
    folder = fixture_folders["gqa"]
    _, tokenizer, plain, ids = generate(folder, max_length=40)
    run_to_end(plain)
    free = plain.get_sequence(0)[len(ids) :]
    stop = tokenizer.decode(free[:8])[-2:]
    k = next(i for i in range(1, 9) if stop in tokenizer.decode(free[:i]))
    _, _, gen, _ = generate(folder, max_length=40, stop=[stop])
    run_to_end(gen)
    assert gen.finish_reason(0) is genai.FinishReason.STOP_STRING
    gen.rewind_to(len(ids) + k - 1)  # before the token that completed the stop string
    assert gen.finish_reason(0) is genai.FinishReason.NONE and not gen.is_done()
    gen.generate_next_token()
    assert gen.finish_reason(0) is genai.FinishReason.STOP_STRING
    np.testing.assert_array_equal(gen.get_sequence(0)[len(ids) :], free[:k])


def test_rewind_to_keeps_counting_max_new_tokens(fixture_folders):
    """The token rewind_to replays counts as generated: max_new_tokens still ends the row
    where it would have, with the same tokens."""
    folder = fixture_folders["gqa"]
    _, _, plain, ids = generate(folder, max_length=48, max_new_tokens=6)
    run_to_end(plain)
    _, _, gen, _ = generate(folder, max_length=48, max_new_tokens=6)
    for _ in range(6):
        gen.generate_next_token()
    gen.rewind_to(len(ids) + 2)
    assert gen.finish_reason(0) is genai.FinishReason.NONE
    assert run_to_end(gen) == 3  # tokens 3 (replayed) and 4 in one step, then 5 and 6
    assert gen.finish_reason(0) is genai.FinishReason.MAX_GENERATED_TOKENS
    np.testing.assert_array_equal(gen.get_sequence(0), plain.get_sequence(0))


def test_generate_until_done_honours_stop_strings(fixture_folders):
    folder = fixture_folders["gqa"]
    _, tokenizer, plain, ids = generate(folder, max_length=48)
    run_to_end(plain)
    free = plain.get_sequence(0)[len(ids) :]
    stop = tokenizer.decode(free[:10])[-3:]
    k = next(i for i in range(1, 11) if stop in tokenizer.decode(free[:i]))
    _, _, gen, _ = generate(folder, max_length=48, stop=stop)
    assert gen.generate_until_done() == k
    assert gen.finish_reason(0) is genai.FinishReason.STOP_STRING
    np.testing.assert_array_equal(gen.get_sequence(0)[len(ids) :], free[:k])


@pytest.mark.slow
def test_stop_string_on_the_real_model(smollm2_path):
    import json

    model = genai.Model(str(smollm2_path))
    tokenizer = genai.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": "What is the capital of France?"}])
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 64)
    plain = genai.Generator(model, params)
    plain.append_tokens(ids)
    plain.generate_until_done()
    full = tokenizer.decode(plain.get_sequence(0)[len(ids) :])
    assert "Paris" in full

    params.set_search_options(stop=["aris"])  # inside the word: the token "Paris" completes it
    gen = genai.Generator(model, params)
    gen.append_tokens(ids)
    stream, matcher, shown = tokenizer.create_stream(), StopStringMatcher(["aris"]), ""
    while not gen.is_done():
        gen.generate_next_token()
        out, _ = matcher.push(stream.decode(int(gen.get_next_tokens()[0])))
        shown += out
    assert gen.finish_reason() is genai.FinishReason.STOP_STRING
    text = tokenizer.decode(gen.get_sequence(0)[len(ids) :])
    assert text.endswith("Paris")  # the sequence ends with the token that completed it
    assert shown == full[: full.index("aris")]  # what a streaming client shows
