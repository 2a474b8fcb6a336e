"""Multimodal inputs: the reference's ``og.Audios``, ``og.Images`` and ``og.MultiModalProcessor``.

A model whose prompt carries more than text (speech: Whisper; vision-language models) is fed
through one path, as in the reference::

    processor = model.create_multimodal_processor()      # a MultiModalProcessor
    inputs = processor(prompt, images=..., audios=...)   # NamedTensors
    generator.set_inputs(inputs)                         # the driver takes them

The parts:

* `genai.multimodal.audios.Audios` / `genai.multimodal.images.Images`: decoded media
  (``open(*paths)``, ``open_bytes(*blobs)``);
* `genai.multimodal.processor.MultiModalProcessor`: the public processor. It owns the
  model's `genai.Tokenizer` (``decode``, ``create_stream``), checks the argument types and
  hands the call to the model kind's processor;
* `genai.multimodal.kinds.PROCESSORS`: ``model.type`` -> the factory of that kind's
  processor. **This table is the only place a kind is named**;
* a kind's processor (e.g. `genai.multimodal.whisper.WhisperProcessor`) turns the prompt(s)
  and media into the `NamedTensors` its driver takes in `genai.Generator.set_inputs`, under
  the reference's nominal names (``input_ids``, ``audio_features``, ``pixel_values``, ...).

How a new kind (e.g. a vision-language model) plugs in, without editing the code above:

1. write its processor in a module of this package: a callable object made by
   ``factory(model)`` whose ``__call__(tokenizer, prompt, *, images=None, audios=None)``
   returns `NamedTensors` (`KindProcessor` in `genai.multimodal.processor` is the protocol;
   ``prompt`` is a str, a list of str or None; refuse media the kind does not take with
   `genai.errors.InvalidArgumentError`);
2. add one entry to `genai.multimodal.kinds.PROCESSORS` (``"phi3v": factory``);
3. give its ``model.type`` a driver whose ``set_inputs(named_tensors)`` takes that output
   and returns the token ids to append (`genai.generation.drivers`, one branch in
   ``make_driver``).

Audio features follow the pipeline a speech model's ``audio_processor_config.json`` names
(`genai.multimodal.audio_features`); long recordings are cut into 30-second windows by
`genai.multimodal.transcribe`.
"""

from __future__ import annotations

from genai.multimodal.audios import Audios
from genai.multimodal.images import Images
from genai.multimodal.kinds import PROCESSORS
from genai.multimodal.processor import KindProcessor, MultiModalProcessor

__all__ = ["PROCESSORS", "Audios", "Images", "KindProcessor", "MultiModalProcessor"]
