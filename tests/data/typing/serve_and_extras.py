"""Serving (docs/serving.md), multimodal inputs, providers and the NumPy sampling twin, as
their docs show them: `mypy --strict` must pass them (tests/test_typing.py). Checked only,
never run. A call followed by ``# type: ignore[arg-type]`` must be refused (mypy --strict
reports an ignore that is not needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI
from typing_extensions import assert_type

import genai as og
import genai.serve
from genai._core import sampling_reference
from genai.serve import ServeEngine, create_app, run_server

engine = ServeEngine.from_path("/models/smollm2", max_slots=2)
assert_type(create_app(engine, api_key="secret"), FastAPI)
assert_type(engine.model, og.Model)
assert_type(engine.tokenizer, og.Tokenizer)
ServeEngine(engine.model, engine.tokenizer, max_slots=2)
assert_type(run_server(engine, port=8000), int | None)
lazy: FastAPI = genai.serve.create_app(genai.serve.ServeEngine.from_path("/models/smollm2"))

vision = og.Model("/models/phi3v")
processor = vision.create_multimodal_processor()
inputs = processor("<|image_1|>\nwhat is it?", images=og.Images.open(Path("stripes.png")))
speech = og.Model("/models/whisper").create_multimodal_processor()
features = speech("<|startoftranscript|>", audios=og.Audios.open("talk.wav"))
processor("<|image_1|>", images="stripes.png")  # type: ignore[arg-type]
assert_type(vision.create_streaming_processor(), og.StreamingProcessor)
params = og.GeneratorParams(vision)
generator = og.Generator(vision, params)
generator.set_inputs(inputs)
print(processor.decode((1, 2, 3)), processor.decode(generator.get_sequence(0)))

og.register_execution_provider_library("example", Path("libexample_ep.so"))
og.unregister_execution_provider_library("example")

sampler = sampling_reference.Sampler(2, 8, seed=1)
sampler.configure(do_sample=True, top_k=4)
sampler.set_logit_bias(0, [1, 2], [0.5, -0.5])
sampler.seed(3, row=1)
logits = np.zeros((2, 8), np.float32)
sequences = np.zeros((2, 4), np.int32)
out = np.zeros(2, np.int32)
chosen = sampler.sample_batch(logits, sequences, 1, [7], out, prompt_lengths=1)
assert_type(chosen, npt.NDArray[np.int32])
assert_type(sampler.rng.draw(), npt.NDArray[np.float64])
temperature: float = sampler.options(0)["temperature"]
