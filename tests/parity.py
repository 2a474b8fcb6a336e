"""Run the same greedy generation on our engine and on the reference, for side-by-side tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Run:
    """What one engine produced: sequences, per-step next tokens and (optionally) logits."""

    sequences: list[np.ndarray]
    next_tokens: list[np.ndarray] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    token_count: int = 0


def greedy(
    engine: Any,
    model: Any,
    prompt: np.ndarray,
    max_length: int,
    *,
    keep_logits: bool = False,
    **options: Any,
) -> Run:
    """Greedy-generate with ``engine`` (``genai`` or ``onnxruntime_genai``) up to max_length."""
    batch = prompt.shape[0] if prompt.ndim == 2 else 1
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=batch, **options)
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    run = Run(sequences=[])
    if keep_logits:
        run.logits.append(np.array(generator.get_logits()))
    while not generator.is_done():
        generator.generate_next_token()
        run.next_tokens.append(np.array(generator.get_next_tokens()))
        if keep_logits and not generator.is_done():
            generator_logits(generator, run)
    run.sequences = [np.array(generator.get_sequence(i)) for i in range(batch)]
    run.token_count = generator.token_count()
    return run


def chat_reply(engine: Any, folder: str | Path, question: str, new_tokens: int) -> str:
    """``engine``'s greedy reply (``new_tokens`` at most) to one user message ``question``
    through the folder's chat template."""
    model = engine.Model(str(folder))
    tokenizer = engine.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": question}])
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    run = greedy(engine, model, prompt, len(prompt) + new_tokens)
    return tokenizer.decode(run.sequences[0][len(prompt) :])


def generator_logits(generator: Any, run: Run) -> None:
    """Record the logits for the pending token (the reference computes them lazily)."""
    run.logits.append(np.array(generator.get_logits()))


def assert_same_run(ours: Run, ref: Run) -> None:
    """Tokens identical: sequences, per-step next tokens and token counts."""
    assert ours.token_count == ref.token_count
    assert len(ours.sequences) == len(ref.sequences)
    for row, (a, b) in enumerate(zip(ours.sequences, ref.sequences, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"sequence {row} differs")
    assert len(ours.next_tokens) == len(ref.next_tokens)
    for step, (a, b) in enumerate(zip(ours.next_tokens, ref.next_tokens, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"next tokens differ at step {step}")


def folder(path: Path) -> str:
    """The reference wants a str path."""
    return str(path)
