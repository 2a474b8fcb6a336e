"""``genai generate`` / ``genai chat`` sampling flags and ``--search KEY=VALUE``: the text is
what the Python API makes with the same search options, a seed repeats it, and bad values
are one-line errors naming the flag."""

from __future__ import annotations

import io
import sys

import pytest

import genai
from genai.cli import main


def _library_text(folder, prompt: str, **options) -> str:
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode(prompt)
    params = genai.GeneratorParams(model)
    params.set_search_options(**options)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return tokenizer.decode(generator.get_sequence(0)[len(ids) :])


def _cli_text(capsys, folder, *flags: str) -> str:
    assert main(["generate", "-m", str(folder), "abc de", "--max-length", "40", *flags]) == 0
    return capsys.readouterr().out


SAMPLING = ["--temperature", "1.5", "--top-k", "20", "--top-p", "0.95", "--seed", "7"]
SEARCH = ["--search", "do_sample=true", "--search", "top_k=5", "--search", "random_seed=3"]


@pytest.mark.parametrize(
    ("flags", "options"),
    [
        (
            [*SAMPLING, "--repetition-penalty", "1.1"],
            {"do_sample": True, "temperature": 1.5, "top_k": 20, "top_p": 0.95,
             "random_seed": 7, "repetition_penalty": 1.1},
        ),
        (
            [*SEARCH, "--search", "min_p=0.05", "--search", "chunk_size=2"],
            {"do_sample": True, "top_k": 5, "random_seed": 3, "min_p": 0.05, "chunk_size": 2},
        ),
    ],
)  # fmt: skip
def test_flags_reach_the_generator(fixture_folders, capsys, flags, options):
    """The text is the Python API's with the same search options (typed by the option
    ``--search`` names), and it is not the greedy text."""
    folder = fixture_folders["gqa"]
    text = _cli_text(capsys, folder, *flags)
    assert text == _library_text(folder, "abc de", max_length=40, **options) + "\n"
    assert text != _library_text(folder, "abc de", max_length=40) + "\n"


def test_a_seed_repeats_a_sampled_text(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    text = _cli_text(capsys, folder, *SAMPLING)
    assert _cli_text(capsys, folder, *SAMPLING) == text
    assert _cli_text(capsys, folder, *SAMPLING[:-1], "8") != text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--search", "top_k"], "--search 'top_k': expected KEY=VALUE"),
        (["--search", "top_k=many"], "--search top_k=many: expected an integer"),
        (["--search", "do_sample=maybe"], "--search do_sample=maybe: expected true or false"),
        (["--search", "temperature=hot"], "--search temperature=hot: expected a number"),
        (["--search", "no_such_option=1"], "unknown search option 'no_such_option'"),
        (["--top-p", "1.5"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--search", "max_length=5"], "--search max_length: use --max-length"),
        (["--search", "max_new_tokens=5"], "--search max_new_tokens: use --max-new-tokens"),
        (["--search", "batch_size=2"], "--search batch_size: the command runs one prompt"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_bad_sampling_values_are_usage_errors_naming_the_problem(
    fixture_folders, capsys, monkeypatch, command, flags, message
):
    folder = fixture_folders["gqa"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("x\n"))
    prompt = ["x"] if command == "generate" else []
    assert main([command, "-m", str(folder), *prompt, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("returned", [1, 2])
def test_generate_prints_the_best_beam_hypotheses(fixture_folders, capsys, returned):
    """With beam search the command prints the hypotheses the Python API returns, best first
    (not a stream of one beam's tokens)."""
    folder = fixture_folders["gqa"]
    flags = ["--search", "num_beams=3", "--search", f"num_return_sequences={returned}"]
    out = _cli_text(capsys, folder, *flags)
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode("abc de")
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, num_beams=3, num_return_sequences=returned)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    texts = [tokenizer.decode(generator.get_sequence(i)[len(ids) :]) for i in range(returned)]
    if returned == 1:
        assert out == texts[0] + "\n"
    else:
        assert out == "".join(
            f"--- hypothesis {i + 1} of {returned}\n{text}\n" for i, text in enumerate(texts)
        )
    assert out != _cli_text(capsys, folder)  # not the greedy text


def test_chat_refuses_beam_search(fixture_folders, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\n"))
    assert main(["chat", "-m", str(fixture_folders["gqa"]), "--search", "num_beams=2"]) == 1
    assert "beam search (num_beams 2) needs `genai generate`" in capsys.readouterr().err


def test_chat_takes_the_sampling_flags(fixture_folders, capsys, monkeypatch):
    folder = fixture_folders["gqa"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc de\n"))
    flags = ["--temperature", "1.5", "--top-k", "20", "--seed", "11", "--max-new-tokens", "12"]
    assert main(["chat", "-m", str(folder), *flags]) == 0
    first = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc de\n"))
    assert main(["chat", "-m", str(folder), *flags]) == 0
    assert capsys.readouterr().out == first
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc de\n"))
    assert main(["chat", "-m", str(folder), "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out != first  # greedy makes another reply
