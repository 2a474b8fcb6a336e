"""Speculative decoding at batch > 1 (beyond the reference, which refuses it): every row runs its
own rounds, and the batch's tokens are plain batched decoding's.

Independent references: onnxruntime-genai 0.18's plain batched decoding and its batch-1
decoding of each prompt on the same folders (tokens, per-step trace, finished rows), with a
logits processor applied through its get_logits / set_logits, with a LoRA adapter; its n-gram
decoding of each prompt on the real int4 model; and the closed-form distribution of a
Markov-chain model (`genai.testing.speculative`) for sampling, per row.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import genai
from genai.generation.speculative import rows as row_speculation
from genai.runtime.verify_rows import rows_like_steps
from genai.testing.lora import write_lora_adapter, write_lora_decoder
from genai.testing.models import write_gqa_decoder, write_optimum_decoder
from genai.testing.speculative import (
    markov_distribution,
    transition_table,
    with_draft,
    write_table_decoder,
)

og = pytest.importorskip("onnxruntime_genai")
scipy_stats = pytest.importorskip("scipy.stats")

PAD = 0  # the fixture writers' pad_token_id

Processor = Callable[[np.ndarray, np.ndarray], None]


def _padded(prompts: Sequence[Sequence[int]], pad: int = PAD) -> np.ndarray:
    width = max(len(p) for p in prompts)
    return np.array([list(p) + [pad] * (width - len(p)) for p in prompts], np.int32)


def _run_batch(
    mod: Any,
    folder: Path,
    prompts: Sequence[Sequence[int]],
    max_length: int,
    spec: dict[str, Any] | None = None,
    *,
    processor: Processor | None = None,
    adapter: Path | None = None,
    pad: int = PAD,
    **search: Any,
) -> tuple[list[list[int]], list[tuple[list[int], int, bool]], dict[str, Any]]:
    """``mod``'s batched generation of ``prompts`` (right-padded): the sequences, a per-step
    trace of (next tokens, token_count, is_done), and genai's stats. ``processor`` (token_ids,
    logits row) is applied to each row's logits: by genai's chain when ``spec`` is given,
    through get_logits / set_logits otherwise."""
    model = mod.Model(str(folder))
    params = mod.GeneratorParams(model)
    options = {"do_sample": False, "max_length": max_length, "batch_size": len(prompts)}
    params.set_search_options(**{**options, **search})
    if spec:
        params.set_speculative_options(**spec)
        if processor is not None:
            params.add_logits_processor(processor)
    gen = mod.Generator(model, params)
    if adapter is not None:
        adapters = mod.Adapters(model)
        adapters.load(str(adapter), "a")
        gen.set_active_adapter(adapters, "a")
    gen.append_tokens(_padded(prompts, pad))
    trace = []
    while not gen.is_done():
        if processor is not None and not spec:
            logits = np.array(gen.get_logits())[:, 0, :]
            for row in range(len(prompts)):
                processor(np.array(gen.get_sequence(row)), logits[row])
            gen.set_logits(logits)
        gen.generate_next_token()
        trace.append(([int(t) for t in gen.get_next_tokens()], gen.token_count(), gen.is_done()))
    sequences = [[int(t) for t in gen.get_sequence(row)] for row in range(len(prompts))]
    stats = gen.get_speculative_stats() if mod is genai else {}
    if mod is genai and spec:
        stats["batched"] = gen._spec.batched  # the batch went back to plain batched steps
    return sequences, trace, stats


def _run_one(mod: Any, folder: Path, prompt: Sequence[int], max_length: int, **search: Any):
    """``mod``'s batch-1 greedy sequence of ``prompt``."""
    model = mod.Model(str(folder))
    params = mod.GeneratorParams(model)
    params.set_search_options(**{"do_sample": False, "max_length": max_length, **search})
    gen = mod.Generator(model, params)
    gen.append_tokens(np.array([list(prompt)], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)]


def _unpadded_rows(sequences, prompts, eos: int) -> list[list[int]]:
    """Each batched row without its prompt padding, cut before its EOS (and the pads after)."""
    width = max(len(p) for p in prompts)
    rows = []
    for sequence, prompt in zip(sequences, prompts, strict=True):
        row = list(prompt) + sequence[width:]
        if eos in row[len(prompt) :]:
            row = row[: row.index(eos, len(prompt))]
        rows.append(row)
    return rows


def _continuation(folder: Path, seed: Sequence[int], length: int) -> list[int]:
    """``seed`` and the reference's greedy tokens after it, ``length`` in all (a prompt whose
    greedy continuation repeats itself on the random fixtures: lookups hit)."""
    return _run_one(og, folder, seed, length)


@pytest.fixture(params=["rows", "leave", "leave-late"])
def mode(request, monkeypatch) -> str:
    """``rows``: every row keeps its own rounds; ``leave``: the batch goes back to plain
    batched steps after a few columns (`RowSpeculation._leave`); ``leave-late``: after 20
    (rows may have finished by then)."""
    if request.param == "rows":
        monkeypatch.setattr(row_speculation, "CHECK_EVERY", 10**9)
    else:
        every = 5 if request.param == "leave" else 20
        monkeypatch.setattr(row_speculation, "CHECK_EVERY", every)
        monkeypatch.setattr(row_speculation, "LEAVE_AT", 0.0)
    return request.param


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch")
    return {
        "shared": write_gqa_decoder(root, vocab_size=48, seed=7, name="shared"),
        "growing": write_gqa_decoder(
            root, vocab_size=48, seed=7, share_buffer=False, name="growing"
        ),
        # the same function with attention that masks the batch's columns (KV column by
        # column, position_ids)
        "masked": write_optimum_decoder(root, vocab_size=48, seed=7, name="masked"),
    }


@pytest.fixture(scope="module")
def prompts(folders) -> list[list[int]]:
    folder = folders["shared"]
    return [
        _continuation(folder, [5, 9, 12], 12),
        _continuation(folder, [3, 4], 7),
        _continuation(folder, [20, 7, 31], 10),
    ]


# --- greedy: plain batched decoding's tokens -------------------------------------------------


@pytest.mark.parametrize("layout", ["shared", "growing", "masked"])
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize(
    ("spec", "search"),
    [
        ({"ngram_size": 2}, {}),
        ({"ngram_size": 3, "max_draft_tokens": 6}, {"repetition_penalty": 1.2}),
        ({"ngram_size": 2, "min_adaptive_k": 1, "cooldown": True}, {"min_length": 30}),
    ],
    ids=["k4", "k6-repetition", "adaptive-cooldown-min-length"],
)
def test_greedy_equals_plain_batched_and_batch1_decoding(
    folders, prompts, layout, batch, spec, search, mode
):
    folder = folders[layout]
    rows = prompts[:batch]
    want = _run_batch(og, folder, rows, 48, **search)
    got = _run_batch(genai, folder, rows, 48, spec, **search)
    assert got[0] == want[0]
    assert got[1] == want[1]  # the same token per call, count and done state
    assert got[2]["batched"] is (mode != "rows")
    if mode == "rows":
        assert got[2]["rounds"] > 0 and got[2]["draft_tokens_accepted"] > 0
    width = max(len(p) for p in rows)
    for row, prompt in zip(_unpadded_rows(got[0], rows, 2), rows, strict=True):
        alone = _run_one(og, folder, prompt, 48 - (width - len(prompt)), **search)
        assert row == alone


def test_max_new_tokens_and_the_draft_model_at_batch_2(folders, prompts, tmp_path, mode):
    """A draft model (the target as its own draft: every proposal accepted) and
    max_new_tokens."""
    pair = with_draft(folders["shared"], folders["shared"], tmp_path)
    rows = prompts[:2]
    width = max(len(p) for p in rows)
    want = _run_batch(og, folders["shared"], rows, width + 11)
    got = _run_batch(genai, pair, rows, 48, max_new_tokens=11)
    assert got[0] == want[0]
    assert got[1] == want[1]
    stats = got[2]
    assert stats["rounds"] > 0
    assert stats["draft_tokens_accepted"] == stats["draft_tokens_evaluated"]


def _with_eos(folder: Path, eos: int, out: Path) -> Path:
    copy = out / f"{folder.name}-eos{eos}"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = eos
    (copy / "genai_config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("layout", ["shared", "growing"])
@pytest.mark.parametrize("which", ["first-row-only", "every-row"])
def test_rows_finishing_at_different_times(folders, prompts, layout, which, tmp_path, mode):
    """EOS ends rows at different steps: the finished rows are padded, an EOS that ends the
    last row is reported but not added, as the reference's plain batched decoding."""
    rows = prompts[:2]
    plain = _run_batch(og, folders[layout], rows, 48)[0]
    width = max(len(p) for p in rows)
    first, second = (sequence[width:] for sequence in plain)
    if which == "first-row-only":
        candidates = [t for t in first[4:] if t not in second and t != PAD]
    else:
        candidates = [t for t in first[3:] if t in second[3:] and t != PAD]
    if not candidates:
        pytest.skip("no token of the fixture's continuations fits this case")
    folder = _with_eos(folders[layout], candidates[0], tmp_path)
    want = _run_batch(og, folder, rows, 48)
    got = _run_batch(genai, folder, rows, 48, {"ngram_size": 2})
    assert got[0] == want[0]
    assert got[1] == want[1]
    # one row was padded while the other still generated
    assert any(PAD in tokens and set(tokens) != {PAD} for tokens, _, _ in want[1])
    if which == "every-row":
        assert want[1][-1][1] < 48  # the last row's EOS ended the batch before max_length


def test_logits_processor_sees_each_rows_tokens(folders, prompts, mode):
    """A custom processor (genai's chain in every row's rounds) gives the tokens the
    reference gives when the same function edits its logits through get/set_logits."""

    def ban_odd_after_14(token_ids: np.ndarray, logits: np.ndarray) -> None:
        ids = np.asarray(token_ids).reshape(-1)
        if len(ids) > 14:
            logits[1::2] = -np.inf

    rows = prompts[:3]
    want = _run_batch(og, folders["shared"], rows, 40, processor=ban_odd_after_14)
    got = _run_batch(
        genai, folders["shared"], rows, 40, {"ngram_size": 2}, processor=ban_odd_after_14
    )
    assert got[0] == want[0]
    assert got[2]["rounds"] > 0


def test_stop_strings_end_each_row_where_plain_decoding_does(folders, prompts, mode):
    rows = prompts[:2]
    folder = folders["shared"]
    width = max(len(p) for p in rows)
    plain = _run_batch(og, folder, rows, 48)[0]
    tokenizer = genai.Tokenizer(genai.Model(str(folder)))
    text = tokenizer.decode(np.array(plain[0][width + 5 : width + 7], np.int32))
    if not text.strip():
        pytest.skip("the fixture tokenizer decodes these ids to nothing")
    found = []
    for spec in (None, {"ngram_size": 2}):
        model = genai.Model(str(folder))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=48, batch_size=2, stop=[text])
        if spec:
            params.set_speculative_options(**spec)
        gen = genai.Generator(model, params)
        gen.append_tokens(_padded(rows))
        steps = []
        while not gen.is_done():
            gen.generate_next_token()
            steps.append([int(t) for t in gen.get_next_tokens()])
        reasons = [gen.finish_reason(row) for row in range(2)]
        found.append(([[int(t) for t in gen.get_sequence(r)] for r in range(2)], steps, reasons))
    assert found[1] == found[0]
    assert found[0][2][0] is genai.FinishReason.STOP_STRING
    # the stopped row is the reference's plain row up to the stop
    stopped = found[0][0][0]
    end = stopped.index(PAD, width) if PAD in stopped[width:] else len(stopped)
    assert stopped[:end] == plain[0][:end]


def test_lora_adapter_is_active_in_every_row(folders, prompts, tmp_path, mode):
    folder = write_lora_decoder(tmp_path, vocab_size=48, seed=7)
    adapter = tmp_path / "a.onnx_adapter"
    write_lora_adapter(folder, adapter, seed=3)
    rows = prompts[:2]
    want = _run_batch(og, folder, rows, 40, adapter=adapter)
    got = _run_batch(genai, folder, rows, 40, {"ngram_size": 2}, adapter=adapter)
    assert got[0] == want[0]
    # the adapter changes the tokens (the folder without it computes the fixture's function)
    assert _run_batch(og, folders["shared"], rows, 40)[0] != want[0]


def test_rewind_then_continue_equals_plain_batched_decoding(folders, prompts, mode):
    rows = prompts[:2]
    width = max(len(p) for p in rows)
    found = []
    for spec in (None, {"ngram_size": 2}):
        model = genai.Model(str(folders["shared"]))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=40, batch_size=2)
        if spec:
            params.set_speculative_options(**spec)
        gen = genai.Generator(model, params)
        gen.append_tokens(_padded(rows))
        for _ in range(9):
            gen.generate_next_token()
        gen.rewind_to(width + 4)
        while not gen.is_done():
            gen.generate_next_token()
        found.append([[int(t) for t in gen.get_sequence(r)] for r in range(2)])
    assert found[1] == found[0]
    assert found[0] == _run_batch(og, folders["shared"], rows, 40)[0]


def test_beam_search_stays_refused(folders):
    model = genai.Model(str(folders["shared"]))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=20, batch_size=2, num_beams=2)
    params.set_speculative_options(ngram_size=3)
    with pytest.raises(genai.errors.UnsupportedFeatureError, match="beam search"):
        genai.Generator(model, params)


# --- sampling --------------------------------------------------------------------------------


def test_sampling_keeps_each_rows_target_distribution(tmp_path):
    """Chi-square per row: the first three sampled tokens of two rows with different prompts
    (lookups proposing from each row's own history) follow the Markov chain's marginals."""
    rng = np.random.default_rng(0)
    table = rng.normal(0.0, 1.2, (8, 8)).astype(np.float32)
    table[:, 7] = -30.0  # EOS (id 7) practically never
    folder = write_table_decoder(tmp_path, table)
    model = genai.Model(str(folder))
    rows = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6, 4]]
    draws = 1000
    counts = np.zeros((2, 3, 8), np.int64)
    accepted = 0
    for seed in range(draws):
        params = genai.GeneratorParams(model)
        params.set_search_options(
            do_sample=True, top_k=8, max_length=11, random_seed=seed, batch_size=2
        )
        params.set_speculative_options(ngram_size=2, max_draft_tokens=3)
        gen = genai.Generator(model, params)
        gen.append_tokens(_padded(rows))
        for step in range(3):
            gen.generate_next_token()
            for row in range(2):
                counts[row, step, int(gen.get_next_tokens()[row])] += 1
        accepted += gen.get_speculative_stats()["draft_tokens_accepted"]
    assert 0 < accepted < draws * 6  # proposals were both accepted and rejected
    for row, prompt in enumerate(rows):
        for step in range(3):
            want = markov_distribution(table, prompt[-1], step + 1)
            keep = want > 1e-6
            result = scipy_stats.chisquare(
                counts[row, step, keep], want[keep] / want[keep].sum() * draws
            )
            assert result.pvalue > 1e-3, (row, step, counts[row, step], want)


def test_sampling_with_a_seed_draws_what_plain_batched_sampling_draws(folders, prompts, mode):
    """Row b draws from stream b of the seed, one uniform per token, as in a plain batched
    run."""
    rows = prompts[:2]
    found = []
    for spec in (None, {"ngram_size": 2, "max_draft_tokens": 5}):
        found.append(
            _run_batch(
                genai, folders["shared"], rows, 44, spec, do_sample=True, top_k=5, random_seed=11
            )[0]
        )
    assert found[1] == found[0]


# --- the real model --------------------------------------------------------------------------

REAL_PROMPTS = [
    "Repeat this passage:\n\nThe committee approved the new budget, which allocates funds for "
    "road repairs, public libraries, and a community garden near the river.",
    "Rename the variable `total` to `amount` and return the function:\n\n"
    "def price(items):\n    total = 0\n    for item in items:\n        total += item\n"
    "    return total\n",
]


def test_real_model_rows_equal_the_references_ngram_decoding_of_each_prompt(
    reference_built_smollm2_path, monkeypatch
):
    """Each row of a batch of two on the int4 folder, running its own rounds throughout, gets
    the reference's batch-1 n-gram tokens for its prompt (the same run shapes; where they
    differ from its plain tokens, int8 activations round a several-token run differently:
    docs/speculative.md). On a CPU whose int4 linears give a row other bits alone than in a
    batch (AVX2) rows apart would make batch-1 tokens, not the batch's: there the batch makes
    plain batched steps, and its tokens are the reference's plain batched decoding's."""
    monkeypatch.setattr(row_speculation, "CHECK_EVERY", 10**9)
    folder = reference_built_smollm2_path
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    rows = []
    for text in REAL_PROMPTS:
        messages = json.dumps([{"role": "user", "content": text}])
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        rows.append([int(t) for t in tokenizer.encode(chat)])
    width = max(len(p) for p in rows)
    spec = {"ngram_size": 3, "max_draft_tokens": 4}
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    eos, pad = int(config["eos_token_id"]), int(config["pad_token_id"])
    got = _run_batch(genai, folder, rows, width + 48, spec, pad=pad)
    model = genai.Model(str(folder))
    session = genai.Generator(model, genai.GeneratorParams(model))._driver.session
    if not rows_like_steps(session.linear_ops):
        want = _run_batch(og, folder, rows, width + 48, pad=pad)
        assert got[0] == want[0] and got[2]["batched"] and got[2]["rounds"] == 0
        return
    for row, prompt in zip(_unpadded_rows(got[0], rows, eos), rows, strict=True):
        model = og.Model(str(folder))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=width + 48 - (width - len(prompt)))
        params.set_speculative_options(**spec)
        gen = og.Generator(model, params)
        gen.append_tokens(np.array([prompt], np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        assert row == [int(t) for t in gen.get_sequence(0)]
    assert got[2]["acceptance_rate"] > 0.3


@pytest.mark.parametrize("spec", [None, {"ngram_size": 2}])
def test_guidance_rows_match_their_grammar_and_plain_batched_decoding(fixture_folders, spec, mode):
    """Guidance at batch 3: each row's grammar holds (checked with `re`), and the tokens are
    plain batched guided decoding's (each row runs guided rounds, then the batch steps)."""
    pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")
    regex = r"[a-z]{2,6}( [a-z]{2,6}){1,3}[.!?]"
    model = genai.Model(str(fixture_folders["gqa"]))
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode_batch(["the cat sat on the mat", "a dog", "is it"])
    found = []
    for options in (None, spec):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=40, batch_size=3)
        params.set_guidance("regex", regex)
        if options:
            params.set_speculative_options(**options)
        gen = genai.Generator(model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        rows = [[int(t) for t in gen.get_sequence(r)] for r in range(3)]
        found.append((rows, [gen.finish_reason(r) for r in range(3)]))
    assert found[1] == found[0]
    eos = 2
    for row in found[1][0]:
        out = row[ids.shape[1] :]
        out = out[: out.index(eos)] if eos in out else out
        assert re.fullmatch(regex, tokenizer.decode(np.array(out, np.int32)))


def test_batch_refusals_are_batch_1s(tmp_path):
    """What batch 1 refuses (here a graph whose logits hold the last position only) is refused
    at batch 2 with the same message."""
    folder = write_table_decoder(tmp_path, transition_table(), last_token_only=True)
    model = genai.Model(str(folder))
    messages = []
    for batch in (1, 2):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=20, batch_size=batch)
        params.set_speculative_options(ngram_size=3)
        with pytest.raises(genai.errors.UnsupportedFeatureError) as raised:
            genai.Generator(model, params)
        messages.append(str(raised.value))
    assert messages[1] == messages[0]
    assert "last-token-only logits" in messages[0]


def test_row_options_set_after_going_back_to_batched_steps_reach_the_next_prompts_rows(
    folders, monkeypatch
):
    """After the rows went back to batched steps, set_row_search_options still reaches the
    rows' generators: a new prompt runs its rounds with them (row 1 made greedy by top_k 1
    gives plain greedy tokens)."""
    folder = folders["shared"]
    prompt = np.array([[5, 42, 5, 42, 5], [7, 19, 7, 19, 7]], np.int32)
    model = genai.Model(str(folder))
    params = genai.GeneratorParams(model)
    params.set_search_options(
        max_length=24, batch_size=2, do_sample=True, random_seed=3, temperature=5.0, top_k=20
    )
    params.set_speculative_options(ngram_size=2)
    gen = genai.Generator(model, params)
    monkeypatch.setattr(row_speculation, "CHECK_EVERY", 2)
    monkeypatch.setattr(row_speculation, "LEAVE_AT", 0.0)
    gen.append_tokens(prompt)
    for _ in range(8):
        gen.generate_next_token()
    assert gen._spec.batched  # back to batched steps
    gen.set_row_search_options(1, top_k=1, temperature=1.0)
    monkeypatch.setattr(row_speculation, "CHECK_EVERY", 10**9)
    gen.rewind_to(0)
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    assert not gen._spec.batched
    greedy = _run_batch(og, folder, [list(r) for r in prompt], 24)[0][1]
    assert [int(t) for t in gen.get_sequence(1)] == greedy
