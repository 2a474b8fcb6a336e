"""A GGUF reader and NumPy dequantizers (no ggml, no PyTorch).

:class:`GGUFFile` parses the header, the metadata key/values and the tensor table of a GGUF file
(versions 2 and 3) and memory-maps the data section; :meth:`GGUFFile.tensor` returns a tensor as
float32 in NumPy's (row-major) shape, i.e. GGUF's ``ne`` dimensions reversed.

Dequantized types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. Any other ggml type raises
:class:`~genai.builder.errors.BuildError` naming the tensor and the type.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genai.builder.errors import BuildError

__all__ = ["DEQUANTIZERS", "GGML_TYPES", "GGUFFile", "GGUFTensorInfo", "dequantize"]

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

#: ggml type id -> (name, elements per block, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
}

# Metadata value types: id -> struct format (scalars), 8 = string, 9 = array.
_SCALAR_FORMATS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


# --------------------------------------------------------------------------------------------
# Dequantizers: raw bytes (uint8, a whole number of blocks) -> float32 of n_blocks * block size
# --------------------------------------------------------------------------------------------


def _blocks(data: np.ndarray, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, block_bytes)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of every block, as float32 ``[n, 1]``."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[n, 16]`` packed bytes -> ``[n, 32]``: low nibbles first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _dq_f32(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).view(np.float32).astype(np.float32, copy=True)


def _dq_f16(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).view(np.float16).astype(np.float32)


def _dq_bf16(data: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _dq_q8_0(data: np.ndarray) -> np.ndarray:
    b = _blocks(data, 34)
    return (_f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)


def _dq_q4_0(data: np.ndarray) -> np.ndarray:
    b = _blocks(data, 18)
    q = _nibbles(b[:, 2:]).astype(np.float32) - 8.0
    return (_f16(b, 0) * q).reshape(-1)


def _dq_q4_1(data: np.ndarray) -> np.ndarray:
    b = _blocks(data, 20)
    q = _nibbles(b[:, 4:]).astype(np.float32)
    return (_f16(b, 0) * q + _f16(b, 2)).reshape(-1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K packed 6-bit scales and mins: ``[n, 12]`` bytes -> two ``[n, 8]`` arrays."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _dq_q4_k(data: np.ndarray) -> np.ndarray:
    b = _blocks(data, 144)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 32)  # four 64-value chunks of 32 bytes
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1)


def _dq_q6_k(data: np.ndarray) -> np.ndarray:
    b = _blocks(data, 210)
    ql = b[:, :128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = _f16(b, 208)
    lo, hi = ql[:, :, :32], ql[:, :, 32:]
    q = np.stack(
        [
            (lo & 0x0F) | ((qh & 3) << 4),
            (hi & 0x0F) | (((qh >> 2) & 3) << 4),
            (lo >> 4) | (((qh >> 4) & 3) << 4),
            (hi >> 4) | (((qh >> 6) & 3) << 4),
        ],
        axis=2,
    )  # [n, half, 4 quarters, 32]
    q = q.astype(np.float32).reshape(-1, 2, 4, 2, 16) - 32.0
    sc = scales.reshape(-1, 2, 4, 2)  # scale index = 2 * quarter + (l // 16)
    return (d[:, :, None, None, None] * sc[..., None] * q).reshape(-1)


#: ggml type name -> dequantizer (raw bytes -> flat float32).
DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _dq_f32,
    "F16": _dq_f16,
    "BF16": _dq_bf16,
    "Q8_0": _dq_q8_0,
    "Q4_0": _dq_q4_0,
    "Q4_1": _dq_q4_1,
    "Q4_K": _dq_q4_k,
    "Q6_K": _dq_q6_k,
}


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize raw GGUF tensor bytes of ggml type ``type_name`` to float32 ``shape``."""
    if type_name not in DEQUANTIZERS:
        raise BuildError(
            f"ggml type {type_name} is not supported; supported: {', '.join(DEQUANTIZERS)}"
        )
    return DEQUANTIZERS[type_name](data).reshape(shape)


# --------------------------------------------------------------------------------------------
# File
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    #: NumPy shape (GGUF's ``ne`` reversed).
    shape: tuple[int, ...]
    type_id: int
    #: Absolute byte offset in the file.
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"unknown type {self.type_id}", 0, 0))[0]


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise BuildError(
                f"{self.path}: truncated or corrupt GGUF (reading {what} at byte {self.pos}, "
                f"file has {len(self.buf)} bytes)"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size, what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        try:
            return bytes(self.take(n, what)).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type = self.scalar("I", what)
            count = self.scalar("Q", what)
            if item_type in _SCALAR_FORMATS and item_type != 7:
                fmt = _SCALAR_FORMATS[item_type]
                size = struct.calcsize(fmt)
                raw = self.take(size * count, what)
                return np.frombuffer(raw, dtype=np.dtype("<" + fmt)).tolist()
            return [self.value(item_type, what) for _ in range(count)]
        raise BuildError(f"{self.path}: unknown GGUF metadata value type {vtype} in {what}")


class GGUFFile:
    """A GGUF file: ``metadata`` (dict), ``tensors`` (name -> :class:`GGUFTensorInfo`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        size = self.path.stat().st_size
        if size < 24:
            raise BuildError(f"{self.path}: truncated GGUF ({size} bytes)")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cur = _Cursor(memoryview(self._map), self.path)
        if bytes(cur.take(4, "magic")) != _MAGIC:
            raise BuildError(f"{self.path} is not a GGUF file (bad magic)")
        self.version = cur.scalar("I", "version")
        if self.version not in (2, 3):
            raise BuildError(f"{self.path}: GGUF version {self.version} is not supported (2, 3)")
        n_tensors = cur.scalar("Q", "tensor count")
        n_kv = cur.scalar("Q", "metadata count")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            self.metadata[key] = cur.value(cur.scalar("I", f"type of {key}"), key)
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string("tensor name")
            n_dims = cur.scalar("I", f"dims of {name}")
            if n_dims > 8:
                raise BuildError(f"{self.path}: tensor {name} has {n_dims} dimensions")
            ne = [cur.scalar("Q", f"shape of {name}") for _ in range(n_dims)]
            type_id = cur.scalar("I", f"type of {name}")
            offset = cur.scalar("Q", f"offset of {name}")
            raw_infos.append((name, ne, type_id, offset))
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, ne, type_id, offset in raw_infos:
            count = int(np.prod(ne, dtype=np.int64)) if ne else 1
            _, block, block_bytes = GGML_TYPES.get(type_id, ("", 1, 0))
            nbytes = (count // block) * block_bytes if block_bytes else 0
            info = GGUFTensorInfo(name, tuple(reversed(ne)), type_id, data_start + offset, nbytes)
            if block_bytes and info.offset + nbytes > size:
                raise BuildError(
                    f"{self.path}: truncated GGUF: tensor {name} needs bytes "
                    f"{info.offset}..{info.offset + nbytes}, the file has {size}"
                )
            self.tensors[name] = info

    # -- metadata ---------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise BuildError(f"{self.path}: no general.architecture in the GGUF metadata")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}`` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    # -- tensors ----------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def raw(self, name: str) -> np.ndarray:
        info = self._info(name)
        return self._map[info.offset : info.offset + info.nbytes]

    def check_readable(self, name: str) -> None:
        """A :class:`BuildError` when :meth:`tensor` cannot dequantize tensor ``name`` (its
        ggml type, or rows that are not whole blocks): from the header, nothing read."""
        info = self._info(name)
        type_name = info.type_name
        if type_name not in DEQUANTIZERS:
            raise BuildError(
                f"{self.path}: tensor {name} has ggml type {type_name}, which this builder "
                f"cannot dequantize; supported: {', '.join(DEQUANTIZERS)}"
            )
        _, block, _ = GGML_TYPES[info.type_id]
        if info.shape and info.shape[-1] % block:
            raise BuildError(f"{self.path}: tensor {name} rows are not whole {type_name} blocks")

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` dequantized to float32, NumPy shape."""
        self.check_readable(name)
        info = self._info(name)
        return dequantize(self.raw(name), info.type_name, info.shape)

    def _info(self, name: str) -> GGUFTensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise BuildError(f"{self.path}: tensor {name!r} not in the GGUF file") from None
