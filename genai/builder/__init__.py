"""A NumPy-only model builder: GGUF files and Hugging Face safetensors folders to
onnxruntime-genai model folders (``genai build``), and the default model (``genai pull``)."""

from __future__ import annotations

from genai.builder.build import build, genai_config
from genai.builder.errors import BuildError
from genai.builder.spec import SUPPORTED_ARCHITECTURES, ModelSpec

__all__ = ["SUPPORTED_ARCHITECTURES", "BuildError", "ModelSpec", "build", "genai_config"]
