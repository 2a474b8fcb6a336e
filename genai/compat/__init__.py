"""The rest of onnxruntime-genai's module-level API: enumerations, log options, telemetry
switches, `Tensor`/`NamedTensors`, and the classes of features genai does not run yet."""
