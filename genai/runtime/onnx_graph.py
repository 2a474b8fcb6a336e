"""A small ONNX graph builder over ``onnx.helper`` that names nodes and outputs itself.

Used by the model builder (`genai.builder`) and by the test-model writers
(`genai.testing.models`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["IR_VERSION", "MS_DOMAIN", "OPSET", "GraphBuilder"]

MS_DOMAIN = "com.microsoft"
OPSET = 21
IR_VERSION = 10


class GraphBuilder:
    """Collects nodes, initializers and graph I/O; `model` assembles the ModelProto."""

    def __init__(self, name: str, producer: str = "genai") -> None:
        self.name = name
        self.producer = producer
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        """Declare a graph input; returns its name."""
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> None:
        """Declare a graph output."""
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def weight(self, name: str, array: np.ndarray) -> str:
        """An initializer stored in the model; returns its name."""
        # np.asarray keeps 0-d scalars 0-d (np.ascontiguousarray would make them 1-d)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, values: object, dtype: type | np.dtype = np.int64) -> str:
        """An initializer holding ``values`` (deduplicated by value)."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(f"const_{len(self._consts)}", array)
        return self._consts[key]

    def ops(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: int | Sequence[str | None] = 1,
        *,
        domain: str = "",
        name: str | None = None,
        **attrs: object,
    ) -> list[str]:
        """Add a node with ``outputs`` outputs (a count, or names where None means "make one
        up"); returns the output names."""
        self._count += 1
        node = f"/{name or op_type}_{self._count}"
        if isinstance(outputs, int):
            outputs = [None] * outputs
        names = [f"{node}/output_{i}" if out is None else out for i, out in enumerate(outputs)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), names, name=node, domain=domain, **attrs)
        )
        return names

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        """Add a single-output node; returns its output name."""
        return self.ops(op_type, inputs, [out] if out else 1, **attrs)[0]

    def model(self) -> onnx.ModelProto:
        """The ModelProto (opset 21, plus com.microsoft when a node uses it)."""
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, self.initializers
        )
        opsets = [helper.make_opsetid("", OPSET)]
        if any(node.domain == MS_DOMAIN for node in self.nodes):
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        return helper.make_model(
            graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name=self.producer
        )
