# cython: language_level=3
"""genai's own onnxruntime custom ops (domain ``genai``), for the sessions genai creates."""

from genai._core.ort_api cimport OrtSessionOptions

# Register the ``genai`` op domain on `options` (created once per process, never released:
# onnxruntime needs it for as long as any session made with it lives).
cdef int add_genai_ops(OrtSessionOptions* options) except -1
