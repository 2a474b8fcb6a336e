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
    OrtAllocator,
    OrtEnv,
    OrtFns,
    OrtIoBinding,
    OrtMemoryInfo,
    OrtRunOptions,
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


# C API functions device tensors need beyond ort_api's table (read from the same library).
cdef struct DeviceFns:
    OrtStatus* (*CreateTensorAsOrtValue)(OrtAllocator* allocator, const int64_t* shape,
                                         size_t shape_len, int elem_type,
                                         OrtValue** out) noexcept nogil
    OrtStatus* (*CreateAllocator)(const OrtSession* session, const OrtMemoryInfo* info,
                                  OrtAllocator** out) noexcept nogil
    void (*ReleaseAllocator)(OrtAllocator* x) noexcept nogil


# A tensor at a fixed address for the life of the object, placed where a session wants the
# input/output it is first bound to (device memory through the session's allocator, or host
# memory). Until then (and, with `keep_staging`, for ever) its data lives in a host array,
# `staging`, of the same shape; upload/download copy between the two without the GIL.
cdef class DeviceTensor:
    cdef const OrtFns* fn
    cdef OrtEnv* env
    cdef OrtValue* value              # owned; NULL until placed
    cdef OrtAllocator* dev_allocator  # owned (CreateAllocator) or NULL
    cdef const OrtMemoryInfo* info    # memory info of `value` (session-owned) or NULL: host
    cdef OrtMemoryInfo* host_info     # owned CPU memory info
    cdef OrtValue* host_view          # owned: a tensor over `staging` (device tensors only)
    cdef void* data                   # GetTensorMutableData of `value`
    cdef readonly bint placed
    cdef readonly bint in_device_memory
    cdef readonly bint keep_staging
    cdef object staging               # host ndarray, or None once dropped
    cdef object owner                 # the NativeSession that placed it
    cdef int elem
    cdef int64_t dims[NS_MAX_DIMS]
    cdef size_t rank
    cdef size_t nbytes_c
    cdef str device_hint
    cdef readonly tuple shape
    cdef readonly object dtype
    cdef readonly str memory_name

    # staging -> value / value -> staging (no-ops for a host-placed tensor, which shares the
    # staging memory); NULL or the failing call's status.
    cdef OrtStatus* upload(self) noexcept nogil
    cdef OrtStatus* download(self) noexcept nogil


cdef class NativeSession:
    cdef const OrtFns* fn
    cdef OrtSession* session
    cdef OrtSessionOptions* options
    cdef OrtIoBinding* binding
    cdef OrtMemoryInfo* cpu_info
    # Passed to every RunWithBinding; NULL when no run config entries were given.
    # A session made by new_binding() borrows the ORT session (and run options) of `owner`.
    cdef bint borrowed
    cdef object owner
    cdef OrtRunOptions* run_options
    # Graph capture (set_graph_capture): run options with gpu_graph_id = the binding's graph
    # id (capture_run_options) and = -1 (skip_run_options: every other run, so that no run
    # is captured by accident under the default id 0). Owned; NULL when unused.
    cdef OrtRunOptions* capture_run_options
    cdef OrtRunOptions* skip_run_options
    cdef readonly object graph_id
    cdef dict _run_config
    # Graph ids handed out on this ORT session (counted on the owning object).
    cdef Py_ssize_t graph_counter
    # The default CPU allocator (for arrays ORT allocates for us).
    cdef OrtAllocator* allocator

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
    # Where an ORT-allocated output is allocated: the session's memory info for it (device
    # memory, owned by the session) or NULL for host memory (cpu_info).
    cdef const OrtMemoryInfo** output_alloc_info
    # 1 where that memory info is not host memory (reads need CopyTensors).
    cdef unsigned char* output_in_device_memory
    # 1 where the session produces output i in device memory (SessionGetMemoryInfoForOutputs;
    # 0 for host memory or an onnxruntime that cannot tell): a host array bound there and as
    # an input is copied to two device buffers, so in-place updates are lost (_check_alias).
    cdef unsigned char* output_wants_device
    # 1 where the value bound as an input lives in device memory (a rebound device output):
    # reading it back needs a copy through CopyTensors.
    cdef unsigned char* input_in_device_memory
    # Position of each output in the IoBinding's output order (ORT keeps the position of the
    # first bind of a name through re-binds; ClearBoundOutputs empties it), -1 when unbound.
    cdef Py_ssize_t* output_bind_pos
    cdef Py_ssize_t n_bound_outputs
    # The values the bound outputs hold, by binding position: one GetBoundOutputValues per
    # run, fetched on first use and dropped at the next run / output bind (owned; an entry is
    # NULL once rebind_outputs_as_inputs has moved it to an input).
    cdef OrtValue** out_cache
    cdef size_t out_cache_count
    cdef bint out_cache_valid
    # 1 where _input_refs / _output_refs may hold an array (maintained without the GIL so that
    # rebind_outputs_as_inputs takes the GIL only when a Python reference must move).
    cdef unsigned char* input_has_ref
    cdef unsigned char* output_has_ref
    # Scratch for rebind_outputs_as_inputs (duplicate-output check).
    cdef unsigned char* out_mark

    cdef readonly tuple input_names
    cdef readonly tuple output_names
    # route_long_runs: runs whose input `long_ids_index` has more than `long_above` entries
    # along axis 1 go to `long_session` (borrowed from `long_owner`), with this binding.
    cdef OrtSession* long_session
    cdef object long_owner
    cdef Py_ssize_t long_ids_index
    cdef int64_t long_above
    # route_verify_runs: every run of this binding goes to `verify_session` (borrowed from
    # `verify_owner`) while it is set: a speculative verify run on the graph of the same model
    # whose linears give each row one-token steps' numbers (genai.runtime.verify_rows).
    cdef OrtSession* verify_session
    cdef object verify_owner
    # Builds that session on first use (genai.runtime.verify_rows.StepRowsSession), or None.
    cdef public object step_rows_session
    # How the graph's logits were trimmed at load (genai.runtime.trimmed_logits.TrimmedLogits),
    # or None: bindings share it.
    cdef public object trimmed
    cdef public object linear_ops
    # Whether genai's op domain (genai._core.custom_ops) was registered on the session.
    cdef readonly bint genai_ops
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
    # RunWithBinding on the session's IoBinding (with the session's run options).
    cdef int run_binding(self) noexcept nogil
    # The same with the run options that capture / replay this binding's graph (see
    # set_graph_capture; falls back to run_binding when graph capture is not set).
    cdef int run_binding_captured(self) noexcept nogil
    # Bind a placed DeviceTensor as input / output `index` (no copy; its address is fixed).
    cdef int bind_input_tensor(self, Py_ssize_t index, DeviceTensor tensor) noexcept nogil
    cdef int bind_output_tensor(self, Py_ssize_t index, DeviceTensor tensor) noexcept nogil
    # Copy a tensor's staging array to its memory / back (errors recorded as for the rest).
    cdef int upload_tensor(self, DeviceTensor tensor) noexcept nogil
    cdef int download_tensor(self, DeviceTensor tensor) noexcept nogil
    # After a run: bind the value output output_indices[k] holds as input input_indices[k], for
    # k < count, without copying (ORT-allocated or pointer-bound outputs alike; the session owns
    # a reference to each such input value). One GetBoundOutputValues per run at most.
    # Element types must match; an output may appear once per call.
    cdef int rebind_outputs_as_inputs(self, const Py_ssize_t* output_indices,
                                      const Py_ssize_t* input_indices,
                                      Py_ssize_t count) noexcept nogil
    # Shape of the value output `output_index` holds after the last run: `shape` must have room
    # for NS_MAX_DIMS entries; *ndim receives the rank.
    cdef int output_value_shape(self, Py_ssize_t output_index, int64_t* shape,
                                size_t* ndim) noexcept nogil
    # Data pointer of that value (valid until the next run, or until the output is re-bound;
    # after a rebind the value lives on as the input's).
    cdef int output_value_data(self, Py_ssize_t output_index, void** data) noexcept nogil
    # Raise the error recorded by the last failing entry point (always raises).
    cdef object raise_last_error(self)

    cdef int _fail(self, int code, const char* message) noexcept nogil
    cdef int _fail_status(self, OrtStatus* status) noexcept nogil
    cdef int _bind_ptr(self, bint is_output, Py_ssize_t index, void* data,
                       const int64_t* shape, size_t ndim, int elem_type) noexcept nogil
    cdef int _bind_ptr_info(self, bint is_output, Py_ssize_t index, void* data,
                            const int64_t* shape, size_t ndim, int elem_type,
                            const OrtMemoryInfo* info, bint in_device) noexcept nogil
    cdef int _run_with(self, OrtRunOptions* options) noexcept nogil
    cdef OrtSession* _session_for_run(self) noexcept nogil
    cdef const OrtMemoryInfo* _memory_info_for(self, bint is_output, Py_ssize_t index) except? NULL
    cdef place_tensor(self, DeviceTensor tensor, bint is_output, Py_ssize_t index)
    cdef void _note_output_bound(self, Py_ssize_t index) noexcept nogil
    cdef void _drop_output_cache(self) noexcept nogil
    cdef int _fetch_output_cache(self) noexcept nogil
    cdef int _output_value(self, Py_ssize_t output_index, OrtValue** value) noexcept nogil
    cdef int _tensor_shape(self, OrtValue* value, int* elem_type, int64_t* shape,
                           size_t* ndim) noexcept nogil

    cdef _bind_array(self, bint is_output, str name, object array, object shape)
    cdef _check_alias(self, bint is_output, Py_ssize_t index, void* data, str name)
    cdef object _value_to_array(self, OrtValue* value, str what, bint in_device_memory=*)

    cpdef Py_ssize_t input_index(self, str name) except -1
    cpdef Py_ssize_t output_index(self, str name) except -1
    # run_binding with the GIL released; raises on error (returns 0).
    cpdef int run_checked(self) except -1
