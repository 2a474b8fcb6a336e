"""Multi-graph decoders (``model.decoder.pipeline``, `genai.generation.pipeline`): the same
tokens and
logits as the same model in one graph and as the reference on the same folder; batches,
rewinds, continuous decoding, prompt-only / token-only stages, stage outputs, and every
refusal."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import genai
from genai.errors import ConfigError, GenerationError
from genai.generation.pipeline import PipelineRunner
from genai.providers import CPUProvider
from genai.runtime import model as genai_model
from genai.runtime.pipeline_stages import PipelineStage, stage_session_options
from genai.testing.models import write_gqa_decoder, write_optimum_decoder
from genai.testing.pipeline import PIPELINE_TYPE, write_pipeline_decoder
from tests.parity import assert_same_run, greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

PROMPT = np.array([5, 9, 12, 7, 20, 33, 41], np.int32)
BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)
NEW_TOKENS = 40

#: name -> (pipeline writer arguments, the single-graph writer of the same function, its args)
CASES = {
    "gqa": ({"attention": "gqa"}, write_gqa_decoder, {}),
    "gqa-noshare": ({"attention": "gqa", "share_buffer": False}, write_gqa_decoder, {}),
    "gqa-3layers-int32": (
        {"attention": "gqa", "num_layers": 3, "layer_groups": [[0, 1], [2]], "id_dtype": "int32"},
        write_gqa_decoder,
        {"num_layers": 3, "id_dtype": "int32"},
    ),
    "plain": ({"attention": "plain"}, write_optimum_decoder, {}),
    "plain-split": (
        {"attention": "plain", "token_gen_stages": True, "forward_embeddings": True},
        write_optimum_decoder,
        {},
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(pipeline folder, single-graph folder) per case."""
    root = tmp_path_factory.mktemp("pipelines")
    out = {}
    for key, (kw, single, single_kw) in CASES.items():
        out[key] = (
            write_pipeline_decoder(root, name=f"{key}-pipeline", **kw),
            single(root, name=f"{key}-single", **single_kw),
        )
    return out


def copy_folder(src: Path, dst: Path, edit=None) -> Path:
    """A copy of a model folder, its genai_config.json passed through ``edit(config)``."""
    shutil.copytree(src, dst)
    if edit is not None:
        path = dst / "genai_config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config, indent=2))
    return dst


def stages_of(config: dict) -> dict:
    return config["model"]["decoder"]["pipeline"][0]


def generate(engine, model, prompt, steps, **options):
    """Greedy (or sampled) tokens after ``prompt``, per row."""
    batch = prompt.shape[0] if prompt.ndim == 2 else 1
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=prompt.shape[-1] + steps, batch_size=batch, **options)
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return [np.array(generator.get_sequence(i))[prompt.shape[-1] :].tolist() for i in range(batch)]


# --- parity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2-padded"])
def test_tokens_and_logits_match_one_graph_and_the_reference(folders, case, prompt):
    pipeline, single = folders[case]
    ours = genai.Model(pipeline)
    assert ours.pipeline is not None and genai.Model(single).pipeline is None
    max_length = prompt.shape[-1] + NEW_TOKENS
    mine = greedy(genai, ours, prompt, max_length, keep_logits=True)
    one_graph = greedy(genai, genai.Model(single), prompt, max_length, keep_logits=True)
    theirs = greedy(og, og.Model(str(pipeline)), prompt, max_length, keep_logits=True)
    assert_same_run(mine, one_graph)
    assert_same_run(mine, theirs)
    assert len(set(np.concatenate(mine.next_tokens).tolist())) >= 8, "degenerate fixture"
    for step, (a, b, c) in enumerate(
        zip(mine.logits, one_graph.logits, theirs.logits, strict=True)
    ):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=f"one graph, step {step}")
        np.testing.assert_allclose(a, c, atol=1e-4, rtol=0, err_msg=f"reference, step {step}")


@pytest.mark.parametrize("case", ["gqa-noshare", "plain"])
def test_parity_fails_when_a_layer_loses_its_kv(folders, monkeypatch, case):
    """The parity checks above see a runner that loses a layer's past between runs."""
    model = genai.Model(folders[case][0])
    expected = generate(genai, model, PROMPT, 12)
    original = PipelineRunner._run_stages

    def forgetful(self, fed, prompt):
        original(self, fed, prompt)
        for name in ("past_key_values.1.key", "past_key_values.1.value"):
            self.kv[name] = np.zeros_like(self.kv[name])

    monkeypatch.setattr(PipelineRunner, "_run_stages", forgetful)
    assert generate(genai, model, PROMPT, 12) != expected


def test_parity_fails_with_another_stage_graph(folders, tmp_path):
    """A transformer stage swapped for one with other weights changes the tokens."""
    pipeline, _ = folders["gqa"]
    other = write_pipeline_decoder(tmp_path, name="other", seed=11)
    broken = copy_folder(pipeline, tmp_path / "broken")
    shutil.copy(other / "transformer_1.onnx", broken / "transformer_1.onnx")
    assert generate(genai, genai.Model(broken), PROMPT, 12) != generate(
        genai, genai.Model(pipeline), PROMPT, 12
    )


def test_sampling_matches_one_graph(folders):
    pipeline, single = folders["gqa"]
    options = {"do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 0.8, "random_seed": 7}
    for prompt in (PROMPT, BATCH):
        got = generate(genai, genai.Model(pipeline), prompt, 24, **options)
        assert got == generate(genai, genai.Model(single), prompt, 24, **options)


def test_stop_strings_logprobs_and_guidance_match_one_graph(folders):
    """The Python stage (stop strings, guidance) and log-probabilities run as for one graph."""
    pipeline, single = folders["gqa"]
    results = []
    for folder in (pipeline, single):
        model = genai.Model(folder)
        tokenizer = genai.Tokenizer(model)
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=40, top_logprobs=2, stop=["x"], temperature=0.7)
        generator = genai.Generator(model, params)
        generator.append_tokens(PROMPT)
        steps = []
        while not generator.is_done():
            generator.generate_next_token()
            chosen, ids, logprobs = generator.get_next_logprobs()
            steps.append((chosen.tolist(), ids.tolist(), np.round(logprobs, 4).tolist()))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=40)
        params.set_guidance("regex", "[a-z ]{3,12}")
        guided = genai.Generator(model, params)
        guided.append_tokens(tokenizer.encode("the"))
        while not guided.is_done():
            guided.generate_next_token()
        results.append((generator.get_sequence(0).tolist(), steps, guided.get_sequence(0).tolist()))
    assert results[0] == results[1]


def test_two_generators_interleaved_on_one_model(folders):
    """Each generator binds its own buffers on every stage session."""
    model = genai.Model(folders["gqa-noshare"][0])
    alone = [generate(genai, model, prompt, 12)[0] for prompt in (PROMPT, PROMPT[:3])]
    generators = []
    for prompt in (PROMPT, PROMPT[:3]):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 12)
        generator = genai.Generator(model, params)
        generator.append_tokens(prompt)
        generators.append(generator)
    while not all(g.is_done() for g in generators):
        for generator in generators:
            if not generator.is_done():
                generator.generate_next_token()
    got = [g.get_sequence(0).tolist()[n:] for g, n in zip(generators, (7, 3), strict=True)]
    assert got == alone


def test_generate_until_done_equals_steps(folders):
    pipeline, _ = folders["plain"]
    model = genai.Model(pipeline)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 20)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    assert generator.generate_until_done() == 20
    assert (
        generator.get_sequence(0)[len(PROMPT) :].tolist() == generate(genai, model, PROMPT, 20)[0]
    )


def beams(engine, model, prompt, steps=16):
    batch = prompt.shape[0] if prompt.ndim == 2 else 1
    params = engine.GeneratorParams(model)
    params.set_search_options(
        max_length=prompt.shape[-1] + steps, num_beams=3, num_return_sequences=2, batch_size=batch
    )
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return [np.array(generator.get_sequence(i)).tolist() for i in range(2 * batch)]


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "plain-split"])
def test_beam_search_matches_the_reference(folders, case):
    """Batch 1: the reference on the pipeline folder. Batch 2 (padded): the reference's
    pipeline runs its second row differently from its own one-graph run of the same model;
    genai's pipeline equals the one-graph run of both engines."""
    pipeline, single = folders[case]
    ours = genai.Model(pipeline)
    assert beams(genai, ours, PROMPT) == beams(og, og.Model(str(pipeline)), PROMPT)
    assert beams(genai, ours, BATCH) == beams(og, og.Model(str(single)), BATCH)


# --- rewind and continuous decoding ----------------------------------------------------------


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "plain"])
def test_rewind_then_append_equals_one_graph(folders, case):
    """Beyond the reference, which refuses rewind_to on pipeline models."""
    results = []
    for folder in folders[case]:
        model = genai.Model(folder)
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPT) + 30)
        generator = genai.Generator(model, params)
        generator.append_tokens(PROMPT)
        for _ in range(6):
            generator.generate_next_token()
        generator.rewind_to(4)
        generator.append_tokens(PROMPT[4:])
        for _ in range(10):
            generator.generate_next_token()
        results.append(generator.get_sequence(0).tolist())
    assert results[0] == results[1]
    assert results[0][: len(PROMPT)] == PROMPT.tolist()
    reference = og.Model(str(folders[case][0]))
    params = og.GeneratorParams(reference)
    params.set_search_options(max_length=20)
    generator = og.Generator(reference, params)
    generator.append_tokens(PROMPT)
    with pytest.raises(RuntimeError, match="RewindTo is currently not supported"):
        generator.rewind_to(4)


@pytest.mark.parametrize("case", ["gqa", "plain"])
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2-padded"])
def test_rewind_and_continue_equals_one_graph(folders, case, prompt):
    """rewind_to inside the generated part, generate on: the same tokens as the one-graph
    model doing the same (batch 2 included)."""
    out = []
    for folder in folders[case]:
        model = genai.Model(folder)
        params = genai.GeneratorParams(model)
        rows = prompt.shape[0] if prompt.ndim == 2 else 1
        params.set_search_options(max_length=prompt.shape[-1] + 30, batch_size=rows)
        generator = genai.Generator(model, params)
        generator.append_tokens(prompt)
        for _ in range(8):
            generator.generate_next_token()
        generator.rewind_to(prompt.shape[-1] + 3)
        for _ in range(10):
            generator.generate_next_token()
        out.append([generator.get_sequence(i).tolist() for i in range(rows)])
    assert out[0] == out[1]


@pytest.mark.parametrize("case", ["gqa", "plain-split"])
def test_continuous_decoding_equals_one_graph_and_a_fresh_run(folders, case):
    pipeline, single = folders[case]
    out = []
    for folder in (pipeline, single):
        model = genai.Model(folder)
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=64)
        generator = genai.Generator(model, params)
        generator.append_tokens(PROMPT)
        for _ in range(5):
            generator.generate_next_token()
        generator.append_tokens(np.array([13, 14, 15], np.int32))
        for _ in range(8):
            generator.generate_next_token()
        out.append(generator.get_sequence(0).tolist())
    assert out[0] == out[1]
    fresh = generate(genai, genai.Model(pipeline), np.array(out[0][:15], np.int32), 8)[0]
    assert out[0][15:] == fresh


# --- run_on_prompt / run_on_token_gen --------------------------------------------------------


@pytest.fixture(scope="module")
def token_stage_swapped(folders, tmp_path_factory) -> Path:
    """The prompt/token-split folder with other weights in the token-run stages only."""
    pipeline, _ = folders["plain-split"]
    root = tmp_path_factory.mktemp("swapped")
    other = write_pipeline_decoder(
        root, name="other", attention="plain", token_gen_stages=True, seed=11
    )
    swapped = copy_folder(pipeline, root / "swapped")
    for k in range(2):
        shutil.copy(other / f"transformer_{k}_token.onnx", swapped / f"transformer_{k}_token.onnx")
    return swapped


def test_token_runs_use_the_token_stages_as_the_reference(folders, token_stage_swapped):
    pipeline, _ = folders["plain-split"]
    base = generate(genai, genai.Model(pipeline), PROMPT, 12)[0]
    mine = generate(genai, genai.Model(token_stage_swapped), PROMPT, 12)[0]
    theirs = generate(og, og.Model(str(token_stage_swapped)), PROMPT, 12)[0]
    assert mine == theirs
    assert mine[0] == base[0]  # the prompt ran on the prompt stages
    assert mine[1:] != base[1:]  # the tokens on the others


def test_batch2_token_runs_use_the_token_stages(folders, token_stage_swapped):
    """Beyond the reference, which takes every run of a batch > 1 for a prompt run (it counts
    the tokens of all rows): each row equals its batch-1 run."""
    swapped = genai.Model(token_stage_swapped)
    rows = generate(genai, swapped, BATCH, 12)
    assert rows[0] == generate(genai, swapped, PROMPT, 12)[0]
    assert rows[1] == generate(genai, swapped, BATCH[1, :3], 12)[0]
    reference = og.Model(str(token_stage_swapped))
    assert (
        generate(og, reference, BATCH, 12)[0]
        == generate(genai, genai.Model(folders["plain-split"][0]), BATCH, 12)[0]
    )


def test_a_stage_fed_by_a_prompt_only_stage_fails_on_token_runs(folders, tmp_path):
    def edit(config):
        del stages_of(config)["transformer_1_token"]

    folder = copy_folder(folders["plain-split"][0], tmp_path / "no-token-1", edit)
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=20)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    generator.generate_next_token()
    with pytest.raises(GenerationError, match="present.1.key"):
        generator.generate_next_token()


# --- reading stage outputs -------------------------------------------------------------------


def test_get_output_of_stage_tensors(folders):
    pipeline, single = folders["plain-split"]
    embed = {
        t.name: onnx.numpy_helper.to_array(t)
        for t in onnx.load(str(pipeline / "embeddings.onnx")).graph.initializer
    }["embed_tokens.weight"]
    mine = genai.Model(pipeline)
    params = genai.GeneratorParams(mine)
    params.set_search_options(max_length=20)
    ours = genai.Generator(mine, params)
    ref_model = og.Model(str(pipeline))
    ref_params = og.GeneratorParams(ref_model)
    ref_params.set_search_options(max_length=20)
    ref = og.Generator(ref_model, ref_params)
    one = genai.Generator(genai.Model(single), params)
    for generator in (ours, ref, one):
        generator.append_tokens(PROMPT)
    # the forwarded name, not the graph's
    np.testing.assert_array_equal(ours.get_output("inputs_embeds"), embed[PROMPT][None])
    with pytest.raises(KeyError):
        ours.get_output("embeddings_out")
    for name in ("inputs_embeds", "hidden_states.0", "hidden_states.1", "logits", "present.1.key"):
        np.testing.assert_allclose(ours.get_output(name), ref.get_output(name), atol=1e-5)
    np.testing.assert_allclose(
        ours.get_output("present.0.value"), one.get_output("present.0.value")
    )
    np.testing.assert_array_equal(ours.get_input("position_ids"), one.get_input("position_ids"))
    for generator in (ours, ref):
        generator.generate_next_token()
        generator.generate_next_token()  # a token run
    for name in ("inputs_embeds", "logits", "present.0.key"):
        np.testing.assert_allclose(ours.get_output(name), ref.get_output(name), atol=1e-5)
    assert ours.get_output("inputs_embeds").shape == (1, 1, 64)
    assert ours.get_output("present.0.key").shape == (1, 2, len(PROMPT) + 1, 16)
    # as the reference: after a token run the outputs of prompt-only stages are dropped, and
    # with them the same names the token stages wrote
    for name in ("hidden_states.0", "hidden_states.1"):
        with pytest.raises(KeyError):
            ours.get_output(name)
        with pytest.raises(RuntimeError, match="not found"):
            ref.get_output(name)


def test_model_pipeline_describes_the_stages(folders):
    model = genai.Model(folders["plain-split"][0])
    assert [s.name for s in model.pipeline] == [
        "embeddings",
        "transformer_0_prompt",
        "transformer_0_token",
        "transformer_1_prompt",
        "transformer_1_token",
        "lm_head",
    ]
    assert all(isinstance(s, PipelineStage) for s in model.pipeline)
    assert model.pipeline[1].run_on_token_gen is False and model.pipeline[2].run_on_prompt is False
    assert model.pipeline[0].stored_name("embeddings_out") == "inputs_embeds"
    assert len(model.stage_sessions) == 6
    assert model.session is model.stage_sessions[-1]  # the stage writing the logits


def test_object_style_and_one_stage_per_entry_configs(folders, tmp_path):
    pipeline, _ = folders["gqa"]

    def as_object(config):
        config["model"]["decoder"]["pipeline"] = stages_of(config)

    def one_per_entry(config):
        config["model"]["decoder"]["pipeline"] = [{k: v} for k, v in stages_of(config).items()]

    expected = generate(genai, genai.Model(pipeline), PROMPT, 8)
    for edit in (as_object, one_per_entry):
        folder = copy_folder(pipeline, tmp_path / edit.__name__, edit)
        assert generate(genai, genai.Model(folder), PROMPT, 8) == expected
        assert generate(og, og.Model(str(folder)), PROMPT, 8) == expected


def test_stage_session_options_merge_as_the_reference(folders):
    config = genai.Config(folders["gqa"][0])
    config.overlay(
        {
            "model": {
                "decoder": {
                    "session_options": {
                        "intra_op_num_threads": 2,
                        "provider_options": [{"cpu": {"a": "1", "b": "2"}}],
                    }
                }
            }
        }
    )
    plain = PipelineStage("s", "p", "f.onnx", (), ())
    assert stage_session_options(config, plain)["intra_op_num_threads"] == 2
    own = {"log_id": "x", "provider_options": [{"cpu": {"b": "3"}}]}
    alone = PipelineStage("s", "p", "f.onnx", (), (), session_options=own)
    assert stage_session_options(config, alone) == own
    inherit = PipelineStage(
        "s", "p", "f.onnx", (), (), session_options=own, inherit_session_options=True
    )
    merged = stage_session_options(config, inherit)
    assert merged["intra_op_num_threads"] == 2 and merged["log_id"] == "x"
    assert merged["provider_options"] == [{"cpu": {"b": "3", "a": "1"}}]


# --- refusals --------------------------------------------------------------------------------


def _broken(folders, tmp_path, edit, case="gqa"):
    return copy_folder(folders[case][0], tmp_path / "broken", edit)


def _stage_edit(stage, **changes):
    def edit(config):
        entry = stages_of(config)[stage]
        for key, value in changes.items():
            if value is None:
                entry.pop(key, None)
            else:
                entry[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_stage_edit("lm_head", filename=None), r"pipeline\[0\]\.lm_head\.filename is required"),
        (_stage_edit("lm_head", filename="missing.onnx"), r"lm_head\.filename 'missing.onnx'"),
        (_stage_edit("lm_head", filename="../x.onnx"), "relative path inside the model folder"),
        (
            _stage_edit("lm_head", bogus=True),
            r"unknown key 'model\.decoder\.pipeline\[0\]\.lm_head\.bogus'",
        ),
        (
            _stage_edit("lm_head", inputs="residual.1"),
            r"lm_head\.inputs .* must be a list of strings",
        ),
        (
            _stage_edit("lm_head", inputs=["residual.1", "mlp_out.1", "nope"]),
            r"lm_head\.inputs lists 'nope', which is not an input of lm_head\.onnx",
        ),
        (
            _stage_edit("lm_head", inputs=["residual.1"]),
            r"input 'mlp_out\.1' of lm_head\.onnx .* not listed",
        ),
        (
            _stage_edit("lm_head", outputs=["logits", "nope"]),
            r"lm_head\.outputs lists 'nope', which is not an output",
        ),
        (
            _stage_edit("lm_head", output_names_forwarder={"nope": "x"}),
            r"output_names_forwarder names 'nope'",
        ),
        (
            _stage_edit("lm_head", reset_session_idx=9),
            r"reset_session_idx = 9 .* not a stage index",
        ),
    ],
    ids=[
        "no-filename",
        "missing-file",
        "escaping-file",
        "unknown-key",
        "inputs-not-a-list",
        "unknown-input",
        "unlisted-input",
        "unknown-output",
        "forwarder",
        "reset-index",
    ],
)
def test_malformed_stages_raise_config_errors(folders, tmp_path, edit, match):
    with pytest.raises(ConfigError, match=match):
        genai.Model(_broken(folders, tmp_path, edit))


def test_wrong_stage_order_is_refused(folders, tmp_path):
    def swap(config):
        stages = stages_of(config)
        order = ["embeddings", "transformer_1", "transformer_0", "lm_head"]
        config["model"]["decoder"]["pipeline"] = [{name: stages[name] for name in order}]

    with pytest.raises(
        ConfigError, match=r"transformer_1\.inputs lists 'residual\.0', which is neither"
    ):
        genai.Model(_broken(folders, tmp_path, swap))


def test_duplicate_stage_and_missing_outputs(folders, tmp_path):
    def twice(config):
        stages = stages_of(config)
        config["model"]["decoder"]["pipeline"] = [stages, {"lm_head": stages["lm_head"]}]

    with pytest.raises(ConfigError, match="stage 'lm_head' twice"):
        genai.Model(copy_folder(folders["gqa"][0], tmp_path / "twice", twice))

    def no_logits(config):
        del stages_of(config)["lm_head"]

    with pytest.raises(
        ConfigError, match="logits = 'logits' is not an output of the pipeline stages"
    ):
        genai.Model(copy_folder(folders["gqa"][0], tmp_path / "no-logits", no_logits))

    def empty(config):
        config["model"]["decoder"]["pipeline"] = []

    with pytest.raises(ConfigError, match="needs model.decoder.pipeline stages"):
        genai.Model(copy_folder(folders["gqa"][0], tmp_path / "empty", empty))


def test_pipeline_under_another_model_type(folders, tmp_path):
    """The reference runs stages only for "decoder-pipeline" and otherwise loads
    decoder.filename: so does genai, with a warning, or refuses when that file is missing."""
    pipeline, single = folders["gqa"]

    def as_llama(config):
        config["model"]["type"] = "llama"

    folder = copy_folder(pipeline, tmp_path / "llama", as_llama)
    with pytest.raises(ConfigError, match="stages run only with model.type 'decoder-pipeline'"):
        genai.Model(folder)
    shutil.copy(single / "model.onnx", folder / "model.onnx")
    with pytest.warns(UserWarning, match="model.decoder.pipeline is ignored"):
        model = genai.Model(folder)
    assert model.pipeline is None
    assert generate(genai, model, PROMPT, 8) == generate(genai, genai.Model(single), PROMPT, 8)


def test_unsupported_combinations_raise(folders, tmp_path):
    pipeline, _ = folders["gqa"]
    model = genai.Model(pipeline)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=20)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    with pytest.raises(NotImplementedError, match="snapshots of pipeline models"):
        generator.snapshot()

    def windowed(config):
        config["model"]["decoder"]["sliding_window"] = {
            "window_size": 8,
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "layers": [0],
        }

    with pytest.raises(NotImplementedError, match="sliding_window with model.decoder.pipeline"):
        genai.Model(copy_folder(pipeline, tmp_path / "windowed", windowed))


def test_an_input_genai_does_not_feed_is_refused(folders, tmp_path):
    """A QNN-style past_sequence_length input (batch-1 static graphs) is named, not ignored."""
    folder = copy_folder(folders["gqa"][0], tmp_path / "seqlen")
    graph = onnx.load(str(folder / "embeddings.onnx"))
    graph.graph.input.append(
        onnx.helper.make_tensor_value_info("past_seq_len", onnx.TensorProto.INT32, [1, 1])
    )
    onnx.save(graph, str(folder / "embeddings.onnx"))
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["inputs"]["past_sequence_length"] = "past_seq_len"
    stages_of(config)["embeddings"]["inputs"].append("past_seq_len")
    path.write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match=r"past_seq_len.*past_sequence_length"):
        genai.Model(folder)


def test_a_static_shape_provider_is_refused(folders, monkeypatch):
    class StaticCPU(CPUProvider):
        static_shapes = True

    monkeypatch.setattr(genai_model, "get_provider", lambda name: StaticCPU())
    with pytest.raises(NotImplementedError, match="stage 'embeddings' on cpu: .*static shapes"):
        genai.Model(folders["gqa"][0])


def test_docs_example_runs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "pipeline.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "['embeddings', 'transformer_0', 'transformer_1', 'lm_head']" in result.stdout
    assert "(1, 4, 64)" in result.stdout


def test_writer_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="layer_groups"):
        write_pipeline_decoder(tmp_path, layer_groups=[[1], [0]])
    with pytest.raises(ValueError, match="share_buffer=False"):
        write_pipeline_decoder(tmp_path, attention="plain", share_buffer=True)
    config = json.loads((write_pipeline_decoder(tmp_path) / "genai_config.json").read_text())
    assert config["model"]["type"] == PIPELINE_TYPE
