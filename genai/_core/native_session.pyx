# cython: language_level=3
"""NativeSession: an onnxruntime session, its IoBinding and CPU tensors, through the C API.

Python methods validate and convert (names, dtypes, shapes) and then call the same ``nogil``
entry points that other Cython modules call directly (see native_session.pxd). Names and types
are read once when the session is created.
"""

import os

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, strlen

from genai._core.ort_api cimport (
    ELEM_BFLOAT16,
    ELEM_UNDEFINED,
    ONNX_TYPE_TENSOR,
    ORT_ARENA_ALLOCATOR,
    ORT_FAIL,
    ORT_MEM_TYPE_DEFAULT,
    OrtAllocator,
    OrtCUDAProviderOptionsV2,
    OrtEnv,
    OrtTensorTypeAndShapeInfo,
    OrtTypeInfo,
    check_status,
    elem_size,
    ort_default_allocator,
    ort_env,
    ort_fns,
    status_to_exception,
)

cnp.import_array()

# ONNX element type -> numpy dtype (types numpy lacks are absent).
ELEM_TO_DTYPE = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
}
DTYPE_TO_ELEM = {dt: t for t, dt in ELEM_TO_DTYPE.items()}


cdef char* _dup_cstr(const char* s) except NULL:
    cdef size_t n = strlen(s)
    cdef char* out = <char*>malloc(n + 1)
    if out == NULL:
        raise MemoryError()
    memcpy(out, s, n + 1)
    return out


cdef tuple _read_type(const OrtFns* f, OrtTypeInfo* info):
    """(elem_type, shape) of a TypeInfo; shape dims: int, symbolic name (str) or -1."""
    cdef int onnx_type = 0
    cdef int elem = ELEM_UNDEFINED
    cdef const OrtTensorTypeAndShapeInfo* tinfo = NULL
    cdef size_t ndim = 0, i
    cdef int64_t* dims = NULL
    cdef const char** syms = NULL
    check_status(f.GetOnnxTypeFromTypeInfo(info, &onnx_type), "GetOnnxTypeFromTypeInfo")
    if onnx_type != ONNX_TYPE_TENSOR:
        return ELEM_UNDEFINED, None
    check_status(f.CastTypeInfoToTensorInfo(info, &tinfo), "CastTypeInfoToTensorInfo")
    if tinfo == NULL:
        return ELEM_UNDEFINED, None
    check_status(f.GetTensorElementType(tinfo, &elem), "GetTensorElementType")
    check_status(f.GetDimensionsCount(tinfo, &ndim), "GetDimensionsCount")
    dims = <int64_t*>calloc(ndim + 1, sizeof(int64_t))
    syms = <const char**>calloc(ndim + 1, sizeof(const char*))
    try:
        if dims == NULL or syms == NULL:
            raise MemoryError()
        check_status(f.GetDimensions(tinfo, dims, ndim), "GetDimensions")
        check_status(f.GetSymbolicDimensions(tinfo, syms, ndim), "GetSymbolicDimensions")
        shape = []
        for i in range(ndim):
            if dims[i] >= 0:
                shape.append(dims[i])
            elif syms[i] != NULL and syms[i][0] != 0:
                shape.append(syms[i].decode("utf-8", "replace"))
            else:
                shape.append(-1)
        return elem, tuple(shape)
    finally:
        free(dims)
        free(syms)


cdef _append_provider(const OrtFns* f, OrtSessionOptions* opts, str name,
                      dict provider_options):
    """Add one execution provider to `opts` (see NativeSession)."""
    cdef OrtCUDAProviderOptionsV2* cuda = NULL
    short = name[:-len("ExecutionProvider")] if name.endswith("ExecutionProvider") else name
    if short.upper() == "CPU":
        return
    keys = [str(k).encode() for k in provider_options]
    values = [str(v).encode() for v in provider_options.values()]
    cdef Py_ssize_t n = len(keys), i
    cdef bytes bkey, bvalue, bshort = short.encode()
    cdef const char** ckeys = <const char**>calloc(n + 1, sizeof(char*))
    cdef const char** cvalues = <const char**>calloc(n + 1, sizeof(char*))
    try:
        if ckeys == NULL or cvalues == NULL:
            raise MemoryError()
        for i in range(n):
            bkey = keys[i]
            bvalue = values[i]
            ckeys[i] = bkey
            cvalues[i] = bvalue
        if short.upper() == "CUDA":
            check_status(f.CreateCUDAProviderOptions(&cuda), "CreateCUDAProviderOptions")
            try:
                check_status(f.UpdateCUDAProviderOptions(cuda, ckeys, cvalues, n),
                             "UpdateCUDAProviderOptions")
                check_status(f.SessionOptionsAppendExecutionProvider_CUDA_V2(
                    opts, cuda), "SessionOptionsAppendExecutionProvider_CUDA_V2")
            finally:
                f.ReleaseCUDAProviderOptions(cuda)
        else:
            check_status(f.SessionOptionsAppendExecutionProvider(
                opts, bshort, ckeys, cvalues, n),
                f"SessionOptionsAppendExecutionProvider({short!r})")
    finally:
        free(ckeys)
        free(cvalues)


cdef class NativeSession:
    """An ORT session with an owned IoBinding, created through onnxruntime's C API.

    ``providers``: ``[(name, {key: value})]``; ``"CPU"``/``"CPUExecutionProvider"`` is implied
    and skipped, ``"CUDA"`` goes through the CUDA V2 options, every other name (the
    ``ExecutionProvider`` suffix removed) through SessionOptionsAppendExecutionProvider.

    Not thread-safe: one thread at a time may bind/run one session.
    """

    def __cinit__(self):
        self.fn = NULL
        self.session = NULL
        self.options = NULL
        self.binding = NULL
        self.cpu_info = NULL
        self.last_status = NULL
        self.last_code = 0
        self.last_message = NULL
        self.n_inputs = 0
        self.n_outputs = 0
        self.input_names_c = NULL
        self.output_names_c = NULL
        self.input_types_c = NULL
        self.output_types_c = NULL
        self.input_values = NULL
        self.output_values = NULL
        self.output_on_device = NULL

    def __init__(self, model_path, *, int intra_op_num_threads=0, int inter_op_num_threads=0,
                 int graph_optimization_level=99, config_entries=None, providers=None,
                 str log_id="genai"):
        if self.options != NULL:
            raise RuntimeError("NativeSession.__init__ may be called only once")
        self.fn = ort_fns()
        cdef const OrtFns* f = self.fn
        cdef OrtEnv* env = ort_env()
        cdef OrtAllocator* alloc = ort_default_allocator()
        cdef OrtSessionOptions* opts = NULL
        cdef OrtStatus* st = NULL
        cdef bytes bpath = os.fsencode(os.fspath(model_path))
        cdef const char* cpath = bpath
        cdef Py_ssize_t i
        cdef char* cname = NULL
        cdef OrtTypeInfo* tinfo = NULL

        cdef bytes blog_id = log_id.encode()
        cdef bytes bkey, bvalue
        check_status(f.CreateSessionOptions(&opts), "CreateSessionOptions")
        self.options = opts
        check_status(f.SetSessionLogId(opts, blog_id), "SetSessionLogId")
        check_status(f.SetIntraOpNumThreads(opts, intra_op_num_threads), "SetIntraOpNumThreads")
        check_status(f.SetInterOpNumThreads(opts, inter_op_num_threads), "SetInterOpNumThreads")
        check_status(f.SetSessionGraphOptimizationLevel(opts, graph_optimization_level),
                     "SetSessionGraphOptimizationLevel")
        for key, value in (config_entries or {}).items():
            bkey = str(key).encode()
            bvalue = str(value).encode()
            check_status(f.AddSessionConfigEntry(opts, bkey, bvalue),
                         f"AddSessionConfigEntry({key!r})")
        for name, provider_options in (providers or []):
            _append_provider(f, opts, str(name), dict(provider_options or {}))

        with nogil:
            st = f.CreateSession(env, cpath, opts, &self.session)
        check_status(st, f"CreateSession({os.fspath(model_path)!r})")

        check_status(f.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT,
                                           &self.cpu_info), "CreateCpuMemoryInfo")
        check_status(f.CreateIoBinding(self.session, &self.binding), "CreateIoBinding")

        cdef size_t count = 0
        check_status(f.SessionGetInputCount(self.session, &count), "SessionGetInputCount")
        self.n_inputs = <Py_ssize_t>count
        check_status(f.SessionGetOutputCount(self.session, &count), "SessionGetOutputCount")
        self.n_outputs = <Py_ssize_t>count
        self.input_names_c = <char**>calloc(self.n_inputs + 1, sizeof(char*))
        self.output_names_c = <char**>calloc(self.n_outputs + 1, sizeof(char*))
        self.input_types_c = <int*>calloc(self.n_inputs + 1, sizeof(int))
        self.output_types_c = <int*>calloc(self.n_outputs + 1, sizeof(int))
        self.input_values = <OrtValue**>calloc(self.n_inputs + 1, sizeof(OrtValue*))
        self.output_values = <OrtValue**>calloc(self.n_outputs + 1, sizeof(OrtValue*))
        self.output_on_device = <unsigned char*>calloc(self.n_outputs + 1, 1)
        if (self.input_names_c == NULL or self.output_names_c == NULL
                or self.input_types_c == NULL or self.output_types_c == NULL
                or self.input_values == NULL or self.output_values == NULL
                or self.output_on_device == NULL):
            raise MemoryError()

        names, shapes = [], []
        for i in range(self.n_inputs):
            check_status(f.SessionGetInputName(self.session, i, alloc, &cname),
                         "SessionGetInputName")
            try:
                self.input_names_c[i] = _dup_cstr(cname)
            finally:
                check_status(f.AllocatorFree(alloc, cname), "AllocatorFree")
            names.append(self.input_names_c[i].decode("utf-8"))
            check_status(f.SessionGetInputTypeInfo(self.session, i, &tinfo),
                         "SessionGetInputTypeInfo")
            try:
                elem, shape = _read_type(f, tinfo)
            finally:
                f.ReleaseTypeInfo(tinfo)
            self.input_types_c[i] = elem
            shapes.append(shape)
        self.input_names = tuple(names)
        self._input_shapes = tuple(shapes)

        names, shapes = [], []
        for i in range(self.n_outputs):
            check_status(f.SessionGetOutputName(self.session, i, alloc, &cname),
                         "SessionGetOutputName")
            try:
                self.output_names_c[i] = _dup_cstr(cname)
            finally:
                check_status(f.AllocatorFree(alloc, cname), "AllocatorFree")
            names.append(self.output_names_c[i].decode("utf-8"))
            check_status(f.SessionGetOutputTypeInfo(self.session, i, &tinfo),
                         "SessionGetOutputTypeInfo")
            try:
                elem, shape = _read_type(f, tinfo)
            finally:
                f.ReleaseTypeInfo(tinfo)
            self.output_types_c[i] = elem
            shapes.append(shape)
        self.output_names = tuple(names)
        self._output_shapes = tuple(shapes)

        self._input_index = {n: k for k, n in enumerate(self.input_names)}
        self._output_index = {n: k for k, n in enumerate(self.output_names)}
        self._input_refs = [None] * self.n_inputs
        self._output_refs = [None] * self.n_outputs

    def __dealloc__(self):
        cdef const OrtFns* f = self.fn
        cdef Py_ssize_t i
        if f == NULL:
            return
        if self.binding != NULL:
            f.ReleaseIoBinding(self.binding)
            self.binding = NULL
        if self.input_values != NULL:
            for i in range(self.n_inputs):
                if self.input_values[i] != NULL:
                    f.ReleaseValue(self.input_values[i])
            free(self.input_values)
            self.input_values = NULL
        if self.output_values != NULL:
            for i in range(self.n_outputs):
                if self.output_values[i] != NULL:
                    f.ReleaseValue(self.output_values[i])
            free(self.output_values)
            self.output_values = NULL
        if self.session != NULL:
            f.ReleaseSession(self.session)
            self.session = NULL
        if self.options != NULL:
            f.ReleaseSessionOptions(self.options)
            self.options = NULL
        if self.cpu_info != NULL:
            f.ReleaseMemoryInfo(self.cpu_info)
            self.cpu_info = NULL
        if self.last_status != NULL:
            f.ReleaseStatus(self.last_status)
            self.last_status = NULL
        if self.input_names_c != NULL:
            for i in range(self.n_inputs):
                free(self.input_names_c[i])
            free(self.input_names_c)
            self.input_names_c = NULL
        if self.output_names_c != NULL:
            for i in range(self.n_outputs):
                free(self.output_names_c[i])
            free(self.output_names_c)
            self.output_names_c = NULL
        free(self.input_types_c)
        self.input_types_c = NULL
        free(self.output_types_c)
        self.output_types_c = NULL
        free(self.output_on_device)
        self.output_on_device = NULL

    # ----------------------------------------------------------------- nogil entry points

    cdef int _fail(self, int code, const char* message) noexcept nogil:
        if self.last_status != NULL:
            self.fn.ReleaseStatus(self.last_status)
            self.last_status = NULL
        self.last_code = code
        self.last_message = message
        return code

    cdef int _fail_status(self, OrtStatus* status) noexcept nogil:
        cdef int code = self.fn.GetErrorCode(status)
        if code <= 0:
            code = ORT_FAIL
        self._fail(code, NULL)
        self.last_status = status
        return code

    cdef int _bind_ptr(self, bint is_output, Py_ssize_t index, void* data,
                       const int64_t* shape, size_t ndim, int elem_type) noexcept nogil:
        cdef const OrtFns* f = self.fn
        cdef OrtValue* value = NULL
        cdef OrtStatus* st = NULL
        cdef size_t nbytes, k
        cdef Py_ssize_t n = self.n_outputs if is_output else self.n_inputs
        cdef int declared
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        if index < 0 or index >= n:
            return self._fail(NS_ERR_INDEX, b"input/output index out of range")
        declared = self.output_types_c[index] if is_output else self.input_types_c[index]
        if declared != ELEM_UNDEFINED and elem_type != declared:
            return self._fail(NS_ERR_DTYPE, b"element type differs from the model's")
        if ndim > NS_MAX_DIMS:
            return self._fail(NS_ERR_SHAPE, b"too many dimensions")
        nbytes = elem_size(elem_type)
        if nbytes == 0:
            return self._fail(NS_ERR_DTYPE, b"unsupported element type")
        for k in range(ndim):
            if shape[k] < 0:
                return self._fail(NS_ERR_SHAPE, b"negative dimension")
            nbytes *= <size_t>shape[k]
        st = f.CreateTensorWithDataAsOrtValue(self.cpu_info, data, nbytes, shape, ndim,
                                              elem_type, &value)
        if st != NULL:
            return self._fail_status(st)
        if is_output:
            st = f.BindOutput(self.binding, self.output_names_c[index], value)
        else:
            st = f.BindInput(self.binding, self.input_names_c[index], value)
        if st != NULL:
            f.ReleaseValue(value)
            return self._fail_status(st)
        # The binding holds its own reference; keep ours until the slot is re-bound.
        if is_output:
            if self.output_values[index] != NULL:
                f.ReleaseValue(self.output_values[index])
            self.output_values[index] = value
            self.output_on_device[index] = 0
        else:
            if self.input_values[index] != NULL:
                f.ReleaseValue(self.input_values[index])
            self.input_values[index] = value
        return NS_OK

    cdef int bind_input_ptr(self, Py_ssize_t index, void* data, const int64_t* shape,
                            size_t ndim, int elem_type) noexcept nogil:
        return self._bind_ptr(False, index, data, shape, ndim, elem_type)

    cdef int bind_output_ptr(self, Py_ssize_t index, void* data, const int64_t* shape,
                             size_t ndim, int elem_type) noexcept nogil:
        return self._bind_ptr(True, index, data, shape, ndim, elem_type)

    cdef int bind_output_device_index(self, Py_ssize_t index) noexcept nogil:
        cdef OrtStatus* st = NULL
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        if index < 0 or index >= self.n_outputs:
            return self._fail(NS_ERR_INDEX, b"output index out of range")
        st = self.fn.BindOutputToDevice(self.binding, self.output_names_c[index], self.cpu_info)
        if st != NULL:
            return self._fail_status(st)
        if self.output_values[index] != NULL:
            self.fn.ReleaseValue(self.output_values[index])
            self.output_values[index] = NULL
        self.output_on_device[index] = 1
        return NS_OK

    cdef int run_binding(self) noexcept nogil:
        cdef OrtStatus* st = NULL
        cdef Py_ssize_t i
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        # An ORT-allocated output keeps the value of the previous run in the binding (and with
        # it that run's shape): bind it to the device again so ORT allocates for this run.
        for i in range(self.n_outputs):
            if self.output_on_device[i]:
                st = self.fn.BindOutputToDevice(self.binding, self.output_names_c[i],
                                                self.cpu_info)
                if st != NULL:
                    return self._fail_status(st)
        st = self.fn.RunWithBinding(self.session, NULL, self.binding)
        if st != NULL:
            return self._fail_status(st)
        return NS_OK

    cdef object raise_last_error(self):
        cdef OrtStatus* st = self.last_status
        cdef int code = self.last_code
        message = (self.last_message.decode("utf-8", "replace")
                   if self.last_message != NULL else "")
        self.last_status = NULL
        self.last_code = 0
        self.last_message = NULL
        if st != NULL:
            raise status_to_exception(st)
        if code == NS_ERR_INDEX:
            raise IndexError(message)
        if code == NS_ERR_DTYPE:
            raise TypeError(message)
        if code == NS_ERR_SHAPE:
            raise ValueError(message)
        if code == NS_ERR_STATE:
            raise RuntimeError(message)
        raise RuntimeError(f"NativeSession: error {code} with no recorded message")

    # ----------------------------------------------------------------- Python API

    cpdef Py_ssize_t input_index(self, str name) except -1:
        """Index of input ``name`` (KeyError if the model has no such input)."""
        try:
            return self._input_index[name]
        except KeyError:
            raise KeyError(f"model has no input {name!r}; inputs: {list(self.input_names)}")

    cpdef Py_ssize_t output_index(self, str name) except -1:
        """Index of output ``name`` (KeyError if the model has no such output)."""
        try:
            return self._output_index[name]
        except KeyError:
            raise KeyError(f"model has no output {name!r}; outputs: {list(self.output_names)}")

    @property
    def input_elem_types(self):
        """{name: ONNX element type (int; 0 for non-tensors)}."""
        return {n: self.input_types_c[i] for i, n in enumerate(self.input_names)}

    @property
    def output_elem_types(self):
        """{name: ONNX element type (int; 0 for non-tensors)}."""
        return {n: self.output_types_c[i] for i, n in enumerate(self.output_names)}

    @property
    def input_dtypes(self):
        """{name: numpy dtype, or None when numpy has no equivalent}."""
        return {n: ELEM_TO_DTYPE.get(self.input_types_c[i])
                for i, n in enumerate(self.input_names)}

    @property
    def output_dtypes(self):
        """{name: numpy dtype, or None when numpy has no equivalent}."""
        return {n: ELEM_TO_DTYPE.get(self.output_types_c[i])
                for i, n in enumerate(self.output_names)}

    @property
    def input_shapes(self):
        """{name: shape}; a dynamic dim is its symbolic name (str), or -1 when unnamed."""
        return dict(zip(self.input_names, self._input_shapes))

    @property
    def output_shapes(self):
        """{name: shape}; a dynamic dim is its symbolic name (str), or -1 when unnamed."""
        return dict(zip(self.output_names, self._output_shapes))

    cdef _bind_array(self, bint is_output, str name, object array, object shape):
        cdef cnp.ndarray arr = array
        cdef Py_ssize_t index = self.output_index(name) if is_output else self.input_index(name)
        cdef int declared = self.output_types_c[index] if is_output else self.input_types_c[index]
        cdef int64_t dims[NS_MAX_DIMS]
        cdef Py_ssize_t k, ndim, numel = 1
        cdef int rc
        kind = "output" if is_output else "input"
        if declared == ELEM_UNDEFINED:
            raise TypeError(f"{kind} {name!r} is not a tensor")
        expected = ELEM_TO_DTYPE.get(declared)
        if declared == ELEM_BFLOAT16:
            ok = array.dtype.itemsize == 2 and array.dtype.name in ("bfloat16", "uint16")
        else:
            ok = expected is not None and array.dtype == expected
        if not ok:
            want = expected if expected is not None else f"ONNX element type {declared}"
            raise TypeError(f"{kind} {name!r} expects {want}, got an array of {array.dtype}")
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            raise ValueError(f"{kind} {name!r}: the array must be C-contiguous")
        if is_output and not cnp.PyArray_ISWRITEABLE(arr):
            raise ValueError(f"output {name!r}: the array must be writeable")
        shape = tuple(array.shape) if shape is None else tuple([int(d) for d in shape])
        ndim = len(shape)
        if ndim > NS_MAX_DIMS:
            raise ValueError(f"{kind} {name!r}: more than {NS_MAX_DIMS} dimensions")
        for k in range(ndim):
            if shape[k] < 0:
                raise ValueError(f"{kind} {name!r}: negative dimension in {shape}")
            dims[k] = shape[k]
            numel *= shape[k]
        if numel > array.size:
            raise ValueError(f"{kind} {name!r}: shape {shape} needs {numel} elements, "
                             f"the array has {array.size}")
        rc = self._bind_ptr(is_output, index, cnp.PyArray_DATA(arr), dims, ndim, declared)
        if rc != 0:
            self.raise_last_error()
        if is_output:
            self._output_refs[index] = array
        else:
            self._input_refs[index] = array

    def bind_input(self, str name, cnp.ndarray array not None, shape=None):
        """Bind ``array``'s memory (no copy) as input ``name``.

        ``shape`` defaults to ``array.shape``; a different shape binds the first
        ``prod(shape)`` elements (e.g. a prefix of a preallocated attention-mask buffer). The
        session keeps a reference to ``array`` until the input is re-bound.
        """
        self._bind_array(False, name, array, shape)

    def bind_output(self, str name, cnp.ndarray array not None, shape=None):
        """Bind ``array``'s memory (no copy) as output ``name``; ORT writes into it on run()."""
        self._bind_array(True, name, array, shape)

    def bind_output_to_device(self, str name):
        """Let ORT allocate output ``name`` (on the CPU) at each run; read it with get_output."""
        cdef Py_ssize_t index = self.output_index(name)
        if self.bind_output_device_index(index) != 0:
            self.raise_last_error()
        self._output_refs[index] = None

    def clear_bindings(self):
        """Unbind all inputs and outputs."""
        cdef Py_ssize_t i
        if self.binding == NULL:
            raise RuntimeError("NativeSession is not initialised")
        self.fn.ClearBoundInputs(self.binding)
        self.fn.ClearBoundOutputs(self.binding)
        for i in range(self.n_inputs):
            if self.input_values[i] != NULL:
                self.fn.ReleaseValue(self.input_values[i])
                self.input_values[i] = NULL
            self._input_refs[i] = None
        for i in range(self.n_outputs):
            if self.output_values[i] != NULL:
                self.fn.ReleaseValue(self.output_values[i])
                self.output_values[i] = NULL
            self.output_on_device[i] = 0
            self._output_refs[i] = None

    def run(self):
        """Run the session on its bindings; the GIL is released for the whole run."""
        cdef int rc
        with nogil:
            rc = self.run_binding()
        if rc != 0:
            self.raise_last_error()

    def get_output(self, str name):
        """A copy (ndarray) of bound output ``name`` after run()."""
        cdef const OrtFns* f = self.fn
        cdef OrtAllocator* alloc = ort_default_allocator()
        cdef char* names_buf = NULL
        cdef size_t* lengths = NULL
        cdef size_t count = 0, vcount = 0, i, pos = 0, ndim = 0
        cdef OrtValue** values = NULL
        cdef OrtTensorTypeAndShapeInfo* info = NULL
        cdef int elem = 0
        cdef void* data = NULL
        cdef int64_t dims[NS_MAX_DIMS]
        cdef Py_ssize_t found = -1
        cdef cnp.ndarray out
        self.output_index(name)
        if self.binding == NULL:
            raise RuntimeError("NativeSession is not initialised")
        check_status(f.GetBoundOutputNames(self.binding, alloc, &names_buf, &lengths, &count),
                     "GetBoundOutputNames")
        try:
            for i in range(count):
                if names_buf[pos:pos + lengths[i]].decode("utf-8") == name:
                    found = i
                pos += lengths[i]
        finally:
            if names_buf != NULL:
                f.AllocatorFree(alloc, names_buf)
            if lengths != NULL:
                f.AllocatorFree(alloc, lengths)
        if found < 0:
            raise KeyError(f"output {name!r} is not bound")
        check_status(f.GetBoundOutputValues(self.binding, alloc, &values, &vcount),
                     "GetBoundOutputValues")
        try:
            if <size_t>found >= vcount or values[found] == NULL:
                raise RuntimeError(f"output {name!r} has no value (was run() called?)")
            check_status(f.GetTensorTypeAndShape(values[found], &info), "GetTensorTypeAndShape")
            try:
                check_status(f.GetTensorElementType(info, &elem), "GetTensorElementType")
                check_status(f.GetDimensionsCount(info, &ndim), "GetDimensionsCount")
                if ndim > NS_MAX_DIMS:
                    raise ValueError(f"output {name!r} has more than {NS_MAX_DIMS} dimensions")
                check_status(f.GetDimensions(info, dims, ndim), "GetDimensions")
            finally:
                f.ReleaseTensorTypeAndShapeInfo(info)
            dtype = ELEM_TO_DTYPE.get(elem)
            if dtype is None:
                raise TypeError(f"output {name!r}: element type {elem} has no numpy dtype")
            check_status(f.GetTensorMutableData(values[found], &data), "GetTensorMutableData")
            out = np.empty(tuple([dims[k] for k in range(ndim)]), dtype=dtype)
            if out.nbytes:
                memcpy(cnp.PyArray_DATA(out), data, out.nbytes)
            return out
        finally:
            if values != NULL:
                for i in range(vcount):
                    f.ReleaseValue(values[i])
                f.AllocatorFree(alloc, values)
