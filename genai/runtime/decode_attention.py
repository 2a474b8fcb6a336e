"""Whether genai's op may compute single query rows of GroupQueryAttention itself.

onnxruntime's CPU GroupQueryAttention takes 60-80 us a layer for one query row of a small
model (docs/benchmarks.md), about a fifth of a decode step, much of it around the arithmetic.
genai's ``ChunkedGroupQueryAttention`` (`genai._core.custom_ops`) can compute such rows itself
(`decode_attention_kernels.h`: onnxruntime 1.32's decode arithmetic, reproduced), for decode
steps of one sequence and speculative verify rows; it does so for a node that carries
``genai_exact_decode`` = 1, which `chunked_attention.chunk_attention` sets where `exact` says
the kernel gives onnxruntime's bits for that node's setting with the session's threads. `exact`
asks onnxruntime once per process and setting: a GroupQueryAttention node with the setting
runs single rows on random data at a few cache lengths, and the kernel must give every bit
of its outputs and caches. It refuses where onnxruntime would take another path (fewer heads
than threads: onnxruntime then splits the cache across threads) and on CPUs where the kernel
does not apply (`custom_ops.decode_attention_level`). ``GENAI_EXACT_DECODE=0`` turns it off.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import numpy as np

from genai._core import custom_ops

__all__ = ["agrees", "enabled", "exact", "onnxruntime_session", "rotary_caches"]

log = logging.getLogger(__name__)

_HEAD_SIZE = 64
_CACHE = 512
#: Cache lengths the probe tries (one row each, after that many past positions).
_PASTS = (0, 9, 300)


def enabled() -> bool:
    """Whether genai's op may compute single rows itself (``GENAI_EXACT_DECODE`` is not 0)."""
    return os.environ.get("GENAI_EXACT_DECODE", "1") != "0"


@functools.cache
def exact(heads: int, kv_heads: int, scale: float, rotary: bool, threads: int) -> bool:
    """Whether genai's kernel gives onnxruntime's GroupQueryAttention bits for single query
    rows of a node with ``heads`` / ``kv_heads``, ``scale`` (0: onnxruntime's default) and
    ``rotary`` (non-interleaved) in a session of ``threads`` intra-op threads (asked of
    onnxruntime once per process)."""
    if custom_ops.decode_attention_level() != 1 or threads < 1 or heads < threads:
        return False
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        return False
    try:
        same = _probe(heads, kv_heads, scale, rotary, threads)
    except Exception as exc:  # an onnxruntime that refuses the probe: keep its kernel
        log.debug("decode attention probe failed: %s", exc)
        return False
    log.debug("decode attention, %d/%d heads, %d threads: genai's kernel %s onnxruntime's",
              heads, kv_heads, threads, "matches" if same else "does not match")  # fmt: skip
    return same


def onnxruntime_session(
    heads: int, kv_heads: int, dim: int, scale: float, rotary: bool, threads: int, cache: int
) -> Any:
    """An onnxruntime session of one GroupQueryAttention node (packed QKV input ``qkv`` [1, 1,
    (heads + 2 kv_heads) x dim], caches ``past_key`` / ``past_value`` [1, kv_heads, ``cache``,
    dim], ``seqlens_k``, ``total``, and with ``rotary`` ``cos`` / ``sin`` [cache, dim / 2]):
    the kernel genai's is compared with."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    width = (heads + 2 * kv_heads) * dim
    attrs: dict[str, Any] = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": scale}
    inputs = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total"]
    if rotary:
        attrs.update(do_rotary=1, rotary_interleaved=0)
        inputs += ["cos", "sin"]
    node = helper.make_node(
        "GroupQueryAttention",
        inputs,
        ["out", "present_key", "present_value"],
        domain="com.microsoft",
        **attrs,
    )
    kv = [1, kv_heads, cache, dim]
    infos = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, 1, width]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if rotary:
        infos += [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [cache, dim // 2])
            for name in ("cos", "sin")
        ]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in node.output]
    graph = helper.make_graph([node], "gqa", infos, outputs)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def rotary_caches(dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotary ``cos`` / ``sin`` caches [positions, dim / 2] (base 10000), float32."""
    angles = (
        np.arange(positions, dtype=np.float32)[:, None]
        / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))[None]
    )
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _probe(heads: int, kv_heads: int, scale: float, rotary: bool, threads: int) -> bool:
    return agrees(heads, kv_heads, _HEAD_SIZE, scale, rotary, threads, _PASTS, _CACHE)


def agrees(
    heads: int,
    kv_heads: int,
    dim: int,
    scale: float,
    rotary: bool,
    threads: int,
    pasts: tuple[int, ...],
    cache: int,
    seed: int = 7,
) -> bool:
    """Whether genai's kernel gives every bit of onnxruntime's GroupQueryAttention (output and
    caches) for one random query row after each of ``pasts`` positions, with head size ``dim``
    and caches of ``cache`` positions (see `exact` for the other arguments)."""
    width = (heads + 2 * kv_heads) * dim
    kv = [1, kv_heads, cache, dim]
    session = onnxruntime_session(heads, kv_heads, dim, scale, rotary, threads, cache)
    cos, sin = rotary_caches(dim, cache)
    rng = np.random.default_rng(seed)
    for past in pasts:
        qkv = (2 * rng.standard_normal((1, 1, width))).astype(np.float32)
        keys = rng.standard_normal(kv).astype(np.float32)
        values = rng.standard_normal(kv).astype(np.float32)
        feed = {
            "qkv": qkv,
            "past_key": keys,
            "past_value": values,
            "seqlens_k": np.array([past], np.int32),
            "total": np.array(past + 1, np.int32),
        }
        if rotary:
            feed.update(cos=cos, sin=sin)
        want, want_keys, want_values = session.run(None, feed)
        got_keys, got_values = keys[0].copy(), values[0].copy()
        got = custom_ops.decode_attention_row(
            qkv[0, 0],
            past,
            heads,
            kv_heads,
            scale if scale else np.float32(1) / np.sqrt(np.float32(dim)),
            cos if rotary else None,
            sin if rotary else None,
            got_keys,
            got_values,
        )
        rows = slice(0, past + 1)
        if not (
            np.array_equal(got.view(np.uint32), want.reshape(-1).view(np.uint32))
            and np.array_equal(got_keys[:, rows], want_keys[0][:, rows])
            and np.array_equal(got_values[:, rows], want_values[0][:, rows])
        ):
            return False
    return True
