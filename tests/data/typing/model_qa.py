"""onnxruntime-genai's model-qa loop and the calls its users write around it: `mypy --strict`
must pass them (tests/test_typing.py). Checked only, never run.

`assert_type` pins the types genai returns (a bare `np.ndarray` checks as
``ndarray[Any, dtype[Any]]`` and fails it); a call followed by ``# type: ignore[arg-type]`` must
be refused (mypy --strict reports an ignore that is not needed)."""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt
from typing_extensions import assert_type

import genai as og

config = og.Config("/models/smollm2")
config.clear_providers()
config.append_provider("cuda")
config.set_provider_option("cuda", "enable_cuda_graph", "0")
model = og.Model(config)
tokenizer = og.Tokenizer(model)
og.Tokenizer(config)  # a Config or a folder path too, as the reference
og.Tokenizer("/models/smollm2")
og.Tokenizer(3.5)  # type: ignore[arg-type]
tokenizer_stream = tokenizer.create_stream()

messages = json.dumps([{"role": "user", "content": "Hi"}])
prompt: str = tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True)
input_tokens = tokenizer.encode(prompt)
assert_type(input_tokens, npt.NDArray[np.int32])
assert_type(tokenizer.eos_token_ids, npt.NDArray[np.int32])

params = og.GeneratorParams(model)
params.set_search_options(max_length=64, top_k=40, stop=["\n\n"])
search: dict[str, float | bool | list[str]] = params.get_search_options()
stop = search["stop"]  # a list of str when set
assert isinstance(stop, list)
stops: list[str] = stop

generator = og.Generator(model, params)
generator.append_tokens(input_tokens)
generator.append_tokens(og.Tensor(np.array([1, 2, 3], np.int32)))  # the reference's overload
generator.append_tokens((1, 2, 3))
generator.append_tokens(range(4, 8))
generator.append_tokens([np.int32(5), np.int32(9)])
generator.append_tokens([[1, 2], [3, 4]])
new_tokens: list[int] = []
while not generator.is_done():
    generator.generate_next_token()
    next_tokens: npt.NDArray[np.int32] = generator.get_next_tokens()
    new_tokens.append(int(next_tokens[0]))
    piece: str = tokenizer_stream.decode(next_tokens[0])
    print(piece + tokenizer_stream.decode(np.int32(5)), end="", flush=True)

assert_type(generator.get_next_tokens(), npt.NDArray[np.int32])
assert_type(generator.get_sequence(np.int64(0)), npt.NDArray[np.int32])
logits = generator.get_logits()
assert_type(logits, npt.NDArray[np.float32])
generator.set_logits(logits * np.float32(0.5))
chosen, top_ids, top_logprobs = generator.get_next_logprobs()
assert_type(chosen, npt.NDArray[np.float32])
assert_type(top_ids, npt.NDArray[np.int32])
assert_type(top_logprobs, npt.NDArray[np.float32])
sequence: npt.NDArray[np.int32] = generator.get_sequence(0)
print(tokenizer.decode(sequence[len(input_tokens) :]), tokenizer.decode(new_tokens))
generator.rewind_to(np.int64(generator.token_count() - len(new_tokens)))
generator.truncate(3)
reason: og.FinishReason = generator.finish_reason()
generator.set_inputs("pixels")  # type: ignore[arg-type]

mtp = og.MtpGenerator(model, model, params)
mtp.append_tokens((1, 2, 3))
assert_type(mtp.get_sequence(), npt.NDArray[np.int32])
