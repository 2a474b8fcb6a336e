"""Draft-model speculative decoding (``model.draft`` + ``speculative``): the reference's
configuration, checks and semantics, output equal to plain decoding, the target distribution
kept when sampling.

Independent references: onnxruntime-genai 0.18 on the same folders (tokens, traces, stats, error
messages; its plain decoding), and the closed-form distribution of a Markov-chain target.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.testing.models import write_gqa_decoder
from genai.testing.speculative import (
    transition_table,
    with_draft,
    write_table_decoder,
)
from tests.speculation import STATS, assert_first_tokens_follow_the_chain, error_text, start

og = pytest.importorskip("onnxruntime_genai")
scipy_stats = pytest.importorskip("scipy.stats")


def _run(mod, folder, prompt, max_length, spec=None, **search):
    _model, gen = start(mod, folder, prompt, max_length, spec, **search)
    trace = []
    while not gen.is_done():
        gen.generate_next_token()
        trace.append((int(gen.get_next_tokens()[0]), gen.token_count()))
    stats = gen.get_speculative_stats()
    # (draft_forward_passes is left out: the reference counts some catch-up runs of the draft
    # differently; it is at least the proposed tokens in both)
    if mod is genai:
        assert stats["draft_forward_passes"] >= stats["draft_tokens_proposed"]
    return [int(t) for t in gen.get_sequence(0)], trace, {k: stats[k] for k in STATS}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A Markov target and a draft that agrees with it on some tokens only."""
    root = tmp_path_factory.mktemp("pair")
    target = write_table_decoder(root, transition_table(10, {3: 5}), name="target")
    draft = write_table_decoder(root, transition_table(10, {3: 7, 6: 2}), name="draft")
    return with_draft(target, draft, root)


def _variant(source: Path, tmp_path: Path, edit) -> str:
    folder = tmp_path / "variant"
    shutil.copytree(source, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    edit(config)
    (folder / "genai_config.json").write_text(json.dumps(config))
    return str(folder)


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["model"].__setitem__("draft", {}),
        lambda c: c["model"]["draft"]["outputs"].__setitem__("logits", "missing_logits"),
        lambda c: c.__setitem__("speculative", {"max_draft_tokens": 0}),
        lambda c: c.__setitem__("speculative", {"max_draft_tokens": 99}),
        lambda c: c.__setitem__("speculative", {"min_adaptive_k": 17}),
        # checked before any graph loads (the target's file is missing here)
        lambda c: c["model"].update(
            draft={}, decoder={**c["model"]["decoder"], "filename": "missing.onnx"}
        ),
        lambda c: c["model"]["decoder"].update(
            filename="missing.onnx",
            sliding_window={"window_size": 4, "slide_key_value_cache": True},
        ),
        lambda c: c["model"]["draft"].update(layer_types=["full_attention", "conv"]),
    ],
    ids=[
        "no-filename",
        "no-logits-output",
        "k-zero",
        "k-too-large",
        "min-k-too-large",
        "no-filename-before-loading",
        "sliding-kv",
        "lfm2-layer-types",
    ],
)
def test_draft_config_guards_fire_as_the_references(pair, tmp_path, edit):
    folder = _variant(pair, tmp_path, edit)
    want = error_text(lambda: og.Model(folder))
    assert want is not None
    with pytest.raises(genai.errors.GenaiError) as raised:
        genai.Model(folder)
    problem = want.split("JSON Error: ")[-1].split(" at line")[0].split(":")[-1].strip()
    assert problem in str(raised.value)


def test_draft_vocabulary_mismatch_is_refused_as_the_reference(tmp_path):
    target = write_table_decoder(tmp_path, transition_table(10), name="t")
    draft = write_table_decoder(tmp_path, np.zeros((10, 11), np.float32), name="d")
    folder = str(with_draft(target, draft, tmp_path))
    want = error_text(lambda: og.Model(folder))
    assert want is not None and "Draft vocab: 11" in want
    with pytest.raises(genai.errors.ModelError) as raised:
        genai.Model(folder)
    assert str(raised.value) == want


@pytest.mark.parametrize(
    "search",
    [{"num_beams": 2}, {"no_repeat_ngram_size": 3}],
    ids=str,
)
def test_generator_guards_raise_the_references_message(pair, search):
    """(batch_size > 1, which the reference refuses, runs here: tests/test_speculative_batch.py.)"""
    messages = []
    for mod in (og, genai):
        model = mod.Model(str(pair))
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=20, **search)
        messages.append(error_text(lambda mod=mod, m=model, p=params: mod.Generator(m, p)))
    assert messages[0] is not None
    assert messages[1] == messages[0]


def test_ngram_with_a_draft_is_refused_as_the_reference(pair):
    messages = []
    for mod in (og, genai):
        model = mod.Model(str(pair))
        params = mod.GeneratorParams(model)
        params.set_speculative_options(ngram_size=3)
        messages.append(error_text(lambda mod=mod, m=model, p=params: mod.Generator(m, p)))
    assert messages[0] is not None
    assert messages[1] == messages[0]


def test_speculative_model_type_loads_as_the_reference(pair, tmp_path):
    folder = _variant(pair, tmp_path, lambda c: c["model"].__setitem__("type", "speculative"))
    want = _run(og, folder, [1, 2], 16)
    got = _run(genai, folder, [1, 2], 16)
    assert got[:2] == want[:2]
    assert got[2] == pytest.approx(want[2])


# --- controlled target and draft -------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "max_length", "spec"),
    [
        ([1, 2], 24, None),
        ([3], 16, {"max_draft_tokens": 2}),
        ([4, 5, 6], 30, {"max_draft_tokens": 6}),
        ([1, 2], 24, {"max_draft_tokens": 3, "cooldown": True}),
    ],
)
def test_controlled_pair_matches_the_reference(pair, prompt, max_length, spec):
    want = _run(og, pair, prompt, max_length, spec)
    got = _run(genai, pair, prompt, max_length, spec)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == pytest.approx(want[2])


@pytest.mark.parametrize("k", [1, 2])
def test_target_runs_are_counted_when_the_reference_counts_them(pair, k):
    """After every call, the stats (target runs included) are the reference's: after a
    round of one proposal the target runs the round's last token in the call that emits it,
    as the reference re-anchors there, so the per-token baseline and the speed-up estimate
    exist as soon as the reference's do."""
    trace = {}
    for mod in (og, genai):
        _model, gen = start(mod, pair, [1, 2], 20, {"max_draft_tokens": k})
        steps = []
        while not gen.is_done():
            gen.generate_next_token()
            stats = gen.get_speculative_stats()
            baseline = stats["target_baseline_ms_per_token"] > 0
            speedup = stats["estimated_speedup"] > 0
            steps.append(({key: stats[key] for key in STATS}, baseline, speedup))
        trace[mod] = steps
    assert len(trace[genai]) == len(trace[og])
    for (got, *flags), (want, *want_flags) in zip(trace[genai], trace[og], strict=True):
        assert got == pytest.approx(want) and flags == want_flags
    assert any(baseline for _, baseline, _ in trace[genai]) == (k == 1)


@pytest.mark.parametrize(
    "spec", [{"max_draft_tokens": 3}, {"max_draft_tokens": 2, "cooldown": True}]
)
def test_a_target_with_last_position_logits_verifies_a_token_per_run(tmp_path, spec):
    """A target graph that returns the last position's logits only (refused for n-gram
    decoding) runs with a draft model as the reference runs it: each proposal verified in a
    run of its own, the round's last token re-anchored; tokens, per-call trace and stats are
    the reference's (but one run per round), the tokens plain decoding's."""
    target = write_table_decoder(
        tmp_path, transition_table(10, {3: 5}), name="target", last_token_only=True
    )
    draft = write_table_decoder(tmp_path, transition_table(10, {3: 7, 6: 2}), name="draft")
    folder = with_draft(target, draft, tmp_path)
    want = _run(og, folder, [1, 2], 24, spec)
    got = _run(genai, folder, [1, 2], 24, spec)
    assert got[0] == want[0] == _run(og, target, [1, 2], 24)[0]
    assert got[1] == want[1]
    # each round of the reference first runs its proposals in one run, finds one row, then
    # runs them one by one: a target run per round more than genai's
    runs = got[2].pop("target_forward_passes")
    assert runs == want[2].pop("target_forward_passes") - want[2]["rounds"]
    assert got[2] == pytest.approx(want[2])
    assert got[2]["rounds"] > 0 and got[2]["draft_tokens_accepted"] > 0


def test_controlled_pair_equals_plain_decoding_of_the_target(pair, tmp_path):
    target = write_table_decoder(tmp_path, transition_table(10, {3: 5}), name="plain")
    plain = _run(og, target, [4, 5, 6], 30)
    got = _run(genai, pair, [4, 5, 6], 30)
    assert got[0] == plain[0]
    assert [t for t, _ in got[1]] == [t for t, _ in plain[1]]


# --- real weights: GQA fixture target and draft ----------------------------------------------


@pytest.fixture(scope="module")
def gqa_pairs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gqa")
    target = write_gqa_decoder(root, vocab_size=48, seed=7, name="target")
    draft = write_gqa_decoder(root, vocab_size=48, seed=7, num_layers=1, name="draft")
    other = write_gqa_decoder(root, vocab_size=48, seed=3, name="other")
    noshare = write_gqa_decoder(root, vocab_size=48, seed=7, share_buffer=False, name="noshare")
    return {
        "target": target,
        "self": with_draft(target, None, root, name="self"),
        "small-draft": with_draft(target, draft, root, name="small-draft"),
        "unrelated-draft": with_draft(target, other, root, name="unrelated-draft"),
        "growing-kv": with_draft(noshare, None, root, name="growing-kv"),
    }


@pytest.mark.parametrize("kind", ["self", "small-draft", "unrelated-draft", "growing-kv"])
@pytest.mark.parametrize(
    "search", [{}, {"repetition_penalty": 1.2}, {"min_length": 40}, {"max_new_tokens": 7}], ids=str
)
def test_gqa_pairs_equal_the_references_plain_decoding_of_the_target(gqa_pairs, kind, search):
    prompt = [5, 9, 12, 3, 30]
    reference_search = {k: v for k, v in search.items() if k != "max_new_tokens"}
    max_length = len(prompt) + search.get("max_new_tokens", 44 - len(prompt))
    plain = _run(og, gqa_pairs["target"], prompt, max_length, **reference_search)
    got = _run(genai, gqa_pairs[kind], prompt, 44, {"max_draft_tokens": 3}, **search)
    assert got[0] == plain[0]
    assert got[2]["rounds"] > 0
    if kind == "self":
        assert got[2]["acceptance_rate"] == 1.0


@pytest.mark.parametrize("kind", ["small-draft", "unrelated-draft", "growing-kv"])
def test_gqa_pairs_under_adaptive_k_equal_plain_decoding(gqa_pairs, kind):
    """Adaptive K: genai verifies the pending token with the draft's proposals in one run and
    may back off to plain steps; the tokens stay the target's plain ones."""
    prompt = [5, 9, 12, 3, 30]
    plain = _run(og, gqa_pairs["target"], prompt, 44)
    spec = {"max_draft_tokens": 4, "min_adaptive_k": 1}
    got = _run(genai, gqa_pairs[kind], prompt, 44, spec)
    assert got[0] == plain[0]
    assert got[2]["rounds"] > 0


def test_gqa_self_speculation_matches_the_references_stats(gqa_pairs):
    prompt = [5, 9, 12, 3, 30]
    want = _run(og, gqa_pairs["small-draft"], prompt, 40, {"max_draft_tokens": 4})
    got = _run(genai, gqa_pairs["small-draft"], prompt, 40, {"max_draft_tokens": 4})
    assert got[0] == want[0]
    for key in ("rounds", "draft_tokens_proposed", "draft_tokens_accepted", "tokens_emitted"):
        assert got[2][key] == want[2][key], key


def _record_draft_runs(monkeypatch) -> list[int]:
    """Record how many tokens each run of a draft's catch-up feeds (the list returned)."""
    from genai.generation.speculative.draft import DraftProposer

    fed: list[int] = []
    catch_up = DraftProposer._catch_up

    def counting(self, committed):
        driver = self.driver
        loop, run, run_as_steps = driver.loop, driver.run, driver.run_as_steps

        def feeding(prompt=False):
            fed.append(loop.length - loop.computed)
            run(prompt=prompt)

        def feeding_rows():
            fed.append(loop.length - loop.computed)
            run_as_steps()

        monkeypatch.setattr(driver, "run", feeding)
        monkeypatch.setattr(driver, "run_as_steps", feeding_rows)
        try:
            catch_up(self, committed)
        finally:
            monkeypatch.setattr(driver, "run", run)
            monkeypatch.setattr(driver, "run_as_steps", run_as_steps)

    monkeypatch.setattr(DraftProposer, "_catch_up", counting)
    return fed


def test_the_draft_catches_up_without_recomputing_what_it_ran(gqa_pairs, monkeypatch):
    """After a round whose proposals were partly rejected the draft already holds the KV of the
    accepted ones: its catch-up run feeds only the target's token (as the reference's does),
    where it used to run the last accepted proposal again; the tokens are unchanged."""
    prompt = [5, 9, 12, 3, 30]
    fed = _record_draft_runs(monkeypatch)
    got = _run(genai, gqa_pairs["small-draft"], prompt, 44, {"max_draft_tokens": 4})
    plain = _run(genai, gqa_pairs["target"], prompt, 44)
    assert got[0] == plain[0]
    accepted_all = got[2]["draft_tokens_accepted"] == got[2]["draft_tokens_proposed"]
    runs = fed[1:]  # after the prompt
    assert runs and not accepted_all
    # one token after a round with a rejection, two (the last proposal and the target's
    # token) after a round that accepted every proposal
    assert set(runs) <= {1, 2} and 1 in runs


def test_the_draft_runs_appended_tokens_when_they_are_appended(gqa_pairs, monkeypatch):
    """As the reference's prompt run: `append_tokens` runs the draft on the prompt (and on a
    later append) with the target, so the first round proposes from logits it has, and the
    round's draft time leaves the prompt out. The tokens stay plain decoding's."""
    prompt = [5, 9, 12, 3, 30]
    fed = _record_draft_runs(monkeypatch)
    model = genai.Model(str(gqa_pairs["small-draft"]))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=44)
    params.set_speculative_options(max_draft_tokens=3)
    gen = genai.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    assert fed == [len(prompt)]
    fed.clear()
    gen.generate_next_token()
    assert fed == []  # the first round's catch-up had nothing to run
    while gen.token_count() < len(prompt) + 6:
        gen.generate_next_token()
    kept = gen.token_count()
    fed.clear()
    gen.append_tokens(np.array([[7, 8]], np.int32))
    assert fed and fed[-1] >= 2  # (with the round's tokens the draft had not run, if any)
    fed.clear()
    gen.generate_next_token()
    assert fed == []
    while not gen.is_done():
        gen.generate_next_token()
    sequence = [int(t) for t in gen.get_sequence(0)]
    plain = genai.Model(str(gqa_pairs["target"]))
    params = genai.GeneratorParams(plain)
    params.set_search_options(max_length=44)
    want = genai.Generator(plain, params)
    want.append_tokens(np.array([prompt], np.int32))
    while want.token_count() < kept:
        want.generate_next_token()
    want.append_tokens(np.array([[7, 8]], np.int32))
    while not want.is_done():
        want.generate_next_token()
    assert sequence == [int(t) for t in want.get_sequence(0)]


def test_rewind_and_append_mid_round_continue_as_plain_decoding(gqa_pairs):
    prompt = [5, 9, 12, 3, 30]
    plain_model = genai.Model(str(gqa_pairs["target"]))
    found = []
    for folder in (gqa_pairs["target"], gqa_pairs["small-draft"]):
        model = plain_model if folder == gqa_pairs["target"] else genai.Model(str(folder))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=44)
        gen = genai.Generator(model, params)
        gen.append_tokens(np.array([prompt], np.int32))
        for _ in range(5):
            gen.generate_next_token()
        gen.rewind_to(len(prompt) + 2)
        gen.append_tokens(np.array([[7, 8]], np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        found.append([int(t) for t in gen.get_sequence(0)])
    assert found[1] == found[0]


# --- sampling --------------------------------------------------------------------------------


def test_sampling_with_a_draft_keeps_the_target_distribution(tmp_path):
    """Chi-square: the first three sampled tokens follow the target chain's exact marginals
    whatever the draft proposes (here: a different chain)."""
    rng = np.random.default_rng(1)
    table = rng.normal(0.0, 1.0, (8, 8)).astype(np.float32)
    table[:, 7] = -30.0
    target = write_table_decoder(tmp_path, table, name="t")
    draft_table = table + rng.normal(0.0, 1.0, (8, 8)).astype(np.float32)
    draft = write_table_decoder(tmp_path, draft_table, name="d")
    folder = with_draft(target, draft, tmp_path)
    model = genai.Model(str(folder))
    assert_first_tokens_follow_the_chain(model, table, [1, 2], {"max_draft_tokens": 2})


# --- a draft chosen at run time (beyond the reference) ---------------------------------------


def test_a_draft_set_at_run_time_gives_the_targets_plain_tokens(gqa_pairs):
    prompt = [5, 9, 12, 3, 30]
    plain = _run(og, gqa_pairs["target"], prompt, 44)
    target = genai.Model(str(gqa_pairs["target"]))
    draft_folder = gqa_pairs["small-draft"].parent / "draft"
    params = genai.GeneratorParams(target)
    params.set_search_options(max_length=44, repetition_penalty=1.0)
    params.set_draft_model(genai.Model(str(draft_folder)))
    params.set_speculative_options(max_draft_tokens=3)
    gen = genai.Generator(target, params)
    gen.append_tokens(np.array([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    assert [int(t) for t in gen.get_sequence(0)] == plain[0]
    stats = gen.get_speculative_stats()
    assert stats["rounds"] > 0 and stats["draft_forward_passes"] >= stats["draft_tokens_proposed"]


def test_a_run_time_draft_of_another_vocabulary_is_refused(gqa_pairs, tmp_path):
    target = genai.Model(str(gqa_pairs["target"]))
    other = genai.Model(str(write_gqa_decoder(tmp_path, vocab_size=40, name="other-vocab")))
    params = genai.GeneratorParams(target)
    with pytest.raises(genai.errors.ModelError, match="Target vocab: 48, Draft vocab: 40"):
        params.set_draft_model(other)
    params.set_draft_model(None)
    assert params.draft_model is None


@pytest.mark.parametrize("k", [1, 4])
def test_a_self_draft_of_a_real_model_agrees_every_time(smollm2_path, tmp_path, k):
    """SmolLM2 int4 as its own draft: the draft's catch-up rows get one-token
    steps' numbers as the target's verify rows do, so every proposal is the target's own
    choice (acceptance 1, as in the reference, where draft and target run the same rows), and
    the text is plain decoding's. (With the catch-up in one plain call, a proposal parted
    from the target's in the second round of this prompt on the reference-built folder, on
    an AVX2 Zen 3.)"""
    from genai.runtime.verify_rows import exact_rows

    folder = with_draft(smollm2_path, None, tmp_path, speculative={"max_draft_tokens": k})
    model = genai.Model(str(folder))
    if not exact_rows(model.session):
        pytest.skip("this CPU's int4 kernels give a run's rows other numbers than one-token steps")
    prompt = np.array([[785, 3838, 374, 279, 6722, 315, 9625, 30]], np.int32)

    def run(source) -> tuple[list[int], dict]:
        params = genai.GeneratorParams(source)
        params.set_search_options(do_sample=False, max_length=prompt.shape[1] + 40)
        gen = genai.Generator(source, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        stats = gen.get_speculative_stats() if source is model else {}
        return [int(t) for t in gen.get_sequence(0)], stats

    plain, _ = run(genai.Model(str(smollm2_path)))
    got, stats = run(model)
    assert got == plain
    assert stats["draft_tokens_proposed"] > 0
    assert stats["acceptance_rate"] == 1.0


@pytest.mark.parametrize("k", [2, 4])
def test_a_sampled_self_draft_accepts_every_proposal(smollm2_path, tmp_path, k):
    """Sampling with SmolLM2 as its own draft: proposals are drawn from the draft's q, which
    equals the target's p, so min(1, p/q) is 1 and every one is kept (no correction, a bonus
    each round, as the reference's self-speculative sampling); the same seed gives the same
    tokens."""
    from genai.runtime.verify_rows import exact_rows

    folder = with_draft(smollm2_path, None, tmp_path, speculative={"max_draft_tokens": k})
    model = genai.Model(str(folder))
    if not exact_rows(model.session):
        pytest.skip("this CPU's int4 kernels give a run's rows other numbers than one-token steps")
    prompt = np.array([[785, 3838, 374, 279, 6722, 315, 9625, 30]], np.int32)
    runs = []
    for _ in range(2):
        params = genai.GeneratorParams(model)
        params.set_search_options(
            do_sample=True,
            random_seed=1234,
            top_k=40,
            top_p=0.95,
            temperature=0.8,
            max_length=prompt.shape[1] + 24,
        )
        gen = genai.Generator(model, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        runs.append([int(t) for t in gen.get_sequence(0)])
    stats = gen.get_speculative_stats()
    assert runs[0] == runs[1]
    assert stats["rounds"] > 0 and stats["draft_tokens_accepted"] > 0
    assert stats["correction_tokens"] == 0
    assert stats["bonus_tokens"] == stats["rounds"]


def _with_bias_input(folder: Path) -> None:
    """The folder's graph with a float input ``user_bias`` [vocab] added to its logits."""
    import onnx
    from onnx import TensorProto, helper

    path = folder / "model.onnx"
    graph_model = onnx.load(str(path))
    graph = graph_model.graph
    vocab = graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    for node in graph.node:
        node.output[:] = ["unbiased" if out == "logits" else out for out in node.output]
    graph.node.append(helper.make_node("Add", ["unbiased", "user_bias"], ["logits"]))
    graph.input.append(helper.make_tensor_value_info("user_bias", TensorProto.FLOAT, [vocab]))
    onnx.save(graph_model, str(path))


def test_model_inputs_reach_the_draft_that_takes_them(tmp_path):
    """As the reference: with a draft model, `set_model_input` feeds each of the two models
    that takes the input, `get_input` reads it from the draft when only the draft takes it,
    and a name neither takes fails the next append, naming it."""
    target = write_table_decoder(tmp_path, transition_table(10, {3: 5}), name="target")
    draft = write_table_decoder(tmp_path, transition_table(10, {3: 5}), name="draft")
    _with_bias_input(draft)
    folder = with_draft(target, draft, tmp_path)
    prompt = np.array([[1, 2, 3]], np.int32)

    def accepted(bias: np.ndarray | None) -> int:
        model = genai.Model(str(folder))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=12)
        gen = genai.Generator(model, params)
        if bias is not None:
            gen.set_model_input("user_bias", bias)
        gen.append_tokens(prompt)
        if bias is not None:
            np.testing.assert_array_equal(gen.get_input("user_bias"), bias)
        while not gen.is_done():
            gen.generate_next_token()
        return gen.get_speculative_stats()["draft_tokens_accepted"]

    agreeing = accepted(np.zeros(10, np.float32))
    misled = np.zeros(10, np.float32)
    misled[8] = 100.0  # the draft always proposes 8, which the target rarely chooses
    assert accepted(misled) < agreeing

    model = genai.Model(str(folder))
    gen = genai.Generator(model, genai.GeneratorParams(model))
    gen.set_model_input("no_such_input", np.ones(1, np.float32))
    with pytest.raises(genai.errors.TensorNotFoundError, match="'no_such_input' was not found"):
        gen.append_tokens(prompt)
