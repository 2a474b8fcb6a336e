"""A decoder graph whose GroupQueryAttention runs a long prompt in chunks of query rows.

onnxruntime's CPU GroupQueryAttention computes, for each head, the whole ``rows x (past + rows)``
score matrix of a run (the causal half is then masked to zero) in a buffer of ``rows x KV
buffer length`` floats. For a 512-token prompt on a 8192-position cache that is 9 x 16 MB of
scores per layer, twice the arithmetic the causal half needs, and the largest single cost of
the prompt once its linears are int8 (docs/benchmarks.md). `chunk_attention` rewrites each
such node to genai's ``ChunkedGroupQueryAttention`` (`genai._core.custom_ops`), which calls
onnxruntime's own kernel on chunks of `DEFAULT_CHUNK_ROWS` query rows in turn (the last one
taking the rest, never a lone row), each on the KV the chunks before it wrote to the shared
past/present buffer: the same numbers, bit for bit (a row's scores, softmax and weighted sum
cover its own causal prefix in the same order whatever rows share its call), a little over half
the work and a score buffer that stays in cache. Runs it does not chunk (decode steps,
speculative verification, batches of several rows, caches that are not one shared buffer,
sliding windows) call the kernel once, as before.

The rewrite applies to nodes with GroupQueryAttention's nine inputs at most (no position ids,
attention bias or head sink; empty names after them are dropped), its three outputs, only the
attributes the custom op passes on, and a float32 past key that is a graph input (the KV cache
genai binds); other nodes stay. It needs the provider to run attention with onnxruntime's CPU
kernels (`ExecutionProvider.host_ops`), reads and writes the protobuf itself
(`genai.runtime.onnx_wire`), and ``GENAI_CHUNKED_ATTENTION=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from genai._core.custom_ops import (
    CHUNK_ATTRIBUTE,
    CHUNKED_GQA,
    DEFAULT_CHUNK_ROWS,
    DOMAIN,
    EXACT_DECODE_ATTRIBUTE,
    single_row_attention,
)
from genai.runtime import decode_attention
from genai.runtime import onnx_wire as wire

__all__ = ["DEFAULT_CHUNK_ROWS", "chunk_attention", "enabled", "single_rows"]

log = logging.getLogger(__name__)

_GQA = ("com.microsoft", "GroupQueryAttention")
#: The attributes the custom op passes on to onnxruntime's kernel.
_PASSED_ON = frozenset(
    {
        "num_heads",
        "kv_num_heads",
        "scale",
        "softcap",
        "do_rotary",
        "rotary_interleaved",
        "local_window_size",
        "smooth_softmax",
    }
)
_MAX_INPUTS = 9


def enabled() -> bool:
    """False when ``GENAI_CHUNKED_ATTENTION=0`` turns the rewrite off."""
    return os.environ.get("GENAI_CHUNKED_ATTENTION", "1") != "0"


@contextlib.contextmanager
def single_rows() -> Iterator[None]:
    """The calling thread's runs inside the block compute attention one query row per call
    (speculative verification): each row of a run then gets the numbers a one-token step
    would give it, so a verify run's logits are the plain decoding steps' bit for bit (on
    onnxruntime's CPU kernel, a run of several rows sums in another order). Applies where the
    graph's attention runs as genai's op (`chunk_attention`), to runs of one row of the batch
    on a shared past/present buffer or a growing past; elsewhere runs are as before."""
    previous = single_row_attention(True)
    try:
        yield
    finally:
        single_row_attention(previous)


def chunk_attention(
    data: bytes, chunk_rows: int = DEFAULT_CHUNK_ROWS, threads: int = 0
) -> bytes | None:
    """The serialized model ``data`` with its eligible GroupQueryAttention nodes (see the
    module docstring) run in chunks of ``chunk_rows`` query rows (keep it a multiple of 32, the
    row blocks of onnxruntime's SGEMM, for bit-identical results), or None when it has none.
    ``threads``: the session's intra-op threads; where given, a node whose single query rows
    genai's kernel computes with onnxruntime's bits (`genai.runtime.decode_attention.exact`)
    lets the op compute them."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    try:
        return _rewrite(data, chunk_rows, threads)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError) as exc:
        log.debug("attention not chunked: %s", exc)
        return None


def _eligible(node: list, float_inputs: set[str]) -> bool:
    domain = (wire.strings(node, wire.NODE_DOMAIN) or [""])[0]
    op = (wire.strings(node, wire.NODE_OP_TYPE) or [""])[0]
    if (domain, op) != _GQA:
        return False
    inputs = wire.given(wire.strings(node, wire.NODE_INPUT))
    outputs = wire.strings(node, wire.NODE_OUTPUT)
    if len(inputs) > _MAX_INPUTS or len(inputs) < 7 or len(outputs) != 3 or not all(outputs):
        return False
    if inputs[3] not in float_inputs or inputs[4] not in float_inputs:
        return False
    names = {
        (wire.strings(wire.fields(attr), wire.ATTR_NAME) or [""])[0]
        for attr in wire.payloads(node, wire.NODE_ATTRIBUTE)
    }
    return names <= _PASSED_ON


def _chunked_node(node: list, raw: bytes, chunk_rows: int, threads: int) -> bytes:
    kept = len(wire.given(wire.strings(node, wire.NODE_INPUT)))
    chunked = wire.as_op(node, CHUNKED_GQA, DOMAIN, kept)
    chunked += wire.int_attribute(CHUNK_ATTRIBUTE, chunk_rows)
    if threads and decode_attention.enabled() and _exact_decode(wire.parse_node(raw), threads):
        chunked += wire.int_attribute(EXACT_DECODE_ATTRIBUTE, 1)
    return chunked


def _exact_decode(node: wire.Node, threads: int) -> bool:
    """Whether genai's kernel may compute ``node``'s single query rows (its setting asked of
    onnxruntime: `decode_attention.exact`)."""
    ints, floats = node.ints, node.floats
    window = ints.get("local_window_size", -1)
    if (
        ints.get("rotary_interleaved", 0)
        or ints.get("smooth_softmax", 0)
        or floats.get("softcap", 0.0)
        or not isinstance(window, int)
        or window > 0
    ):
        return False
    heads, kv_heads = ints.get("num_heads"), ints.get("kv_num_heads")
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        return False
    rotary = bool(ints.get("do_rotary", 0))
    return decode_attention.exact(heads, kv_heads, floats.get("scale", 0.0), rotary, threads)


def _rewrite(data: bytes, chunk_rows: int, threads: int = 0) -> bytes | None:
    found = wire.model_graph(data)
    if found is None:
        return None
    model, graph = found
    float_inputs = set()
    for info in wire.payloads(graph, wire.GRAPH_INPUT):
        name, elem, _ = wire.read_value_info(info)
        if elem == wire.FLOAT:
            float_inputs.add(name)
    top = bytearray()
    rewritten = 0
    for number, kind, value, raw in graph:
        if number == wire.GRAPH_NODE and kind == wire.LEN:
            node = wire.fields(value)  # type: ignore[arg-type]
            if _eligible(node, float_inputs):
                chunked = _chunked_node(node, value, chunk_rows, threads)  # type: ignore[arg-type]
                top += wire.len_field(wire.GRAPH_NODE, chunked)
                rewritten += 1
                continue
        top += raw
    if not rewritten:
        return None
    log.debug("%d GroupQueryAttention nodes run long prompts in chunks of %d rows", rewritten,
              chunk_rows)  # fmt: skip
    return wire.with_graph(model, bytes(top), DOMAIN)
