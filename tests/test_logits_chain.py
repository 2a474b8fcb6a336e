"""The logits chain (`genai.generation.logits.LogitsChain`) and custom logits processors,
against the NumPy twin of the sampling kernels (`genai._core.sampling_reference`): the
chain's stages in their documented order, a processor's effect, and the tokens chosen
after it, on synthetic logits, through the server's scheduler and through `Generator`."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from genai._core import sampling_reference as ref
from genai.errors import GenerationError, InvalidArgumentError
from genai.generation.logits import LogitsChain
from genai.generation.search import SearchOptions

VOCAB = 64
EOS = np.array([2], np.int32)
LOWEST = np.float32(ref.LOWEST)


# --- the NumPy twin ---------------------------------------------------------------------------
def ban_and_tilt(token_ids: np.ndarray, logits: np.ndarray) -> None:
    """A processor under test: bans tokens 5-9 and the row's current argmax, and adds 3.0 to
    the token (7 * position) % VOCAB (a bias per position), in place."""
    top = int(np.argmax(logits))
    logits[5:10] = -np.inf
    logits[top] = -np.inf
    logits[(7 * len(token_ids)) % len(logits)] += np.float32(3.0)


def twin_ban_and_tilt(token_ids: np.ndarray, row: np.ndarray) -> np.ndarray:
    """`ban_and_tilt` written independently: a new row (float32) from masks."""
    ids = np.arange(row.size)
    banned = ((ids >= 5) & (ids < 10)) | (ids == ids[row == row.max()][0])
    out = np.where(banned, np.float32(-np.inf), row).astype(np.float32)
    tilt = np.zeros_like(out)
    tilt[(7 * token_ids.size) % row.size] = np.float32(3.0)
    return (out + tilt).astype(np.float32)


def twin_stages(row, history, length, start, options, bias=None):
    """Stages 3-7 of the chain on one row (float32 [vocab]) by the twin, in place."""
    one = row[None, :]
    seq = history[None, :]
    ref.apply_min_length(one, length, options.get("min_length", 0), EOS)
    ref.apply_repetition_penalty(one, seq, length, options.get("repetition_penalty", 1.0))
    ref.apply_no_repeat_ngram(one, seq, length, options.get("no_repeat_ngram_size", 0))
    ref.apply_presence_frequency(
        one,
        seq,
        length,
        start,
        options.get("presence_penalty", 0.0),
        options.get("frequency_penalty", 0.0),
    )
    if bias:
        ref.apply_logit_bias(one, list(bias), list(bias.values()))


def twin_choice(row, u, options, n_logprobs=None):
    """The twin's choice on one processed row with uniform ``u``: (token, logprob, top ids,
    top logprobs)."""
    out = np.zeros(1, np.int32)
    lp = np.zeros(1, np.float32) if n_logprobs is not None else None
    tid = np.zeros((1, n_logprobs), np.int32) if n_logprobs else None
    tlp = np.zeros((1, n_logprobs), np.float32) if n_logprobs else None
    ref.sample(
        row[None, :],
        np.array([u]),
        out,
        do_sample=options.get("do_sample", False),
        temperature=options.get("temperature", 1.0),
        top_k=options.get("top_k", 50),
        top_p=options.get("top_p", 0.0),
        min_p=options.get("min_p", 0.0),
        logprobs=lp,
        top_ids=tid,
        top_logprobs=tlp,
    )
    return int(out[0]), lp, tid, tlp


SAMPLING = [
    {},  # greedy
    {"do_sample": True, "top_k": 8, "temperature": 0.8},
    {"do_sample": True, "top_k": 0, "top_p": 0.9, "temperature": 1.3},
    {
        "do_sample": True,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.4,
        "no_repeat_ngram_size": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "min_length": 12,
    },
]


def search(seed: int, **options) -> SearchOptions:
    result = SearchOptions(random_seed=seed)
    result.update(**options)
    return result


def history_of(rng, rows, length, max_len=32):
    seqs = np.zeros((rows, max_len), np.int32)
    seqs[:, :length] = rng.integers(0, VOCAB, size=(rows, length))
    return seqs


# --- the chain on synthetic logits -----------------------------------------------------------
@pytest.mark.parametrize("options", SAMPLING)
def test_processor_effect_and_choice_equal_the_twin(options):
    """Several steps over 3 rows (one flagged done): the chain with `ban_and_tilt` leaves the
    logits and chooses the tokens the twin computes (stages 3-7, the processor written with
    masks, the twin's choice with the twin's RNG stream of each row)."""
    rng = np.random.default_rng(7)
    rows, seed, bias = 3, 99, {11: 1.5, 40: -2.0}
    chain = LogitsChain(
        rows, VOCAB, EOS, search(seed, **options), logit_bias=bias, processors=[ban_and_tilt]
    )
    twin_rng = ref.RowRng(rows, seed)
    seqs = history_of(rng, rows, 6)
    done = np.array([0, 1, 0], np.uint8)
    length, start = 6, 4
    for _ in range(8):
        logits = rng.normal(0, 3, size=(rows, VOCAB)).astype(np.float32)
        expect = logits.copy()
        want = np.zeros(rows, np.int32)
        for r in (0, 2):
            u = twin_rng.uniform(r)
            twin_stages(expect[r], seqs[r], length, start, options, bias)
            expect[r] = twin_ban_and_tilt(seqs[r, :length], expect[r])
            want[r] = twin_choice(expect[r], u, options)[0]
        out = np.full(rows, -7, np.int32)
        chain.process(logits, seqs, length, out, prompt_lengths=start, done=done)
        np.testing.assert_array_equal(logits, expect)  # bit for bit, done row untouched
        assert out[1] == -7
        assert out[[0, 2]].tolist() == want[[0, 2]].tolist()
        assert not set(out[[0, 2]].tolist()) & set(range(5, 10))
        seqs[:, length] = out
        length += 1


@pytest.mark.parametrize("options", SAMPLING)
def test_without_processor_the_chain_is_the_samplers_chain(options):
    """No processor: the chain equals the twin `Sampler.sample_batch` (one call, fused);
    with a processor that changes nothing (it only reads), the same tokens: moving stages
    3-7 out of the sampler changes no bit and no draw."""
    rng = np.random.default_rng(3)
    bias = {3: 2.0}
    fused = LogitsChain(2, VOCAB, EOS, search(5, **options), logit_bias=bias)
    seen = []
    split = LogitsChain(
        2,
        VOCAB,
        EOS,
        search(5, **options),
        logit_bias=bias,
        processors=[lambda ids, row: seen.append(len(ids))],
    )
    twin = ref.Sampler(2, VOCAB, seed=5)
    twin.configure(**search(5, **options).sampler_options())
    twin.set_logit_bias(None, list(bias), list(bias.values()))
    seqs = history_of(rng, 2, 5)
    for length in range(5, 15):
        logits = rng.normal(0, 2, size=(2, VOCAB)).astype(np.float32)
        a, b, c = logits.copy(), logits.copy(), logits.copy()
        want = twin.sample_batch(c, seqs, length, EOS, np.zeros(2, np.int32), prompt_lengths=3)
        got = fused.process(a, seqs, length, prompt_lengths=3)
        got_split = split.process(b, seqs, length, prompt_lengths=3)
        assert got.tolist() == want.tolist() == got_split.tolist()
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)
        seqs[:, length] = got
    assert seen == [length for length in range(5, 15) for _ in range(2)]


def test_order_guidance_then_penalties_then_processors_then_choice():
    """A recording processor sees the logits after the guidance mask, min_length, the
    penalties and the logit bias (the twin's stages on the raw logits); the next processor
    sees the first one's output; log-probabilities are those of the logits the processors
    left (the twin's log-softmax at temperature 1)."""
    options = {
        "do_sample": True,
        "top_k": 10,
        "temperature": 0.7,
        "repetition_penalty": 2.0,
        "presence_penalty": 0.3,
        "min_length": 50,
    }
    bias = {20: 4.0}
    allowed = np.r_[2, 10:30]

    class Mask:  # a guidance constraint's interface (`TokenConstraint`)
        def fill_mask(self, row):
            keep = row[allowed].copy()
            row[:] = LOWEST
            row[allowed] = keep

        def advance(self, token):
            return [token + 1] if token != 2 else []

    seen: list[np.ndarray] = []
    second: list[np.ndarray] = []

    def record(ids, row):
        seen.append(row.copy())

    def shift(ids, row):
        second.append(row.copy())
        return row - np.float32(1.0)  # a returned row replaces it

    chain = LogitsChain.for_search(
        1,
        VOCAB,
        EOS,
        search(11, logprobs=True, top_logprobs=4, **options),
        logit_bias=bias,
        processors=[record, shift],
        constraints=[Mask()],
    )
    rng = np.random.default_rng(0)
    seqs = history_of(rng, 1, 9)
    seqs[0, :9] = [10, 11, 12, 20, 20, 13, 21, 21, 14]
    raw = rng.normal(0, 2, size=(1, VOCAB)).astype(np.float32)
    logits = raw.copy()
    token = int(chain.process(logits, seqs, 9, prompt_lengths=6)[0])

    expect = raw[0].copy()
    Mask().fill_mask(expect)
    twin_stages(expect, seqs[0], 9, 6, options, bias)
    np.testing.assert_array_equal(seen[0], expect)
    assert seen[0][2] == LOWEST  # min_length banned EOS after the mask kept it
    np.testing.assert_array_equal(second[0], expect)
    final = expect - np.float32(1.0)
    np.testing.assert_array_equal(logits[0], final)
    u = ref.RowRng(1, 11).uniform(0)
    want, lp, tid, tlp = twin_choice(final, u, options, n_logprobs=4)
    assert token == want and 10 <= token < 30
    np.testing.assert_allclose(chain.logprobs, lp, rtol=1e-6)
    assert chain.top_ids.tolist() == tid.tolist()
    np.testing.assert_allclose(chain.top_logprobs, tlp, rtol=1e-6)
    assert chain.accept(0, token) == [token + 1]  # forced tokens come back
    assert chain.accept(0, 2) == []  # none after EOS


def test_per_row_options_with_a_processor():
    """`configure(row, ...)` after a processor split the chain: each row's stages run with
    its own options (the twin per row)."""
    rng = np.random.default_rng(5)
    chain = LogitsChain(2, VOCAB, EOS, search(1), processors=[ban_and_tilt])
    chain.configure(1, repetition_penalty=3.0, do_sample=True, top_k=5)
    assert chain.options(1)["repetition_penalty"] == 3.0
    assert chain.options(0)["repetition_penalty"] == 1.0
    seqs = history_of(rng, 2, 10)
    raw = rng.normal(0, 2, size=(2, VOCAB)).astype(np.float32)
    logits = raw.copy()
    out = chain.process(logits, seqs, 10)
    twin = ref.RowRng(2, 1)
    for r, options in enumerate(({}, {"repetition_penalty": 3.0, "do_sample": True, "top_k": 5})):
        u = twin.uniform(r)
        row = raw[r].copy()
        twin_stages(row, seqs[r], 10, 0, options)
        row = twin_ban_and_tilt(seqs[r, :10], row)
        np.testing.assert_array_equal(logits[r], row)
        assert out[r] == twin_choice(row, u, options)[0]


def test_ban_eos_and_constraint_rows():
    """``ban_eos`` bans EOS on rows without a constraint; a constrained row keeps what its
    mask allows (the server's ``ignore_eos`` rule)."""

    class OnlyEos:
        def fill_mask(self, row):
            keep = row[2]
            row[:] = LOWEST
            row[2] = keep

    chain = LogitsChain(2, VOCAB, EOS, ban_eos=True, constraints=[None, OnlyEos()])
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 2] = 10.0
    out = chain.process(logits, np.zeros((2, 4), np.int32), 1)
    assert out[0] != 2 and logits[0, 2] == LOWEST
    assert out[1] == 2


def test_processor_errors():
    chain = LogitsChain(1, VOCAB, EOS, processors=[lambda ids, row: row[:3]])
    with pytest.raises(GenerationError, match="returned shape"):
        chain.process(np.zeros((1, VOCAB), np.float32), np.zeros((1, 4), np.int32), 2)
    with pytest.raises(InvalidArgumentError, match="callable"):
        LogitsChain(1, VOCAB, EOS, processors=["not a function"])

    def writes_ids(ids, row):
        ids[0] = 1  # the token ids are read-only

    chain = LogitsChain(1, VOCAB, EOS, processors=[writes_ids])
    with pytest.raises(ValueError, match="read-only"):
        chain.process(np.zeros((1, VOCAB), np.float32), np.zeros((1, 4), np.int32), 2)


def test_loop_sampler_only_when_needed():
    """The native loop keeps its plain argmax when nothing can change it."""
    assert LogitsChain(1, VOCAB, EOS).loop_sampler is None
    assert not LogitsChain(1, VOCAB, EOS).python_stage
    assert LogitsChain(1, VOCAB, EOS, logit_bias={1: 1.0}).loop_sampler is not None
    with_processor = LogitsChain(1, VOCAB, EOS, processors=[ban_and_tilt])
    assert with_processor.loop_sampler is not None and with_processor.python_stage


def test_from_openai_maps_the_servers_parameters():
    greedy = SearchOptions.from_openai(temperature=0.0)
    assert greedy.is_greedy and greedy.sampler_options()["temperature"] == 1.0
    sampled = SearchOptions.from_openai(temperature=0.5, top_p=1.0, seed=3, logprobs=2)
    assert not sampled.is_greedy
    assert (sampled.top_p, sampled.top_k, sampled.random_seed) == (0.0, 0, 3)
    assert (sampled.logprobs, sampled.top_logprobs) == (True, 2)
    assert SearchOptions.from_openai(top_k=1).is_greedy
    assert SearchOptions.from_openai().random_seed == -1


# --- through the scheduler ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def gqa_model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


def test_processor_through_the_scheduler(gqa_model):
    """Requests with `ban_and_tilt` between two recorders, beside one without processors:
    each step's processed logits are the twin's processing of what the first recorder saw,
    each token is the twin's choice from them with the request's seed, no banned token is
    emitted, and the request without processors gives a batch-1 Generator's greedy tokens."""
    pytest.importorskip("fastapi")
    from genai.serve.batch_runner import SlotBatchRunner
    from genai.serve.scheduler import GenerationRequest, Scheduler
    from tests.serve_helpers import alone_greedy, run_with

    tokenizer = genai.Tokenizer(gqa_model)
    scheduler = Scheduler(SlotBatchRunner(gqa_model, 4, initial_capacity=16), tokenizer, [2])
    options = {"do_sample": True, "top_k": 12, "temperature": 0.9, "repetition_penalty": 1.3}
    records: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {0: [], 1: []}

    def recorders(index):
        before: list[np.ndarray] = []

        def first(ids, row):
            before.append(row.copy())

        def last(ids, row):
            records[index].append((ids.copy(), before[-1], row.copy()))

        return [first, ban_and_tilt, last]

    prompt = np.array([5, 6, 7, 8, 9, 10], np.int32)
    requests = [
        GenerationRequest(
            prompt,
            10,
            search(100 + i, **options),
            index=i,
            logits_processors=recorders(i),
            ignore_eos=True,
        )
        for i in range(2)
    ]
    requests.append(GenerationRequest(prompt, 10, SearchOptions(), index=2))

    async def main():
        tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
        async for event in scheduler.submit(requests):
            tokens[event.index].extend(event.tokens)
        return tokens

    tokens = run_with(scheduler, main)
    for i in range(2):
        assert len(records[i]) == len(tokens[i]) == 10
        twin = ref.RowRng(1, 100 + i)
        for step, (ids, seen, processed) in enumerate(records[i]):
            assert ids.tolist() == prompt.tolist() + tokens[i][:step]
            np.testing.assert_array_equal(processed, twin_ban_and_tilt(ids, seen))
            assert tokens[i][step] == twin_choice(processed, twin.uniform(0), options)[0]
        assert not set(tokens[i]) & set(range(5, 10))
    assert tokens[2] == alone_greedy(gqa_model, prompt, 10)[: len(tokens[2])]


# --- through Generator -------------------------------------------------------------------------
@pytest.mark.parametrize("options", SAMPLING[:2] + SAMPLING[3:])
def test_processor_through_generator(gqa_model, options):
    """`GeneratorParams.add_logits_processor` on the fixture model: the first processor sees
    the model's raw logits (`get_logits`) after the twin's stages; each token is the twin's
    choice from them processed by `twin_ban_and_tilt`, with the generator's seed; no banned
    token comes out."""
    bias = {12: 2.0}
    params = genai.GeneratorParams(gqa_model)
    params.set_search_options(max_length=40, random_seed=21, **options)
    params.set_logit_bias(bias)
    seen: list[np.ndarray] = []
    params.add_logits_processor(lambda ids, row: seen.append(row.copy()))
    params.add_logits_processor(ban_and_tilt)
    generator = genai.Generator(gqa_model, params)
    prompt = np.array([5, 6, 7, 8, 5, 6], np.int32)
    generator.append_tokens(prompt)
    twin = ref.RowRng(1, 21)
    for step in range(12):
        raw = generator.get_logits()[0, 0].copy()
        sequence = generator.get_sequence(0)
        after_stages = raw.copy()
        twin_stages(after_stages, sequence, len(sequence), len(prompt), options, bias)
        generator.generate_next_token()
        np.testing.assert_array_equal(seen[step], after_stages)
        token = int(generator.get_next_tokens()[0])
        processed = twin_ban_and_tilt(sequence, after_stages)
        assert token == twin_choice(processed, twin.uniform(0), options)[0]
        assert not 5 <= token < 10
        if generator.is_done():
            break
