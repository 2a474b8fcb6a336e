"""``genai adapter convert``: errors like every ``genai`` command and ``-m/--model``.

Errors were printed as ``error: ...`` (every other command: ``genai: error: ...``); a model
folder the config loader refuses, or an OUT path that cannot be written, ended in a traceback;
``-m`` (the model option of generate/chat/serve/transcribe) was not accepted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


# --- adapters the converter must refuse before writing (a QA sweep's findings) ----------------
def _write_config(folder: Path, config: object) -> None:
    import json

    (folder / "adapter_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "config, words",
    [
        ([1, 2], "expected a JSON object, got list"),  # was an AttributeError traceback
        (None, "expected a JSON object, got NoneType"),
        ({"r": 4, "lora_alpha": float("inf")}, "lora_alpha must be a finite positive number"),
        ({"r": 4, "lora_alpha": float("nan")}, "lora_alpha must be a finite positive number"),
        ({"r": 4.5, "lora_alpha": 8}, "r must be a positive integer, got 4.5"),  # passed as 4
        ({"r": True, "lora_alpha": 8}, "r must be a positive integer, got True"),  # taken as 1
        ({"r": 4, "lora_alpha": 8, "alpha_pattern": {"q_proj": "x"}}, "alpha_pattern"),
        ({"r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 0}}, "rank_pattern"),
    ],
    ids=["list", "null", "alpha-inf", "alpha-nan", "r-float", "r-bool", "alpha-str", "rank-0"],
)
def test_a_config_with_bad_values_is_refused(peft_dir, tmp_path, capsys, config, words):
    folder = tmp_path / "peft"
    write_peft(folder)
    _write_config(folder, config)
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(folder), str(out)]) == 1
    assert words in _one_line_error(capsys)
    assert not out.exists()


def test_weights_holding_nan_are_refused(tmp_path, capsys):
    """Were written (exit 0): genai then raised at the first token, the reference made zeros."""
    from safetensors.numpy import save_file

    folder = tmp_path / "peft"
    tensors = write_peft(folder)
    key = next(k for k in sorted(tensors) if ".lora_A." in k)
    tensors[key][0, 0] = np.nan
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    out = tmp_path / "a.onnx_adapter"
    assert main(["adapter", "convert", str(folder), str(out)]) == 1
    assert f"tensor {key!r} holds NaN or infinite values" in _one_line_error(capsys)
    assert not out.exists()


def test_a_float16_adapter_for_a_float32_model_is_refused(peft_dir, lora_model, tmp_path, capsys):
    """-m checked names and shapes, not the type: the file then failed to load in both engines."""
    out = tmp_path / "a.onnx_adapter"
    argv = ["adapter", "convert", str(peft_dir), str(out), "--dtype", "float16"]
    assert main([*argv, "-m", str(lora_model)]) == 1
    assert "is float32, the adapter would be float16 (use --dtype float32)" in _one_line_error(
        capsys
    )
    assert not out.exists()


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json"])
def test_out_may_not_be_the_adapters_own_file(tmp_path, capsys, name):
    folder = tmp_path / "peft"
    write_peft(folder)
    before = (folder / name).read_bytes()
    assert main(["adapter", "convert", str(folder), str(folder / name)]) == 1
    assert "writing it would destroy the input" in _one_line_error(capsys)
    assert (folder / name).read_bytes() == before


def test_two_modules_mapped_to_one_name_are_refused(peft_dir, tmp_path, capsys):
    """q_proj and v_proj both became ...attn.v_proj: one pair silently overwrote the other."""
    out = tmp_path / "a.onnx_adapter"
    argv = ["adapter", "convert", str(peft_dir), str(out)]
    assert main([*argv, "--module-map", "self_attn=attn", "--module-map", "q_proj=v_proj"]) == 1
    err = _one_line_error(capsys)
    assert "both map to 'model.layers.0.attn.v_proj'" in err and "--module-map" in err
    assert not out.exists()


@pytest.mark.parametrize("decode_ahead", ["1", "0"])
def test_nan_logits_from_an_adapter_are_a_genai_error(
    peft_dir, lora_model, tmp_path, monkeypatch, decode_ahead
):
    """An adapter written with NaN (by another tool) makes NaN logits: the native decode loop
    raised a plain ValueError, which the CLI printed as a traceback."""
    import genai
    from genai.runtime.adapters import write_adapter_file

    monkeypatch.setenv("GENAI_DECODE_AHEAD", decode_ahead)
    good = tmp_path / "good.onnx_adapter"
    assert main(["adapter", "convert", str(peft_dir), str(good)]) == 0
    params = read_adapter_file(good)
    for name in params:
        if ".lora_B." in name:
            params[name][:] = np.nan
    bad = tmp_path / "bad.onnx_adapter"
    write_adapter_file(bad, params)
    model = genai.Model(str(lora_model))
    adapters = genai.Adapters(model)
    adapters.load(str(bad), "nan")
    params_ = genai.GeneratorParams(model)
    params_.set_search_options(max_length=16)
    generator = genai.Generator(model, params_)
    generator.set_active_adapter(adapters, "nan")
    generator.append_tokens(np.array([[5, 6, 7]], np.int32))
    with pytest.raises(genai.NonFiniteLogitsError, match="cannot choose a token: logits contain"):
        generator.generate_next_token()
