"""The ``genai`` command's start-up cost, chat commands and one-line errors (issue 17)."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import genai
from genai.cli import main
from genai.providers import plugins

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import importlib.metadata as md, sys
scans = []
real = md.entry_points
def counting(*a, **k):
    scans.append(k.get("group"))
    return real(*a, **k)
md.entry_points = counting
import genai.cli
genai.cli._build_parser({argv!r})
print("onnx" in sys.modules, "genai.plugins" in scans)
"""


def _probe(argv: list[str] | None) -> str:
    code = _PROBE.format(argv=argv)
    env = {**os.environ, "GENAI_LOAD_PLUGINS": "genai-provider-example"}
    env.pop("GENAI_DISABLE_PLUGIN_AUTOLOAD", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return result.stdout.strip()


def test_building_the_parser_imports_no_onnx_and_scans_no_plugins():
    assert _probe(None) == "False False"  # genai --help / --version
    assert _probe(["generate", "x"]) == "False False"


def test_a_command_that_is_not_built_in_scans_the_plugins_and_build_loads_the_builder():
    assert _probe(["no-such-command"]).endswith("True")
    assert _probe(["build", "x.gguf", "-o", "out"]).startswith("True")


def test_install_hints_name_the_checkout_folder_until_published(monkeypatch):
    monkeypatch.chdir(ROOT)
    hint = plugins.provider_install_hint("cuda")
    assert "pip install ./providers/cuda " in hint
    folder = ROOT / "providers" / "cuda"
    assert 'name = "genai-provider-cuda"' in (folder / "pyproject.toml").read_text()
    assert "pip install ./providers/tensorrt_rtx" in plugins.provider_install_hint(
        "NvTensorRtRtxExecutionProvider"
    )
    assert (ROOT / "providers" / "tensorrt_rtx" / "pyproject.toml").is_file()
    monkeypatch.setattr(plugins, "PUBLISHED_PROVIDER_PACKAGES", frozenset({"genai-provider-cuda"}))
    assert "pip install genai-provider-cuda " in plugins.provider_install_hint("cuda")
    assert plugins.provider_install_hint("no-such-provider") == ""


def test_providers_listing_shows_installable_commands(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    for line in out.splitlines():
        if "not installed" in line:
            command = line.split("not installed (", 1)[1].split(";")[0]
            assert command.startswith("pip install ./providers/")
            assert (ROOT / command.split()[-1] / "pyproject.toml").is_file()


def _fresh_reply(folder: Path, messages: list[dict[str, str]], new: int) -> str:
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return tokenizer.decode(generator.get_sequence(0)[len(ids) :])


def _chat(folder: Path, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genai", "chat", "-m", str(folder), *flags],
        input=script,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def test_chat_commands_are_not_sent_to_the_model(fixture_folders):
    folder = fixture_folders["gqa"]
    result = _chat(folder, "/help\n/bogus\nabc de\n/reset\nabc de\n/exit\nnever read\n",
                   "--max-new-tokens", "8")  # fmt: skip
    lines = result.stdout.split("\n")
    assert lines[0].lstrip().startswith("/help") and any("/system" in x for x in lines)
    assert "unknown command /bogus" in result.stderr
    assert "Ctrl-D" in result.stderr  # says how to leave
    replies = [x for x in lines if x and not x.startswith(" ")]
    expected = _fresh_reply(folder, [{"role": "user", "content": "abc de"}], 8)
    assert replies == [expected, expected]  # /reset: the second turn starts afresh


def test_chat_system_command_sets_the_system_message(fixture_folders):
    folder = fixture_folders["gqa"]
    result = _chat(folder, "/system be brief\nabc de\n", "--max-new-tokens", "8")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc de"}]
    assert result.stdout.split("\n")[0] == _fresh_reply(folder, messages, 8)


def test_chat_ctrl_c_stops_the_reply_not_the_chat(fixture_folders, monkeypatch, capsys):
    folder = fixture_folders["gqa"]
    real = genai.Generator.generate_next_token
    calls = []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C does
            time.sleep(1)  # the handler runs in the main thread before this returns
        return real(self)

    monkeypatch.setattr(genai.Generator, "generate_next_token", interrupted)
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc de\n/help\n"))
    # Python's own Ctrl-C handler, also where the run was started with SIGINT ignored (a
    # background job of a non-interactive shell)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["chat", "-m", str(folder), "--max-new-tokens", "20"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    out = capsys.readouterr().out
    assert out.split("\n")[0].endswith("[stopped]")
    assert "/reset" in out  # the chat went on to the next line


def test_chat_ctrl_d_leaves_with_a_newline(fixture_folders):
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai", "chat", "-m", str(fixture_folders["gqa"])],
        stdin=child_fd,
        stdout=child_fd,
        stderr=subprocess.DEVNULL,
    )
    os.close(child_fd)
    seen = b""
    deadline = time.monotonic() + 60
    while b"> " not in seen and time.monotonic() < deadline:
        if select.select([main_fd], [], [], 1)[0]:
            seen += os.read(main_fd, 1024)
    os.write(main_fd, b"\x04")  # Ctrl-D on an empty line
    assert proc.wait(timeout=60) == 0
    # read what is left until the terminal closes (EIO), never blocking: a read with nothing
    # to read would wait for ever if anything still held the terminal open
    closed = False
    deadline = time.monotonic() + 60
    while not closed and time.monotonic() < deadline:
        if not select.select([main_fd], [], [], 1)[0]:
            continue
        try:
            chunk = os.read(main_fd, 1024)
        except OSError:
            closed = True
        else:
            closed = not chunk
            seen += chunk
    os.close(main_fd)
    assert closed, "the chat's terminal stayed open after it exited"
    # what the terminal shows: readline's bracketed-paste switches and carriage returns aside,
    # the prompt's line ends once (readline ends it itself when bracketed paste is on)
    shown = re.sub(rb"\x1b\[\?2004[hl]", b"", seen).replace(b"\r", b"")
    assert shown.endswith(b"> \n") and not shown.endswith(b"\n\n"), seen


def _pty_chat(folder, *writes: bytes) -> bytes:
    """Run `genai chat` on a terminal, send ``writes`` (each once the prompt is back), then
    Ctrl-D; what the terminal showed."""
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai", "chat", "-m", str(folder), "--max-new-tokens", "4"],
        stdin=child_fd,
        stdout=child_fd,
        stderr=child_fd,
        env=dict(os.environ, TERM="xterm"),  # (a CI job may have no TERM: readline then off)
    )
    os.close(child_fd)
    seen = b""
    for data in (*writes, b"\x04"):
        prompts = seen.count(b"> ")
        deadline = time.monotonic() + 60
        while seen.count(b"> ") == prompts and time.monotonic() < deadline:
            if select.select([main_fd], [], [], 1)[0]:
                seen += os.read(main_fd, 4096)
        os.write(main_fd, data)
    assert proc.wait(timeout=60) == 0
    with contextlib.suppress(OSError):
        while select.select([main_fd], [], [], 1)[0]:
            chunk = os.read(main_fd, 4096)
            if not chunk:
                break
            seen += chunk
    os.close(main_fd)
    return seen


def test_a_pasted_block_is_one_message(fixture_folders):
    """A terminal sends a paste between ESC[200~ and ESC[201~ when the program asks for it;
    CPython's readline does not, so each pasted line was a message with a reply of its own."""
    import readline

    version = getattr(readline, "_READLINE_LIBRARY_VERSION", "0.0")
    if "libedit" in (readline.__doc__ or "") or tuple(map(int, version.split(".")[:2])) < (8, 1):
        pytest.skip(f"needs GNU readline 8.1 or later (bracketed paste); this is {version}")
    seen = _pty_chat(fixture_folders["gqa"], b"\x1b[200~first line\nsecond line\x1b[201~\r")
    assert b"\x1b[?2004h" in seen  # bracketed paste asked for
    assert seen.count(b"> ") == 2, seen  # the first prompt, one reply, the prompt again


def test_a_gguf_file_as_model_says_build_it_first(tmp_path, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["generate", "-m", str(gguf), "hi"]) == 1
    assert "build it first with `genai build" in capsys.readouterr().err


def test_build_onto_an_existing_file_is_a_one_line_error(tmp_path, capsys):
    existing = tmp_path / "out"
    existing.write_text("")
    assert main(["build", str(tmp_path / "x.gguf"), "-o", str(existing)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not a folder" in err


def test_conformance_without_pytest_names_the_extra(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pytest" else real(name, *a)
    )
    assert main(["conformance", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'conformance' extra" in err


def test_generate_accepts_max_new_tokens(fixture_folders, capsys):
    folder = fixture_folders["gqa"]
    assert main(["generate", "-m", str(folder), "abc de", "--max-new-tokens", "5"]) == 0
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode("abc de")
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 5)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    expected = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    assert capsys.readouterr().out == expected + "\n"


def test_a_long_prefill_shows_progress_on_a_terminal(fixture_folders, monkeypatch, capsys):
    """On a terminal a long prompt goes in steps with a progress line; the text generated is
    the one the whole prompt at once gives (and off a terminal nothing is shown)."""
    import genai.cli as cli

    prompt = " ".join(["token"] * 30)
    args = ["generate", "-m", str(fixture_folders["gqa"]), prompt, "--max-new-tokens", "6"]
    assert cli.main(args) == 0
    plain = capsys.readouterr()
    assert "genai: prompt" not in plain.err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(cli.common, "PREFILL_PROGRESS_TOKENS", 8)
    monkeypatch.setattr(cli.common, "PREFILL_CHUNK", 4)
    monkeypatch.setattr(cli.common.sys, "stderr", terminal)
    assert cli.main(args) == 0
    assert capsys.readouterr().out == plain.out
    shown = terminal.getvalue()
    assert "genai: prompt 4/" in shown and "\r\033[K" in shown


def test_ctrl_c_while_the_parser_is_built_exits_130_without_a_traceback(monkeypatch, capsys):
    """Building the parser loads the plugins (a second or more): a Ctrl-C then is a quiet
    130, as during a command."""
    import genai.cli as cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_build_parser", interrupted)
    assert main(["build", "x", "-o", "y"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_an_unknown_option_shows_the_commands_own_usage(capsys):
    """argparse hands a command's leftovers to the top-level parser, whose error shows
    ``usage: genai [-h] ... COMMAND``; each command reports them with its own usage."""
    for argv in (
        ["generate", "hi", "--bogus"],
        ["chat", "--bogus"],
        ["serve", "--bogus"],
        ["adapter", "convert", "peft", "out.onnx_adapter", "--bogus"],
    ):
        try:
            main(argv)
        except SystemExit as exit_:
            assert exit_.code == 2
        err = capsys.readouterr().err
        name = " ".join(argv[:2] if argv[0] == "adapter" else argv[:1])
        assert f"usage: genai {name} " in err
        assert f"genai {name}: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["generate", "hi", "--threads", "0"], "--threads must be >= 1, got 0"),
        (["generate", "hi", "--top-p", "2"], "top_p (2.0) must be in [0, 1]"),
        (["generate", "hi", "--top-k", "-5"], "top_k (-5) must be in [0, 2147483647]"),
        (["generate", "hi", "--temperature", "-1"], "temperature (-1.0) must be >= 0"),
        (["generate", "hi", "--search", "min_p=abc"], "--search min_p=abc: expected a number"),
        (["generate", "hi", "--search", "max_length=40"], "--search max_length: use --max-length"),
        (["generate", "hi", "--search", "bogus=1"], "unknown search option 'bogus'"),
        (["generate", "hi", "--system", "be brief"], "--system needs --chat"),
        (["chat", "--repetition-penalty", "0"], "repetition_penalty (0.0) must be > 0"),
        (["pull", "--precision", "fp16"], "--precision needs REPO_ID"),
        (["pull", "--include", "*.onnx"], "--include needs REPO_ID"),
        (["pull", "--revision", "main"], "--revision needs REPO_ID"),
        (["pull", "org/model", "--keep-source"], "--keep-source is for the default model"),
        (
            ["transcribe", "a.wav", "-m", "w", "--temperature", "5"],
            "--temperature must be in [0, 2], got 5.0",
        ),
        (["transcribe", "a.wav", "-m", "w", "--threads", "0"], "--threads must be >= 1, got 0"),
    ],
)
def test_option_values_the_command_refuses_are_usage_errors(tmp_path, capsys, argv, message):
    """A refused option value is a usage error, as argparse's own (--max-new-tokens abc):
    the command's usage line, `genai COMMAND: error: ...`, exit status 2, before any model
    loads (the -m folder here does not exist)."""
    if argv[0] in ("generate", "chat"):
        argv = [*argv, "-m", str(tmp_path / "absent")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: genai {argv[0]} ")
    assert f"genai {argv[0]}: error: {message}" in err, err
    assert "Traceback" not in err and "absent" not in err


def test_output_into_a_closed_pipe_stops_quietly(smollm2_path):
    """`genai generate ... | head -c 5`: no error once the reader is gone, and the status a
    SIGPIPE death gives (was `genai: error: [Errno 32] Broken pipe`, status 1)."""
    command = [sys.executable, "-m", "genai", "generate", "-m", str(smollm2_path)]
    command += ["--max-new-tokens", "300", "Tell me a long story about a dragon."]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(5)
    process.stdout.close()
    assert process.wait(120) == 141
    assert process.stderr.read() == b""


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_whisper_folder_for_text_points_at_transcribe(tmp_path, capsys, command):
    """A Whisper folder given to a text command says which command takes it (was the
    library's 'call generator.set_inputs(processor(...))' / 'pass a non-empty template_str')."""
    from genai.testing.whisper import write_whisper_fixture

    folder = write_whisper_fixture(tmp_path)
    argv = [command, "-m", str(folder), *(["hello"] if command == "generate" else [])]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        f"genai: error: -m {folder} is a Whisper (speech) model: for audio, use "
        f"`genai transcribe FILE -m {folder}`\n"
    )
