"""The ``genai`` command line: generation on a fixture, streaming, and clear errors."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest

import genai
from genai.cli import main


def test_generate_streams_the_greedy_text(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    assert main(["generate", "-m", str(folder), "abc de", "--max-length", "24", "-v"]) == 0
    out, err = capsys.readouterr()
    # the same tokens through the Python API, decoded independently
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode("abc de")
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=24)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    expected = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    assert out == expected + "\n"
    assert "prefill" in err and "tok/s" in err


def test_chat_and_threads(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    code = main(["generate", "-m", str(folder), "hi", "--chat", "--threads", "1",
                 "--max-length", "40"])  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out.endswith("\n")


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["generate", "-m", "/nonexistent/folder", "x"], "does not exist", 1),
        (["generate", "-m", "{folder}", "x", "--threads", "0"], "--threads must be >= 1", 2),
        (
            ["generate", "-m", "{folder}", "x", "--max-length", "4096"],
            "--max-length 4096 exceeds the model's context length ({context})",
            1,
        ),
        (["generate", "-m", "{folder}", "x", "--max-length", "0"], "--max-length must be >= 1", 2),
        (["chat", "-m", "{folder}", "--max-length", "0"], "--max-length must be >= 1", 2),
        (
            ["generate", "-m", "{folder}", "x", "--max-new-tokens", "-5"],
            "--max-new-tokens must be >= 1",
            2,
        ),
        (["generate", "-m", "{folder}", "x " * 400], "does not fit the model's context length", 1),
    ],
)
def test_errors_exit_with_a_message(fixture_folders, capsys, args, message, status):
    """Refused option values are usage errors (2, as argparse's); what the model or its input
    refuses is a runtime error (1)."""
    folder = fixture_folders["gqa"]
    context = json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]
    args = [a.replace("{folder}", str(folder)) for a in args]
    assert main(args) == status
    assert message.format(context=context) in capsys.readouterr().err


def test_python_dash_m_and_usage_errors():
    result = subprocess.run(
        [sys.executable, "-m", "genai", "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and result.stdout.startswith("genai ")
    result = subprocess.run(
        [sys.executable, "-m", "genai", "generate"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "usage:" in result.stderr


def test_chat_reuses_the_cache_and_matches_fresh_generation(fixture_folders):
    """Two turns through ``genai chat``: each reply equals a fresh greedy generation on the
    whole templated conversation (so reusing the KV cache between turns changes nothing)."""
    folder = fixture_folders["gqa"]
    turns = ["abc de", "fed cba"]
    result = subprocess.run(
        [sys.executable, "-m", "genai", "chat", "-m", str(folder), "--max-new-tokens", "12"],
        input="\n".join(turns) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    replies = result.stdout.split("\n")[:2]
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    messages = []
    for turn, reply in zip(turns, replies, strict=True):
        messages.append({"role": "user", "content": turn})
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 12)
        generator = genai.Generator(model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        new = generator.get_sequence(0)[len(ids) :]
        assert reply == tokenizer.decode(new)
        messages.append({"role": "assistant", "content": tokenizer.decode(new)})


def test_chat_rejects_bad_options(fixture_folders):
    result = subprocess.run(
        [sys.executable, "-m", "genai", "chat", "-m", str(fixture_folders["gqa"]),
         "--max-new-tokens", "0"],
        input="hi\n", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "--max-new-tokens must be >= 1" in result.stderr


def _generate(folder, *flags: str, verbose_after: bool = False) -> list[str]:
    args = [*flags, "generate", "-m", str(folder), "abc", "--max-length", "12"]
    return [*args, "-v"] if verbose_after else args


def test_top_level_verbose_logs_genai_info_records_to_stderr(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    logger = logging.getLogger("genai")
    level, handlers = logger.level, list(logger.handlers)
    assert main(_generate(folder, "-v")) == 0
    err = capsys.readouterr().err
    assert f"genai: INFO genai.runtime.model: loaded {folder.resolve()}" in err
    assert "DEBUG" not in err
    assert "tok/s" not in err  # the top-level flag is not generate's own -v
    assert (logger.level, logger.handlers) == (level, handlers)  # restored after the command

    assert main(_generate(folder)) == 0
    assert "INFO" not in capsys.readouterr().err

    assert main(_generate(folder, verbose_after=True)) == 0  # generate's -v: speeds, no logging
    err = capsys.readouterr().err
    assert "tok/s" in err and "INFO" not in err


def test_top_level_vv_adds_debug_records(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    assert main(_generate(folder, "-vv")) == 0
    err = capsys.readouterr().err
    assert "genai: DEBUG genai.runtime.model: session for " in err
    assert "genai: INFO genai.runtime.model: loaded" in err
    assert main(_generate(folder, "--verbose", "--verbose")) == 0
    assert "genai: DEBUG" in capsys.readouterr().err


def test_top_level_verbose_shows_the_traceback_of_an_error(capsys):
    assert main(["-vv", "generate", "-m", "/nonexistent/folder", "x"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "genai: error:" in err
    assert main(["generate", "-m", "/nonexistent/folder", "x"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_a_bug_is_not_turned_into_a_one_line_error(fixture_folders, monkeypatch):
    """Only GenaiError (and OSError) become "genai: error: ..."; anything else is a bug and
    keeps its traceback."""
    import genai.cli as cli

    def broken(args):
        raise ValueError("a plain ValueError is not a user error")

    argv = ["generate", "-m", str(fixture_folders["gqa"]), "hi"]
    parser = cli._build_parser(argv)
    args = parser.parse_args(argv)
    monkeypatch.setattr(cli, "_build_parser", lambda argv=None: parser)
    monkeypatch.setattr(args, "handler", broken, raising=False)
    monkeypatch.setattr(parser, "parse_args", lambda argv: args)
    with pytest.raises(ValueError, match="not a user error"):
        main(["generate", "-m", str(fixture_folders["gqa"]), "hi"])


# --- at the length limit (a QA sweep: replies were cut without a word) ------------------------
def _chat_run(folder, lines: list[str], *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "genai", "chat", "-m", str(folder), *options],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_chat_says_when_a_reply_is_cut_by_the_length_limit(fixture_folders):
    run = _chat_run(
        fixture_folders["gqa"], ["abc de"], "--max-length", "40", "--search", "min_length=40",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "the reply was cut: the conversation filled --max-length (40 tokens)" in run.stderr
    quiet = _chat_run(fixture_folders["gqa"], ["abc de"], "--max-new-tokens", "3")
    assert "cut" not in quiet.stderr  # ended by --max-new-tokens: nothing to say


def test_chat_names_what_does_not_fit(fixture_folders):
    """A message too long for even a new conversation was told "/reset starts again"."""
    long = "abc de " * 40
    run = _chat_run(fixture_folders["gqa"], [long, "ab"], "--max-length", "48")
    assert run.returncode == 0
    refusal = next(line for line in run.stderr.splitlines() if "does not fit" in line)
    assert refusal.endswith(
        "does not fit --max-length (48 tokens) even in a new conversation; shorten it"
    )
    assert len(run.stdout.splitlines()) == 1  # the short message still got its reply
    system = _chat_run(fixture_folders["gqa"], ["ab"], "--max-length", "48", "--system", long)
    assert system.returncode == 1
    assert "--system: the system message (" in system.stderr
    assert "does not fit --max-length (48 tokens) with room for a reply" in system.stderr


def test_generate_and_chat_stop_at_the_configs_search_max_length(fixture_folders, tmp_path):
    """search.max_length below the context: the Python API and the Engine stop there, the
    CLI used the context length."""
    folder = tmp_path / "model"
    shutil.copytree(fixture_folders["gqa"], folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config.setdefault("search", {})["max_length"] = 24
    (folder / "genai_config.json").write_text(json.dumps(config))
    run = subprocess.run(
        [sys.executable, "-m", "genai", "generate", "-m", str(folder), "abc de",
         "--max-new-tokens", "100", "--search", "min_length=24"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "the output stopped at the model's search.max_length (--max-length raises it) (24" in (
        run.stderr
    )
    too_long = subprocess.run(
        [sys.executable, "-m", "genai", "generate", "-m", str(folder), "abc de " * 10],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert too_long.returncode == 1
    assert "does not fit the model's search.max_length (--max-length raises it) (24 tokens)" in (
        too_long.stderr
    )
    more = subprocess.run(  # --max-length may go past search.max_length, as max_length may
        [sys.executable, "-m", "genai", "generate", "-m", str(folder), "abc de",
         "--max-length", "30", "--search", "min_length=30", "-v"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert more.returncode == 0 and "stopped at" not in more.stderr, more.stderr
    stopped = subprocess.run(  # a stop string ends a chat reply: no "cut" note
        [sys.executable, "-m", "genai", "chat", "-m", str(fixture_folders["gqa"]),
         "--search", "stop=q"],  # (its greedy reply: "rql sisl...")
        input="abc de\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert stopped.returncode == 0 and stopped.stdout == "r\n", stopped.stdout  # not "q"
    assert "cut" not in stopped.stderr, stopped.stderr
    generated = subprocess.run(  # generate writes no stop string either, as genai serve
        [sys.executable, "-m", "genai", "generate", "-m", str(fixture_folders["gqa"]), "abc de",
         "--chat", "--search", "stop=q"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert generated.returncode == 0 and generated.stdout == "r\n", generated.stdout
