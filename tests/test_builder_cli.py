"""`genai build` / `genai pull` subcommands (added with add_build_commands)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from genai.builder import cli
from genai.builder.testing import ARCH_CONFIGS, random_weights, write_gguf_checkpoint


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genai")
    cli.add_build_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_build_command(tmp_path, capsys):
    pytest.importorskip("gguf")
    cfg = ARCH_CONFIGS["qwen3"]
    src = write_gguf_checkpoint(tmp_path / "m.gguf", cfg, random_weights(cfg))
    args = _parser().parse_args(
        ["build", str(src), "-o", str(tmp_path / "out"), "--precision", "fp32", "--all-logits"]
    )
    assert args.handler(args) == 0
    err = capsys.readouterr().err
    assert "weights" in err and "tokenizer" in err and "built" in err
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert config["model"]["type"] == "qwen3"


def test_build_defaults_and_choices():
    args = _parser().parse_args(["build", "x.gguf", "-o", "out"])
    assert args.precision == "int4" and not args.all_logits
    with pytest.raises(SystemExit):
        _parser().parse_args(["build", "x.gguf", "-o", "out", "--precision", "int2"])
    # int8 is Whisper's (MatMulNBits bits 8); a decoder refuses it when building
    args = _parser().parse_args(["build", "x.gguf", "-o", "out", "--precision", "int8"])
    assert args.precision == "int8"


def test_pull_command_prints_the_folder(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "ensure_default_model", lambda progress, force, keep_source: tmp_path)
    args = _parser().parse_args(["pull", "-q"])
    assert args.handler(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: "{not json", "is not valid JSON"),
        (lambda c: "[1, 2]", "expected a JSON object, got list"),
        (
            lambda c: {**c, "hidden_size": "big"},
            "'hidden_size' must be a positive integer, got 'big'",
        ),
        (lambda c: {**c, "num_attention_heads": 0}, "'num_attention_heads' must be a positive"),
        (lambda c: {**c, "num_key_value_heads": 3}, "not a multiple of num_key_value_heads (3)"),
        (lambda c: {k: v for k, v in c.items() if k != "vocab_size"}, "missing 'vocab_size'"),
        (lambda c: {**c, "rms_norm_eps": "tiny"}, "malformed value (ValueError"),
    ],
)
def test_a_malformed_hf_config_is_one_line_naming_the_key(tmp_path, capsys, edit, message):
    pytest.importorskip("safetensors")
    from genai.builder.testing import write_hf_checkpoint
    from genai.cli import main

    cfg = ARCH_CONFIGS["llama"]
    folder = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    config_file = folder / "config.json"
    edited = edit(json.loads(config_file.read_text()))
    config_file.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    assert main(["build", str(folder), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unknown_option_shows_the_build_usage(tmp_path, capsys):
    """argparse hands a subcommand's unknown options to the top-level parser, whose error
    shows `usage: genai [-h] ... COMMAND`; `genai build` reports them with its own usage."""
    from genai.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["build", "x.gguf", "-o", str(tmp_path / "out"), "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genai build ") and "--prefill-int8" in err
    assert "genai build: error: unrecognized arguments: --bogus" in err
    assert not (tmp_path / "out").exists()


def test_the_built_line_names_the_options(tmp_path, capsys):
    pytest.importorskip("safetensors")
    from genai.builder.testing import write_hf_checkpoint

    cfg = ARCH_CONFIGS["llama"]
    src = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    args = _parser().parse_args(["build", str(src), "-o", str(tmp_path / "out"), "--prefill-int8"])
    assert args.handler(args) == 0
    built = capsys.readouterr().err.strip().splitlines()[-1]
    assert built.startswith(f"built {tmp_path / 'out'} (int4, --prefill-int8) in ")


def test_window_cache_on_a_model_without_a_window_is_one_line(tmp_path, capsys):
    pytest.importorskip("safetensors")
    from genai.builder.testing import write_hf_checkpoint
    from genai.cli import main

    cfg = ARCH_CONFIGS["llama"]
    src = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    assert main(["build", str(src), "-o", str(tmp_path / "out"), "--window-cache"]) == 1
    err = capsys.readouterr().err
    assert "--window-cache: this llama model has no sliding-window layers" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_made_is_named_as_given(tmp_path, capsys):
    """Was the OSError of the hidden staging folder (``/proc/.x.building-1a2b3c4d``), and the
    parent folders made for -o stayed behind."""
    pytest.importorskip("safetensors")
    from genai.builder.testing import write_hf_checkpoint
    from genai.cli import main

    cfg = ARCH_CONFIGS["llama"]
    src = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = blocker / "sub" / "model"  # a parent is a file: no folder can be made there
    assert main(["build", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"genai: error: cannot create the output folder {out}: "), err
    assert ".building-" not in err and err.count("\n") == 1
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            return  # root ignores the mode: the case above covers the message
        assert main(["build", str(src), "-o", str(locked / "a" / "b")]) == 1
        err = capsys.readouterr().err
        assert f"cannot create the output folder {locked / 'a' / 'b'}" in err
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)
