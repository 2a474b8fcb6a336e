"""`genai.Config`: schema validation, clear errors, and the reference's editing API."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import genai
from genai.runtime.config import normalize_provider_name, window_slides

BASE = {
    "model": {
        "type": "llama",
        "context_length": 64,
        "vocab_size": 10,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
        "decoder": {
            "filename": "model.onnx",
            "num_hidden_layers": 1,
            "session_options": {"log_id": "x", "provider_options": []},
            "inputs": {"input_ids": "input_ids"},
        },
    },
    "search": {"max_length": 32},
}


def write(folder: Path, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc))
    (folder / "model.onnx").write_bytes(b"")
    return folder


def test_reads_values(tmp_path):
    cfg = genai.Config(write(tmp_path, BASE))
    assert cfg.get("model.decoder.filename") == "model.onnx"
    assert cfg.get("model.missing", 5) == 5
    assert cfg.context_length == 64
    assert cfg.eos_token_ids == [2, 3]
    assert cfg.path == tmp_path.resolve()
    # the json file itself is accepted too
    assert genai.Config(tmp_path / "genai_config.json").path == cfg.path


def test_real_model_config_loads(smollm2_path):
    cfg = genai.Config(smollm2_path)
    assert cfg.get("model.decoder.num_hidden_layers") == 30
    assert cfg.eos_token_ids == [2]


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        genai.Config(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="genai_config.json not found"):
        genai.Config(tmp_path)


@pytest.mark.parametrize("folder", ["nope", "."])
def test_a_missing_model_folder_is_also_the_references_runtime_error(tmp_path, folder):
    """Scripts written for the reference catch RuntimeError ("Error opening ...")."""
    reference = pytest.importorskip("onnxruntime_genai")
    for og in (reference, genai):
        with pytest.raises(RuntimeError):
            og.Model(str(tmp_path / folder))


def test_malformed_json(tmp_path):
    (tmp_path / "genai_config.json").write_text("{not json")
    with pytest.raises(genai.ConfigError, match="not valid JSON"):
        genai.Config(tmp_path)


def test_unknown_key_names_path_and_file(tmp_path):
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["inputs"]["bogus_input"] = "x"
    write(tmp_path, doc)
    with pytest.raises(genai.ConfigError) as info:
        genai.Config(tmp_path)
    assert "model.decoder.inputs.bogus_input" in str(info.value)
    assert "genai_config.json" in str(info.value)
    with pytest.warns(UserWarning, match="model.decoder.inputs.bogus_input"):
        cfg = genai.Config(tmp_path, strict=False)
    assert cfg.get("model.decoder.inputs.bogus_input") == "x"


def test_wrong_type(tmp_path):
    doc = json.loads(json.dumps(BASE))
    doc["model"]["context_length"] = "64"
    write(tmp_path, doc)
    with pytest.raises(genai.ConfigError, match=r"model.context_length .* must be int"):
        genai.Config(tmp_path)


def test_session_options_free_string_entries(tmp_path):
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["session_options"]["session.disable_prepacking"] = "1"
    cfg = genai.Config(write(tmp_path, doc))
    assert cfg.get("model.decoder.session_options")["session.disable_prepacking"] == "1"
    doc["model"]["decoder"]["session_options"]["other"] = 3
    write(tmp_path, doc)
    with pytest.raises(genai.ConfigError, match="session_options.other"):
        genai.Config(tmp_path)


@pytest.mark.parametrize("name", ["../model.onnx", "/etc/passwd", "sub/../../x.onnx"])
def test_filename_must_stay_inside_folder(tmp_path, name):
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["filename"] = name
    write(tmp_path / "m", doc)
    with pytest.raises(genai.ConfigError, match="inside the model folder|escapes"):
        genai.Config(tmp_path / "m")


def test_symlink_escaping_folder_is_refused(tmp_path):
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"")
    folder = write(tmp_path / "m", BASE)
    (folder / "model.onnx").unlink()
    (folder / "model.onnx").symlink_to(outside)
    with pytest.raises(genai.ConfigError, match="escapes the model folder") as raised:
        genai.Config(folder)
    assert f"symbolic link to {outside.resolve()}" in str(raised.value)


def test_max_length_over_context_loads(tmp_path):
    """As the reference: checked when a generator is made (tests/test_reference_behaviour.py),
    where an overlay or set_search_options may have changed either."""
    doc = json.loads(json.dumps(BASE))
    doc["search"]["max_length"] = 65
    write(tmp_path, doc)
    assert genai.Config(tmp_path).get("search.max_length") == 65


def test_overlay_merges_and_validates(tmp_path):
    cfg = genai.Config(write(tmp_path, BASE))
    cfg.overlay('{"search": {"max_length": 16, "top_k": 3}}')
    assert cfg.get("search.max_length") == 16
    assert cfg.get("search.top_k") == 3
    assert cfg.get("model.vocab_size") == 10  # untouched
    with pytest.raises(genai.ConfigError, match="search.nonsense"):
        cfg.overlay({"search": {"nonsense": 1}})
    with pytest.raises(genai.ConfigError, match="context_length"):
        cfg.overlay({"search": {"max_length": 100}, "model": {"context_length": 0}})
    assert cfg.get("search.max_length") == 16  # a rejected overlay changes nothing
    assert cfg.get("model.context_length") == BASE["model"]["context_length"]


def test_provider_editing(tmp_path):
    cfg = genai.Config(write(tmp_path, BASE))
    cfg.append_provider("CUDAExecutionProvider")
    cfg.set_provider_option("cuda", "device_id", "1")
    cfg.set_provider_option("webgpu", "enableGraphCapture", "1")
    assert cfg.providers == [("cuda", {"device_id": "1"}), ("WebGPU", {"enableGraphCapture": "1"})]
    with pytest.raises(TypeError):
        cfg.set_provider_option("cuda", "device_id", 1)
    cfg.clear_providers()
    assert cfg.providers == []


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("CUDAExecutionProvider", "cuda"),
        ("cuda", "cuda"),
        ("dml", "DML"),
        ("qnn", "QNN"),
        ("WEBGPU", "WebGPU"),
        ("OpenVINOExecutionProvider", "OpenVINO"),
        ("NvTensorRtRtx", "NvTensorRtRtx"),
        ("my_vendor_ep", "my_vendor_ep"),
    ],
)
def test_provider_names_normalised(given, canonical):
    assert normalize_provider_name(given) == canonical


def test_provider_options_validated(tmp_path):
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"x": 1}}]
    write(tmp_path, doc)
    with pytest.raises(genai.ConfigError, match=r"provider_options\[0\].cuda.x"):
        genai.Config(tmp_path)


def test_model_requires_existing_file(tmp_path, smollm2_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copy(smollm2_path / "genai_config.json", folder)
    with pytest.raises(FileNotFoundError, match="model.onnx"):
        genai.Model(folder)


def test_provider_entries_split_and_merged_as_the_reference(tmp_path):
    og = pytest.importorskip("onnxruntime_genai", reason="reference engine not installed")
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["session_options"]["provider_options"] = [
        {"cuda": {"device_id": "0"}, "dml": {}},
        {},
        {"cuda": {"enable_cuda_graph": "1"}},
    ]
    folder = write(tmp_path, doc)
    og.Config(str(folder))  # the reference takes this shape too
    cfg = genai.Config(folder)
    assert cfg.providers == [
        ("cuda", {"device_id": "0", "enable_cuda_graph": "1"}),
        ("DML", {}),
    ]


def test_sliding_window_slides_default_to_true_as_in_the_reference(tmp_path):
    """``slide_key_value_cache`` and ``slide_inputs`` are true when absent (the reference's
    defaults; its builder writes both false for GroupQueryAttention windows), so a block
    without them is a window the engine slides, not GQA window layers."""
    assert window_slides({"window_size": 8})
    assert window_slides({"window_size": 8, "slide_inputs": False})
    assert not window_slides(
        {"window_size": 8, "slide_key_value_cache": False, "slide_inputs": False}
    )
    assert not window_slides(None)
    doc = json.loads(json.dumps(BASE))
    doc["model"]["decoder"]["sliding_window"] = {"window_size": 4, "layers": [0]}
    with pytest.raises(genai.ConfigError, match="covers every layer"):
        genai.Config(write(tmp_path / "slid", doc))
    doc["model"]["decoder"]["sliding_window"].update(
        slide_key_value_cache=False, slide_inputs=False
    )
    genai.Config(write(tmp_path / "gqa", doc))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("decoder", "num_hidden_layers"), 1, "num_hidden_layers is 1 in .* more layers"),
        (("decoder", "num_key_value_heads"), 4, "num_key_value_heads gives 4 KV heads .* has 2"),
        (("decoder", "head_size"), 8, "head_size gives 8 head size .* has 16"),
        (("vocab_size",), 60, "vocab_size is 60 .* logits .* are 64 wide"),
    ],
)
def test_sizes_the_graph_contradicts_are_config_errors(tmp_path, path, value, message):
    """A config whose sizes disagree with the graph's fixed dimensions fails at load with a
    ConfigError naming the key, not at the first step inside ORT."""
    folder = _fixture_with(tmp_path, path, value)
    with pytest.raises(genai.ConfigError, match=message):
        genai.Model(folder)


def _fixture_with(tmp_path: Path, path: tuple[str, ...], value: object) -> Path:
    """A GQA fixture folder whose ``model`` section has ``value`` at ``path`` (None: the key
    removed)."""
    from genai.testing.models import write_gqa_decoder

    folder = write_gqa_decoder(tmp_path, name="edited")
    config_file = folder / "genai_config.json"
    config = json.loads(config_file.read_text())
    section = config["model"]
    for key in path[:-1]:
        section = section[key]
    if value is None:
        del section[path[-1]]
    else:
        section[path[-1]] = value
    config_file.write_text(json.dumps(config))
    return folder


def test_a_decoder_type_without_a_decoder_section_says_so(tmp_path):
    folder = _fixture_with(tmp_path, ("decoder",), None)
    with pytest.raises(genai.ConfigError, match="no model.decoder section"):
        genai.Model(folder)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("context_length",), 0, r"context_length must be in \[1, 2147483647\]"),
        (("context_length",), 2**40, r"context_length must be in \[1, 2147483647\]"),
        (("vocab_size",), 0, r"vocab_size must be in \[1, 2147483647\]"),
        (("vocab_size",), -5, r"vocab_size must be in \[1, 2147483647\]"),
        (("decoder", "num_hidden_layers"), -1, "num_hidden_layers must be >= 0"),
        (("decoder", "head_size"), -16, "head_size must be >= 0"),
    ],
)
def test_sizes_out_of_range_are_config_errors(tmp_path, path, value, message):
    with pytest.raises(genai.ConfigError, match=message):
        genai.Config(_fixture_with(tmp_path, path, value))
