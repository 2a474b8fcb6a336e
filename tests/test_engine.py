"""``og.Engine``: the same scripts run on onnxruntime-genai's Engine and on genai's, and give
the same greedy tokens, finish reasons and usage; multi-turn requests, cancellation, rewinds,
max session tokens, stop strings and the errors for misuse.

The reference's static-batch Engine (every folder here: none is a paged-attention model) keeps
only one request resident between turns, so a conversation the reference cannot run
concurrently is compared with the same conversation run alone there."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import numpy as np
import onnxruntime_genai as ref
import pytest

import genai

MODULES = {"reference": ref, "genai": genai}


# --- a script that runs on either module ----------------------------------------------------------
@dataclass
class Turn:
    """What a script gave one turn (``tokens``, options) and what came back (``events``)."""

    tokens: list[int]
    max_generated: int = 0
    stop_strings: Sequence[str] = ()
    cancel_after: int | None = None  # cancel once this many tokens arrived
    rewind_to: int | None = None  # rewind to the start of this turn (1-based) first
    events: list[tuple[int, int | None, int, tuple[int, int, int], int | None]] = field(
        default_factory=list
    )

    @property
    def generated(self) -> list[int]:
        return [e[1] for e in self.events if e[1] is not None]

    @property
    def finish(self) -> tuple[int, int, tuple[int, int, int], int | None]:
        """(flags, finish reason, usage, matched stop index) of the turn's last event."""
        flags, _, reason, usage, stop = self.events[-1]
        return flags, reason, usage, stop


def converse(
    og: ModuleType,
    model: Any,
    conversations: list[list[Turn]],
    *,
    capacity: int = 8,
    max_session_tokens: int = 0,
    min_decode_rows: int | None = None,
) -> list[list[Turn]]:
    """Run every conversation's turns through ``og.Engine``: all first turns together, then
    all second turns, ... (each conversation is one Request). ``min_decode_rows`` (genai
    only) sets its schedulers' `Scheduler.min_decode_rows`."""
    engine = og.Engine(model)
    set_min_decode_rows(engine, min_decode_rows)
    buffer = engine.create_event_buffer(capacity)
    requests = []
    for _ in conversations:
        options = og.RequestOptions()
        options.set_max_session_tokens(max_session_tokens)
        requests.append(engine.create_request(options=options))
    for step in range(max(len(c) for c in conversations)):
        current: dict[int, Turn] = {}
        for request, conversation in zip(requests, conversations, strict=True):
            if step >= len(conversation):
                continue
            turn = conversation[step]
            if turn.rewind_to is not None:
                request.rewind_to_start_of_turn(turn.rewind_to)
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(turn.max_generated)
            if turn.stop_strings:
                options.set_stop_strings(list(turn.stop_strings))
            turn_id = request.begin_turn(np.asarray(turn.tokens, np.int32), options)
            current[id(request)] = turn
            turn.turn_id = turn_id  # type: ignore[attr-defined]
        while engine.has_pending_requests():
            engine.run(buffer)
            for index in range(len(buffer)):
                event = buffer[index]
                turn = current[id(event.request)]
                assert event.turn_id == turn.turn_id  # type: ignore[attr-defined]
                usage = event.usage
                turn.events.append(
                    (
                        int(event.flags),
                        event.token,
                        int(event.finish_reason),
                        (usage.prompt_tokens, usage.cached_prompt_tokens, usage.generated_tokens),
                        event.matched_stop_string_index,
                    )
                )
                cancel = turn.cancel_after
                if event.token is not None and cancel is not None and len(turn.generated) == cancel:
                    assert event.request.cancel_turn(turn.turn_id)  # type: ignore[attr-defined]
                    assert not event.request.cancel_turn(turn.turn_id)  # type: ignore[attr-defined]
    for request in requests:
        request.close()
    return conversations


def set_min_decode_rows(engine: Any, rows: int | None) -> None:
    if rows is not None:
        for scheduler in engine._schedulers:
            scheduler.min_decode_rows = rows


def check_together_and_alone(
    ref_model: Any, our_model: Any, conversations: list[list[Turn]], run: Any = None
) -> list[list[Turn]]:
    """Conversations run together on genai's Engine, checked two ways, each exact on any CPU
    (ORT's M = 1 kernels round otherwise than its M >= 2 ones, by ~1e-5, and on some CPUs,
    e.g. AVX2 without VNNI, that flips greedy tokens of the int4 model):
    - each conversation alone gives the tokens the reference's Engine gives it alone (both
      decode one row);
    - run together (``run``, `converse` by default) with decode steps of at least two rows,
      the `genai serve` rule, each gets the tokens it gets alone under that rule.
    Returns the conversations run together."""
    theirs = on_reference_alone(ref_model, conversations)
    for a, b in zip(theirs, alone(genai, our_model, conversations), strict=True):
        assert without_cached(b) == without_cached(a)
    return check_together_as_alone(our_model, conversations, run)


def check_together_as_alone(
    our_model: Any, conversations: list[list[Turn]], run: Any = None
) -> list[list[Turn]]:
    """The second check of `check_together_and_alone`."""
    together = copy(conversations)
    (run or converse)(genai, our_model, together, min_decode_rows=2)
    each = alone(genai, our_model, conversations, min_decode_rows=2)
    for a, b in zip(each, together, strict=True):
        assert without_cached(b) == without_cached(a)
    return together


def copy(conversations: list[list[Turn]]) -> list[list[Turn]]:
    return [
        [
            Turn(t.tokens, t.max_generated, t.stop_strings, t.cancel_after, t.rewind_to)
            for t in conversation
        ]
        for conversation in conversations
    ]


def alone(
    og: ModuleType, model: Any, conversations: list[list[Turn]], **kw: Any
) -> list[list[Turn]]:
    """Each conversation on its own ``og.Engine``."""
    return [converse(og, model, [c], **kw)[0] for c in copy(conversations)]


def on_reference_alone(model: Any, conversations: list[list[Turn]], **kw: Any) -> list[list[Turn]]:
    """Each conversation on its own reference Engine (it holds one request between turns)."""
    return alone(ref, model, conversations, **kw)


def by_reference_generator(
    model: Any, eos: set[int], conversation: list[Turn]
) -> list[tuple[list[int], int]]:
    """(generated tokens, finish reason) of each turn from the reference's greedy Generator,
    run on the whole conversation so far: for folders the reference's Engine cannot run."""
    history: list[int] = []
    out = []
    for turn in conversation:
        history += turn.tokens
        params = ref.GeneratorParams(model)
        params.set_search_options(max_length=len(history) + turn.max_generated, do_sample=False)
        generator = ref.Generator(model, params)
        generator.append_tokens(np.asarray(history, np.int32))
        generated: list[int] = []
        reason = int(ref.FinishReason.MAX_GENERATED_TOKENS)
        while len(generated) < turn.max_generated:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in eos:
                reason = int(ref.FinishReason.EOS)
                break
            generated.append(token)
        history += generated
        out.append((generated, reason))
    return out


def eos_ids(folder: str | Path) -> set[int]:
    eos = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["eos_token_id"]
    return set(eos) if isinstance(eos, list) else {eos}


def without_cached(turns: list[Turn]) -> list[tuple]:
    """The events with ``cached_prompt_tokens`` left out (the reference's static engine has
    no prefix cache; genai's may reuse an earlier request's prompt)."""
    out = []
    for turn in turns:
        for flags, token, reason, usage, stop in turn.events:
            out.append((flags, token, reason, (usage[0], usage[2]), stop))
    return out


# --- models -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["gqa", "optimum"])
def fixture_pair(request: pytest.FixtureRequest, fixture_folders: dict[str, Path]) -> tuple:
    folder = str(fixture_folders[request.param])
    return ref.Model(folder), genai.Model(folder)


@pytest.fixture(scope="module")
def default_model(default_model_path: Path) -> tuple:
    """The default model: the reference's Engine fails on its last-position logits graph
    ("Static-batch execution failed ... logits"), so its checks use the reference's
    Generator."""
    folder = str(default_model_path)
    return ref.Model(folder), genai.Model(folder), folder


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> tuple:
    """A real folder (../shared's reference-built one, else the default model): for checks
    that need no tokens from the reference's Engine (errors, threads, genai alone)."""
    folder = str(smollm2_path)
    return ref.Model(folder), genai.Model(folder), folder


@pytest.fixture(scope="module")
def smollm2_all_logits(full_logits_smollm2_path: Path) -> tuple:
    """A real folder the reference's Engine generates on (logits for every position):
    ../shared's reference-built one, else an all-logits build of the default model's weights.
    The default model's own graph is checked against the reference's Generator
    (`default_model`)."""
    folder = str(full_logits_smollm2_path)
    return ref.Model(folder), genai.Model(folder), folder


def chat(tokenizer: Any, question: str, *, first: bool = True) -> list[int]:
    text = "" if first else "<|im_end|>\n"
    text += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return [int(t) for t in tokenizer.encode(text)]


# --- tokens, finish reasons, usage ---------------------------------------------------------------
def test_concurrent_greedy_requests_match_the_reference_on_fixture_models(fixture_pair) -> None:
    """Six requests batched together give each the tokens the reference's Engine gives it
    alone (its static batch fails on folders without a shared KV buffer: ORT rejects the
    present shapes of rows of different lengths)."""
    ref_model, our_model = fixture_pair
    conversations = [
        [Turn([1, 2, 3], 6)],
        [Turn([5, 9, 13, 7], 9)],
        [Turn([3, 8, 2, 15, 6, 11], 4)],
        [Turn([7], 7)],
        [Turn([4, 4, 4, 4, 4], 5)],
        [Turn([11, 2], 8)],
    ]
    theirs = on_reference_alone(ref_model, conversations)
    ours = converse(genai, our_model, copy(conversations))
    for a, b in zip(theirs, ours, strict=True):
        assert without_cached(b) == without_cached(a)
        assert b[0].finish[1] == int(ref.FinishReason.MAX_GENERATED_TOKENS)


def test_batched_requests_match_the_references_batch(smollm2_all_logits) -> None:
    """On a shared-buffer folder the reference batches too: same tokens, request by request."""
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    questions = ["What is the capital of France?", "Name three colors.", "Hi!", "2+2?"]
    conversations = [[Turn(chat(tokenizer, q), 12)] for q in questions]
    theirs = converse(ref, ref_model, copy(conversations))
    ours = converse(genai, our_model, copy(conversations))
    for a, b in zip(theirs, ours, strict=True):
        assert without_cached(b) == without_cached(a)


def test_multi_turn_requests_keep_their_kv_and_match_the_reference(smollm2_all_logits) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    conversations = [
        [
            Turn(chat(tokenizer, "What is the capital of France?"), 24),
            Turn(chat(tokenizer, "And of Germany?", first=False), 24),
            Turn(chat(tokenizer, "Which one is bigger?", first=False), 16),
        ],
        [
            Turn(chat(tokenizer, "Name three colors."), 40),  # ends with EOS before 40
            Turn(chat(tokenizer, "Now three animals.", first=False), 12),
        ],
        [
            Turn(chat(tokenizer, "What is 2+2?"), 10),
            Turn(chat(tokenizer, "And 3+3?", first=False), 10),
        ],
    ]
    ours = check_together_and_alone(ref_model, our_model, conversations)
    reasons = {turn.finish[1] for conversation in ours for turn in conversation}
    assert reasons == {int(ref.FinishReason.EOS), int(ref.FinishReason.MAX_GENERATED_TOKENS)}


def test_a_next_turn_runs_only_its_own_tokens(smollm2) -> None:
    """The KV of earlier turns stays in the request's slot: the scheduler prefills only the
    new turn's tokens (plus the previous turn's last token, chosen but not yet run)."""
    _, model, _ = smollm2
    tokenizer = genai.Tokenizer(model)
    engine = genai.Engine(model)
    buffer = engine.create_event_buffer(8)
    request = engine.create_request()
    first = chat(tokenizer, "What is the capital of France?")
    options = genai.TurnOptions(request)
    options.set_max_generated_tokens(5)
    request.begin_turn(np.asarray(first, np.int32), options)
    while engine.has_pending_requests():
        engine.run(buffer)

    def prefilled() -> float:
        return sum(s.stats["prefill_tokens"] for s in engine._schedulers)

    before = prefilled()
    second = chat(tokenizer, "And of Germany?", first=False)
    request.begin_turn(np.asarray(second, np.int32), options)
    while engine.has_pending_requests():
        engine.run(buffer)
    assert prefilled() - before == len(second) + 1


def test_more_conversations_than_slots_match_the_reference(smollm2_all_logits) -> None:
    """Two slots, four conversations: idle requests give their slot up to waiting ones and
    run their whole conversation again at their next turn, with the same tokens."""
    ref_model, _, folder = smollm2_all_logits
    config = genai.Config(folder)
    config.overlay('{"engine": {"static_batching": {"max_batch_size": 2}}}')
    model = genai.Model(config)
    tokenizer = genai.Tokenizer(model)
    questions = ["Hi!", "What is 1+1?", "Name a fruit.", "Say yes."]
    conversations = [
        [Turn(chat(tokenizer, q), 6), Turn(chat(tokenizer, "Why?", first=False), 6)]
        for q in questions
    ]
    check_together_and_alone(ref_model, model, conversations)
    assert genai.Engine(model).get_capabilities().configured_max_batch_size == 2


def test_gpt2_fixture_matches_the_reference_generator(fixture_folders: dict[str, Path]) -> None:
    """The reference's Engine runs only its decoder-only types (not gpt2): its Generator is
    the check there."""
    folder = fixture_folders["gpt2"]
    conversation = [Turn([1, 2, 3], 6), Turn([7, 8], 5)]
    expected = by_reference_generator(ref.Model(str(folder)), eos_ids(folder), conversation)
    ours = converse(genai, genai.Model(str(folder)), [copy([conversation])[0]])[0]
    assert [(t.generated, t.finish[1]) for t in ours] == expected


def test_default_model_conversations_match_the_reference_generator(default_model) -> None:
    ref_model, our_model, folder = default_model
    tokenizer = genai.Tokenizer(our_model)
    conversations = [
        [
            Turn(chat(tokenizer, "What is the capital of France?"), 16),
            Turn(chat(tokenizer, "And of Germany?", first=False), 16),
        ],
        [
            Turn(chat(tokenizer, "Name three colors."), 40),
            Turn(chat(tokenizer, "Now three animals.", first=False), 12),
        ],
        [Turn(chat(tokenizer, "Hi!"), 8)],
    ]
    eos = eos_ids(folder)
    expected = [by_reference_generator(ref_model, eos, c) for c in conversations]
    ours = alone(genai, our_model, conversations)
    assert [[(t.generated, t.finish[1]) for t in c] for c in ours] == expected
    check_together_as_alone(our_model, conversations)
    assert {r for c in expected for _, r in c} == {
        int(ref.FinishReason.EOS),
        int(ref.FinishReason.MAX_GENERATED_TOKENS),
    }


# --- cancellation, rewinds, session limits, stop strings -------------------------------------
def test_cancel_turn_matches_the_reference(smollm2_all_logits) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    conversation = [
        [
            Turn(chat(tokenizer, "Tell me a long story."), 50, cancel_after=3),
            Turn(chat(tokenizer, "Shorter please.", first=False), 8),
        ]
    ]
    theirs = on_reference_alone(ref_model, conversation)
    ours = converse(genai, our_model, copy(conversation))
    assert without_cached(ours[0]) == without_cached(theirs[0])
    flags, reason, usage, _ = ours[0][0].finish
    assert reason == int(ref.FinishReason.CANCELLED)
    assert flags & int(ref.EngineEventFlags.TURN_FINISHED)
    assert usage[2] == len(ours[0][0].generated) == 3


def test_rewind_to_start_of_turn_matches_the_reference(smollm2_all_logits) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    conversation = [
        [
            Turn(chat(tokenizer, "What is the capital of France?"), 8),
            Turn(chat(tokenizer, "And of Italy?", first=False), 8),
            Turn(chat(tokenizer, "And of Spain?", first=False), 8, rewind_to=2),
            Turn(chat(tokenizer, "What was my first question?"), 8, rewind_to=1),
        ]
    ]
    theirs = on_reference_alone(ref_model, conversation)
    ours = converse(genai, our_model, copy(conversation))
    assert without_cached(ours[0]) == without_cached(theirs[0])


def converse_eagerly(
    og: ModuleType, model: Any, conversations: list[list[Turn]], min_decode_rows: int | None = None
) -> None:
    """`converse`, but each conversation begins its next turn as soon as its turn's last
    event arrives, while the others keep generating."""
    engine = og.Engine(model)
    set_min_decode_rows(engine, min_decode_rows)
    buffer = engine.create_event_buffer(8)
    requests = [engine.create_request() for _ in conversations]
    index = {id(request): i for i, request in enumerate(requests)}
    position = [0] * len(conversations)

    def begin(i: int) -> None:
        turn = conversations[i][position[i]]
        if turn.rewind_to is not None:
            requests[i].rewind_to_start_of_turn(turn.rewind_to)
        options = og.TurnOptions(requests[i])
        options.set_max_generated_tokens(turn.max_generated)
        turn.turn_id = requests[i].begin_turn(np.asarray(turn.tokens, np.int32), options)  # type: ignore[attr-defined]

    for i in range(len(conversations)):
        begin(i)
    while engine.has_pending_requests():
        engine.run(buffer)
        for k in range(len(buffer)):
            event = buffer[k]
            i = index[id(event.request)]
            turn = conversations[i][position[i]]
            assert event.turn_id == turn.turn_id  # type: ignore[attr-defined]
            usage = event.usage
            turn.events.append(
                (
                    int(event.flags),
                    event.token,
                    int(event.finish_reason),
                    (usage.prompt_tokens, usage.cached_prompt_tokens, usage.generated_tokens),
                    event.matched_stop_string_index,
                )
            )
            if event.token is not None and len(turn.generated) == turn.cancel_after:
                assert event.request.cancel_turn(turn.turn_id)  # type: ignore[attr-defined]
            finished = event.flags & og.EngineEventFlags.TURN_FINISHED
            if finished and position[i] + 1 < len(conversations[i]):
                position[i] += 1
                begin(i)
    for request in requests:
        request.close()


def test_reactions_while_another_lanes_step_runs_match_the_reference(
    smollm2_all_logits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two lanes step at their own pace: `run` returns one lane's events while the other's
    step may still run. Cancelling a turn, rewinding and beginning the next turn right
    when an event arrives (the other conversations still generating) gives every
    conversation the tokens it has on the reference alone."""
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    conversations = [
        [
            Turn(chat(tokenizer, "Tell me a long story."), 30, cancel_after=3),
            Turn(chat(tokenizer, "Shorter please.", first=False), 6),
            Turn(chat(tokenizer, "Thanks.", first=False), 3),
        ],
        [
            Turn(chat(tokenizer, "Name three colors."), 24, cancel_after=11),
            Turn(chat(tokenizer, "Now three animals."), 5, rewind_to=1),
        ],
        [
            Turn(chat(tokenizer, "Count from one to twenty."), 20),
            Turn(chat(tokenizer, "Again, slower.", first=False), 4),
        ],
        [
            Turn(chat(tokenizer, "Hi!"), 4),
            Turn(chat(tokenizer, "Who are you?", first=False), 6, cancel_after=2),
            Turn(chat(tokenizer, "Bye.", first=False), 3),
        ],
    ]
    monkeypatch.setenv("GENAI_SERVE_LANES", "2")
    running_after_run = []
    run = genai.Engine.run

    def recording_run(self: Any, buffer: Any) -> Any:
        out = run(self, buffer)
        assert len(self._schedulers) == 2
        running_after_run.append(len(self._inflight))
        return out

    monkeypatch.setattr(genai.Engine, "run", recording_run)
    ours = check_together_and_alone(ref_model, our_model, conversations, converse_eagerly)
    assert ours[0][0].finish[1] == ours[3][1].finish[1] == int(ref.FinishReason.CANCELLED)
    assert any(running_after_run)  # some reactions came while a lane's step was running


def test_max_session_tokens_matches_the_reference(smollm2_all_logits) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    prompt = chat(tokenizer, "What is the capital of France?")
    conversation = [[Turn(prompt, 0)]]
    limit = len(prompt) + 5
    theirs = on_reference_alone(ref_model, conversation, max_session_tokens=limit)
    ours = converse(genai, our_model, copy(conversation), max_session_tokens=limit)
    assert without_cached(ours[0]) == without_cached(theirs[0])
    assert ours[0][0].finish[1] == int(ref.FinishReason.MAX_SESSION_TOKENS)
    assert len(ours[0][0].generated) == 5
    # a full session takes no further turn, with the reference's message
    messages = []
    for og, model in ((ref, ref_model), (genai, our_model)):
        options = og.RequestOptions()
        options.set_max_session_tokens(limit)
        engine = og.Engine(model)
        request = engine.create_request(options=options)
        request.begin_turn(np.asarray(prompt, np.int32))
        buffer = engine.create_event_buffer(4)
        while engine.has_pending_requests():
            engine.run(buffer)
        with pytest.raises(RuntimeError) as info:
            request.begin_turn(np.asarray([42], np.int32))
        messages.append(str(info.value))
    assert messages[1] == messages[0]


def test_stop_strings_end_the_turn_where_the_text_first_contains_one(smollm2_all_logits) -> None:
    """The reference runs stop strings only on paged-attention folders: the independent check
    is its tokens without stop strings, decoded until the text first holds one."""
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = ref.Tokenizer(ref_model)
    prompt = chat(tokenizer, "What is the capital of France?")
    plain = on_reference_alone(ref_model, [[Turn(prompt, 30)]])[0][0].generated
    stops = ["Zanzibar", " is"]
    cut = next(
        k for k in range(1, len(plain) + 1) if any(s in tokenizer.decode(plain[:k]) for s in stops)
    )
    expected_index = next(i for i, s in enumerate(stops) if s in tokenizer.decode(plain[:cut]))
    ours = converse(genai, our_model, [[Turn(prompt, 30, stop_strings=stops)]])[0][0]
    assert ours.generated == plain[:cut]
    flags, reason, usage, index = ours.finish
    assert flags == int(ref.EngineEventFlags.TOKEN | ref.EngineEventFlags.TURN_FINISHED)
    assert reason == int(ref.FinishReason.STOP_STRING)
    assert index == expected_index
    assert usage[2] == cut


# --- events, buffers, threads --------------------------------------------------------------
@pytest.mark.parametrize("capacity", [1, 2, 5])
def test_events_beyond_the_buffer_wait_for_the_next_run(smollm2_all_logits, capacity: int) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    tokens = {}
    for name, og, model in (("reference", ref, ref_model), ("genai", genai, our_model)):
        engine = og.Engine(model)
        buffer = engine.create_event_buffer(capacity)
        requests = []
        for prompt in prompts:
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(3)
            request.begin_turn(np.asarray(prompt, np.int32), options)
            requests.append(request)
        got: list[list[int]] = [[] for _ in prompts]
        full = 0
        while engine.has_pending_requests():
            engine.run(buffer)
            assert len(buffer) <= capacity
            full += len(buffer) == capacity
            if len(buffer):
                assert buffer[-1] is buffer[len(buffer) - 1]
            for k in range(len(buffer)):
                got[requests.index(buffer[k].request)].append(buffer[k].token)
            with pytest.raises(IndexError):
                buffer[capacity]
        assert full > 0 or capacity > len(prompts)
        tokens[name] = got
    assert tokens["genai"] == tokens["reference"]


OTHER_THREAD = {
    "create_request": lambda og, e, r, b: e.create_request(),
    "create_event_buffer": lambda og, e, r, b: e.create_event_buffer(2),
    "run": lambda og, e, r, b: e.run(b),
    "has_pending_requests": lambda og, e, r, b: e.has_pending_requests(),
    "get_capabilities": lambda og, e, r, b: e.get_capabilities(),
    "begin_turn": lambda og, e, r, b: r.begin_turn(np.asarray([1, 2, 3], np.int32)),
    "cancel_turn": lambda og, e, r, b: r.cancel_turn(1),
    "TurnOptions": lambda og, e, r, b: og.TurnOptions(r),
}


@pytest.mark.parametrize("operation", sorted(OTHER_THREAD))
def test_only_the_owner_thread_may_use_an_engine(smollm2, operation: str) -> None:
    """The thread that made the Engine owns it and its requests: another thread gets the
    reference's error, and the owner can go on."""
    errors = []
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        engine = og.Engine(model)
        request = engine.create_request()
        buffer = engine.create_event_buffer(4)
        caught: list[BaseException] = []

        def other(og=og, engine=engine, request=request, buffer=buffer, caught=caught) -> None:
            try:
                OTHER_THREAD[operation](og, engine, request, buffer)
            except RuntimeError as exc:
                caught.append(exc)

        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert len(caught) == 1
        errors.append(str(caught[0]))
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(2)
        request.begin_turn(np.asarray([1, 504, 3575], np.int32), options)
        _drain(engine)
    assert errors[1] == errors[0]


def test_event_objects_and_enumerations_are_the_references(smollm2) -> None:
    ref_model, model, _ = smollm2
    engine = genai.Engine(model)
    request = engine.create_request()
    options = genai.TurnOptions(request)
    options.set_max_generated_tokens(2)
    turn = request.begin_turn(np.asarray([1, 504, 3575], np.int32), options)
    buffer = engine.create_event_buffer(4)
    assert engine.run(buffer) is buffer
    event = buffer[0]
    assert event.request is request and event.turn_id == turn == 1
    assert event.flags == genai.EngineEventFlags.TOKEN
    assert event.finish_reason == genai.FinishReason.NONE
    assert event.error_code == genai.EngineErrorCode.NONE
    assert event.matched_stop_string_index is None
    assert (event.usage.prompt_tokens, event.usage.generated_tokens) == (0, 0)
    for name in ("Engine", "Request", "EngineEvent", "EngineEventBuffer", "TurnUsage"):
        with pytest.raises(TypeError):
            getattr(genai, name)()
    # newer reference examples write og.Request(params): a TypeError saying what to call
    # instead (was "missing 2 required positional arguments: 'options' and '_token'")
    with pytest.raises(TypeError, match=r"use Engine\.create_request\(\)"):
        genai.Request(genai.GeneratorParams(model))
    with pytest.raises(TypeError):
        ref.Request(ref.GeneratorParams(ref_model))


def test_speculative_fields_say_there_is_no_speculation(smollm2) -> None:
    ref_model, our_model, _ = smollm2
    theirs, ours = ref.Engine(ref_model), genai.Engine(our_model)
    assert ours.max_draft_tokens_per_proposal() == theirs.max_draft_tokens_per_proposal() == 0
    assert ours.get_speculative_stats() == theirs.get_speculative_stats()
    request = ours.create_request()
    with pytest.raises(RuntimeError):
        request.set_draft_tokens(np.asarray([5], np.int32))


# --- errors ----------------------------------------------------------------------------------
def _reference_and_ours(smollm2: tuple, script: Any) -> list[tuple[type, str]]:
    """``script(og, model)`` on both modules: the RuntimeError each raises (type, message)."""
    out = []
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        with pytest.raises(RuntimeError) as info:
            script(og, model)
        out.append(str(info.value))
    return out


def _begin(og: ModuleType, model: Any, tokens: Sequence[int] = (1, 504, 3575)) -> tuple:
    engine = _engine(og, model)
    request = engine.create_request()
    turn = request.begin_turn(np.asarray(tokens, np.int32))
    return engine, request, turn


def _drain(engine: Any) -> None:
    buffer = engine.create_event_buffer(8)
    while engine.has_pending_requests():
        engine.run(buffer)


#: Engines the scripts made, kept alive: a reference Request whose Engine is gone says
#: "Cannot use a closed request." to everything.
_ALIVE: list[Any] = []


def _engine(og: ModuleType, model: Any) -> Any:
    engine = og.Engine(model)
    _ALIVE.append(engine)
    return engine


SCRIPTS = {
    "empty prompt": lambda og, m: _engine(og, m).create_request().begin_turn(np.zeros(0, np.int32)),
    "begin while a turn runs": lambda og, m: _begin(og, m)[1].begin_turn(np.asarray([5], np.int32)),
    "rewind while a turn runs": lambda og, m: _begin(og, m)[1].rewind_to_start_of_turn(1),
    "rewind to an unknown turn": lambda og, m: (
        lambda e, r, t: (r.cancel_turn(t), _drain(e), r.rewind_to_start_of_turn(7))
    )(*_begin(og, m)),
    "cancel before a turn": lambda og, m: _engine(og, m).create_request().cancel_turn(1),
    "begin after close": lambda og, m: (
        lambda r: (r.close(), r.begin_turn(np.asarray([5], np.int32)))
    )(_engine(og, m).create_request()),
    "options of a closed request": lambda og, m: (lambda r: (r.close(), og.TurnOptions(r)))(
        _engine(og, m).create_request()
    ),
    "another request's options": lambda og, m: (
        lambda e: e.create_request().begin_turn(
            np.asarray([5], np.int32), og.TurnOptions(e.create_request())
        )
    )(_engine(og, m)),
    "another engine's buffer": lambda og, m: _engine(og, m).run(
        _engine(og, m).create_event_buffer(2)
    ),
    "an empty stop string": lambda og, m: og.TurnOptions(
        _engine(og, m).create_request()
    ).set_stop_strings(["a", ""]),
    "17 stop strings": lambda og, m: og.TurnOptions(
        _engine(og, m).create_request()
    ).set_stop_strings(["a"] * 17),
    "unknown guidance type": lambda og, m: og.TurnOptions(
        _engine(og, m).create_request()
    ).set_guidance("yaml", "x"),
    "rewind before a turn": lambda og, m: (
        _engine(og, m).create_request().rewind_to_start_of_turn(1)
    ),
    "max_session_tokens above search.max_length": lambda og, m: _engine(og, m).create_request(
        options=_session_options(og, 10**9)
    ),
    "min above max generated": lambda og, m: _begin_with(
        og, m, lambda o: (o.set_min_generated_tokens(6), o.set_max_generated_tokens(5))
    ),
    "min beyond the session": lambda og, m: _begin_with(
        og, m, lambda o: o.set_min_generated_tokens(6), session=8
    ),
    "min beyond the context": lambda og, m: _begin_with(
        og, m, lambda o: o.set_min_generated_tokens(2**40)
    ),
    "sampled top_k above the vocabulary": lambda og, m: _begin_with(
        og, m, lambda o: (o.set_do_sample(True), o.set_top_k(10**6))
    ),
}


def _session_options(og: ModuleType, max_session_tokens: int) -> Any:
    options = og.RequestOptions()
    options.set_max_session_tokens(max_session_tokens)
    return options


def _begin_with(og: ModuleType, model: Any, setup: Any, session: int = 0) -> None:
    """Begin a turn of [1, 504, 3575] with ``setup(turn_options)`` (and a session limit)."""
    request = _engine(og, model).create_request(options=_session_options(og, session))
    options = og.TurnOptions(request)
    setup(options)
    request.begin_turn(np.asarray([1, 504, 3575], np.int32), options)


@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_misuse_raises_the_references_error(smollm2, case: str) -> None:
    theirs, ours = _reference_and_ours(smollm2, SCRIPTS[case])
    assert ours == theirs


@pytest.mark.parametrize("kind", ["past-vocab", "negative", "float-negative", "nan", "infinity"])
def test_tokens_outside_the_vocabulary_are_a_value_error(smollm2, kind: str) -> None:
    """genai's own check (the reference runs them: docs/engine.md)."""
    _, model, folder = smollm2
    vocab = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"]
    tokens = {
        "past-vocab": np.asarray([1, vocab], np.int32),
        "negative": np.asarray([-1, 5], np.int32),
        "float-negative": np.asarray([-1.0, 5.0], np.float32),
        "nan": np.asarray([np.nan, 5.0]),
        "infinity": np.asarray([1.0, np.inf]),
    }[kind]
    request = genai.Engine(model).create_request()
    with pytest.raises(ValueError, match="outside the vocabulary|must be finite"):
        request.begin_turn(tokens)


@pytest.mark.parametrize(
    "tokens",
    [
        np.asarray([[1, 504, 3575]], np.int32),
        np.asarray([[1], [504]], np.int32),
        np.asarray([[1.0, 504.0]], np.float32),
        np.zeros((1, 0), np.int32),
        np.int32(5),
    ],
    ids=["1xn", "nx1", "float-1xn", "empty-1x0", "scalar"],
)
def test_tokens_of_any_other_shape_than_n_are_a_value_error(smollm2, tokens: Any) -> None:
    """The reference's binding takes only a one-dimensional array: also not [1, n] (genai took
    [1, n] as [n])."""
    messages = []
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        request = _engine(og, model).create_request()
        with pytest.raises(ValueError, match="one-dimensional") as info:
            request.begin_turn(tokens)
        messages.append(str(info.value))
    assert messages[1].startswith(messages[0].rstrip("."))


@pytest.mark.parametrize(
    ("tokens", "as_int32"),
    [
        (np.asarray([1.0, 504.0, 3575.0], np.float32), [1, 504, 3575]),
        (np.asarray([1.0, 504.9, 3575.5]), [1, 504, 3575]),
        ([1.0, 504.0, 3575.0], [1, 504, 3575]),
        (np.asarray([1, 504, 3575], np.int64), [1, 504, 3575]),
        (np.asarray([True, False, True]), [1, 0, 1]),
    ],
    ids=["float32", "fractional-float64", "float-list", "int64", "bool"],
)
def test_float_tokens_are_cast_as_the_reference_casts_them(
    smollm2_all_logits, tokens: Any, as_int32: list[int]
) -> None:
    """The reference's binding casts a float (or bool) array to int32, floats toward zero, and
    runs it; genai refused them. Both now give the tokens of the cast ids."""
    ref_model, our_model, _ = smollm2_all_logits

    def setup(options: Any) -> None:
        options.set_max_generated_tokens(3)

    theirs = _turn_events(ref, ref_model, tokens, setup)
    assert _turn_events(genai, our_model, tokens, setup) == theirs
    assert theirs == _turn_events(ref, ref_model, np.asarray(as_int32, np.int32), setup)


@pytest.mark.parametrize(
    "script",
    [
        lambda og, m: _engine(og, m).create_event_buffer(-1),
        lambda og, m: og.RequestOptions().set_max_session_tokens(-1),
        lambda og, m: og.TurnOptions(_engine(og, m).create_request()).set_max_generated_tokens(-1),
        lambda og, m: _engine(og, m).run(None),
        lambda og, m: og.TurnOptions(_engine(og, m).create_request()).set_seed(2**64 + 5),
        lambda og, m: og.RequestOptions().set_max_session_tokens(2**64),
        lambda og, m: og.TurnOptions(_engine(og, m).create_request()).set_top_k(2**31),
        lambda og, m: og.TurnOptions(_engine(og, m).create_request()).set_no_repeat_ngram_size(
            2**31
        ),
        lambda og, m: og.TurnOptions(_engine(og, m).create_request()).set_stop_strings(
            ["a\ud800b"]
        ),
    ],
    ids=[
        "capacity",
        "session",
        "max-generated",
        "run-none",
        "seed-above-uint64",
        "session-above-uint64",
        "top-k-above-int32",
        "ngram-above-int32",
        "stop-string-lone-surrogate",
    ],
)
def test_negative_counts_and_wrong_types_are_type_errors(smollm2, script: Any) -> None:
    """What the reference's binding cannot convert (a negative or too large int for its
    uint64 / int32 argument, a str with a lone surrogate) is a TypeError; genai wrapped a seed
    above 2**64 - 1 and took the rest."""
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        with pytest.raises(TypeError):
            script(og, model)


def test_the_largest_seed_is_taken_as_the_reference_takes_it(smollm2) -> None:
    """2**64 - 1 (uint64's largest) is a seed in both; genai's seeds a repeatable turn."""
    ref_model, model, _ = smollm2
    prompt = np.asarray([1, 504, 3575], np.int32)
    ref.TurnOptions(_engine(ref, ref_model).create_request()).set_seed(2**64 - 1)

    def setup(options: Any) -> None:
        options.set_do_sample(True)
        options.set_max_generated_tokens(3)
        options.set_seed(2**64 - 1)

    events = _turn_events(genai, model, prompt, setup)
    assert len(events) == 3 and events[-1][2] == int(genai.FinishReason.MAX_GENERATED_TOKENS)
    assert _turn_events(genai, model, prompt, setup) == events


def test_a_stop_string_with_a_nul_byte_is_the_references_value_error(smollm2) -> None:
    messages = []
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        options = og.TurnOptions(_engine(og, model).create_request())
        with pytest.raises(ValueError) as info:
            options.set_stop_strings(["ok", "a\0b"])
        messages.append(str(info.value))
    assert messages[1] == messages[0]


def test_streaming_processor_needs_a_streaming_speech_model(smollm2) -> None:
    messages = []
    for og, model in ((ref, smollm2[0]), (genai, smollm2[1])):
        with pytest.raises(RuntimeError) as info:
            og.StreamingProcessor(model)
        messages.append(str(info.value))
    assert messages[1] == messages[0]


def test_idle_conversations_do_not_widen_the_decode_steps(smollm2_all_logits) -> None:
    """Requests waiting between turns keep their KV but move behind the running ones: a step
    runs only the running rows (and the tokens still match the reference)."""
    ref_model, our_model, _ = smollm2_all_logits
    tokenizer = genai.Tokenizer(our_model)
    engine = genai.Engine(our_model)
    buffer = engine.create_event_buffer(64)
    idle = [engine.create_request() for _ in range(6)]
    for k, request in enumerate(idle):
        options = genai.TurnOptions(request)
        options.set_max_generated_tokens(2)
        request.begin_turn(np.asarray(chat(tokenizer, f"Question {k}?"), np.int32), options)
    while engine.has_pending_requests():
        engine.run(buffer)
    prompt = chat(tokenizer, "What is the capital of France?")
    busy = engine.create_request()
    options = genai.TurnOptions(busy)
    options.set_max_generated_tokens(12)
    busy.begin_turn(np.asarray(prompt, np.int32), options)
    rows = [s.stats["decode_rows"] for s in engine._schedulers]
    steps = [s.stats["decode_steps"] for s in engine._schedulers]
    got = []
    while engine.has_pending_requests():
        engine.run(buffer)
        got += [buffer[i].token for i in range(len(buffer))]
    widths = [
        (s.stats["decode_rows"] - r) / max(1, s.stats["decode_steps"] - n)
        for s, r, n in zip(engine._schedulers, rows, steps, strict=True)
    ]
    assert max(widths) == 1  # the one running row
    expected = on_reference_alone(ref_model, [[Turn(prompt, 12)]])[0][0].generated
    assert got == expected


# --- turn options ----------------------------------------------------------------------------
def _one_turn(og: ModuleType, model: Any, prompt: list[int], setup: Any) -> tuple:
    engine = og.Engine(model)
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(24)
    setup(options)
    request.begin_turn(np.asarray(prompt, np.int32), options)
    tokens, finish = [], None
    buffer = engine.create_event_buffer(32)
    while engine.has_pending_requests():
        engine.run(buffer)
        for i in range(len(buffer)):
            event = buffer[i]
            if event.token is not None:
                tokens.append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                finish = (int(event.finish_reason), event.usage.generated_tokens)
    return tokens, finish


@pytest.mark.parametrize(
    "setup",
    [
        lambda o: o.set_guidance("regex", "[0-9]{3}"),
        lambda o: o.set_min_generated_tokens(20),
        lambda o: (o.set_do_sample(True), o.set_top_k(1)),
        lambda o: (o.set_repetition_penalty(1.3), o.set_no_repeat_ngram_size(3)),
    ],
    ids=["regex-guidance", "min-generated", "top-k-1-sampling", "penalties"],
)
def test_turn_options_match_the_reference(smollm2_all_logits, setup: Any) -> None:
    ref_model, our_model, _ = smollm2_all_logits
    prompt = chat(ref.Tokenizer(ref_model), "Give me a number.")
    assert _one_turn(genai, our_model, prompt, setup) == _one_turn(ref, ref_model, prompt, setup)


def _turn_events(
    og: ModuleType, model: Any, tokens: Any, setup: Any, *, max_session_tokens: int = 0
) -> list[tuple[int, int | None, int, int]]:
    """One turn of ``tokens`` with ``setup(turn_options)``: every event as (flags, token,
    finish reason, generated tokens)."""
    engine = og.Engine(model)
    options = og.RequestOptions()
    options.set_max_session_tokens(max_session_tokens)
    request = engine.create_request(options=options)
    turn_options = og.TurnOptions(request)
    setup(turn_options)
    request.begin_turn(tokens, turn_options)
    buffer = engine.create_event_buffer(32)
    events = []
    while engine.has_pending_requests():
        engine.run(buffer)
        for i in range(len(buffer)):
            event = buffer[i]
            events.append(
                (
                    int(event.flags),
                    event.token,
                    int(event.finish_reason),
                    event.usage.generated_tokens,
                )
            )
    request.close()
    return events


@pytest.mark.parametrize(
    ("max_generated", "session_room"),
    [(0, 0), (3, 0), (2, 0), (0, 3), (3, 3)],
    ids=["grammar-ends", "grammar-ends-at-max", "max-first", "grammar-ends-at-session", "both"],
)
def test_a_completed_grammar_ends_the_turn_as_the_reference_does(
    smollm2_all_logits, max_generated: int, session_room: int
) -> None:
    """The grammar's last token is a TOKEN event and the end a TURN_FINISHED of its own (token
    None, EOS: the reference samples the EOS the grammar forces next); when that last token
    reaches max_generated_tokens or max_session_tokens, the reason is that limit. genai sent
    one TOKEN|TURN_FINISHED event with EOS in every case."""
    ref_model, our_model, _ = smollm2_all_logits
    prompt = np.asarray(chat(ref.Tokenizer(ref_model), "Give me a number."), np.int32)
    session = len(prompt) + session_room if session_room else 0

    def setup(options: Any) -> None:
        options.set_guidance("regex", "[0-9]{3}")
        options.set_max_generated_tokens(max_generated)

    theirs = _turn_events(ref, ref_model, prompt, setup, max_session_tokens=session)
    ours = _turn_events(genai, our_model, prompt, setup, max_session_tokens=session)
    assert ours == theirs
    if (max_generated, session_room) == (0, 0):  # what the reference's events say
        assert [flags for flags, *_ in theirs] == [1, 1, 1, 2]
        assert theirs[-1][1:] == (None, int(ref.FinishReason.EOS), 3)


#: Turn options on the folder's search defaults (greedy: do_sample false, top_k 50,
#: temperature 1), and whether the reference takes them: it refuses sampling options that a
#: turn resolved to the top logit would ignore, and takes their neutral values.
GREEDY_POLICY = {
    "top_k": ([("top_k", 5)], False),
    "top_k-50": ([("top_k", 50)], False),
    "top_p": ([("top_p", 0.5)], False),
    "temperature": ([("temperature", 2.0)], False),
    "all-three": ([("top_k", 5), ("top_p", 0.5), ("temperature", 0.7)], False),
    "do_sample-false": ([("do_sample", False), ("top_k", 5)], False),
    "do_sample-top_k-1": ([("do_sample", True), ("top_k", 1), ("top_p", 0.5)], False),
    "do_sample-temperature-0": ([("do_sample", True), ("temperature", 0.0), ("top_k", 5)], False),
    "before-min-above-max": (
        [("min_generated_tokens", 6), ("max_generated_tokens", 5), ("top_k", 5)],
        False,
    ),
    "neutral-values": ([("top_k", 1), ("top_p", 1.0), ("temperature", 1.0)], True),
    "neutral-zeros": ([("top_k", 0), ("top_p", 0.0), ("temperature", 0.0)], True),
    "sampled": ([("do_sample", True), ("top_k", 5), ("top_p", 0.5), ("temperature", 0.5)], True),
    "greedy-by-choice": ([("do_sample", True), ("temperature", 0.0), ("top_k", 1)], True),
}


def _policy_outcome(og: ModuleType, model: Any, calls: list[tuple[str, Any]]) -> str:
    """``begin_turn`` after ``calls`` (setter name, value): "ok" or the RuntimeError's text."""
    request = _engine(og, model).create_request()
    options = og.TurnOptions(request)
    for name, value in calls:
        getattr(options, f"set_{name}")(value)
    try:
        request.begin_turn(np.asarray([1, 504, 3575], np.int32), options)
    except RuntimeError as exc:
        return str(exc)
    request.cancel_turn(1)
    return "ok"


@pytest.mark.parametrize("case", sorted(GREEDY_POLICY))
def test_sampling_options_on_a_greedy_turn_are_refused_as_the_reference(smollm2, case) -> None:
    ref_model, our_model, _ = smollm2
    calls, accepted = GREEDY_POLICY[case]
    theirs = _policy_outcome(ref, ref_model, calls)
    assert _policy_outcome(genai, our_model, calls) == theirs
    assert (theirs == "ok") == accepted


@pytest.fixture(scope="module")
def greedy_defaults(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The smollm2 folder with search defaults ``do_sample: true, top_k: 1`` (copied: genai
    refuses files that link out of the folder)."""
    folder = tmp_path_factory.mktemp("greedy-defaults")
    for source in Path(smollm2_path).iterdir():
        if source.is_file():
            shutil.copy(source, folder / source.name)
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"].update(do_sample=True, top_k=1)
    (folder / "genai_config.json").write_text(json.dumps(config))
    return ref.Model(str(folder)), genai.Model(str(folder))


@pytest.mark.parametrize(
    "calls",
    [
        [("do_sample", True)],
        [("do_sample", True), ("temperature", 0.5)],
        [("temperature", 0.5)],
        [("top_k", 5)],
        [("do_sample", True), ("temperature", 0.0)],
        [("do_sample", False), ("top_k", 5)],
    ],
    ids=["do_sample", "do_sample-temperature", "temperature", "top_k", "own-zero", "off"],
)
def test_do_sample_overruled_by_the_folders_defaults_is_refused_as_the_reference(
    greedy_defaults, calls
) -> None:
    """do_sample=true that only the folder's top_k = 1 makes greedy is refused, naming the
    default; the options the turn sets decide otherwise."""
    ref_model, our_model = greedy_defaults
    theirs = _policy_outcome(ref, ref_model, calls)
    assert _policy_outcome(genai, our_model, calls) == theirs


def test_a_turn_seed_makes_sampling_repeatable(smollm2) -> None:
    """The reference takes per-turn seeds only on paged folders; genai on every folder."""
    _, model, _ = smollm2
    prompt = chat(genai.Tokenizer(model), "Tell me a story.")

    def sampled(seed: int) -> list[int]:
        def setup(options: Any) -> None:
            options.set_do_sample(True)
            options.set_temperature(1.5)
            options.set_seed(seed)

        return _one_turn(genai, model, prompt, setup)[0]

    first = sampled(7)
    assert sampled(7) == first
    assert any(sampled(seed) != first for seed in (8, 9, 10))


def test_a_failed_model_run_ends_the_turn_as_the_reference_reports_it(default_model) -> None:
    """The reference's Engine fails on the default model's graph (last-position logits): its
    event is the check for genai's when a model run raises (injected here)."""
    ref_model, our_model, _ = default_model
    reported = []
    for og, model in ((ref, ref_model), (genai, our_model)):
        engine = og.Engine(model)
        if og is genai:
            for runner in engine._runners:
                runner.prefill = _raise_runtime_error
        request = engine.create_request()
        request.begin_turn(np.asarray([1, 2, 3], np.int32))
        buffer = engine.create_event_buffer(8)
        events = []
        while engine.has_pending_requests():
            engine.run(buffer)
            events += [buffer[i] for i in range(len(buffer))]
        reported.append(
            [
                (
                    int(e.flags),
                    e.token,
                    int(e.finish_reason),
                    int(e.error_code),
                    (e.usage.prompt_tokens, e.usage.generated_tokens),
                )
                for e in events
            ]
        )
        with pytest.raises(RuntimeError):  # neither continues a failed request
            request.begin_turn(np.asarray([5], np.int32))
    assert reported[1] == reported[0]
    assert reported[0][0][3] == int(ref.EngineErrorCode.ENGINE_EXECUTION_FAILURE)


def _raise_runtime_error(*args: Any) -> NoReturn:
    raise RuntimeError("injected model failure")


def test_turns_and_rewinds_on_fixture_models_match_the_reference(fixture_pair) -> None:
    """Both batch runners (shared-buffer slots; one Generator per slot for `optimum`) keep,
    continue and rewind a conversation as the reference does."""
    ref_model, our_model = fixture_pair
    conversations = [
        [Turn([1, 2, 3], 5), Turn([7, 8], 4), Turn([9], 4, rewind_to=2), Turn([4, 4], 3)],
        [Turn([5, 9, 13], 6), Turn([2, 20, 4], 6, cancel_after=2), Turn([11], 5)],
    ]
    theirs = on_reference_alone(ref_model, conversations)
    ours = converse(genai, our_model, copy(conversations))
    for a, b in zip(theirs, ours, strict=True):
        assert without_cached(b) == without_cached(a)


@pytest.mark.parametrize("case", ["nan-temperature", "bad-schema"])
def test_bad_turn_options_are_runtime_errors_as_the_reference(smollm2, case) -> None:
    """A NaN sampling option or a schema that does not compile is a RuntimeError in both
    engines (genai's were ValueErrors: code catching the reference's RuntimeError missed them)."""

    def script(og: ModuleType, model: Any) -> None:
        engine = _engine(og, model)
        request = engine.create_request()
        options = og.TurnOptions(request)
        if case == "nan-temperature":
            options.set_do_sample(True)
            options.set_temperature(float("nan"))
        else:
            options.set_guidance("json_schema", '{"type": "object", "properties": 5}')
        request.begin_turn(np.asarray([1, 504, 3575], np.int32), options)
        _drain(engine)

    _reference_and_ours(smollm2, script)


def test_a_session_past_a_lowered_context_length_is_refused(fixture_folders) -> None:
    """A folder whose search.max_length exceeds an overlaid context_length loads (as the
    reference); a request may not ask for a session past the context (it used to be clamped
    without a word)."""
    config = genai.Config(str(fixture_folders["gqa"]))
    config.overlay('{"model": {"context_length": 32}, "search": {"max_length": 64}}')
    engine = genai.Engine(genai.Model(config))
    options = genai.RequestOptions()
    options.set_max_session_tokens(48)
    with pytest.raises(genai.GenerationError, match=r"context_length \(32\)"):
        engine.create_request(options=options)
    options.set_max_session_tokens(32)
    assert engine.create_request(options=options) is not None
