"""`genai.MtpGenerator`: multi-token prediction with an MTP head, against onnxruntime-genai
0.18's ``og.MtpGenerator`` on the same folders (fixture pairs from `genai.testing.mtp`): the
same tokens, one per call, its checks and errors; and the main model's own greedy output."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from genai.generation.speculative.sampling import ReferenceStream
from genai.testing.mtp import write_markov_mtp_pair, write_mtp_pair
from genai.testing.speculative import markov_distribution, transition_table
from tests.speculation import assert_freed_at_once, error_text

og = pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("mtp")
    table = transition_table(10, {3: 5})
    rng = np.random.default_rng(5)
    feedback = rng.normal(0.0, 1.0, (10, 8))
    return {
        "exact-head": write_markov_mtp_pair(root / "exact", table, table),
        "partial-head": write_markov_mtp_pair(
            root / "partial", table, transition_table(10, {3: 7, 6: 2}), feedback=feedback
        ),
        # the head's hidden-state term decides: its chained drafts (fed its own feedback
        # output) differ from those fed the main model's hidden states
        "feedback-head": write_markov_mtp_pair(
            root / "feedback",
            table,
            table,
            proj=rng.normal(0.0, 12.0, (8, 10)),
            feedback=rng.normal(0.0, 1.0, (10, 8)),
        ),
        "gqa": write_mtp_pair(root / "gqa"),
        "sampled": _soft_pair(root / "sampled"),
    }


def _soft_table() -> np.ndarray:
    table = np.random.default_rng(1).normal(0.0, 1.0, (8, 8)).astype(np.float32)
    table[:, 7] = -30.0
    return table


def _soft_pair(root):
    """A Markov main model of soft rows (EOS, id 7, practically never) and a head that
    disagrees with it a little, with a hidden-state term and a feedback output: sampled
    drafts are accepted and rejected."""
    rng = np.random.default_rng(1)
    table = rng.normal(0.0, 1.0, (8, 8)).astype(np.float32)
    table[:, 7] = -30.0  # = _soft_table()
    head_table = table + rng.normal(0.0, 1.0, (8, 8)).astype(np.float32)
    feedback = rng.normal(0.0, 1.0, (8, 8))
    proj = rng.normal(0.0, 0.5, (8, 8))
    return write_markov_mtp_pair(root, table, head_table, feedback=feedback, proj=proj)


PROMPTS = {
    "exact-head": [1, 2],
    "partial-head": [4, 5, 6],
    "feedback-head": [4, 5, 6],
    "gqa": [5, 9, 12, 3, 30],
}

#: get_stats keys both engines count the same way (genai keeps the accepted prefix's KV where
#: the reference re-runs it: forward-pass counts differ)
SHARED_STATS = [
    "rounds",
    "draft_tokens_proposed",
    "draft_tokens_evaluated",
    "draft_tokens_accepted",
    "correction_tokens",
    "bonus_tokens",
    "acceptance_rate",
    "avg_draft_tokens_per_round",
    "tokens_queued",
    "tokens_emitted",
    "mean_emitted_tokens_per_round",
]


def _run(mod, main, head, prompt, max_length=30, drafts=1, **search):
    main_model, head_model = mod.Model(str(main)), mod.Model(str(head))
    params = mod.GeneratorParams(main_model)
    params.set_search_options(**{"do_sample": False, "max_length": max_length, **search})
    params.set_speculative_options(max_draft_tokens=drafts)
    gen = mod.MtpGenerator(main_model, head_model, params)
    gen.append_tokens(np.array(prompt, np.int32))
    trace = []
    while not gen.is_done():
        gen.generate_next_token()
        trace.append([int(t) for t in gen.get_sequence()])
    return trace, gen.get_stats()


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_tokens_one_per_call_match_the_reference(pairs, kind):
    main, head = pairs[kind]
    want, want_stats = _run(og, main, head, PROMPTS[kind])
    got, stats = _run(genai, main, head, PROMPTS[kind])
    assert got == want
    for alias, key in (
        ("forwards", "target_forward_passes"),
        ("accepts", "draft_tokens_accepted"),
        ("trials", "draft_tokens_evaluated"),
    ):
        assert stats[alias] == stats[key]
    if kind == "exact-head":  # the head predicts the token after next exactly
        assert stats["acceptance_rate"] == want_stats["acceptance_rate"] == 1.0
        assert stats["target_forward_passes"] == want_stats["target_forward_passes"]


@pytest.mark.parametrize("drafts", [1, 2, 3])
@pytest.mark.parametrize("kind", ["partial-head", "feedback-head", "gqa"])
def test_chained_drafts_give_the_references_tokens(pairs, kind, drafts):
    """max_draft_tokens K: the head drafts K tokens a round, each after the first fed the
    head's own feedback output; one main run verifies them. Same tokens per call as the
    reference, and its drafts, rounds and acceptance counts."""
    main, head = pairs[kind]
    want, want_stats = _run(og, main, head, PROMPTS[kind], drafts=drafts)
    got, stats = _run(genai, main, head, PROMPTS[kind], drafts=drafts)
    assert got == want
    # The reference's one-draft rounds draft from a two-token head run that reads the row
    # before a last token equal to the head's pad id (0, generated by the partial head's
    # chain): its drafts there differ from genai's (the tokens do not).
    if (kind, drafts) != ("partial-head", 1):
        for key in SHARED_STATS:
            assert stats[key] == pytest.approx(want_stats[key], rel=1e-6), key
    if kind == "feedback-head" and drafts > 1:  # accepted and rejected drafts, both engines
        assert 0 < want_stats["draft_tokens_accepted"] < want_stats["draft_tokens_evaluated"]


@pytest.mark.parametrize("kind", ["partial-head", "gqa"])
def test_output_is_the_main_models_plain_greedy_output(pairs, kind):
    main, _ = pairs[kind]
    model = og.Model(str(main))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=30)
    plain = og.Generator(model, params)
    plain.append_tokens(np.array([PROMPTS[kind]], np.int32))
    while not plain.is_done():
        plain.generate_next_token()
    got, _ = _run(genai, *pairs[kind], PROMPTS[kind])
    assert got[-1][: len(plain.get_sequence(0))] == [int(t) for t in plain.get_sequence(0)]


@pytest.mark.parametrize(
    ("search", "drafts"),
    [({"batch_size": 2}, 1), ({"num_beams": 2}, 1), ({}, 4)],
    ids=["batch", "beams", "chained-without-feedback"],
)
def test_construction_checks_raise_the_references_message(pairs, search, drafts):
    main, head = pairs["exact-head"]
    messages = []
    for mod in (og, genai):
        main_model, head_model = mod.Model(str(main)), mod.Model(str(head))
        params = mod.GeneratorParams(main_model)
        params.set_search_options(max_length=30, **search)
        params.set_speculative_options(max_draft_tokens=drafts)
        messages.append(
            error_text(
                lambda mod=mod, m=main_model, h=head_model, p=params: mod.MtpGenerator(m, h, p)
            )
        )
    assert messages[0] is not None
    assert messages[1] == messages[0]


def test_call_order_errors_and_reset_as_the_reference(pairs):
    main, head = pairs["exact-head"]
    found = []
    for mod in (og, genai):
        main_model, head_model = mod.Model(str(main)), mod.Model(str(head))
        params = mod.GeneratorParams(main_model)
        params.set_search_options(max_length=30)
        params.set_speculative_options(max_draft_tokens=1)
        gen = mod.MtpGenerator(main_model, head_model, params)
        before = error_text(gen.generate_next_token)
        gen.append_tokens(np.array([1, 2], np.int32))
        twice = error_text(lambda gen=gen: gen.append_tokens(np.array([3], np.int32)))
        gen.reset()
        gen.append_tokens(np.array([4, 5], np.int32))
        gen.generate_next_token()
        found.append((before, twice, [int(t) for t in gen.get_sequence()]))
    assert found[0][0] is not None and found[0][1] is not None
    assert found[1] == found[0]


# --- sampled rounds ----------------------------------------------------------------------------


@pytest.mark.parametrize("drafts", [1, 2, 3])
def test_sampled_rounds_draw_the_references_tokens_for_a_seed(pairs, drafts):
    """do_sample: drafts drawn from the head's truncated distribution, accepted with
    probability min(1, p/q), corrections from the residual, on the reference's random stream:
    a seed gives the reference's tokens one per call, and its round counts."""
    main, head = pairs["sampled"]
    accepted = rejected = 0
    for seed in range(8):
        search = {"do_sample": True, "top_k": 8, "random_seed": seed}
        want, want_stats = _run(og, main, head, [1, 2], 24, drafts, **search)
        got, stats = _run(genai, main, head, [1, 2], 24, drafts, **search)
        assert got == want, seed
        for key in SHARED_STATS:
            assert stats[key] == pytest.approx(want_stats[key], rel=1e-6), (seed, key)
        accepted += want_stats["draft_tokens_accepted"]
        rejected += want_stats["correction_tokens"]
    assert accepted > 0 and rejected > 0


@pytest.mark.parametrize(
    "search",
    [
        {"top_p": 0.8, "top_k": 8},
        {"temperature": 0.7, "top_k": 4},
        {"top_k": 0, "top_p": 0.9},
        {"top_k": 1, "top_p": 1.0},
        {"top_k": 1},  # the reference's MTP nucleus of p = 0: its best token
    ],
    ids=["top-p", "temperature", "vocabulary-nucleus", "no-cut", "top-k-1"],
)
def test_sampled_rounds_with_truncation_draw_the_references_tokens(pairs, search):
    main, head = pairs["sampled"]
    for seed in range(4):
        options = {"do_sample": True, "random_seed": seed, **search}
        want, _ = _run(og, main, head, [3, 4], 20, 2, **options)
        got, _ = _run(genai, main, head, [3, 4], 20, 2, **options)
        assert got == want, seed


def test_sampled_rounds_keep_the_main_models_distribution(pairs):
    """Chi-square: the first three tokens sampled through MtpGenerator (two chained drafts a
    round, drafts both accepted and rejected) follow the main chain's exact marginals."""
    from scipy import stats as scipy_stats  # lazy: scipy is a test-only dependency

    main, head = pairs["sampled"]
    table = _soft_table()
    main_model, head_model = genai.Model(str(main)), genai.Model(str(head))
    draws, prompt = 1500, [1, 2]
    counts = np.zeros((3, 8), np.int64)
    accepted = rejected = 0
    for seed in range(draws):
        params = genai.GeneratorParams(main_model)
        params.set_search_options(do_sample=True, top_k=8, max_length=5, random_seed=seed)
        params.set_speculative_options(max_draft_tokens=2)
        gen = genai.MtpGenerator(main_model, head_model, params)
        gen.append_tokens(np.array(prompt, np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        sequence = gen.get_sequence()
        for step in range(3):
            counts[step, int(sequence[len(prompt) + step])] += 1
        found = gen.get_stats()
        accepted += found["draft_tokens_accepted"]
        rejected += found["correction_tokens"]
    assert accepted > 0 and rejected > 0
    for step in range(3):
        want = markov_distribution(table, prompt[-1], step + 1)
        keep = want > 1e-6
        result = scipy_stats.chisquare(counts[step, keep], want[keep] / want[keep].sum() * draws)
        assert result.pvalue > 1e-3, (step, counts[step], want)


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 1.5}, {"no_repeat_ngram_size": 2}],
    ids=["repetition", "no-repeat-ngram"],
)
def test_penalties_shape_every_verified_row_as_the_reference(pairs, penalty):
    """The main model's rows go through the repetition penalty and no_repeat_ngram with the
    tokens before each row (verified drafts included), greedy and sampled."""
    main, head = pairs["sampled"]
    for seed in range(3):
        search = {"do_sample": True, "top_k": 8, "random_seed": seed, **penalty}
        want, _ = _run(og, main, head, [1, 2], 20, 3, **search)
        assert _run(genai, main, head, [1, 2], 20, 3, **search)[0] == want, seed
    main, head = pairs["gqa"]
    want, _ = _run(og, main, head, PROMPTS["gqa"], 30, 2, **penalty)
    assert _run(genai, main, head, PROMPTS["gqa"], 30, 2, **penalty)[0] == want


def test_the_reference_stream_is_std_mt19937():
    """The C++ standard's check of std::mt19937: the 10000th output of a default-constructed
    engine (seed 5489) is 4123659995."""
    stream = ReferenceStream(5489)
    for _ in range(9999):
        stream._next()
    assert stream._next() == 4123659995


def test_a_deleted_generator_is_freed_at_once(pairs):
    """The rounds and the head's proposer refer back to the generator weakly: deleting the
    last reference frees it (and its KV caches) without waiting for the cycle collector."""
    main, head = pairs["gqa"]
    main_model, head_model = genai.Model(str(main)), genai.Model(str(head))
    params = genai.GeneratorParams(main_model)
    params.set_search_options(max_length=30)
    params.set_speculative_options(max_draft_tokens=2)
    gen = genai.MtpGenerator(main_model, head_model, params)
    gen.append_tokens(np.array([1, 2, 3, 4], np.int32))
    for _ in range(3):
        gen.generate_next_token()
    box = [gen]
    del gen
    assert_freed_at_once(box)
