"""The decode driver protocol (`genai.generation.drivers`): `make_driver` picks one driver per
kind of model, each satisfies `Driver` and refuses exactly what it declares unsupported, and
`Generator` drives any driver through the protocol alone (a fake driver over a NumPy twin of a
model, plugged in where `make_driver` is called)."""

from __future__ import annotations

import warnings
from types import MappingProxyType

import numpy as np
import pytest

import genai
import genai.generation.generator as generator_module
from genai.generation.drivers import (
    Driver,
    LoopSettings,
    NativeDriver,
    PipelineDriver,
    WindowedDriver,
    new_loop,
)
from genai.generation.generator import KVSnapshot
from genai.serve.batch_runner import BatchRunner, GeneratorBatchRunner, SlotBatchRunner
from genai.testing.models import write_gqa_decoder
from genai.testing.pipeline import write_pipeline_decoder
from genai.testing.windowed import write_windowed_decoder

KINDS = {"native": NativeDriver, "windowed": WindowedDriver, "pipeline": PipelineDriver}

#: What each kind cannot do (docs/differences.md and the reference: a windowed cache drops the
#: positions slid out; a pipeline has no single session).
UNSUPPORTED = {
    "native": set(),
    "windowed": {"rewind", "reorder", "snapshot", "model_inputs"},
    "pipeline": {"snapshot", "model_inputs", "run_options"},
}

PROMPT = np.array([5, 9, 12, 7, 20, 33], np.int32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, genai.Model]:
    root = tmp_path_factory.mktemp("drivers")
    return {
        "native": genai.Model(write_gqa_decoder(root, name="native")),
        "windowed": genai.Model(write_windowed_decoder(root, name="windowed", window_size=4)),
        "pipeline": genai.Model(write_pipeline_decoder(root, name="pipeline")),
    }


def generator(model: genai.Model, **options: object) -> genai.Generator:
    params = genai.GeneratorParams(model)
    params.set_search_options(**{"max_length": 40, **options})
    return genai.Generator(model, params)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_make_driver_picks_by_kind_and_each_satisfies_the_protocol(models, kind):
    gen = generator(models[kind])
    driver = gen._driver
    assert type(driver) is KINDS[kind]
    assert isinstance(driver, Driver)
    assert driver.loop is gen._loop
    assert set(driver.unsupported) == UNSUPPORTED[kind]
    assert driver.fused_steps == (kind == "native")


def _attempt(gen: genai.Generator, operation: str) -> None:
    """The Generator call that needs ``operation`` from its driver."""
    if operation == "rewind":
        gen.rewind_to(3)
    elif operation == "snapshot":
        generator(gen.model).restore(gen.snapshot())
    elif operation == "restore":
        tokens = PROMPT[None, :4]
        generator(gen.model).restore(KVSnapshot(io=gen.model.io, layout="?", tokens=tokens, kv=[]))
    elif operation == "model_inputs":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a name the graph lacks: ignored with a warning
            gen.set_model_input("not_an_input", np.zeros(1, np.float32))
    elif operation == "run_options":
        gen.set_runtime_option("memory.enable_memory_arena_shrinkage", "cpu:0")
    else:
        raise AssertionError(operation)


@pytest.mark.parametrize(
    "operation", ["rewind", "snapshot", "restore", "model_inputs", "run_options"]
)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_driver_refuses_exactly_what_it_declares(models, kind, operation):
    gen = generator(models[kind])
    gen.append_tokens(PROMPT)
    gen.generate_next_token()
    reason = gen._driver.unsupported.get("snapshot" if operation == "restore" else operation)
    if reason is None:
        if operation == "restore":  # supported: refused for the wrong layout, after the ask
            with pytest.raises(ValueError, match="another model or KV layout"):
                _attempt(gen, operation)
        else:
            _attempt(gen, operation)
        return
    with pytest.raises(NotImplementedError) as caught:
        _attempt(gen, operation)
    assert str(caught.value) == reason


def test_the_windowed_driver_refuses_reorder_as_declared(models):
    driver = generator(models["windowed"])._driver
    with pytest.raises(NotImplementedError) as caught:
        driver.reorder(np.array([0]))
    assert str(caught.value) == driver.unsupported["reorder"]


def test_batch_runners_declare_prefix_reuse_as_drivers_declare_snapshots(models):
    model = models["native"]
    assert issubclass(SlotBatchRunner, BatchRunner) and issubclass(
        GeneratorBatchRunner, BatchRunner
    )
    slots = SlotBatchRunner(model, 2, initial_capacity=16, max_chunk=16)
    assert "snapshot" not in slots.unsupported
    fallback = GeneratorBatchRunner(model, 2)
    assert fallback.export_prefix(0, 0) is None
    with pytest.raises(NotImplementedError) as caught:
        fallback.load_prefix(0, [], 0)
    assert str(caught.value) == fallback.unsupported["snapshot"]
    with pytest.raises(TypeError):
        BatchRunner()  # the interface alone runs nothing


# --- a fake driver over a NumPy twin ------------------------------------------------------------
class Twin:
    """A NumPy model: after token t the logits peak at ``3 + (7 t + 3) % (vocab - 3)`` (never
    pad 0 or EOS 2) and fall off linearly."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def favourite(self, tokens: np.ndarray) -> np.ndarray:
        return 3 + (7 * tokens.astype(np.int64) + 3) % (self.vocab - 3)

    def logits(self, last: np.ndarray) -> np.ndarray:
        target = self.favourite(last)
        return -np.abs(np.arange(self.vocab)[None, :] - target[:, None]).astype(np.float32)

    def greedy(self, prompt: np.ndarray, new: int) -> np.ndarray:
        rows = [prompt]
        for _ in range(new):
            rows.append(self.favourite(rows[-1][:, -1:]).astype(np.int32))
            rows[-1] = np.concatenate([rows[-2], rows[-1]], axis=1)
        return rows[-1]


class FakeDriver:
    """A driver written against the protocol alone: the loop without a session, the twin's
    logits written into its rows; every call recorded."""

    session = None
    kv = None
    kv_layout = "fake"

    def __init__(self, model: genai.Model, settings: LoopSettings, twin: Twin, fused: bool):
        self.loop = new_loop(model.io, None, settings, kv_pairs=[])
        self.twin, self.fused_steps = twin, fused
        self.unsupported = MappingProxyType(
            {
                "snapshot": "the fake takes no snapshots",
                "model_inputs": "the fake takes no model inputs",
                "run_options": "the fake takes no run options",
            }
        )
        self.computed = 0
        self.calls: list[tuple] = []
        self.fed: list[np.ndarray] = []
        self.hidden: np.ndarray | None = None

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        self.calls.append(("prepare_prompt", length))
        return tokens

    def run(self, prompt: bool = False) -> None:
        self.calls.append(("run", prompt))
        loop = self.loop
        sequences = loop.array("sequences")
        self.fed.append(sequences[:, self.computed : loop.length].copy())
        loop.array("logits_rows")[:] = self.twin.logits(sequences[:, loop.length - 1])
        self.computed = loop.length
        loop.set_logits_ready()

    def step(self) -> None:
        self.calls.append(("step",))
        if not self.loop.logits_ready:
            self.run()
        self.loop.step()

    def steps(self, count: int) -> int:
        self.calls.append(("steps", count))
        made = 0
        while made < count and not self.loop.all_done:
            if not self.loop.logits_ready:
                self.run()
            self.loop.step()
            made += 1
        return made

    def rewind(self, length: int, keep_last: bool = False) -> None:
        self.calls.append(("rewind", length, "keep_last") if keep_last else ("rewind", length))
        self.loop.rewind(length, keep_last)
        self.computed = min(self.computed, length if keep_last else max(length - 1, 0))

    def reorder(self, order: np.ndarray) -> None:
        self.calls.append(("reorder", order.tolist()))

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        raise AssertionError("declared unsupported: never asked")

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        raise AssertionError("declared unsupported: never asked")

    def read_output(self, name: str) -> np.ndarray:
        return self.loop.array("logits_rows")[:, None, :].copy()

    def read_input(self, name: str) -> np.ndarray:
        return self.fed[-1].copy()

    def set_model_input(self, name: str, value: np.ndarray) -> None:
        raise NotImplementedError(self.unsupported["model_inputs"])

    def set_hidden_states(self, hidden_states: np.ndarray) -> None:
        self.hidden = hidden_states

    def set_run_option(self, key: str, value: str) -> None:
        raise NotImplementedError(self.unsupported["run_options"])

    @property
    def kv_bytes(self) -> int:
        return 4096

    @property
    def kv_used_bytes(self) -> int:
        return 16 * self.computed


@pytest.fixture
def fake(models, monkeypatch):
    """Generators made in the test get a `FakeDriver` (fused steps: ``fake.fused``)."""
    model = models["native"]
    twin = Twin(model.io.vocab_size)

    class Made(list):
        fused = False

    made = Made()

    def factory(model, search, settings):
        assert settings.rows == search.batch_size * search.num_beams
        driver = FakeDriver(model, settings, twin, made.fused)
        made.append(driver)
        return driver

    monkeypatch.setattr(generator_module, "make_driver", factory)
    made.model, made.twin = model, twin
    return made


def test_generator_drives_a_fake_driver_through_the_protocol(fake):
    gen = generator(fake.model, batch_size=2)
    (driver,) = fake
    assert isinstance(driver, Driver)
    prompt = np.array([[5, 9, 12], [30, 31, 8]], np.int32)
    gen.append_tokens(prompt)
    assert driver.calls == [("prepare_prompt", 0), ("run", True)]
    np.testing.assert_array_equal(driver.fed[-1], prompt)
    np.testing.assert_array_equal(gen.get_logits()[:, 0], fake.twin.logits(prompt[:, -1]))
    for _ in range(4):
        gen.generate_next_token()
    expected = fake.twin.greedy(prompt, 8)
    for row in range(2):
        np.testing.assert_array_equal(gen.get_sequence(row), expected[row, :7])
    # the prompt's logits serve the first step; each later step runs the token before it
    assert driver.calls[2:] == [("step",)] + [("step",), ("run", False)] * 3
    # one token fed per step after the prompt
    assert [f.shape[1] for f in driver.fed] == [3, 1, 1, 1]

    gen.truncate(5)
    assert driver.calls[-1] == ("rewind", 5)
    gen.generate_next_token()  # the kept last token runs again, then the twin's choice
    np.testing.assert_array_equal(driver.fed[-1], expected[:, 4:5])
    np.testing.assert_array_equal(gen.get_sequence(1), expected[1, :6])

    # not fused: generate_until_done steps one by one
    calls = len(driver.calls)
    assert gen.generate_until_done(2) == 2
    assert driver.calls[calls:] == [("step",), ("run", False)] * 2
    np.testing.assert_array_equal(gen.get_sequence(0), expected[0, :8])

    # continuing: prepare_prompt at the current length, a run that is not a prompt
    gen.append_tokens(np.array([[40], [41]], np.int32))
    assert driver.calls[-2:] == [("prepare_prompt", 8), ("run", False)]
    # the last generated token (pending since its step) and the appended ones
    np.testing.assert_array_equal(driver.fed[-1], [[expected[0, 7], 40], [expected[1, 7], 41]])
    assert gen.kv_cache_bytes == 4096 and gen.kv_cache_used_bytes == 16 * 9
    np.testing.assert_array_equal(
        gen.get_output("logits")[:, 0], fake.twin.logits(np.array([40, 41]))
    )


def test_rewind_to_replays_the_rewound_token_through_the_protocol(fake):
    """The reference's rewind_to(n): the token at index n runs first, on the KV of the first
    n (the driver keeps it pending), then the twin's choice; an append takes its place."""
    gen = generator(fake.model, batch_size=2)
    (driver,) = fake
    prompt = np.array([[5, 9, 12], [30, 31, 8]], np.int32)
    gen.append_tokens(prompt)
    for _ in range(4):
        gen.generate_next_token()
    expected = fake.twin.greedy(prompt, 8)
    gen.rewind_to(5)
    assert driver.calls[-1] == ("rewind", 6)  # token 5 pending, the KV of 0..4 kept
    assert gen.token_count() == 5
    np.testing.assert_array_equal(gen.get_sequence(0), expected[0, :5])
    np.testing.assert_array_equal(gen.get_next_tokens(), expected[:, 5])
    assert not gen.is_done()
    gen.generate_next_token()
    np.testing.assert_array_equal(driver.fed[-1], expected[:, 5:6])
    np.testing.assert_array_equal(gen.get_sequence(1), expected[1, :7])
    gen.rewind_to(5)
    gen.rewind_to(5)  # the current length: nothing changes
    assert gen.get_next_tokens().tolist() == expected[:, 5].tolist()
    gen.append_tokens(np.array([[40], [41]], np.int32))
    assert driver.calls[-3:] == [("rewind", 5, "keep_last"), ("prepare_prompt", 5), ("run", False)]
    np.testing.assert_array_equal(driver.fed[-1], [[40], [41]])  # only the appended ones
    np.testing.assert_array_equal(gen.get_sequence(0), [*expected[0, :5], 40])


def test_fused_steps_go_to_the_driver_in_one_call(fake):
    fake.fused = True
    gen = generator(fake.model, max_length=30)
    (driver,) = fake
    gen.append_tokens(PROMPT)
    assert gen.generate_until_done(5) == 5
    asked = [call for call in driver.calls if call[0] != "run"]
    assert asked == [("prepare_prompt", 0), ("steps", 5)]
    np.testing.assert_array_equal(gen.get_sequence(0), fake.twin.greedy(PROMPT[None, :], 5)[0])
    # capped by max_length: the driver is asked for what is left
    assert gen.generate_until_done() == 30 - len(PROMPT) - 5
    asked = [call for call in driver.calls if call[0] != "run"]
    assert asked[-1] == ("steps", 30 - len(PROMPT) - 5)


def test_generator_asks_the_fake_driver_what_it_cannot_do(fake):
    gen = generator(fake.model)
    (driver,) = fake
    gen.append_tokens(PROMPT)
    for call, operation in (
        (gen.snapshot, "snapshot"),
        (lambda: gen.set_model_input("x", np.zeros(1)), "model_inputs"),
        (lambda: gen.set_runtime_option("some.entry", "1"), "run_options"),
    ):
        with pytest.raises(NotImplementedError) as caught:
            call()
        assert str(caught.value) == driver.unsupported[operation]
    gen.set_hidden_states(np.ones((1, 1, 4), np.float32))
    assert driver.hidden is not None
    # terminate_session stays the generator's own (no driver involved)
    gen.set_runtime_option("terminate_session", "1")
    with pytest.raises(genai.GenerationError):
        gen.generate_next_token()


def test_beam_search_reorders_through_the_driver(fake, monkeypatch):
    gen = generator(fake.model, num_beams=3, max_length=12)
    (driver,) = fake
    beams = gen._beams
    orders = []
    step = beams.step

    def recording_step(*args, **kwargs):
        step(*args, **kwargs)
        orders.append(beams.next_indices.tolist())

    monkeypatch.setattr(beams, "step", recording_step)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    # every order that is not the identity reaches the driver, in step order
    moved = [order for order in orders if order != [0, 1, 2]]
    assert moved, orders
    assert [c[1] for c in driver.calls if c[0] == "reorder"] == moved
    # every step's best log-probability is the same: the greedy path is the best hypothesis
    np.testing.assert_array_equal(gen.get_sequence(0), fake.twin.greedy(PROMPT[None, :], 6)[0])
