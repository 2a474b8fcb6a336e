"""Test helpers: tiny random-weight model folders in the onnxruntime-genai layout."""
