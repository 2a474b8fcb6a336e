"""Multi-LoRA (`genai.Adapters`, ``Generator.set_active_adapter``) and the PEFT converter.

The expected logits come from a NumPy forward pass written here from the graph's weight
initializers and the adapter arrays merged into them (``W + A @ B``), independent of the graph's
LoRA branches and of the engine; the reference engine (onnxruntime-genai) is compared where it
can run the graph (it needs an adapter active: it has no base values for LoRA inputs).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import genai
from genai.builder.errors import BuildError
from genai.builder.peft import convert_peft_adapter
from genai.errors import ConfigError
from genai.runtime.adapters import (
    AdapterError,
    AdapterInUseError,
    read_adapter_file,
    write_adapter_file,
)
from genai.testing.lora import write_lora_adapter, write_lora_decoder
from genai.testing.models import write_optimum_decoder
from tests.numpy_decoder import decoder_logits
from tests.speculation import assert_freed_at_once

PROMPT = [5, 9, 12, 7, 20]
LAYERS, HEADS, KV_HEADS = 2, 4, 2
ATOL = 1e-4


# --------------------------------------------------------------------------------------------
# NumPy reference
# --------------------------------------------------------------------------------------------


def graph_weights(folder: pathlib.Path) -> dict[str, np.ndarray]:
    """The model's weight initializers as float64."""
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def merged(base: dict[str, np.ndarray], *adapters: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``W + sum(A @ B)`` for every adapter pair (``model.X.lora_A.weight`` -> ``X.weight``)."""
    w = dict(base)
    for params in adapters:
        for name, a in params.items():
            if ".lora_A." not in name:
                continue
            b = params[name.replace(".lora_A.", ".lora_B.")]
            target = name[len("model.") :].replace(".lora_A.weight", ".weight")
            assert target in w, target
            w[target] = w[target] + a.astype(np.float64) @ b.astype(np.float64)
    return w


def numpy_logits(w: dict[str, np.ndarray], tokens: list[int] | np.ndarray) -> np.ndarray:
    """Logits ``[len, vocab]`` of a Llama-style decoder (RMSNorm, rotary, GQA, SwiGLU)."""
    return decoder_logits(w, tokens, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS)


# --------------------------------------------------------------------------------------------
# Driving an engine
# --------------------------------------------------------------------------------------------


def run(
    engine, model, adapters=None, names=(), *, steps: int = 12, prompt=PROMPT, **options
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy ``steps`` tokens; returns (sequence, logits ``[steps + 1, vocab]``: the prompt's
    last position, then each generated token's)."""
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps + 1, **options)
    generator = engine.Generator(model, params)
    for name in names:
        generator.set_active_adapter(adapters, name)
    generator.append_tokens(np.array(prompt, np.int32))
    logits = [np.array(generator.get_logits())[0, -1]]
    for _ in range(steps):
        generator.generate_next_token()
        logits.append(np.array(generator.get_logits())[0, -1])
    return np.array(generator.get_sequence(0)), np.array(logits)


def check_against_numpy(seq: np.ndarray, logits: np.ndarray, weights: dict) -> None:
    """Each step's logits equal the NumPy forward pass of the sequence so far."""
    expected = numpy_logits(weights, seq[: len(PROMPT) + len(logits) - 1])[len(PROMPT) - 1 :]
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A LoRA decoder (q/v/down_proj branches) and adapters: ``a`` everywhere (rank 4), ``b``
    on q_proj (rank 2), ``c`` on v_proj + down_proj (rank 3; disjoint from ``b``)."""
    root = tmp_path_factory.mktemp("lora")
    folder = write_lora_decoder(root, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS)
    files, params = {}, {}
    for name, kw in {
        "a": {"rank": 4, "seed": 1},
        "b": {"rank": 2, "seed": 2, "modules": ["q_proj"]},
        "c": {"rank": 3, "seed": 3, "modules": ["v_proj", "down_proj"]},
    }.items():
        files[name] = root / f"{name}.onnx_adapter"
        params[name] = write_lora_adapter(folder, files[name], **kw)
    return {
        "root": root,
        "folder": folder,
        "files": files,
        "params": params,
        "weights": graph_weights(folder),
        "model": genai.Model(folder),
    }


@pytest.fixture
def adapters(lora: dict) -> genai.Adapters:
    loaded = genai.Adapters(lora["model"])
    for name, path in lora["files"].items():
        loaded.load(path, name)
    return loaded


# --------------------------------------------------------------------------------------------
# The fixture graph
# --------------------------------------------------------------------------------------------


def test_lora_graph_inputs(lora: dict) -> None:
    graph = onnx.load(str(lora["folder"] / "model.onnx")).graph
    onnx.checker.check_model(onnx.load(str(lora["folder"] / "model.onnx")), full_check=True)
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in graph.input
    }
    assert shapes["model.layers.0.attn.q_proj.lora_A.weight"] == [
        64,
        "lora_rank_layers_0_attn_q_proj",
    ]
    assert shapes["model.layers.1.mlp.down_proj.lora_B.weight"] == [
        "lora_rank_layers_1_mlp_down_proj",
        64,
    ]
    assert len([n for n in shapes if "lora_" in n]) == LAYERS * 3 * 2
    specs = lora["model"].lora_inputs
    assert set(specs) == {n for n in shapes if "lora_" in n}
    a = specs["model.layers.0.mlp.down_proj.lora_A.weight"]
    assert (a.kind, a.rank_axis, a.max_rank, a.base.shape) == ("A", 1, None, (128, 0))
    assert a.partner == "model.layers.0.mlp.down_proj.lora_B.weight"


def test_base_equals_plain_model_exactly(lora: dict) -> None:
    """Rank-0 branches add exact zeros: the LoRA graph without adapters is the plain fixture."""
    plain = write_optimum_decoder(lora["root"], name="plain", num_layers=LAYERS)
    seq_plain, logits_plain = run(genai, genai.Model(plain))
    seq, logits = run(genai, lora["model"])
    np.testing.assert_array_equal(seq, seq_plain)
    np.testing.assert_array_equal(logits, logits_plain)
    check_against_numpy(seq, logits, lora["weights"])


# --------------------------------------------------------------------------------------------
# Adapters active: merged-weight logits
# --------------------------------------------------------------------------------------------


def test_adapter_logits_equal_merged_weights(lora: dict, adapters: genai.Adapters) -> None:
    seq, logits = run(genai, lora["model"], adapters, ["a"])
    check_against_numpy(seq, logits, merged(lora["weights"], lora["params"]["a"]))
    _, base = run(genai, lora["model"])
    assert np.abs(logits - base).max() > 1.0, "the adapter must change the logits"


def test_two_adapters_add_their_deltas(lora: dict, adapters: genai.Adapters) -> None:
    """``a`` and ``b`` both adapt q_proj: concatenated ranks give W + A_a B_a + A_b B_b."""
    seq, logits = run(genai, lora["model"], adapters, ["a", "b"])
    check_against_numpy(
        seq, logits, merged(lora["weights"], lora["params"]["a"], lora["params"]["b"])
    )
    _, only_a = run(genai, lora["model"], adapters, ["a"])
    assert np.abs(logits - only_a).max() > 0.1


def test_activating_twice_changes_nothing(lora: dict, adapters: genai.Adapters) -> None:
    params = genai.GeneratorParams(lora["model"])
    generator = genai.Generator(lora["model"], params)
    generator.set_active_adapter(adapters, "b")
    generator.set_active_adapter(adapters, "b")
    assert generator.active_adapters == ["b"]
    generator.append_tokens(np.array(PROMPT, np.int32))
    _, once = run(genai, lora["model"], adapters, ["b"], steps=0)
    np.testing.assert_array_equal(generator.get_logits()[0, -1], once[0])


@pytest.fixture(scope="module")
def gqa_lora(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """GQA layout with LoRA on the packed qkv_proj and on up_proj; adapter ``g`` (rank 3)."""
    root = tmp_path_factory.mktemp("gqa-lora")
    folder = write_lora_decoder(root, layout="gqa", targets=("qkv_proj", "up_proj"))
    params = write_lora_adapter(folder, root / "g.onnx_adapter", rank=3, seed=7)
    return {"folder": folder, "file": root / "g.onnx_adapter", "params": params}


def test_adapter_survives_kv_growth_and_batch(gqa_lora: dict) -> None:
    """A KV cache that starts at 8 positions and grows (shared-buffer GQA layout): every step
    still runs with the adapter's weights, at batch 2 with right padding too."""
    folder = gqa_lora["folder"]
    model = genai.Model(folder)
    adapters = genai.Adapters(model)
    adapters.load(gqa_lora["file"], "g")
    weights = merged(graph_weights(folder), gqa_lora["params"])
    seq, logits = run(genai, model, adapters, ["g"], steps=30, kv_initial_capacity=8)
    check_against_numpy(seq, logits, weights)

    rows = [PROMPT, [30, 31, 8]]
    batch = np.zeros((2, len(PROMPT)), np.int32)  # pad id 0
    for r, row in enumerate(rows):
        batch[r, : len(row)] = row
    gen_params = genai.GeneratorParams(model)
    gen_params.set_search_options(max_length=20, batch_size=2, kv_initial_capacity=8)
    generator = genai.Generator(model, gen_params)
    generator.set_active_adapter(adapters, "g")
    generator.append_tokens(batch)
    while not generator.is_done():
        generator.generate_next_token()
    for r, row in enumerate(rows):
        sequence = generator.get_sequence(r)
        generated = sequence[len(PROMPT) :]
        full = [*row, *generated]
        expected = numpy_logits(weights, full).argmax(-1)[len(row) - 1 : -1]
        np.testing.assert_array_equal(generated, expected, err_msg=f"row {r}")


# --------------------------------------------------------------------------------------------
# Several generators, switching, unloading
# --------------------------------------------------------------------------------------------


def test_generators_on_one_model_use_different_adapters(
    lora: dict, adapters: genai.Adapters
) -> None:
    """Interleaved steps of four generators (base, a, b, a+c) match their solo runs exactly."""
    model = lora["model"]
    setups = [(), ("a",), ("b",), ("a", "c")]
    solo = [run(genai, model, adapters, names)[1] for names in setups]
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 13)
    generators = []
    for names in setups:
        generator = genai.Generator(model, params)
        for name in names:
            generator.set_active_adapter(adapters, name)
        generators.append(generator)
    logits: list[list[np.ndarray]] = [[] for _ in setups]
    for generator, out in zip(generators, logits, strict=True):
        generator.append_tokens(np.array(PROMPT, np.int32))
        out.append(np.array(generator.get_logits())[0, -1])
    for _ in range(12):
        for generator, out in zip(generators, logits, strict=True):
            generator.generate_next_token()
            out.append(np.array(generator.get_logits())[0, -1])
    for names, mine, expected in zip(setups, logits, solo, strict=True):
        np.testing.assert_array_equal(np.array(mine), expected, err_msg=f"adapters {names}")
    assert [g.active_adapters for g in generators] == [list(s) for s in setups]
    # Different adapters give different runs, so the comparison above can fail.
    assert len({np.round(s[-1], 3).tobytes() for s in solo}) == len(setups)


def test_unload_restores_base_outputs(lora: dict) -> None:
    model = lora["model"]
    _, base = run(genai, model)
    adapters = genai.Adapters(model)
    adapters.load(lora["files"]["a"], "a")
    params = genai.GeneratorParams(model)
    generator = genai.Generator(model, params)
    generator.set_active_adapter(adapters, "a")
    with pytest.raises(AdapterInUseError, match="'a' is active on 1 live generator"):
        adapters.unload("a")
    assert "a" in adapters
    del generator
    adapters.unload("a")
    assert adapters.names == [] and "a" not in adapters
    _, after = run(genai, model)
    np.testing.assert_array_equal(after, base)
    adapters.load(lora["files"]["b"], "a")  # the name is free again
    seq, reloaded = run(genai, model, adapters, ["a"])
    check_against_numpy(seq, reloaded, merged(lora["weights"], lora["params"]["b"]))


def test_unload_ignores_generators_of_other_adapters(lora: dict, adapters: genai.Adapters) -> None:
    params = genai.GeneratorParams(lora["model"])
    generator = genai.Generator(lora["model"], params)
    generator.set_active_adapter(adapters, "b")
    adapters.unload("a")
    with pytest.raises(AdapterInUseError):
        adapters.unload("b")
    assert adapters.names == ["b", "c"]


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _write(path: pathlib.Path, params: dict[str, np.ndarray]) -> pathlib.Path:
    write_adapter_file(path, params)
    return path


def test_load_errors(lora: dict, tmp_path: pathlib.Path) -> None:
    adapters = genai.Adapters(lora["model"])
    good = dict(lora["params"]["b"])
    a_name = "model.layers.0.attn.q_proj.lora_A.weight"
    b_name = "model.layers.0.attn.q_proj.lora_B.weight"

    with pytest.raises(FileNotFoundError, match="missing.onnx_adapter"):
        adapters.load(tmp_path / "missing.onnx_adapter", "x")
    junk = tmp_path / "junk.onnx_adapter"
    junk.write_bytes(b"not an adapter at all")
    with pytest.raises(AdapterError, match="junk.onnx_adapter.*not a readable"):
        adapters.load(junk, "x")
    wrong_name = {**good, "model.layers.0.attn.q_proj.lora_C.weight": good[a_name]}
    with pytest.raises(AdapterError, match=r"wrong_name.*'model.layers.0.attn.q_proj.lora_C"):
        adapters.load(_write(tmp_path / "wrong_name.onnx_adapter", wrong_name), "x")
    typo = {k.replace("q_proj", "q_prj"): v for k, v in good.items()}
    with pytest.raises(AdapterError, match=r"did you mean 'model.layers.\d.attn.q_proj.lora_"):
        adapters.load(_write(tmp_path / "typo.onnx_adapter", typo), "x")
    half = {**good, a_name: good[a_name].astype(np.float16)}
    with pytest.raises(AdapterError, match=r"half.*q_proj.lora_A.weight' is float16.*float32"):
        adapters.load(_write(tmp_path / "half.onnx_adapter", half), "x")
    shape = {**good, a_name: np.zeros((32, 2), np.float32)}
    with pytest.raises(AdapterError, match=r"shape \[32, 2\].*expects \[64, 'rank'\]"):
        adapters.load(_write(tmp_path / "shape.onnx_adapter", shape), "x")
    alone = {a_name: good[a_name]}
    with pytest.raises(AdapterError, match=r"no partner 'model.layers.0.attn.q_proj.lora_B"):
        adapters.load(_write(tmp_path / "alone.onnx_adapter", alone), "x")
    ranks = {**good, b_name: np.zeros((3, 64), np.float32)}
    with pytest.raises(AdapterError, match="rank 2 but .* has rank 3"):
        adapters.load(_write(tmp_path / "ranks.onnx_adapter", ranks), "x")
    assert adapters.names == []  # nothing half-loaded

    adapters.load(lora["files"]["a"], "a")
    with pytest.raises(AdapterError, match="'a' is already loaded"):
        adapters.load(lora["files"]["b"], "a")
    with pytest.raises(AdapterError, match="non-empty string"):
        adapters.load(lora["files"]["b"], "")
    assert isinstance(AdapterError("x"), RuntimeError)  # what the reference raises


def test_unknown_names_and_wrong_model(lora: dict, tmp_path: pathlib.Path) -> None:
    adapters = genai.Adapters(lora["model"])
    adapters.load(lora["files"]["a"], "a")
    generator = genai.Generator(lora["model"], genai.GeneratorParams(lora["model"]))
    with pytest.raises(AdapterError, match=r"no adapter named 'zz' is loaded \(loaded: 'a'\)"):
        generator.set_active_adapter(adapters, "zz")
    with pytest.raises(AdapterError, match="no adapter named 'zz'"):
        adapters.unload("zz")
    assert generator.active_adapters == []

    other = genai.Model(lora["folder"])  # same files, another Model
    stranger = genai.Generator(other, genai.GeneratorParams(other))
    with pytest.raises(AdapterError, match="loaded for model .* Adapters\\(generator.model\\)"):
        stranger.set_active_adapter(adapters, "a")

    plain = genai.Model(write_optimum_decoder(tmp_path, name="plain", num_layers=LAYERS))
    with pytest.raises(AdapterError, match="has no LoRA inputs"):
        genai.Adapters(plain).load(lora["files"]["a"], "a")


def test_fixed_rank_inputs_are_zero_padded(lora: dict, tmp_path: pathlib.Path) -> None:
    """A graph whose LoRA rank dimension is a fixed 5: base = zeros of rank 5, a rank-2 adapter
    is padded with zeros, ranks adding up to more than 5 are refused."""
    model_proto = onnx.load(str(lora["folder"] / "model.onnx"))
    for value in model_proto.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param.startswith("lora_rank"):
                dim.Clear()
                dim.dim_value = 5
    folder = write_lora_decoder(tmp_path, num_layers=LAYERS, name="fixed")
    onnx.save(model_proto, str(folder / "model.onnx"))
    model = genai.Model(folder)
    spec = model.lora_inputs["model.layers.0.attn.q_proj.lora_B.weight"]
    assert spec.max_rank == 5 and spec.base.shape == (5, 64) and not spec.base.any()
    adapters = genai.Adapters(model)
    for name in ("a", "b"):
        adapters.load(lora["files"][name], name)
    seq, logits = run(genai, model)
    check_against_numpy(seq, logits, lora["weights"])
    seq, logits = run(genai, model, adapters, ["b"])
    check_against_numpy(seq, logits, merged(lora["weights"], lora["params"]["b"]))
    with pytest.raises(AdapterError, match="add up to 6 .* fixed rank 5"):
        run(genai, model, adapters, ["a", "b"])


def test_model_rejects_malformed_lora_inputs(tmp_path: pathlib.Path) -> None:
    folder = write_lora_decoder(tmp_path, num_layers=1, targets=("q_proj",))
    model_proto = onnx.load(str(folder / "model.onnx"))
    lora_b = next(v for v in model_proto.graph.input if ".lora_B." in v.name)
    lora_b.name = lora_b.name.replace("lora_B", "lora_b")
    for node in model_proto.graph.node:
        node.input[:] = [i.replace("lora_B", "lora_b") for i in node.input]
    onnx.save(model_proto, str(folder / "model.onnx"))
    with pytest.raises(ConfigError, match="no partner input 'model.layers.0.attn.q_proj.lora_B"):
        genai.Model(folder)


# --------------------------------------------------------------------------------------------
# The reference engine
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("names", [("a",), ("b", "c")])
def test_parity_with_reference(lora: dict, adapters: genai.Adapters, names: tuple) -> None:
    """Same tokens and logits as onnxruntime-genai with the same adapter files active (``b``
    and ``c`` adapt disjoint inputs: the reference requires that of simultaneous adapters)."""
    og = pytest.importorskip("onnxruntime_genai")
    ref_model = og.Model(str(lora["folder"]))
    ref_adapters = og.Adapters(ref_model)
    for name in names:
        ref_adapters.load(str(lora["files"][name]), name)
    seq, logits = run(genai, lora["model"], adapters, names)
    ref_seq, ref_logits = run(og, ref_model, ref_adapters, names)
    np.testing.assert_array_equal(seq, ref_seq)
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)


def test_parity_with_reference_gqa(gqa_lora: dict) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    model = genai.Model(gqa_lora["folder"])
    adapters = genai.Adapters(model)
    adapters.load(gqa_lora["file"], "g")
    ref_model = og.Model(str(gqa_lora["folder"]))
    ref_adapters = og.Adapters(ref_model)
    ref_adapters.load(str(gqa_lora["file"]), "g")
    seq, logits = run(genai, model, adapters, ["g"], steps=20)
    ref_seq, ref_logits = run(og, ref_model, ref_adapters, ["g"], steps=20)
    np.testing.assert_array_equal(seq, ref_seq)
    np.testing.assert_allclose(logits, ref_logits, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------
# PEFT converter
# --------------------------------------------------------------------------------------------


def write_peft(
    folder: pathlib.Path,
    *,
    r: int = 4,
    alpha: float = 8.0,
    seed: int = 0,
    modules: tuple[str, ...] = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"),
    sizes: dict[str, tuple[int, int]] | None = None,
    extra_config: dict | None = None,
) -> dict[str, np.ndarray]:
    """A PEFT LoRA folder as ``save_pretrained`` writes it (torch layout: A [r, in],
    B [out, r]); returns the tensors by key."""
    from safetensors.numpy import save_file

    sizes = sizes or {"q_proj": (64, 64), "v_proj": (64, 32), "down_proj": (128, 64)}
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(LAYERS):
        for module in modules:
            n_in, n_out = sizes[module.split(".")[-1]]
            key = f"base_model.model.model.layers.{i}.{module}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((r, n_in)) / 8).astype(
                np.float32
            )
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((n_out, r)) / 4).astype(
                np.float32
            )
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": alpha,
        "target_modules": sorted({m.split(".")[-1] for m in modules}),
        "bias": "none",
        "task_type": "CAUSAL_LM",
        **(extra_config or {}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def peft_merged(base: dict, tensors: dict, scale: float) -> dict[str, np.ndarray]:
    """``W[in, out] + scale * (B @ A).T``, straight from the PEFT tensors."""
    w = dict(base)
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        module = key[len("base_model.model.model.") : -len(".lora_A.weight")]
        target = module.replace("self_attn", "attn") + ".weight"
        w[target] = w[target] + scale * (b.astype(np.float64) @ a.astype(np.float64)).T
    return w


@pytest.mark.parametrize("rslora", [False, True])
def test_peft_adapter_gives_merged_logits(lora: dict, tmp_path: pathlib.Path, rslora: bool) -> None:
    tensors = write_peft(tmp_path / "peft", extra_config={"use_rslora": rslora})
    out = tmp_path / "peft.onnx_adapter"
    params = convert_peft_adapter(tmp_path / "peft", out, model_dir=lora["folder"])
    assert sorted(params) == sorted(read_adapter_file(out))
    assert params["model.layers.1.attn.v_proj.lora_B.weight"].shape == (4, 32)
    adapters = genai.Adapters(lora["model"])
    adapters.load(out, "peft")
    seq, logits = run(genai, lora["model"], adapters, ["peft"])
    scale = 8.0 / (np.sqrt(4) if rslora else 4)
    check_against_numpy(seq, logits, peft_merged(lora["weights"], tensors, scale))


def test_peft_rank_and_alpha_patterns(lora: dict, tmp_path: pathlib.Path) -> None:
    """Per-module alpha (``alpha_pattern``) scales only the matching modules."""
    tensors = write_peft(
        tmp_path / "peft",
        modules=("self_attn.q_proj",),
        extra_config={"alpha_pattern": {"layers.1.self_attn.q_proj": 2.0}},
    )
    params = convert_peft_adapter(tmp_path / "peft", tmp_path / "p.onnx_adapter")
    for i, scale in ((0, 2.0), (1, 0.5)):
        key = f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"
        np.testing.assert_allclose(
            params[f"model.layers.{i}.attn.q_proj.lora_B.weight"], scale * tensors[key].T, rtol=1e-6
        )


def test_peft_fp16_and_module_map(lora: dict, tmp_path: pathlib.Path) -> None:
    write_peft(tmp_path / "peft", modules=("self_attn.q_proj",))
    params = convert_peft_adapter(
        tmp_path / "peft",
        tmp_path / "p.onnx_adapter",
        dtype="float16",
        module_map={"self_attn": "sa"},
    )
    assert set(params) == {
        f"model.layers.{i}.sa.q_proj.lora_{k}.weight" for i in range(LAYERS) for k in "AB"
    }
    assert all(v.dtype == np.float16 for v in params.values())
    with pytest.raises(BuildError, match="is not an input of .*adjust module_map"):
        convert_peft_adapter(
            tmp_path / "peft", tmp_path / "q.onnx_adapter", module_map={}, model_dir=lora["folder"]
        )
    assert not (tmp_path / "q.onnx_adapter").exists()


def test_peft_errors(lora: dict, tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    out = tmp_path / "out.onnx_adapter"
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        convert_peft_adapter(tmp_path / "nothing", out)
    write_peft(tmp_path / "ia3", extra_config={"peft_type": "IA3"})
    with pytest.raises(BuildError, match="peft_type 'IA3'"):
        convert_peft_adapter(tmp_path / "ia3", out)
    write_peft(tmp_path / "dora", extra_config={"use_dora": True})
    with pytest.raises(BuildError, match="DoRA"):
        convert_peft_adapter(tmp_path / "dora", out)
    tensors = write_peft(tmp_path / "emb")
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = np.zeros((4, 64), np.float32)
    save_file(tensors, str(tmp_path / "emb" / "adapter_model.safetensors"))
    with pytest.raises(BuildError, match="embed_tokens.lora_embedding_A.*embedding LoRA"):
        convert_peft_adapter(tmp_path / "emb", out)
    write_peft(tmp_path / "rank", extra_config={"r": 8})
    with pytest.raises(BuildError, match="rank 4 in the weights but 8"):
        convert_peft_adapter(tmp_path / "rank", out)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(BuildError, match="safe_serialization=True"):
        convert_peft_adapter(tmp_path / "bin", out)
    write_peft(tmp_path / "plain")
    plain = write_optimum_decoder(tmp_path, name="plain", num_layers=LAYERS)
    with pytest.raises(BuildError, match="has no LoRA inputs"):
        convert_peft_adapter(tmp_path / "plain", out, model_dir=plain)
    assert not out.exists()


def test_peft_command_line(lora: dict, tmp_path: pathlib.Path) -> None:
    write_peft(tmp_path / "peft")
    out = tmp_path / "cli.onnx_adapter"
    command = [sys.executable, "-m", "genai.builder.peft"]
    cwd = pathlib.Path(__file__).resolve().parents[1]  # the checkout: `genai` importable
    helped = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, check=True, cwd=cwd
    )
    assert "PEFT_DIR" in helped.stdout and "--module-map" in helped.stdout
    done = subprocess.run(
        [*command, str(tmp_path / "peft"), str(out), "--model", str(lora["folder"])],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    )
    assert "wrote 6 LoRA pairs" in done.stdout
    assert len(read_adapter_file(out)) == 12
    failed = subprocess.run(
        [*command, str(tmp_path / "none"), str(out)], capture_output=True, text=True, cwd=cwd
    )
    assert failed.returncode == 1 and "adapter_config.json" in failed.stderr


# --------------------------------------------------------------------------------------------
# docs/adapters.md
# --------------------------------------------------------------------------------------------


def test_docs_example_runs() -> None:
    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "docs" / "adapters.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["base", "['math']", "['math',"]
    assert len({line.rsplit("[", 1)[-1] for line in lines}) == 3  # three different continuations


def test_genai_cli_adapter_convert_and_generate(
    lora: dict, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`genai adapter convert` writes what the converter writes; `genai generate --adapter
    FILE=NAME` prints exactly the text the Python API generates with that adapter active."""
    from genai.cli import main

    write_peft(tmp_path / "peft")
    out = tmp_path / "cli.onnx_adapter"
    assert main(["adapter", "convert", str(tmp_path / "peft"), str(out)]) == 0
    assert "wrote 6 LoRA pairs" in capsys.readouterr().out
    assert len(read_adapter_file(out)) == 12
    assert main(["adapter", "convert", str(tmp_path / "none"), str(out)]) == 1
    capsys.readouterr()

    folder, file = lora["folder"], lora["files"]["a"]
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    prompt = "hello world"
    ids = tokenizer.encode(prompt)
    texts = {}
    for active in (False, True):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 12)
        generator = genai.Generator(model, params)
        if active:
            loaded = genai.Adapters(model)
            loaded.load(file, "a")
            generator.set_active_adapter(loaded, "a")
        generator.append_tokens(ids)
        generator.generate_until_done()
        texts[active] = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    assert texts[True] != texts[False]
    argv = ["generate", "-m", str(folder), prompt, "--max-length", str(len(ids) + 12)]
    assert main([*argv, "--adapter", f"{file}=a"]) == 0
    assert capsys.readouterr().out == texts[True] + "\n"
    assert main(argv) == 0
    assert capsys.readouterr().out == texts[False] + "\n"


@pytest.mark.parametrize("batch", [1, 2])
def test_a_deleted_speculative_generator_is_freed_at_once(gqa_lora: dict, batch: int) -> None:
    """docs/adapters.md: deleting the generators frees an adapter. A speculative generator and
    its rounds referred to each other, so it (and its KV cache) lived on until the cycle
    collector ran, and `unload` refused meanwhile."""
    model = genai.Model(str(gqa_lora["folder"]))
    adapters = genai.Adapters(model)
    adapters.load(str(gqa_lora["file"]), "g")
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=32, batch_size=batch)
    params.set_speculative_options(ngram_size=2, max_draft_tokens=3)
    generator = genai.Generator(model, params)
    generator.set_active_adapter(adapters, "g")
    generator.append_tokens(np.array([[5, 9, 12, 7, 5, 9, 12]] * batch, np.int32))
    for _ in range(4):
        generator.generate_next_token()
    box = [generator]
    del generator
    assert_freed_at_once(box)
    adapters.unload("g")
    assert adapters.names == []
