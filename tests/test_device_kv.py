"""KV cache kept in device memory by a provider placing ``kv_cache`` on its device. Growing
layout: presents are ORT-allocated where the session produces them and handed over as pasts
without a host round trip; reads, rewinds and beam reorders copy through the host. Shared
layout (``Placement(allocator="session")``): the buffers are DeviceTensors placed where the
session wants the pasts, bound as past and present; growth, reads, rewinds and snapshots copy
through the host, beam reorders are refused (they need host memory).

On this CPU-only machine the session's "device" memory for those outputs is host memory, but
the path is the device one: memory infos from the session, CopyTensors for every read. The
GPU side of the same code runs in the WebGPU conformance (scripts/conformance_all.sh)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import genai
from genai.providers import Placement
from genai.testing.models import write_gpt2_decoder, write_gqa_decoder

PROMPT = np.array([5, 9, 3, 17, 2, 11], dtype=np.int32)


def _model(folder, device_kv: bool) -> genai.Model:
    model = genai.Model(folder)
    if device_kv:
        provider = copy.copy(model.provider)
        provider.placement = Placement(kv_cache="device-under-test")
        model.provider = provider
    return model


def _generate(model, new_tokens=12, **search):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + new_tokens, **search)
    gen = genai.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return gen


@pytest.fixture(scope="module", params=["gqa", "gpt2"])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("devkv")
    if request.param == "gqa":
        return write_gqa_decoder(root, share_buffer=False)
    return write_gpt2_decoder(root)


def test_device_kv_is_used_and_tokens_match(folder):
    host = _generate(_model(folder, False))
    device = _generate(_model(folder, True))
    assert device._kv.device_memory and not host._kv.device_memory
    np.testing.assert_array_equal(device.get_sequence(0), host.get_sequence(0))
    # Reads copy the device values back (CopyTensors), equal to the host layout's.
    name = device._kv.pasts[0]
    np.testing.assert_array_equal(
        device._session.input_value(name), host._session.input_value(name)
    )
    present = device._kv.presents[0]
    np.testing.assert_allclose(device.get_output(present), host.get_output(present), atol=0)


def test_device_kv_rewind_and_beams(folder):
    full = _generate(_model(folder, False)).get_sequence(0)
    model = _model(folder, True)
    gen = _generate(model)
    gen.rewind_to(len(PROMPT) + 4)
    gen.append_tokens(full[len(PROMPT) + 4 : len(PROMPT) + 6])
    while not gen.is_done():
        gen.generate_next_token()
    np.testing.assert_array_equal(gen.get_sequence(0), full)
    beams_host = _generate(_model(folder, False), num_beams=3, num_return_sequences=2)
    beams_device = _generate(model, num_beams=3, num_return_sequences=2)
    for i in range(2):
        np.testing.assert_array_equal(beams_device.get_sequence(i), beams_host.get_sequence(i))


# --- the shared-buffer layout in device memory -------------------------------------------------


def _shared_model(folder, device_kv: bool) -> genai.Model:
    model = genai.Model(folder)
    if device_kv:
        provider = copy.copy(model.provider)
        provider.placement = Placement(kv_cache="device-under-test", allocator="session")
        provider.device = "device-under-test"
        model.provider = provider
    return model


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory):
    return write_gqa_decoder(tmp_path_factory.mktemp("devkv-shared"), share_buffer=True)


def test_shared_device_kv_buffers_are_device_tensors(shared_folder):
    from genai._core.native_session import DeviceTensor

    host = _generate(_shared_model(shared_folder, False), kv_initial_capacity=4)
    device = _generate(_shared_model(shared_folder, True), kv_initial_capacity=4)
    buffers = device._kv._buffers
    assert buffers and all(isinstance(b, DeviceTensor) and b.placed for b in buffers)
    assert device._kv.capacity > 4  # grown: copied through the host into new tensors
    np.testing.assert_array_equal(device.get_sequence(0), host.get_sequence(0))
    name = "present.0.key"
    np.testing.assert_array_equal(device.get_output(name), host.get_output(name))


def test_shared_device_kv_snapshot_restore(shared_folder):
    model = _shared_model(shared_folder, True)
    full = _generate(_shared_model(shared_folder, False)).get_sequence(0)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 12, kv_initial_capacity=4)
    base = genai.Generator(model, params)
    base.append_tokens(PROMPT)
    snapshot = base.snapshot()
    gen = genai.Generator(model, params)
    gen.restore(snapshot)  # loaded through the host into new device tensors
    while not gen.is_done():
        gen.generate_next_token()
    np.testing.assert_array_equal(gen.get_sequence(0), full)


def test_shared_device_kv_rewind_and_restore(shared_folder):
    full = _generate(_shared_model(shared_folder, False)).get_sequence(0)
    model = _shared_model(shared_folder, True)
    gen = _generate(model, kv_initial_capacity=4)
    gen.rewind_to(len(PROMPT) + 4)
    gen.append_tokens(full[len(PROMPT) + 4 : len(PROMPT) + 6])
    while not gen.is_done():
        gen.generate_next_token()
    np.testing.assert_array_equal(gen.get_sequence(0), full)
    # Beam reorders: through the host where SharedKVCache moves device tensors that way, else
    # refused with a message naming the layout that works
    beams_host = _generate(_shared_model(shared_folder, False), num_beams=3, num_return_sequences=2)
    try:
        beams_device = _generate(model, num_beams=3, num_return_sequences=2)
    except NotImplementedError as exc:
        assert "past_present_share_buffer=false" in str(exc)
    else:
        for i in range(2):
            np.testing.assert_array_equal(beams_device.get_sequence(i), beams_host.get_sequence(i))
