"""A graph file that holds its weights, as a small graph that reads them from that file.

genai's load-time rewrites (`genai.runtime.trimmed_logits`, `genai.runtime.chunked_attention`,
`genai.runtime.verify_rows`, ...) edit a graph's bytes in memory. A graph with its weights in an
external-data file (what builders write) is a few hundred kilobytes; one with its weights
inside (``onnx.save`` without ``save_as_external_data``) can be hundreds of megabytes, and
reading, copying and handing such bytes to onnxruntime costs seconds and a second copy of the
weights.

`outlined` reads such a file through a memory map and writes only its structure: each top-graph
initializer whose ``raw_data`` is at least `MIN_OUTLINED_BYTES` becomes an external-data
reference (``location``, ``offset``, ``length``) to the bytes where they already lie, in the
graph file itself. Loaded with the folder as its external-data folder (onnxruntime's
``session.model_external_initializers_file_folder_path``), the small graph has the same
tensors, and the rewrites apply to it as to a builder's folder.
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

from genai.runtime import onnx_wire as wire

__all__ = ["MIN_OUTLINED_BYTES", "outlined"]

log = logging.getLogger(__name__)

#: The smallest ``raw_data`` an initializer has to be outlined (onnx's own threshold for
#: external data): smaller constants (shapes, scalars) stay in the graph, where rewrites read
#: them.
MIN_OUTLINED_BYTES = 1024
#: TensorProto.data_type of string tensors, which have no raw bytes to point at.
_STRING = 8


def _spans(buf: mmap.mmap | bytes, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """``(number, wire type, field start, value start, field end)`` of each field of the
    message in ``buf[start:end]``, without copying its payloads (a varint's value start is its
    own start)."""
    out = []
    pos = start
    while pos < end:
        first = pos
        key, pos = wire.varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == wire.LEN:
            size, pos = wire.varint(buf, pos)
            value, pos = pos, pos + size
        elif kind == wire.VARINT:
            value = pos
            _, pos = wire.varint(buf, pos)
        elif kind in (wire.FIXED64, wire.FIXED32):
            value, pos = pos, pos + (8 if kind == wire.FIXED64 else 4)
        else:
            raise wire.MalformedProto(f"wire type {kind}")
        if pos > end:
            raise wire.MalformedProto("truncated field")
        out.append((number, kind, first, value, pos))
    return out


def _outlined_tensor(buf: mmap.mmap, start: int, end: int, location: str) -> bytes | None:
    """The TensorProto at ``buf[start:end]`` with its ``raw_data`` as a reference into the file
    named ``location``; None when it keeps its bytes (small, typed fields, strings, already
    external)."""
    spans = _spans(buf, start, end)
    raw = [(value, stop) for number, kind, _, value, stop in spans if number == wire.TENSOR_RAW]
    if len(raw) != 1 or raw[0][1] - raw[0][0] < MIN_OUTLINED_BYTES:
        return None
    for number, kind, _, value, _ in spans:
        if kind == wire.VARINT and number in (wire.TENSOR_TYPE, wire.TENSOR_LOCATION):
            found, _ = wire.varint(buf, value)
            if (number, found) in ((wire.TENSOR_TYPE, _STRING), (wire.TENSOR_LOCATION, 1)):
                return None
    offset, stop = raw[0]
    out = bytearray()
    for number, _, first, _, field_end in spans:
        if number != wire.TENSOR_RAW:
            out += buf[first:field_end]
    for key, value in (("location", location), ("offset", offset), ("length", stop - offset)):
        entry = wire.len_field(1, key.encode()) + wire.len_field(2, str(value).encode())
        out += wire.len_field(wire.TENSOR_EXTERNAL_DATA, entry)
    out += wire.encode_varint(wire.TENSOR_LOCATION << 3 | wire.VARINT) + wire.encode_varint(1)
    return bytes(out)


def outlined(path: Path, limit: int) -> bytes | None:
    """The graph file at ``path`` with its top graph's large initializers as references into
    the file itself (see the module docstring), or None: nothing to outline, the result is
    still larger than ``limit`` bytes (weights in subgraphs or typed fields), or the file
    cannot be read or parsed."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _outlined(buf, path.name, limit)
    except (OSError, ValueError) as exc:  # ValueError: an empty file; MalformedProto
        log.debug("%s: weights not outlined (%s)", path, exc)
        return None


def _outlined(buf: mmap.mmap, location: str, limit: int) -> bytes | None:
    model = bytearray()
    count = 0
    for number, kind, first, value, stop in _spans(buf, 0, len(buf)):
        if number != wire.MODEL_GRAPH or kind != wire.LEN:
            model += buf[first:stop]
            continue
        graph = bytearray()
        for g_number, g_kind, g_first, g_value, g_stop in _spans(buf, value, stop):
            tensor = None
            if g_number == wire.GRAPH_INITIALIZER and g_kind == wire.LEN:
                tensor = _outlined_tensor(buf, g_value, g_stop, location)
            if tensor is None:
                graph += buf[g_first:g_stop]
            else:
                graph += wire.len_field(g_number, tensor)
                count += 1
            if len(graph) > limit:
                return None
        model += wire.len_field(number, bytes(graph))
    if count == 0 or len(model) > limit:
        return None
    log.debug("%s: %d initializers read from the graph file in place", location, count)
    return bytes(model)
