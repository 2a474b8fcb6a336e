"""Decode drivers: what runs each kind of model's graphs for a `genai.Generator`.

`Driver` is the protocol (`genai.generation.drivers.base`); `make_driver` is the one place
that picks an implementation by the kind of model:

* a decoder split over several graphs (``model.decoder.pipeline``): `PipelineDriver`;
* a vision-language model (``model.vision`` + ``model.embedding``): `VisionDriver`;
* an encoder-decoder model (``model.encoder``: Whisper): `EncoderDecoderDriver`;
* a QNN-style windowed model (``sliding_window.slide_key_value_cache``): `WindowedDriver`;
* any other single-graph decoder: `NativeDriver` (the native loop runs it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genai.generation.drivers.base import Driver, LoopSettings, new_loop, require
from genai.generation.drivers.encoder_decoder import EncoderDecoderDriver
from genai.generation.drivers.multimodal import VisionDriver
from genai.generation.drivers.native import NativeDriver
from genai.generation.drivers.pipeline import PipelineDriver
from genai.generation.drivers.windowed import WindowedDriver
from genai.kv.windowed_cache import sliding_window_spec

if TYPE_CHECKING:
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = [
    "Driver",
    "EncoderDecoderDriver",
    "LoopSettings",
    "NativeDriver",
    "PipelineDriver",
    "VisionDriver",
    "WindowedDriver",
    "make_driver",
    "new_loop",
    "require",
]


def make_driver(model: Model, search: SearchOptions, settings: LoopSettings) -> Driver:
    """The driver for ``model``'s kind, for a generator with ``search`` options whose loop
    takes ``settings``. Raises `genai.errors.SearchOptionError` for search options the model
    kind cannot run (a windowed model: beam search, batches it cannot align)."""
    if model.pipeline is not None:
        return PipelineDriver(model, settings, search)
    if model.vision is not None:
        return VisionDriver(model, settings, search)
    # Each generator binds its own buffers: it gets its own binding on the shared session.
    session = model.session.new_binding()
    # Inputs beyond ids/mask/positions/KV that every run needs (e.g. LoRA weights, bound to
    # their empty base values until an adapter is activated).
    model.bind_extra_inputs(session)
    if model.encoder is not None:
        return EncoderDecoderDriver(model, session, settings, search)
    window = sliding_window_spec(model.config, model.io, session)
    if window is not None:
        window.check_search(batch_size=search.batch_size, num_beams=search.num_beams)
        return WindowedDriver(model, session, settings, window)
    return NativeDriver(model, session, settings, search)
