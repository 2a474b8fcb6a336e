"""What a model is once loaded: its config (`genai_config.json`), the ONNX Runtime sessions
and the description of their inputs and outputs (`Model`), LoRA adapters bound to them, and
the memory helpers beneath (aligned buffers, huge pages)."""
