"""`Tensor` and `NamedTensors`: the reference's tensor containers (``og.Tensor(array)``,
``og.NamedTensors()``), as scripts pass them to model inputs.

A `Tensor` owns a C-contiguous copy of the NumPy array it was made from; `NamedTensors` maps
input names to tensors. Both behave as the reference's do (see ``docs/differences.md`` for the
few places where genai is more lenient or raises the Python-usual error).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

from genai.errors import ArgumentTypeError, TensorNotFoundError

__all__ = ["ELEMENT_TYPES", "NamedTensors", "Tensor", "TensorArray"]

#: NumPy dtype -> ONNX element type (``TensorProto.DataType``), what `Tensor.type` returns.
ELEMENT_TYPES: dict[np.dtype, int] = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12,
    np.dtype(np.uint64): 13,
}

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Tensor:
    """A typed, shaped block of host memory made from a NumPy array (copied at creation).

    ``array`` must be a NumPy array of a dtype ONNX models take (bool, (u)int8/16/32/64,
    float16/32/64); anything else raises TypeError naming it.
    """

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(
                f"Tensor expects a numpy.ndarray, not {type(array).__name__} "
                "(wrap it with numpy.asarray first)"
            )
        if array.dtype not in ELEMENT_TYPES:
            supported = ", ".join(sorted(str(d) for d in ELEMENT_TYPES))
            raise ArgumentTypeError(
                f"Tensor: unsupported numpy dtype {array.dtype}; supported: {supported}"
            )
        self._array = np.array(array, order="C", copy=True)

    def shape(self) -> list[int]:
        """The dimensions, as a list of ints."""
        return list(self._array.shape)

    def type(self) -> int:
        """The ONNX element type (``TensorProto.DataType``: 1 float32, 7 int64, 10 float16...)."""
        return ELEMENT_TYPES[self._array.dtype]

    def data(self) -> Any:
        """The address of the first element as a PyCapsule (what the reference returns); valid
        while the tensor lives. None for an empty tensor (no memory), as in the reference."""
        if self._array.size == 0:
            return None
        return _capsule_new(self._array.ctypes.data, None, None)

    def as_numpy(self) -> np.ndarray:
        """A copy of the contents as a NumPy array."""
        return self._array.copy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy's view of the contents (read-only), so ``np.asarray(tensor)`` and every genai
        call taking an array (``Generator.append_tokens``, ``set_model_input``) take a
        `Tensor` as the reference's overloads do."""
        view = self._array.view()
        view.flags.writeable = False
        if dtype is not None and np.dtype(dtype) != view.dtype:
            return view.astype(dtype)
        return view.copy() if copy else view

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape()}, dtype={self._array.dtype})"


class TensorArray(np.ndarray):
    """A NumPy array that also answers the reference's `Tensor` methods ``as_numpy``,
    ``type`` and ``data``, for results the reference returns as a ``Tensor`` (e.g.
    ``Tokenizer.encode_batch``): scripts written for either keep working. ``shape`` stays
    NumPy's tuple (the reference's ``shape()`` is a method)."""

    def as_numpy(self) -> np.ndarray:
        """A copy of the contents as a plain NumPy array."""
        return np.array(self, copy=True).view(np.ndarray)

    def type(self) -> int:
        """The ONNX element type (`Tensor.type`)."""
        return ELEMENT_TYPES[self.dtype]

    def data(self) -> Any:
        """The address of the first element as a PyCapsule (`Tensor.data`); None when empty
        or not C-contiguous."""
        if self.size == 0 or not self.flags.c_contiguous:
            return None
        return _capsule_new(self.ctypes.data, None, None)


class NamedTensors(MutableMapping[str, Tensor]):
    """Tensors by name (a model input name -> `Tensor`).

    Setting a NumPy array stores a `Tensor` copy of it; setting a `Tensor` stores that object.
    Reading a missing name raises `TensorNotFoundError` (a KeyError and a RuntimeError);
    deleting one is a no-op, as in the reference.
    """

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise TensorNotFoundError(f"Tensor with name: {name} not found.") from None

    def __setitem__(self, name: str, value: Tensor | np.ndarray) -> None:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"NamedTensors keys are str, not {type(name).__name__}")
        if isinstance(value, np.ndarray):
            value = Tensor(value)
        elif not isinstance(value, Tensor):
            raise ArgumentTypeError(
                f"NamedTensors[{name!r}] takes a Tensor or a numpy.ndarray, "
                f"not {type(value).__name__}"
            )
        self._tensors[name] = value

    def __delitem__(self, name: str) -> None:
        self._tensors.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tensors))

    def __len__(self) -> int:
        return len(self._tensors)

    def keys(self) -> list[str]:  # type: ignore[override]
        """The names, in the order they were first set (a list, as the reference returns)."""
        return list(self._tensors)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v!r}" for k, v in self._tensors.items())
        return f"NamedTensors({{{inner}}})"
