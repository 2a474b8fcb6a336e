"""``genai adapter convert``: errors like every ``genai`` command and ``-m/--model``.

Errors were printed as ``error: ...`` (every other command: ``genai: error: ...``); a model
folder the config loader refuses, or an OUT path that cannot be written, ended in a traceback;
``-m`` (the model option of generate/chat/serve/transcribe) was not accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from genai.builder import peft
from genai.cli import main
from genai.runtime.adapters import read_adapter_file
from genai.testing.lora import write_lora_decoder
from genai.testing.models import write_optimum_decoder
from tests.test_adapters import HEADS, KV_HEADS, LAYERS, write_peft


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("adapter-args") / "peft"
    write_peft(folder)
    return folder


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adapter-args-lora")
    return write_lora_decoder(root, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("genai: error: ") and err.count("\n") == 1, err
    return err


def test_a_missing_peft_folder_is_a_genai_error(tmp_path, capsys):
    out = tmp_path / "out.onnx_adapter"
    assert main(["adapter", "convert", str(tmp_path / "none"), str(out)]) == 1
    assert "adapter_config.json does not exist" in _one_line_error(capsys)
    assert not out.exists()


def test_a_malformed_adapter_config_is_a_genai_error(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("{")
    out = tmp_path / "out.onnx_adapter"
    assert main(["adapter", "convert", str(tmp_path / "bad"), str(out)]) == 1
    assert "is not valid JSON" in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("flag", ["-m", "--model"])
def test_short_m_is_the_model_to_check_against(peft_dir, lora_model, tmp_path, capsys, flag):
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(out), flag, str(lora_model)]) == 0
    assert "wrote 6 LoRA pairs" in capsys.readouterr().out
    assert len(read_adapter_file(out)) == 12


def test_m_with_a_model_without_lora_inputs_is_a_genai_error(peft_dir, tmp_path, capsys):
    plain = write_optimum_decoder(tmp_path, name="plain", num_layers=LAYERS)
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(out), "-m", str(plain)]) == 1
    assert "has no LoRA inputs" in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_m_that_is_not_a_model_folder_is_a_genai_error(peft_dir, tmp_path, capsys, kind):
    model = tmp_path / "model"
    if kind == "empty":
        model.mkdir()
    elif kind == "file":
        model.write_text("x")  # was a ConfigError traceback
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(out), "-m", str(model)]) == 1
    assert str(model) in _one_line_error(capsys)
    assert not out.exists()


def test_an_out_path_that_cannot_be_written_is_a_genai_error(peft_dir, tmp_path, capsys):
    """Was onnxruntime's RuntimeError traceback, after the whole conversion."""
    missing = tmp_path / "no-such-dir" / "a.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(missing)]) == 1
    err = _one_line_error(capsys)
    assert "no-such-dir" in err and "does not exist" in err
    assert main(["adapter", "convert", str(peft_dir), str(tmp_path)]) == 1
    assert "is a folder" in _one_line_error(capsys)


def test_an_existing_out_file_is_overwritten(peft_dir, tmp_path, capsys):
    out = tmp_path / "a.onnx_adapter"
    out.write_text("old")
    assert main(["adapter", "convert", str(peft_dir), str(out)]) == 0
    assert len(read_adapter_file(out)) == 12
    assert capsys.readouterr().err == ""


def test_a_bad_module_map_is_a_usage_error_with_the_command_usage(peft_dir, tmp_path, capsys):
    out = tmp_path / "a.onnx_adapter"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapter", "convert", str(peft_dir), str(out), "--module-map", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genai adapter convert ")
    assert "genai adapter convert: error: --module-map expects FROM=TO, got 'x'" in err
    assert not out.exists()


def test_ctrl_c_exits_130(peft_dir, tmp_path, monkeypatch):
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(peft, "convert_peft_adapter", interrupted)
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(out)]) == 130
    assert peft.main([str(peft_dir), str(out)]) == 130
    assert not out.exists()


def test_the_module_entry_prefixes_its_errors_with_its_prog(peft_dir, tmp_path, capsys):
    """``python -m genai.builder.peft`` (same arguments): its argparse prog as the prefix."""
    assert peft.main([str(tmp_path / "none"), str(tmp_path / "a.onnx_adapter")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("python -m genai.builder.peft: error: ")
    assert "adapter_config.json does not exist" in err
    assert peft.main([str(peft_dir), str(tmp_path / "b.onnx_adapter"), "-m", "nope"]) == 1
    assert "model folder 'nope' does not exist" in capsys.readouterr().err
