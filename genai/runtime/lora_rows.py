"""A graph whose MatMuls on weights bound at run time (LoRA branches) can run one row per call.

A LoRA folder computes each adapted projection as ``MatMul(x, W) + MatMul(MatMul(x, A), B)``
with ``A`` and ``B`` graph inputs (`genai.runtime.adapters` binds them). onnxruntime's CPU MatMul
multiplies a lone row by such an unpacked weight with another kernel than a run of rows (MLAS's
one-row SGEMM), whose sums round otherwise, so a speculative verify run's rows would not get a
one-token step's numbers. `single_rows_lora` makes every ``MatMul`` whose second input is a
float32 graph input of rank 2 genai's ``SingleRowsMatMul`` (`genai._core.custom_ops`): the same
kernel in one call, and one row per call inside `genai.runtime.chunked_attention.single_rows`.
MatMuls on initializers are left alone (onnxruntime packs those weights, and a row's bits are
then the same alone as in a run: `genai.runtime.verify_rows` asks). ``GENAI_LORA_ROWS=0`` turns
it off.
"""

from __future__ import annotations

import logging
import os

from genai._core.custom_ops import DOMAIN, SINGLE_ROWS_MATMUL
from genai.runtime import onnx_wire as wire

__all__ = ["enabled", "single_rows_lora"]

log = logging.getLogger(__name__)


def enabled() -> bool:
    """False when ``GENAI_LORA_ROWS=0`` turns the rewrite off."""
    return os.environ.get("GENAI_LORA_ROWS", "1") != "0"


def single_rows_lora(data: bytes) -> bytes | None:
    """The serialized model ``data`` with ``SingleRowsMatMul`` for each ``MatMul`` whose weight
    (second input) is a float32 rank-2 graph input, or None when it has none or cannot be
    read."""
    try:
        found = wire.model_graph(data)
        if found is None:
            return None
        graph = found[1]
        weights = {
            name
            for name, elem, shape in map(
                wire.read_value_info, wire.payloads(graph, wire.GRAPH_INPUT)
            )
            if elem == wire.FLOAT and len(shape) == 2
        } - wire.initializer_names(graph)  # (an input with an initializer: a default value)

        def rename(node: wire.Node) -> str | None:
            matmul = (node.domain, node.op) == ("", "MatMul") and len(node.inputs) == 2
            return SINGLE_ROWS_MATMUL if matmul and node.inputs[1] in weights else None

        renamed = wire.with_ops_renamed(data, rename, DOMAIN)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError, TypeError) as exc:
        log.debug("LoRA MatMuls left as they are: %s", exc)
        return None
    if renamed is not None:
        log.debug("MatMuls on run-time weights run one row per call in verify runs")
    return renamed
