"""An example genai execution-provider plugin: ONNX Runtime's CPU EP as the provider "example".

Everything a provider decides lives on the provider class; the plugin only registers it. This
module is the whole plugin (see the ``genai.plugins`` entry point in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from genai import hookimpl
from genai.errors import ConfigError
from genai.providers import (
    Capabilities,
    ExecutionProvider,
    Placement,
    SessionSpec,
    available_ort_providers,
)

__all__ = ["ExampleProvider"]

_SWITCHES = {
    "spin": "session.intra_op.allow_spinning",
    "denormals_as_zero": "session.set_denormal_as_zero",
}


class ExampleProvider(ExecutionProvider):
    """The CPU EP under the name "example", configured through session config entries."""

    name = "example"
    aliases = ("example-cpu",)
    ort_name = "CPUExecutionProvider"
    device = "cpu"
    requires = ("onnxruntime",)
    description = "example plugin: ONNX Runtime's CPU EP under another name"
    # What the conformance suite may expect: exactly the cpu provider's tokens, both KV
    # layouts, padded batches, continuous decoding and rewind, seeded sampling. No graph
    # capture (graph_capture stays None), so that test is skipped.
    capabilities = Capabilities(
        exact=True,
        kv_layouts=frozenset({"shared", "growing"}),
        batch=True,
        continuous_decoding=True,
        rewind=True,
        seeded_sampling=True,
    )
    # Host memory for every buffer; sampling on the host.
    placement = Placement(kv_cache="cpu", inputs="cpu", logits="cpu", sampling="cpu")
    known_options = frozenset(_SWITCHES)
    default_options: ClassVar[dict[str, str]] = {"spin": "0", "denormals_as_zero": "0"}

    def unavailable_reason(self) -> str | None:
        # Cheap: the ORT library is loaded once per process anyway; no session is made.
        try:
            names = available_ort_providers()
        except Exception as exc:
            return f"onnxruntime cannot be loaded: {exc}"
        if self.ort_name not in names:
            return f"onnxruntime lists no {self.ort_name} (it has {', '.join(names)})"
        return None

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)  # unknown keys and non-strings rejected
        for key in _SWITCHES:
            if merged[key] not in ("0", "1"):
                raise ConfigError(
                    f"provider option example.{key} must be '0' or '1', got {merged[key]!r}"
                )
        return merged

    def session_spec(self, options: Mapping[str, str], config: Any = None) -> SessionSpec:
        # No EP to append (the CPU EP is always there); the options become config entries.
        return SessionSpec(
            providers=[],
            config_entries={_SWITCHES[key]: options[key] for key in _SWITCHES},
        )


@hookimpl
def register_providers(register):
    """Make "example" (and its alias "example-cpu") selectable."""
    register(ExampleProvider)


@hookimpl
def register_commands(commands):
    """``genai example-info``: print what the provider declares."""
    info = commands.add_parser("example-info", help="describe the example provider")
    info.set_defaults(handler=_info)


def _info(args: Any) -> int:
    import json

    print(json.dumps(ExampleProvider().describe(), indent=2))
    return 0
