"""genai's own onnxruntime custom ops (domain ``genai``); see custom_ops.pyx."""

from typing import Any

import numpy as np
import numpy.typing as npt

DOMAIN: str
CHUNKED_GQA: str
CHUNK_ATTRIBUTE: str
EXACT_DECODE_ATTRIBUTE: str
DEFAULT_CHUNK_ROWS: int
QUANTIZE_ROWS: str
FLOOR_ATTRIBUTE: str
SCALED_SILU_MUL: str
STEP_ROWS_MATMUL: str
SINGLE_ROWS_MATMUL: str

def chunked_calls() -> int: ...
def single_row_calls() -> int: ...
def matmul_row_calls() -> int: ...
def exact_row_calls() -> int: ...
def decode_attention_level() -> int: ...
def decode_attention_row(
    qkv: npt.NDArray[np.float32],
    pos: int,
    heads: int,
    kv_heads: int,
    scale: float,
    cos: npt.NDArray[np.float32] | None,
    sin: npt.NDArray[np.float32] | None,
    key_cache: npt.NDArray[np.float32],
    value_cache: npt.NDArray[np.float32],
) -> npt.NDArray[np.float32]: ...
def single_row_attention(on: bool) -> bool: ...
def quantize_level() -> int: ...
def quantize_rows(
    x: np.ndarray[Any, Any], floor_value: float, level: int = -1
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]: ...
def row_products(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], factors: np.ndarray[Any, Any], level: int = -1
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]: ...
def step_rows_level() -> int: ...
def step_rows_matmul(
    a: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any],
    scales: np.ndarray[Any, Any],
    zero_points: np.ndarray[Any, Any] | None = None,
    level: int = -1,
) -> np.ndarray[Any, Any]: ...
