# cython: language_level=3
"""An onnxruntime session driven through the C API, with entry points callable without the GIL.

Other Cython modules ``cimport`` :class:`NativeSession` and run a whole decode step (bindings,
run, bookkeeping) inside one ``with nogil:`` block::

    from genai._core.native_session cimport NativeSession
    ...
    with nogil:
        rc = sess.bind_input_ptr(mask_index, mask_data, shape, 2, ELEM_INT64)
        if rc == 0:
            rc = sess.run_binding()
    if rc != 0:
        sess.raise_last_error()
"""

from libc.stdint cimport int64_t

from genai._core.ort_api cimport (
    OrtFns,
    OrtIoBinding,
    OrtMemoryInfo,
    OrtSession,
    OrtSessionOptions,
    OrtStatus,
    OrtValue,
)

# Return codes of the nogil entry points: 0 = success; > 0 = the OrtErrorCode of a failed ORT
# call (its OrtStatus is kept for raise_last_error); < 0 = one of these checks of ours.
cdef enum:
    NS_OK = 0
    NS_ERR_INDEX = -1   # input/output index out of range -> IndexError
    NS_ERR_DTYPE = -2   # element type differs from the model's -> TypeError
    NS_ERR_SHAPE = -3   # negative dimension / too many dims -> ValueError
    NS_ERR_STATE = -4   # session not initialised -> RuntimeError

# Most dimensions a bound tensor may have.
cdef enum:
    NS_MAX_DIMS = 16


cdef class NativeSession:
    cdef const OrtFns* fn
    cdef OrtSession* session
    cdef OrtSessionOptions* options
    cdef OrtIoBinding* binding
    cdef OrtMemoryInfo* cpu_info

    # Last error of a nogil entry point (see raise_last_error).
    cdef OrtStatus* last_status
    cdef int last_code
    cdef const char* last_message

    cdef Py_ssize_t n_inputs
    cdef Py_ssize_t n_outputs
    # Names (NUL-terminated, owned) and declared element types, by index.
    cdef char** input_names_c
    cdef char** output_names_c
    cdef int* input_types_c
    cdef int* output_types_c
    # The OrtValue last bound per index (owned; NULL when none / ORT-allocated).
    cdef OrtValue** input_values
    cdef OrtValue** output_values
    # 1 where an output is ORT-allocated (re-bound to the device before every run, so its shape
    # may change between runs).
    cdef unsigned char* output_on_device

    cdef readonly tuple input_names
    cdef readonly tuple output_names
    cdef dict _input_index
    cdef dict _output_index
    cdef tuple _input_shapes
    cdef tuple _output_shapes
    cdef list _input_refs
    cdef list _output_refs

    # Bind `data` (CPU memory the caller keeps alive and large enough for `shape`) as input /
    # output `index`. elem_type must equal the model's declared type (ELEM_* of ort_api).
    cdef int bind_input_ptr(self, Py_ssize_t index, void* data, const int64_t* shape,
                            size_t ndim, int elem_type) noexcept nogil
    cdef int bind_output_ptr(self, Py_ssize_t index, void* data, const int64_t* shape,
                             size_t ndim, int elem_type) noexcept nogil
    # Let ORT allocate output `index` (CPU memory) afresh at each run.
    cdef int bind_output_device_index(self, Py_ssize_t index) noexcept nogil
    # RunWithBinding on the session's IoBinding.
    cdef int run_binding(self) noexcept nogil
    # Raise the error recorded by the last failing entry point (always raises).
    cdef object raise_last_error(self)

    cdef int _fail(self, int code, const char* message) noexcept nogil
    cdef int _fail_status(self, OrtStatus* status) noexcept nogil
    cdef int _bind_ptr(self, bint is_output, Py_ssize_t index, void* data,
                       const int64_t* shape, size_t ndim, int elem_type) noexcept nogil

    cdef _bind_array(self, bint is_output, str name, object array, object shape)

    cpdef Py_ssize_t input_index(self, str name) except -1
    cpdef Py_ssize_t output_index(self, str name) except -1
