# cython: language_level=3
"""NativeSession: an onnxruntime session, its IoBinding and CPU tensors, through the C API.

Python methods validate and convert (names, dtypes, shapes) and then call the same ``nogil``
entry points that other Cython modules call directly (see native_session.pxd). Names and types
are read once when the session is created.
"""

import os

import numpy as np

cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, strlen
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlopen, dlsym

from genai._core.custom_ops cimport add_genai_ops
from genai._core.ort_api cimport (
    ELEM_BFLOAT16,
    ELEM_UNDEFINED,
    ONNX_TYPE_TENSOR,
    ORT_ARENA_ALLOCATOR,
    ORT_FAIL,
    ORT_MEM_TYPE_DEFAULT,
    ORT_API_VERSION_REQUIRED,
    ORT_MEMINFO_DEVICE_CPU,
    EpDevice,
    OrtAllocator,
    OrtCUDAProviderOptionsV2,
    OrtEnv,
    OrtEpDevice,
    OrtMemoryInfo,
    OrtTensorTypeAndShapeInfo,
    OrtTypeInfo,
    check_status,
    elem_size,
    memory_info_to_dict,
    ort_default_allocator,
    ort_env,
    ort_api_version,
    ort_fns,
    status_to_exception,
)

from genai._core.ort_api import OrtError, library_path, version
from genai.runtime.buffers import aligned_zeros

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


def _ndarray(array, str name):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name!r}: expected an ndarray or a DeviceTensor, got "
                        f"{type(array).__name__}")
    return array


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


cdef _append_provider_devices(const OrtFns* f, OrtEnv* env, OrtSessionOptions* opts,
                              list devices, dict provider_options):
    """Add one plugin-style execution provider for `devices` (EpDevice objects of one EP) to
    `opts` with SessionOptionsAppendExecutionProvider_V2."""
    if f.SessionOptionsAppendExecutionProvider_V2 == NULL:
        raise OrtError(f"onnxruntime {version()} cannot append execution providers for "
                       "devices (SessionOptionsAppendExecutionProvider_V2 needs >= 1.22)")
    if not devices:
        raise ValueError("an execution provider for devices needs at least one EpDevice")
    keys = [str(k).encode() for k in provider_options]
    values = [str(v).encode() for v in provider_options.values()]
    cdef Py_ssize_t n = len(keys), nd = len(devices), i
    cdef bytes bkey, bvalue
    cdef EpDevice dev
    cdef const char** ckeys = <const char**>calloc(n + 1, sizeof(char*))
    cdef const char** cvalues = <const char**>calloc(n + 1, sizeof(char*))
    cdef const OrtEpDevice** cdevs = <const OrtEpDevice**>calloc(nd + 1, sizeof(OrtEpDevice*))
    try:
        if ckeys == NULL or cvalues == NULL or cdevs == NULL:
            raise MemoryError()
        for i in range(nd):
            if not isinstance(devices[i], EpDevice):
                raise TypeError(f"expected EpDevice objects, got {type(devices[i]).__name__}")
            dev = devices[i]
            cdevs[i] = dev.checked_ptr()
        for i in range(n):
            bkey = keys[i]
            bvalue = values[i]
            ckeys[i] = bkey
            cvalues[i] = bvalue
        names = sorted({(<EpDevice>d).ep_name for d in devices})
        check_status(f.SessionOptionsAppendExecutionProvider_V2(
            opts, env, cdevs, nd, ckeys, cvalues, n),
            f"SessionOptionsAppendExecutionProvider_V2({', '.join(names)})")
    finally:
        free(ckeys)
        free(cvalues)
        free(cdevs)


# ---------------------------------------------------------------------------------------------
# Device tensors
# ---------------------------------------------------------------------------------------------

# Positions (0-based) in OrtApi of the functions in DeviceFns; ort_api's table does not carry
# them. Same documented layout as ort_api.pxd's ORT_SLOT_* (CreateTensorWithDataAsOrtValue is
# 49, AddSessionConfigEntry 130, RunWithBinding 133).
cdef enum:
    _SLOT_CreateTensorAsOrtValue = 48
    _SLOT_CreateAllocator = 131
    _SLOT_ReleaseAllocator = 132


cdef struct _ApiBase:
    const void* (*GetApi)(uint32_t version) noexcept nogil
    const char* (*GetVersionString)() noexcept nogil

ctypedef const _ApiBase* (*_GetApiBaseFn)() noexcept nogil

cdef DeviceFns _devfns
cdef bint _devfns_loaded = False


cdef const void* const* _api_table() except NULL:
    """The OrtApi function table of the library ort_api loaded (dlopen of a loaded path
    returns it): read the slots ort_api's OrtFns does not copy."""
    ort_fns()
    path = library_path()
    cdef bytes bpath = os.fsencode(path)
    cdef void* handle = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        raise ImportError(f"cannot load {path}")
    cdef void* sym = dlsym(handle, b"OrtGetApiBase")
    if sym == NULL:
        raise ImportError(f"{path} does not export OrtGetApiBase")
    cdef const _ApiBase* base = (<_GetApiBaseFn>sym)()
    cdef const void* const* table = NULL
    if base != NULL:
        table = <const void* const*>base.GetApi(ORT_API_VERSION_REQUIRED)
    if table == NULL:
        raise ImportError(f"{path}: GetApi({ORT_API_VERSION_REQUIRED}) returned NULL")
    return table


cdef int _load_device_fns() except -1:
    """Read DeviceFns from the library ort_api loaded."""
    global _devfns_loaded
    if _devfns_loaded:
        return 0
    cdef const void* const* table = _api_table()
    memcpy(&_devfns.CreateTensorAsOrtValue, &table[_SLOT_CreateTensorAsOrtValue], sizeof(void*))
    memcpy(&_devfns.CreateAllocator, &table[_SLOT_CreateAllocator], sizeof(void*))
    memcpy(&_devfns.ReleaseAllocator, &table[_SLOT_ReleaseAllocator], sizeof(void*))
    _devfns_loaded = True
    return 0


# Overridable initializers (initializers also listed as graph inputs: a run may feed them, or
# not and get the initializer): OrtApi positions, same documented layout as above.
cdef enum:
    _SLOT_SessionGetOverridableInitializerCount = 32
    _SLOT_SessionGetOverridableInitializerTypeInfo = 35
    _SLOT_SessionGetOverridableInitializerName = 38


cdef struct _InitializerFns:
    OrtStatus* (*Count)(const OrtSession* session, size_t* out) noexcept nogil
    OrtStatus* (*TypeInfo)(const OrtSession* session, size_t index,
                           OrtTypeInfo** type_info) noexcept nogil
    OrtStatus* (*Name)(const OrtSession* session, size_t index, OrtAllocator* allocator,
                       char** value) noexcept nogil

cdef _InitializerFns _initfns
cdef bint _initfns_loaded = False


cdef int _load_initializer_fns() except -1:
    """Read _InitializerFns from the library ort_api loaded, as _load_device_fns."""
    global _initfns_loaded
    if _initfns_loaded:
        return 0
    cdef const void* const* table = _api_table()
    memcpy(&_initfns.Count, &table[_SLOT_SessionGetOverridableInitializerCount], sizeof(void*))
    memcpy(&_initfns.TypeInfo, &table[_SLOT_SessionGetOverridableInitializerTypeInfo],
           sizeof(void*))
    memcpy(&_initfns.Name, &table[_SLOT_SessionGetOverridableInitializerName], sizeof(void*))
    _initfns_loaded = True
    return 0


# Run-level profiling (onnxruntime >= 1.25, C API 25): OrtApi positions, same documented
# layout as above (RunOptionsEnableProfiling takes an ORTCHAR_T prefix: char on POSIX).
cdef enum:
    _PROFILING_API_VERSION = 25
    _SLOT_RunOptionsEnableProfiling = 415
    _SLOT_RunOptionsDisableProfiling = 416


cdef struct _ProfilingFns:
    OrtStatus* (*Enable)(OrtRunOptions* options, const char* prefix) noexcept nogil
    OrtStatus* (*Disable)(OrtRunOptions* options) noexcept nogil

cdef _ProfilingFns _proffns
cdef bint _proffns_loaded = False

#: The run option that turns on onnxruntime's run-level profiling (the reference's key).
RUN_PROFILING_KEY = "enable_profiling"
#: Its prefix for the value "1", as the reference's.
DEFAULT_RUN_PROFILE_PREFIX = "onnxruntime_run_profile"


cdef int _load_profiling_fns() except -1:
    """Read _ProfilingFns from the library ort_api loaded, as _load_device_fns; raises OrtError
    when its C API is older than 25."""
    global _proffns_loaded
    if _proffns_loaded:
        return 0
    if ort_api_version() < _PROFILING_API_VERSION:
        raise OrtError(
            f"enable_profiling requires ONNX Runtime 1.25 or later (this is {version()})"
        )
    cdef const void* const* table = _api_table()
    memcpy(&_proffns.Enable, &table[_SLOT_RunOptionsEnableProfiling], sizeof(void*))
    memcpy(&_proffns.Disable, &table[_SLOT_RunOptionsDisableProfiling], sizeof(void*))
    _proffns_loaded = True
    return 0


cdef int _add_run_entries(const OrtFns* f, OrtRunOptions* opts, dict config) except -1:
    """Add ``config``'s entries to ``opts``: run config entries, and `RUN_PROFILING_KEY`
    as the reference takes it ("0": off; "1": profile with `DEFAULT_RUN_PROFILE_PREFIX`; any
    other value: the prefix; each run writes ``<prefix>_<time>.json``)."""
    cdef bytes bkey, bvalue
    for key, value in config.items():
        key, value = str(key), str(value)
        if key == RUN_PROFILING_KEY:
            _load_profiling_fns()
            if value == "0":
                check_status(_proffns.Disable(opts), "RunOptionsDisableProfiling")
            else:
                bvalue = os.fsencode(DEFAULT_RUN_PROFILE_PREFIX if value == "1" else value)
                check_status(_proffns.Enable(opts, bvalue), "RunOptionsEnableProfiling")
            continue
        bkey = key.encode()
        bvalue = value.encode()
        check_status(f.AddRunConfigEntry(opts, bkey, bvalue),
                     f"adding run config entry {key!r}={value!r}")
    return 0


# The tensor's memory may come from its owner's allocator: a garbage-collected cycle (session ->
# bound tensor -> session) must free the tensor first, so tp_clear leaves `owner` alone.
@cython.no_gc_clear
cdef class DeviceTensor:
    """A tensor at a fixed address, in the memory a session wants for the input or output it
    is first bound to (`NativeSession.bind_input` / `bind_output`): device memory allocated
    through the session, or host memory. Until then its data is a host array (zeros, or
    ``staging`` when given). What the engine binds when a provider keeps buffers on its device
    (the shared-buffer KV cache, graph capture's static inputs and logits).

    Reads and writes go through the host: ``numpy()`` / ``copy()`` / ``t[index]`` return host
    copies, ``write(array)`` and ``t[index] = value`` copy in (onnxruntime >= 1.23,
    CopyTensors). ``keep_staging``: keep the host array for the tensor's life, so that the
    decode loop can `upload` / `download` it without the GIL (small tensors: ids, mask,
    logits); otherwise it is dropped once the data is on the device.
    """

    def __cinit__(self):
        self.fn = NULL
        self.env = NULL
        self.value = NULL
        self.dev_allocator = NULL
        self.info = NULL
        self.host_info = NULL
        self.host_view = NULL
        self.data = NULL
        self.placed = False
        self.in_device_memory = False
        self.rank = 0
        self.nbytes_c = 0

    def __init__(self, shape, dtype, *, staging=None, bint keep_staging=False, str device=None):
        """``device``: the device name to report (`device_name`) until the tensor is placed."""
        cdef Py_ssize_t k
        self.fn = ort_fns()
        self.env = ort_env()
        dtype = np.dtype(dtype)
        elem = DTYPE_TO_ELEM.get(dtype)
        if elem is None:
            raise TypeError(f"DeviceTensor: unsupported dtype {dtype}")
        shape = tuple([int(d) for d in shape])
        if len(shape) > NS_MAX_DIMS:
            raise ValueError(f"DeviceTensor: more than {NS_MAX_DIMS} dimensions")
        if any(d < 0 for d in shape):
            raise ValueError(f"DeviceTensor: negative dimension in {shape}")
        if staging is None:

            staging = aligned_zeros(shape, dtype)
        else:
            if not isinstance(staging, np.ndarray) or staging.dtype != dtype:
                raise TypeError(f"DeviceTensor: staging must be an ndarray of {dtype}")
            if not staging.flags.c_contiguous or staging.size != int(np.prod(shape)):
                raise ValueError(f"DeviceTensor: staging must be C-contiguous with "
                                 f"{int(np.prod(shape))} elements")
            staging = staging.reshape(shape)  # a view: the caller's memory
        self.staging = staging
        self.keep_staging = keep_staging
        self.shape = shape
        self.dtype = dtype
        self.elem = elem
        self.rank = len(shape)
        for k in range(len(shape)):
            self.dims[k] = shape[k]
        self.nbytes_c = <size_t>staging.nbytes
        self.device_hint = device or "unplaced"
        self.memory_name = "unplaced"
        check_status(self.fn.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT,
                                                 &self.host_info), "CreateCpuMemoryInfo")

    def __dealloc__(self):
        cdef const OrtFns* f = self.fn
        if f == NULL:
            return
        if self.host_view != NULL:
            f.ReleaseValue(self.host_view)
            self.host_view = NULL
        if self.value != NULL:
            f.ReleaseValue(self.value)
            self.value = NULL
        if self.dev_allocator != NULL:  # after the value it allocated
            _devfns.ReleaseAllocator(self.dev_allocator)
            self.dev_allocator = NULL
        if self.host_info != NULL:
            f.ReleaseMemoryInfo(self.host_info)
            self.host_info = NULL

    # --- numpy-like surface (what the KV cache uses) ---------------------------------------
    @property
    def nbytes(self):
        return int(self.nbytes_c)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def size(self):
        return int(np.prod(self.shape))

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        return self.shape[0] if self.shape else 0

    def device_name(self):
        """"cpu" for a tensor in host memory; the device name given at creation for one in
        device memory (or not yet placed)."""
        if self.placed and not self.in_device_memory:
            return "cpu"
        return self.device_hint

    def numpy(self):
        """A host copy of the whole tensor."""
        cdef cnp.ndarray out
        cdef OrtValue* host = NULL
        cdef OrtStatus* st = NULL
        if not self.placed or not self.in_device_memory:
            return np.array(self.staging, copy=True)
        out = np.empty(self.shape, self.dtype)
        if not out.nbytes:
            return out
        check_status(self.fn.CreateTensorWithDataAsOrtValue(
            self.host_info, cnp.PyArray_DATA(out), self.nbytes_c, self.dims, self.rank,
            self.elem, &host), "CreateTensorWithDataAsOrtValue")
        with nogil:
            st = self.fn.CopyTensors(self.env, <const OrtValue* const*>&self.value, &host,
                                     NULL, 1)
        self.fn.ReleaseValue(host)
        check_status(st, "CopyTensors (a device tensor to the host)")
        return out

    def copy(self):
        """A host copy (ndarray), as ``ndarray.copy``."""
        return self.numpy()

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def write(self, array):
        """Copy ``array`` (broadcast to the tensor's shape) into the tensor."""
        cdef cnp.ndarray src
        cdef OrtValue* host = NULL
        cdef OrtStatus* st = NULL
        src = np.ascontiguousarray(np.broadcast_to(np.asarray(array, dtype=self.dtype),
                                                   self.shape))
        if not self.placed or not self.in_device_memory or self.keep_staging:
            self.staging[...] = src
            if self.placed and self.in_device_memory:
                with nogil:
                    st = self.upload()
                check_status(st, "CopyTensors (host data to a device tensor)")
            return
        if not src.nbytes:
            return
        check_status(self.fn.CreateTensorWithDataAsOrtValue(
            self.host_info, cnp.PyArray_DATA(src), self.nbytes_c, self.dims, self.rank,
            self.elem, &host), "CreateTensorWithDataAsOrtValue")
        with nogil:
            st = self.fn.CopyTensors(self.env, <const OrtValue* const*>&host, &self.value,
                                     NULL, 1)
        self.fn.ReleaseValue(host)
        check_status(st, "CopyTensors (host data to a device tensor)")

    def fill(self, value):
        self.write(value)

    def __getitem__(self, index):
        return self.numpy()[index]

    def __setitem__(self, index, value):
        if not self.placed or not self.in_device_memory:
            self.staging[index] = value
            return
        array = self.numpy()
        array[index] = value
        self.write(array)

    def reshape(self, *args, **kwargs):
        raise NotImplementedError(
            "a DeviceTensor has no host memory to view (beam search reorders and other in-place "
            "edits need a host KV cache: past_present_share_buffer=false)")

    view = reshape

    def __repr__(self):
        return (f"<DeviceTensor {self.shape} {self.dtype} in {self.memory_name} memory"
                f"{'' if self.placed else ' (not placed yet)'}>")

    # --- nogil copies ----------------------------------------------------------------------
    cdef OrtStatus* upload(self) noexcept nogil:
        if not self.in_device_memory or self.host_view == NULL or self.nbytes_c == 0:
            return NULL
        return self.fn.CopyTensors(self.env, <const OrtValue* const*>&self.host_view,
                                   &self.value, NULL, 1)

    cdef OrtStatus* download(self) noexcept nogil:
        if not self.in_device_memory or self.host_view == NULL or self.nbytes_c == 0:
            return NULL
        return self.fn.CopyTensors(self.env, <const OrtValue* const*>&self.value,
                                   &self.host_view, NULL, 1)


cdef class NativeSession:
    """An ORT session with an owned IoBinding, created through onnxruntime's C API.

    ``providers``: ``[(name, {key: value})]``; ``"CPU"``/``"CPUExecutionProvider"`` is implied
    and skipped, ``"CUDA"`` goes through the CUDA V2 options, every other name (the
    ``ExecutionProvider`` suffix removed) through SessionOptionsAppendExecutionProvider. In
    place of a name, an `EpDevice` or a list of them (from ``ort_api.get_ep_devices()``, e.g.
    a registered plugin EP's) appends that EP for those devices
    (SessionOptionsAppendExecutionProvider_V2).

    Not thread-safe: one thread at a time may bind/run one session.
    """

    def __cinit__(self):
        self.fn = NULL
        self.session = NULL
        self.options = NULL
        self.binding = NULL
        self.cpu_info = NULL
        self.run_options = NULL
        self.allocator = NULL
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
        self.output_bind_pos = NULL
        self.n_bound_outputs = 0
        self.out_cache = NULL
        self.out_cache_count = 0
        self.out_cache_valid = False
        self.input_has_ref = NULL
        self.output_has_ref = NULL
        self.out_mark = NULL
        self.borrowed = False
        self.owner = None
        self.capture_run_options = NULL
        self.skip_run_options = NULL
        self.graph_id = None
        self._run_config = {}
        self.graph_counter = 0
        self.long_session = NULL
        self.long_owner = None
        self.long_ids_index = -1
        self.long_above = 0
        self.verify_session = NULL
        self.verify_owner = None
        self.step_rows_session = None

    def __init__(self, model_path=None, *, int intra_op_num_threads=0,
                 int inter_op_num_threads=0, int graph_optimization_level=99,
                 config_entries=None, providers=None, str log_id="genai", model_bytes=None,
                 enable_cpu_mem_arena=None, enable_mem_pattern=None, log_severity_level=None,
                 custom_ops_library=None, run_config_entries=None,
                 free_dimension_overrides=None, profile_file_prefix=None, bint genai_ops=False):
        """Create the session.

        ``model_path``: the .onnx file; with ``model_bytes`` (the serialized model, e.g. read
        from that file) the session is created from memory and ``model_path`` only names the
        model in messages (it may be None or a relative name). ``enable_cpu_mem_arena`` /
        ``enable_mem_pattern``: None keeps onnxruntime's default. ``log_severity_level``: 0
        (verbose) .. 4 (fatal) for this session. ``custom_ops_library``: path of a shared
        library registered with RegisterCustomOpsLibrary_V2 (onnxruntime >= 1.14).
        ``genai_ops``: register genai's own op domain (`genai._core.custom_ops`), which graphs
        rewritten by `genai.runtime.chunked_attention` use.
        ``run_config_entries``: {key: value} set on the one OrtRunOptions used by every run.
        ``free_dimension_overrides``: {symbolic dimension name: value} fixed for this session
        (AddFreeDimensionOverrideByName; static shapes for EPs that need them).
        ``profile_file_prefix``: turn on onnxruntime's profiler; the JSON trace
        (``<prefix>_<date>.json``) is written when the session is released.
        """
        if self.options != NULL:
            raise RuntimeError("NativeSession.__init__ may be called only once")
        if model_path is None and model_bytes is None:
            raise ValueError("NativeSession needs model_path or model_bytes")
        self.fn = ort_fns()
        cdef const OrtFns* f = self.fn
        cdef OrtEnv* env = ort_env()
        cdef OrtAllocator* alloc = ort_default_allocator()
        self.allocator = alloc
        cdef OrtSessionOptions* opts = NULL
        cdef OrtStatus* st = NULL
        label = os.fspath(model_path) if model_path is not None else "<model bytes>"
        cdef bytes bpath = None
        cdef const char* cpath = NULL
        cdef const unsigned char[::1] model_view
        cdef const void* model_data = NULL
        cdef size_t model_len = 0
        cdef bytes blog_id = log_id.encode()
        cdef bytes bkey, bvalue, blib
        check_status(f.CreateSessionOptions(&opts), "CreateSessionOptions")
        self.options = opts
        check_status(f.SetSessionLogId(opts, blog_id), "SetSessionLogId")
        check_status(f.SetIntraOpNumThreads(opts, intra_op_num_threads), "SetIntraOpNumThreads")
        check_status(f.SetInterOpNumThreads(opts, inter_op_num_threads), "SetInterOpNumThreads")
        check_status(f.SetSessionGraphOptimizationLevel(opts, graph_optimization_level),
                     "SetSessionGraphOptimizationLevel")
        if log_severity_level is not None:
            level = int(log_severity_level)
            if not 0 <= level <= 4:
                raise ValueError(f"log_severity_level must be 0 (verbose) .. 4 (fatal), "
                                 f"got {log_severity_level!r}")
            check_status(f.SetSessionLogSeverityLevel(opts, level),
                         f"setting the session log severity level to {level}")
        if enable_cpu_mem_arena is not None:
            if enable_cpu_mem_arena:
                check_status(f.EnableCpuMemArena(opts), "enabling the CPU memory arena")
            else:
                check_status(f.DisableCpuMemArena(opts), "disabling the CPU memory arena")
        cdef bytes bprefix
        if profile_file_prefix:
            bprefix = os.fsencode(profile_file_prefix)
            check_status(f.EnableProfiling(opts, bprefix), "enabling profiling")
        if enable_mem_pattern is not None:
            if enable_mem_pattern:
                check_status(f.EnableMemPattern(opts), "enabling the memory pattern")
            else:
                check_status(f.DisableMemPattern(opts), "disabling the memory pattern")
        for key, value in (config_entries or {}).items():
            bkey = str(key).encode()
            bvalue = str(value).encode()
            check_status(f.AddSessionConfigEntry(opts, bkey, bvalue),
                         f"AddSessionConfigEntry({key!r})")
        if custom_ops_library is not None:
            lib = os.fspath(custom_ops_library)
            if f.RegisterCustomOpsLibrary_V2 == NULL:
                raise OrtError(f"registering custom ops library {lib}: onnxruntime {version()} "
                               "lacks RegisterCustomOpsLibrary_V2 (onnxruntime >= 1.14)")
            blib = os.fsencode(lib)
            check_status(f.RegisterCustomOpsLibrary_V2(opts, blib),
                         f"registering custom ops library {lib}")
        if genai_ops:
            add_genai_ops(opts)
            self.genai_ops = True
        for dim_name, dim_value in (free_dimension_overrides or {}).items():
            bkey = str(dim_name).encode()
            check_status(f.AddFreeDimensionOverrideByName(opts, bkey, int(dim_value)),
                         f"overriding free dimension {dim_name!r} = {dim_value!r}")
        for name, provider_options in (providers or []):
            if isinstance(name, EpDevice):
                name = [name]
            if isinstance(name, (list, tuple)):
                _append_provider_devices(f, env, opts, list(name), dict(provider_options or {}))
            else:
                _append_provider(f, opts, str(name), dict(provider_options or {}))

        if model_bytes is not None:
            model_view = model_bytes
            model_len = <size_t>model_view.shape[0]
            if model_len == 0:
                raise ValueError(f"model_bytes of {label!r} is empty")
            model_data = &model_view[0]
            with nogil:
                st = f.CreateSessionFromArray(env, model_data, model_len, opts, &self.session)
            check_status(st, f"CreateSessionFromArray({label!r}, {model_len} bytes)")
        else:
            bpath = os.fsencode(label)
            cpath = bpath
            with nogil:
                st = f.CreateSession(env, cpath, opts, &self.session)
            check_status(st, f"CreateSession({label!r})")

        self._run_config = {str(k): str(v) for k, v in (run_config_entries or {}).items()}
        if run_config_entries:
            check_status(f.CreateRunOptions(&self.run_options), "CreateRunOptions")
            _add_run_entries(f, self.run_options, self._run_config)

        self._init_binding_state()

    def _init_binding_state(self):
        """Create this object's IoBinding and read the session's input/output metadata."""
        cdef const OrtFns* f = self.fn
        cdef OrtAllocator* alloc = self.allocator
        cdef Py_ssize_t i
        cdef char* cname = NULL
        cdef OrtTypeInfo* tinfo = NULL
        check_status(f.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT,
                                           &self.cpu_info), "CreateCpuMemoryInfo")
        check_status(f.CreateIoBinding(self.session, &self.binding), "CreateIoBinding")

        cdef size_t count = 0, n_overridable = 0
        cdef Py_ssize_t n_graph_inputs
        check_status(f.SessionGetInputCount(self.session, &count), "SessionGetInputCount")
        n_graph_inputs = <Py_ssize_t>count
        # Overridable initializers follow the graph inputs in every per-input array: bindable
        # by name like them, but not listed in input_names / input_dtypes / input_shapes.
        _load_initializer_fns()
        check_status(_initfns.Count(self.session, &n_overridable),
                     "SessionGetOverridableInitializerCount")
        self.n_inputs = n_graph_inputs + <Py_ssize_t>n_overridable
        check_status(f.SessionGetOutputCount(self.session, &count), "SessionGetOutputCount")
        self.n_outputs = <Py_ssize_t>count
        self.input_names_c = <char**>calloc(self.n_inputs + 1, sizeof(char*))
        self.output_names_c = <char**>calloc(self.n_outputs + 1, sizeof(char*))
        self.input_types_c = <int*>calloc(self.n_inputs + 1, sizeof(int))
        self.output_types_c = <int*>calloc(self.n_outputs + 1, sizeof(int))
        self.input_values = <OrtValue**>calloc(self.n_inputs + 1, sizeof(OrtValue*))
        self.output_values = <OrtValue**>calloc(self.n_outputs + 1, sizeof(OrtValue*))
        self.output_on_device = <unsigned char*>calloc(self.n_outputs + 1, 1)
        self.output_alloc_info = <const OrtMemoryInfo**>calloc(self.n_outputs + 1,
                                                               sizeof(OrtMemoryInfo*))
        self.input_in_device_memory = <unsigned char*>calloc(self.n_inputs + 1, 1)
        self.output_in_device_memory = <unsigned char*>calloc(self.n_outputs + 1, 1)
        self.output_wants_device = <unsigned char*>calloc(self.n_outputs + 1, 1)
        self.output_bind_pos = <Py_ssize_t*>malloc((self.n_outputs + 1) * sizeof(Py_ssize_t))
        self.input_has_ref = <unsigned char*>calloc(self.n_inputs + 1, 1)
        self.output_has_ref = <unsigned char*>calloc(self.n_outputs + 1, 1)
        self.out_mark = <unsigned char*>calloc(self.n_outputs + 1, 1)
        if (self.input_names_c == NULL or self.output_names_c == NULL
                or self.input_types_c == NULL or self.output_types_c == NULL
                or self.input_values == NULL or self.output_values == NULL
                or self.output_on_device == NULL or self.output_bind_pos == NULL
                or self.output_alloc_info == NULL or self.input_in_device_memory == NULL
                or self.output_in_device_memory == NULL or self.output_wants_device == NULL
                or self.input_has_ref == NULL or self.output_has_ref == NULL
                or self.out_mark == NULL):
            raise MemoryError()
        for i in range(self.n_outputs + 1):
            self.output_bind_pos[i] = -1

        names, shapes = [], []
        for i in range(self.n_inputs):
            if i < n_graph_inputs:
                check_status(f.SessionGetInputName(self.session, i, alloc, &cname),
                             "SessionGetInputName")
            else:
                check_status(_initfns.Name(self.session, i - n_graph_inputs, alloc, &cname),
                             "SessionGetOverridableInitializerName")
            try:
                self.input_names_c[i] = _dup_cstr(cname)
            finally:
                check_status(f.AllocatorFree(alloc, cname), "AllocatorFree")
            names.append(self.input_names_c[i].decode("utf-8"))
            if i < n_graph_inputs:
                check_status(f.SessionGetInputTypeInfo(self.session, i, &tinfo),
                             "SessionGetInputTypeInfo")
            else:
                check_status(_initfns.TypeInfo(self.session, i - n_graph_inputs, &tinfo),
                             "SessionGetOverridableInitializerTypeInfo")
            try:
                elem, shape = _read_type(f, tinfo)
            finally:
                f.ReleaseTypeInfo(tinfo)
            self.input_types_c[i] = elem
            shapes.append(shape)
        self.input_names = tuple(names[:n_graph_inputs])
        self._input_shapes = tuple(shapes)
        self._input_index = {n: k for k, n in enumerate(names)}

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

        self._output_index = {n: k for k, n in enumerate(self.output_names)}
        self._input_refs = [None] * self.n_inputs
        self._output_refs = [None] * self.n_outputs
        cdef const OrtMemoryInfo** infos = NULL
        cdef int device_type = ORT_MEMINFO_DEVICE_CPU
        if f.SessionGetMemoryInfoForOutputs != NULL and f.MemoryInfoGetDeviceType != NULL:
            infos = <const OrtMemoryInfo**>calloc(self.n_outputs + 1, sizeof(OrtMemoryInfo*))
            if infos == NULL:
                raise MemoryError()
            try:
                check_status(f.SessionGetMemoryInfoForOutputs(self.session, infos,
                                                              self.n_outputs),
                             "SessionGetMemoryInfoForOutputs")
                for i in range(self.n_outputs):
                    device_type = ORT_MEMINFO_DEVICE_CPU
                    if infos[i] != NULL:
                        f.MemoryInfoGetDeviceType(infos[i], &device_type)
                    self.output_wants_device[i] = device_type != ORT_MEMINFO_DEVICE_CPU
            finally:
                free(infos)

    def _memory_infos(self, bint outputs):
        cdef const OrtFns* f = self.fn
        cdef Py_ssize_t n = self.n_outputs if outputs else len(self.input_names), i
        cdef const OrtMemoryInfo** infos = NULL
        if self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        fn_missing = (f.SessionGetMemoryInfoForOutputs == NULL if outputs
                      else f.SessionGetMemoryInfoForInputs == NULL)
        if fn_missing:
            raise OrtError(f"onnxruntime {version()} cannot report where a session keeps its "
                           "inputs/outputs (SessionGetMemoryInfoForInputs needs >= 1.23)")
        infos = <const OrtMemoryInfo**>calloc(n + 1, sizeof(OrtMemoryInfo*))
        if infos == NULL:
            raise MemoryError()
        try:
            if outputs:
                check_status(f.SessionGetMemoryInfoForOutputs(self.session, infos, n),
                             "SessionGetMemoryInfoForOutputs")
            else:
                check_status(f.SessionGetMemoryInfoForInputs(self.session, infos, n),
                             "SessionGetMemoryInfoForInputs")
            names = self.output_names if outputs else self.input_names
            return {names[i]: memory_info_to_dict(infos[i]) for i in range(n)}
        finally:
            free(infos)

    def input_memory_info(self):
        """{input name: where the session expects it} as ``{"name": "Cpu", "id": 0,
        "mem_type": 0, "device_type": "CPU"}`` (None where ORT reports none); onnxruntime
        >= 1.23."""
        return self._memory_infos(False)

    def output_memory_info(self):
        """{output name: where the session produces it}, as `input_memory_info`."""
        return self._memory_infos(True)

    def new_binding(self):
        """Another NativeSession object on the same ORT session with its own IoBinding (and
        bound values): one per generator, so generators on one model don't share bindings.
        It keeps this object alive."""
        if self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        cdef NativeSession other = NativeSession.__new__(NativeSession)
        other.fn = self.fn
        other.allocator = self.allocator
        other.session = self.session
        other.run_options = self.run_options
        other._run_config = self._run_config
        other.owner = self
        other.genai_ops = self.genai_ops
        other.borrowed = True
        other.long_session = self.long_session
        other.long_owner = self.long_owner
        other.long_ids_index = self.long_ids_index
        other.long_above = self.long_above
        other.trimmed = self.trimmed
        other.linear_ops = self.linear_ops
        other.step_rows_session = self.step_rows_session
        other._init_binding_state()
        return other

    def route_long_runs(self, NativeSession other, str ids_name, Py_ssize_t above):
        """Run this session's bindings (made by `new_binding` after this call) on ``other``'s
        ORT session when their input ``ids_name`` is longer than ``above`` along axis 1, on
        this one otherwise: two graphs of one model that differ by the kernels a run's
        length favours (the builder's ``prefill_int8`` branches). ``other`` must take and
        give the same inputs and outputs, in the same order; it is kept alive."""
        if other.session == NULL or self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        if other.long_session != NULL or self.long_session != NULL:
            raise ValueError("route_long_runs: a session routes at most once, to one that "
                             "does not route")
        if (other.input_names != self.input_names or other.output_names != self.output_names
                or other.n_inputs != self.n_inputs
                or other.input_dtypes != self.input_dtypes
                or other.output_dtypes != self.output_dtypes):
            raise ValueError("route_long_runs: the sessions' inputs and outputs differ")
        if above < 0:
            raise ValueError(f"route_long_runs: above must be >= 0, got {above}")
        self.long_ids_index = self.input_index(ids_name)
        self.long_session = other.session
        self.long_owner = other
        self.long_above = above

    def route_verify_runs(self, NativeSession other):
        """Run this binding on ``other``'s ORT session until called again with None: a graph of
        the same model, with the same inputs and outputs in the same order, whose kernels give
        a speculative verify run's rows one-token steps' numbers (`genai.runtime.verify_rows`).
        ``other`` is kept alive while it is set."""
        if self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        if other is None:
            self.verify_session = NULL
            self.verify_owner = None
            return
        if other.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        if (other.input_names != self.input_names or other.output_names != self.output_names
                or other.input_dtypes != self.input_dtypes
                or other.output_dtypes != self.output_dtypes):
            raise ValueError("route_verify_runs: the sessions' inputs and outputs differ")
        self.verify_session = other.session
        self.verify_owner = other

    @property
    def routes_verify_runs(self):
        """Whether this binding's runs go to another session (`route_verify_runs`)."""
        return self.verify_session != NULL

    @property
    def routes_long_runs(self):
        """The length above which runs go to the other session (`route_long_runs`), or
        None."""
        return None if self.long_session == NULL else int(self.long_above)

    def __dealloc__(self):
        cdef const OrtFns* f = self.fn
        cdef Py_ssize_t i
        if f == NULL:
            return
        self._drop_output_cache()
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
        if self.session != NULL and not self.borrowed:
            f.ReleaseSession(self.session)
        self.session = NULL
        if self.options != NULL:
            f.ReleaseSessionOptions(self.options)
            self.options = NULL
        if self.cpu_info != NULL:
            f.ReleaseMemoryInfo(self.cpu_info)
            self.cpu_info = NULL
        if self.run_options != NULL and not self.borrowed:
            f.ReleaseRunOptions(self.run_options)
        self.run_options = NULL
        if self.capture_run_options != NULL:
            f.ReleaseRunOptions(self.capture_run_options)
            self.capture_run_options = NULL
        if self.skip_run_options != NULL:
            f.ReleaseRunOptions(self.skip_run_options)
            self.skip_run_options = NULL
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
        free(self.output_alloc_info)
        free(self.input_in_device_memory)
        free(self.output_in_device_memory)
        free(self.output_wants_device)
        self.output_wants_device = NULL
        self.output_on_device = NULL
        free(self.output_bind_pos)
        self.output_bind_pos = NULL
        free(self.input_has_ref)
        self.input_has_ref = NULL
        free(self.output_has_ref)
        self.output_has_ref = NULL
        free(self.out_mark)
        self.out_mark = NULL

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
        return self._bind_ptr_info(is_output, index, data, shape, ndim, elem_type,
                                   self.cpu_info, False)

    cdef int _bind_ptr_info(self, bint is_output, Py_ssize_t index, void* data,
                            const int64_t* shape, size_t ndim, int elem_type,
                            const OrtMemoryInfo* info, bint in_device) noexcept nogil:
        # `data` in the memory `info` describes (a device address when `in_device`).
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
        st = f.CreateTensorWithDataAsOrtValue(info, data, nbytes, shape, ndim,
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
            self.output_alloc_info[index] = NULL
            self.output_in_device_memory[index] = in_device
            self._note_output_bound(index)
        else:
            if self.input_values[index] != NULL:
                f.ReleaseValue(self.input_values[index])
            self.input_values[index] = value
            self.input_in_device_memory[index] = in_device
        return NS_OK

    cdef int bind_input_tensor(self, Py_ssize_t index, DeviceTensor tensor) noexcept nogil:
        if not tensor.placed:
            return self._fail(NS_ERR_STATE, b"the DeviceTensor is not placed yet")
        return self._bind_ptr_info(False, index, tensor.data, tensor.dims, tensor.rank,
                                   tensor.elem,
                                   tensor.info if tensor.in_device_memory else tensor.host_info,
                                   tensor.in_device_memory)

    cdef int bind_output_tensor(self, Py_ssize_t index, DeviceTensor tensor) noexcept nogil:
        if not tensor.placed:
            return self._fail(NS_ERR_STATE, b"the DeviceTensor is not placed yet")
        return self._bind_ptr_info(True, index, tensor.data, tensor.dims, tensor.rank,
                                   tensor.elem,
                                   tensor.info if tensor.in_device_memory else tensor.host_info,
                                   tensor.in_device_memory)

    cdef int upload_tensor(self, DeviceTensor tensor) noexcept nogil:
        cdef OrtStatus* st = tensor.upload()
        if st != NULL:
            return self._fail_status(st)
        return NS_OK

    cdef int download_tensor(self, DeviceTensor tensor) noexcept nogil:
        cdef OrtStatus* st = tensor.download()
        if st != NULL:
            return self._fail_status(st)
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
        st = self.fn.BindOutputToDevice(
            self.binding, self.output_names_c[index],
            self.output_alloc_info[index] if self.output_alloc_info[index] != NULL
            else self.cpu_info,
        )
        if st != NULL:
            return self._fail_status(st)
        if self.output_values[index] != NULL:
            self.fn.ReleaseValue(self.output_values[index])
            self.output_values[index] = NULL
        self.output_on_device[index] = 1
        self._note_output_bound(index)
        return NS_OK

    cdef int run_binding(self) noexcept nogil:
        # With graph capture set, plain runs say gpu_graph_id=-1: not captured.
        return self._run_with(self.skip_run_options if self.skip_run_options != NULL
                              else self.run_options)

    cdef int run_binding_captured(self) noexcept nogil:
        if self.capture_run_options == NULL:
            return self.run_binding()
        return self._run_with(self.capture_run_options)

    cdef int _run_with(self, OrtRunOptions* options) noexcept nogil:
        cdef OrtStatus* st = NULL
        cdef Py_ssize_t i
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        # The values of the previous run are not wanted any more (they live on where they were
        # re-bound as inputs).
        self._drop_output_cache()
        # An ORT-allocated output keeps the value of the previous run in the binding (and with
        # it that run's shape): bind it to the device again so ORT allocates for this run.
        for i in range(self.n_outputs):
            if self.output_on_device[i]:
                st = self.fn.BindOutputToDevice(
                    self.binding, self.output_names_c[i],
                    self.output_alloc_info[i] if self.output_alloc_info[i] != NULL
                    else self.cpu_info,
                )
                if st != NULL:
                    return self._fail_status(st)
        st = self.fn.RunWithBinding(self._session_for_run(), options, self.binding)
        if st != NULL:
            return self._fail_status(st)
        return NS_OK

    cdef OrtSession* _session_for_run(self) noexcept nogil:
        # route_long_runs: the ids' length along axis 1 picks the session (an unbound or
        # unreadable input runs on this one, which then reports what is wrong)
        cdef int64_t dims[NS_MAX_DIMS]
        cdef size_t ndim = 0
        cdef OrtValue* ids
        if self.verify_session != NULL:
            return self.verify_session
        if self.long_session == NULL:
            return self.session
        ids = self.input_values[self.long_ids_index]
        if ids == NULL or self._tensor_shape(ids, NULL, dims, &ndim) != NS_OK or ndim < 2:
            return self.session
        return self.long_session if dims[1] > self.long_above else self.session

    cdef void _note_output_bound(self, Py_ssize_t index) noexcept nogil:
        # ORT appends a newly bound output name to the binding's output list and re-binds an
        # already bound one in place, so a name keeps its first position until
        # ClearBoundOutputs (tests/test_native_session.py checks this).
        if self.output_bind_pos[index] < 0:
            self.output_bind_pos[index] = self.n_bound_outputs
            self.n_bound_outputs += 1
        self._drop_output_cache()

    cdef void _drop_output_cache(self) noexcept nogil:
        cdef size_t k
        if self.out_cache != NULL:
            for k in range(self.out_cache_count):
                if self.out_cache[k] != NULL:
                    self.fn.ReleaseValue(self.out_cache[k])
            self.fn.AllocatorFree(self.allocator, self.out_cache)
        self.out_cache = NULL
        self.out_cache_count = 0
        self.out_cache_valid = False

    cdef int _fetch_output_cache(self) noexcept nogil:
        cdef OrtValue** values = NULL
        cdef size_t count = 0, k
        cdef OrtStatus* st = NULL
        if self.out_cache_valid:
            return NS_OK
        st = self.fn.GetBoundOutputValues(self.binding, self.allocator, &values, &count)
        if st != NULL:
            return self._fail_status(st)
        if count != <size_t>self.n_bound_outputs:
            if values != NULL:
                for k in range(count):
                    if values[k] != NULL:
                        self.fn.ReleaseValue(values[k])
                self.fn.AllocatorFree(self.allocator, values)
            return self._fail(NS_ERR_STATE, b"the IoBinding holds an unexpected number of outputs")
        self.out_cache = values
        self.out_cache_count = count
        self.out_cache_valid = True
        return NS_OK

    cdef int _output_value(self, Py_ssize_t output_index, OrtValue** value) noexcept nogil:
        # The value output `output_index` holds (borrowed from the cache), checked to be a tensor.
        cdef Py_ssize_t pos
        cdef OrtStatus* st = NULL
        cdef int is_tensor = 0
        cdef int rc
        value[0] = NULL
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        if output_index < 0 or output_index >= self.n_outputs:
            return self._fail(NS_ERR_INDEX, b"output index out of range")
        pos = self.output_bind_pos[output_index]
        if pos < 0:
            return self._fail(NS_ERR_STATE, b"output is not bound")
        rc = self._fetch_output_cache()
        if rc != NS_OK:
            return rc
        if self.out_cache[pos] == NULL:
            # Moved to an input by rebind_outputs_as_inputs: the binding still holds it.
            self._drop_output_cache()
            rc = self._fetch_output_cache()
            if rc != NS_OK:
                return rc
        st = self.fn.IsTensor(self.out_cache[pos], &is_tensor)
        if st != NULL:
            return self._fail_status(st)
        if not is_tensor:
            return self._fail(NS_ERR_STATE, b"output has no value (was the session run?)")
        value[0] = self.out_cache[pos]
        return NS_OK

    cdef int _tensor_shape(self, OrtValue* value, int* elem_type, int64_t* shape,
                           size_t* ndim) noexcept nogil:
        cdef const OrtFns* f = self.fn
        cdef OrtTensorTypeAndShapeInfo* info = NULL
        cdef OrtStatus* st = NULL
        cdef size_t n = 0
        st = f.GetTensorTypeAndShape(value, &info)
        if st != NULL:
            return self._fail_status(st)
        if elem_type != NULL:
            st = f.GetTensorElementType(info, elem_type)
        if st == NULL:
            st = f.GetDimensionsCount(info, &n)
        if st == NULL and n > NS_MAX_DIMS:
            f.ReleaseTensorTypeAndShapeInfo(info)
            return self._fail(NS_ERR_SHAPE, b"the value has more than NS_MAX_DIMS dimensions")
        if st == NULL:
            st = f.GetDimensions(info, shape, n)
        f.ReleaseTensorTypeAndShapeInfo(info)
        if st != NULL:
            return self._fail_status(st)
        ndim[0] = n
        return NS_OK

    cdef int output_value_shape(self, Py_ssize_t output_index, int64_t* shape,
                                size_t* ndim) noexcept nogil:
        cdef OrtValue* value = NULL
        cdef int rc = self._output_value(output_index, &value)
        if rc != NS_OK:
            return rc
        return self._tensor_shape(value, NULL, shape, ndim)

    cdef int output_value_data(self, Py_ssize_t output_index, void** data) noexcept nogil:
        cdef OrtValue* value = NULL
        cdef OrtStatus* st = NULL
        cdef int rc = self._output_value(output_index, &value)
        if rc != NS_OK:
            return rc
        st = self.fn.GetTensorMutableData(value, data)
        if st != NULL:
            return self._fail_status(st)
        return NS_OK

    cdef int rebind_outputs_as_inputs(self, const Py_ssize_t* output_indices,
                                      const Py_ssize_t* input_indices,
                                      Py_ssize_t count) noexcept nogil:
        cdef const OrtFns* f = self.fn
        cdef OrtStatus* st = NULL
        cdef OrtValue* value = NULL
        cdef Py_ssize_t k, o, i, done = 0
        cdef int rc = NS_OK, is_tensor = 0, t_out, t_in
        cdef bint refetch = False, need_gil = False
        if self.binding == NULL:
            return self._fail(NS_ERR_STATE, b"NativeSession is not initialised")
        if count < 0:
            return self._fail(NS_ERR_INDEX, b"negative number of output/input pairs")
        # Check every pair before binding any.
        for k in range(count):
            o = output_indices[k]
            i = input_indices[k]
            if o < 0 or o >= self.n_outputs or i < 0 or i >= self.n_inputs:
                rc = self._fail(NS_ERR_INDEX, b"input/output index out of range")
                break
            if self.out_mark[o]:
                rc = self._fail(NS_ERR_INDEX, b"an output is listed twice")
                break
            self.out_mark[o] = 1
            if self.output_bind_pos[o] < 0:
                rc = self._fail(NS_ERR_STATE, b"output is not bound")
                break
            t_out = self.output_types_c[o]
            t_in = self.input_types_c[i]
            if t_out != ELEM_UNDEFINED and t_in != ELEM_UNDEFINED and t_out != t_in:
                rc = self._fail(NS_ERR_DTYPE, b"output and input element types differ")
                break
        for k in range(count):
            o = output_indices[k]
            if 0 <= o < self.n_outputs:
                self.out_mark[o] = 0
        if rc != NS_OK or count == 0:
            return rc
        rc = self._fetch_output_cache()
        if rc != NS_OK:
            return rc
        for k in range(count):
            if self.out_cache[self.output_bind_pos[output_indices[k]]] == NULL:
                refetch = True   # moved by an earlier call after the same run
        if refetch:
            self._drop_output_cache()
            rc = self._fetch_output_cache()
            if rc != NS_OK:
                return rc
        for k in range(count):
            st = f.IsTensor(self.out_cache[self.output_bind_pos[output_indices[k]]], &is_tensor)
            if st != NULL:
                return self._fail_status(st)
            if not is_tensor:
                return self._fail(NS_ERR_STATE, b"output has no value (was the session run?)")
        for k in range(count):
            o = output_indices[k]
            i = input_indices[k]
            value = self.out_cache[self.output_bind_pos[o]]
            st = f.BindInput(self.binding, self.input_names_c[i], value)
            if st != NULL:
                rc = self._fail_status(st)
                break
            # The binding holds its own reference; the cache's becomes the session's.
            if self.input_values[i] != NULL:
                f.ReleaseValue(self.input_values[i])
            self.input_values[i] = value
            self.input_in_device_memory[i] = self.output_in_device_memory[o]
            self.out_cache[self.output_bind_pos[o]] = NULL
            if self.input_has_ref[i] or (self.output_has_ref[o] and not self.output_on_device[o]):
                need_gil = True
            done = k + 1
        if need_gil:
            # A pointer-bound output's array must outlive the input that now reads it; an
            # input's previous array is no longer needed.
            with gil:
                for k in range(done):
                    o = output_indices[k]
                    i = input_indices[k]
                    if self.output_has_ref[o] and not self.output_on_device[o]:
                        self._input_refs[i] = self._output_refs[o]
                        self.input_has_ref[i] = 1
                    elif self.input_has_ref[i]:
                        self._input_refs[i] = None
                        self.input_has_ref[i] = 0
        return rc

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
    def initializer_dtypes(self):
        """{name: numpy dtype} of the overridable initializers: initializers the graph also
        lists as inputs, which a run may feed (bind_input by name) or leave to their value.
        Not among input_names / input_dtypes."""
        cdef Py_ssize_t first = len(self.input_names)
        return {n: ELEM_TO_DTYPE.get(self.input_types_c[i])
                for n, i in self._input_index.items() if i >= first}

    @property
    def initializer_shapes(self):
        """{name: shape} of the overridable initializers (see initializer_dtypes)."""
        cdef Py_ssize_t first = len(self.input_names)
        return {n: self._input_shapes[i] for n, i in self._input_index.items() if i >= first}

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
        self._check_alias(is_output, index, cnp.PyArray_DATA(arr), name)
        rc = self._bind_ptr(is_output, index, cnp.PyArray_DATA(arr), dims, ndim, declared)
        if rc != 0:
            self.raise_last_error()
        if is_output:
            self._output_refs[index] = array
            self.output_has_ref[index] = 1
        else:
            self._input_refs[index] = array
            self.input_has_ref[index] = 1
        self._bindings_changed()

    cdef _check_alias(self, bint is_output, Py_ssize_t index, void* data, str name):
        # A host array bound as an input and as an output the session produces in device
        # memory: onnxruntime copies the input to one device buffer and the output from
        # another, so what the run writes in place (a shared KV buffer) is lost. Refuse it.
        cdef Py_ssize_t i
        cdef void* other = NULL
        cdef OrtStatus* st = NULL
        if is_output:
            if not self.output_wants_device[index]:
                return
            for i in range(self.n_inputs):
                if self.input_values[i] == NULL or self.input_in_device_memory[i]:
                    continue
                st = self.fn.GetTensorMutableData(self.input_values[i], &other)
                if st != NULL:
                    self.fn.ReleaseStatus(st)
                elif other == data:
                    self._alias_error(name, self.input_names[i], self.output_names[index])
        else:
            for i in range(self.n_outputs):
                if (not self.output_wants_device[i] or self.output_values[i] == NULL
                        or self.output_in_device_memory[i]):
                    continue
                st = self.fn.GetTensorMutableData(self.output_values[i], &other)
                if st != NULL:
                    self.fn.ReleaseStatus(st)
                elif other == data:
                    self._alias_error(name, name, self.output_names[i])

    def _alias_error(self, str name, str input_name, str output_name):
        raise ValueError(
            f"{name!r}: one host array bound as input {input_name!r} and output "
            f"{output_name!r}, which the session produces in device memory: onnxruntime would "
            "copy them to separate device buffers and lose what the run writes in place (a "
            "shared KV buffer); bind a DeviceTensor (placed in the session's memory) instead")

    def bind_input(self, str name, array, shape=None):
        """Bind ``array``'s memory (no copy) as input ``name``.

        ``shape`` defaults to ``array.shape``; a different shape binds the first
        ``prod(shape)`` elements (e.g. a prefix of a preallocated attention-mask buffer). The
        session keeps a reference to ``array`` until the input is re-bound. A `DeviceTensor`
        is placed first (where the session wants this input) when it is not yet.
        """
        if isinstance(array, DeviceTensor):
            self._bind_tensor(False, name, array, shape)
        else:
            self._bind_array(False, name, _ndarray(array, name), shape)

    def bind_output(self, str name, array, shape=None):
        """Bind ``array``'s memory (no copy) as output ``name``; ORT writes into it on run().
        A `DeviceTensor` is placed first (where the session produces this output) when it is
        not yet (e.g. a shared KV buffer: bound as past, then as present)."""
        if isinstance(array, DeviceTensor):
            self._bind_tensor(True, name, array, shape)
        else:
            self._bind_array(True, name, _ndarray(array, name), shape)

    def _bind_tensor(self, bint is_output, str name, DeviceTensor tensor, shape):
        cdef Py_ssize_t index = self.output_index(name) if is_output else self.input_index(name)
        cdef int declared = self.output_types_c[index] if is_output else self.input_types_c[index]
        cdef int rc
        kind = "output" if is_output else "input"
        if shape is not None and tuple([int(d) for d in shape]) != tensor.shape:
            raise ValueError(f"{kind} {name!r}: a DeviceTensor binds whole ({tensor.shape})")
        if declared != ELEM_UNDEFINED and declared != tensor.elem:
            raise TypeError(f"{kind} {name!r} expects {ELEM_TO_DTYPE.get(declared)}, got a "
                            f"DeviceTensor of {tensor.dtype}")
        self.place_tensor(tensor, is_output, index)
        if is_output:
            rc = self.bind_output_tensor(index, tensor)
        else:
            rc = self.bind_input_tensor(index, tensor)
        if rc != 0:
            self.raise_last_error()
        if is_output:
            self._output_refs[index] = tensor
            self.output_has_ref[index] = 1
        else:
            self._input_refs[index] = tensor
            self.input_has_ref[index] = 1
        self._bindings_changed()

    def _bindings_changed(self):
        # A graph captured under this binding's id reads the addresses bound then: after a
        # re-bind from Python (a grown KV cache, an adapter's weights) capture anew under
        # another id. (The decode loop's own binds keep their addresses.)
        if self.capture_run_options != NULL:
            self.set_graph_capture(self.next_graph_id())

    cdef const OrtMemoryInfo* _memory_info_for(self, bint is_output,
                                               Py_ssize_t index) except? NULL:
        # Where the session wants input/output `index` (session-owned); NULL: host memory, or
        # an onnxruntime (< 1.23) that cannot tell.
        cdef Py_ssize_t n = self.n_outputs if is_output else self.n_inputs
        cdef const OrtMemoryInfo** infos = NULL
        cdef const OrtMemoryInfo* found = NULL
        cdef int device_type = ORT_MEMINFO_DEVICE_CPU
        if (self.fn.SessionGetMemoryInfoForInputs == NULL
                or self.fn.SessionGetMemoryInfoForOutputs == NULL):
            return NULL
        infos = <const OrtMemoryInfo**>calloc(n + 1, sizeof(OrtMemoryInfo*))
        if infos == NULL:
            raise MemoryError()
        try:
            if is_output:
                check_status(self.fn.SessionGetMemoryInfoForOutputs(self.session, infos, n),
                             "SessionGetMemoryInfoForOutputs")
            else:
                check_status(self.fn.SessionGetMemoryInfoForInputs(self.session, infos, n),
                             "SessionGetMemoryInfoForInputs")
            found = infos[index]
        finally:
            free(infos)
        if found != NULL and self.fn.MemoryInfoGetDeviceType != NULL:
            self.fn.MemoryInfoGetDeviceType(found, &device_type)
        if device_type == ORT_MEMINFO_DEVICE_CPU:
            return NULL
        return found

    cdef place_tensor(self, DeviceTensor tensor, bint is_output, Py_ssize_t index):
        """Give ``tensor`` its memory: where the session wants input/output ``index``."""
        cdef const OrtFns* f = self.fn
        cdef const OrtMemoryInfo* info = NULL
        cdef cnp.ndarray staging
        cdef OrtStatus* st = NULL
        if tensor.placed:
            return
        if self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        info = self._memory_info_for(is_output, index)
        staging = tensor.staging
        if info == NULL:
            # Host memory: the tensor is its staging array.
            check_status(f.CreateTensorWithDataAsOrtValue(
                tensor.host_info, cnp.PyArray_DATA(staging), tensor.nbytes_c, tensor.dims,
                tensor.rank, tensor.elem, &tensor.value), "CreateTensorWithDataAsOrtValue")
            tensor.in_device_memory = False
            tensor.keep_staging = True
            tensor.memory_name = "Cpu"
        else:
            if f.CopyTensors == NULL:
                raise OrtError(f"onnxruntime {version()} cannot copy to device tensors "
                               "(CopyTensors needs >= 1.23)")
            _load_device_fns()
            check_status(_devfns.CreateAllocator(self.session, info, &tensor.dev_allocator),
                         "CreateAllocator (device memory for a DeviceTensor)")
            check_status(_devfns.CreateTensorAsOrtValue(
                tensor.dev_allocator, tensor.dims, tensor.rank, tensor.elem, &tensor.value),
                "CreateTensorAsOrtValue (a DeviceTensor in device memory)")
            check_status(f.CreateTensorWithDataAsOrtValue(
                tensor.host_info, cnp.PyArray_DATA(staging), tensor.nbytes_c, tensor.dims,
                tensor.rank, tensor.elem, &tensor.host_view), "CreateTensorWithDataAsOrtValue")
            tensor.info = info
            tensor.in_device_memory = True
            with nogil:
                st = tensor.upload()
            check_status(st, "CopyTensors (a DeviceTensor's initial data to the device)")
            tensor.memory_name = (memory_info_to_dict(info) or {}).get("name", "device")
            if not tensor.keep_staging:
                f.ReleaseValue(tensor.host_view)
                tensor.host_view = NULL
                tensor.staging = None
        check_status(f.GetTensorMutableData(tensor.value, &tensor.data), "GetTensorMutableData")
        tensor.placed = True
        tensor.owner = self

    def place(self, DeviceTensor tensor, str name, bint output=False):
        """Place ``tensor`` where the session wants input (or output) ``name``, unbound."""
        self.place_tensor(tensor, output,
                          self.output_index(name) if output else self.input_index(name))

    def bound_input_in_device_memory(self, str name):
        """Whether the value bound as input ``name`` lives in device memory."""
        cdef Py_ssize_t index = self.input_index(name)
        if self.input_values[index] == NULL:
            raise KeyError(f"input {name!r} is not bound")
        return bool(self.input_in_device_memory[index])

    def set_graph_capture(self, graph_id):
        """Graph capture for this binding's runs. ``graph_id`` > 0: `run_binding_captured`
        runs with ``gpu_graph_id`` = graph_id (onnxruntime captures the graph at the first
        such run and replays it afterwards: every bound address must stay the same), every
        other run with ``gpu_graph_id=-1``; -1: every run with -1 (a session created with
        graph capture on, used without it); None: neither (the session's run options)."""
        cdef OrtRunOptions* capture = NULL
        cdef OrtRunOptions* skip = NULL
        cdef const OrtFns* f = self.fn
        if graph_id is not None:
            graph_id = int(graph_id)
            if graph_id == 0 or graph_id < -1:
                raise ValueError(f"graph_id must be > 0, -1 or None, got {graph_id}")
        try:
            for target in ((graph_id, -1) if graph_id is not None and graph_id > 0
                           else (-1,) if graph_id == -1 else ()):
                check_status(f.CreateRunOptions(&skip if target == -1 else &capture),
                             "CreateRunOptions")
                _add_run_entries(f, skip if target == -1 else capture,
                                 {**self._run_config, "gpu_graph_id": str(target)})
        except BaseException:
            if capture != NULL:
                f.ReleaseRunOptions(capture)
            if skip != NULL:
                f.ReleaseRunOptions(skip)
            raise
        if self.capture_run_options != NULL:
            f.ReleaseRunOptions(self.capture_run_options)
        if self.skip_run_options != NULL:
            f.ReleaseRunOptions(self.skip_run_options)
        self.capture_run_options = capture
        self.skip_run_options = skip
        self.graph_id = graph_id

    def set_run_config_entry(self, str key, str value):
        """Add the run config entry ``key`` = ``value`` to this binding's runs only (other
        bindings of the session keep the session's run options)."""
        cdef OrtRunOptions* opts = NULL
        cdef const OrtFns* f = self.fn
        if self.session == NULL:
            raise RuntimeError("NativeSession is not initialised")
        config = {**self._run_config, key: value}  # a copy: the dict is shared with the owner
        if self.graph_id is not None:
            self._run_config = config
            self.set_graph_capture(self.graph_id)  # rebuilds both run options from it
            return
        try:
            check_status(f.CreateRunOptions(&opts), "CreateRunOptions")
            _add_run_entries(f, opts, config)
        except BaseException:
            if opts != NULL:
                f.ReleaseRunOptions(opts)
            raise
        # Plain runs use skip_run_options when set (owned by this object).
        if self.skip_run_options != NULL:
            f.ReleaseRunOptions(self.skip_run_options)
        self.skip_run_options = opts
        self._run_config = config

    def next_graph_id(self):
        """A graph id no other binding of this ORT session has been given (1, 2, ...)."""
        cdef NativeSession root = self.owner if self.borrowed else self
        root.graph_counter += 1
        return root.graph_counter

    def bind_output_to_device(self, str name, bint device_memory=False):
        """Let ORT allocate output ``name`` at each run; read it with get_output. In host
        memory, or with ``device_memory`` where the session produces it (e.g. a GPU EP's KV:
        re-bound as the next past it never leaves the device; reads copy it back)."""
        cdef Py_ssize_t index = self.output_index(name)
        cdef const OrtMemoryInfo** infos = NULL
        cdef int device_type = ORT_MEMINFO_DEVICE_CPU
        if device_memory:
            if self.fn.SessionGetMemoryInfoForOutputs == NULL or self.fn.CopyTensors == NULL:
                raise OrtError(f"onnxruntime {version()} cannot keep outputs in device memory "
                               "(needs >= 1.23)")
            infos = <const OrtMemoryInfo**>calloc(self.n_outputs + 1, sizeof(OrtMemoryInfo*))
            if infos == NULL:
                raise MemoryError()
            try:
                check_status(self.fn.SessionGetMemoryInfoForOutputs(self.session, infos,
                                                                    self.n_outputs),
                             "SessionGetMemoryInfoForOutputs")
                self.output_alloc_info[index] = infos[index]  # owned by the session
            finally:
                free(infos)
            if self.output_alloc_info[index] == NULL:
                pass  # ORT reports none: host memory
            elif self.fn.MemoryInfoGetDeviceType != NULL:
                self.fn.MemoryInfoGetDeviceType(self.output_alloc_info[index], &device_type)
            self.output_in_device_memory[index] = device_type != ORT_MEMINFO_DEVICE_CPU
        else:
            self.output_alloc_info[index] = NULL
            self.output_in_device_memory[index] = 0
        if self.bind_output_device_index(index) != 0:
            self.raise_last_error()
        self._output_refs[index] = None
        self.output_has_ref[index] = 0

    def clear_bindings(self):
        """Unbind all inputs and outputs."""
        cdef Py_ssize_t i
        if self.binding == NULL:
            raise RuntimeError("NativeSession is not initialised")
        self._drop_output_cache()
        self.fn.ClearBoundInputs(self.binding)
        self.fn.ClearBoundOutputs(self.binding)
        for i in range(self.n_inputs):
            if self.input_values[i] != NULL:
                self.fn.ReleaseValue(self.input_values[i])
                self.input_values[i] = NULL
            self._input_refs[i] = None
            self.input_has_ref[i] = 0
            self.input_in_device_memory[i] = 0
        for i in range(self.n_outputs):
            if self.output_values[i] != NULL:
                self.fn.ReleaseValue(self.output_values[i])
                self.output_values[i] = NULL
            self.output_on_device[i] = 0
            self.output_alloc_info[i] = NULL
            self.output_in_device_memory[i] = 0
            self._output_refs[i] = None
            self.output_has_ref[i] = 0
            self.output_bind_pos[i] = -1
        self.n_bound_outputs = 0

    cpdef int run_checked(self) except -1:
        """Run the session on its bindings with the GIL released; raises on error."""
        cdef int rc
        with nogil:
            rc = self.run_binding()
        if rc != 0:
            self.raise_last_error()
        return 0

    def run(self):
        """Run the session on its bindings; the GIL is released for the whole run."""
        self.run_checked()

    @property
    def ort_session_address(self):
        """The address of the ORT session: equal for every binding (`new_binding`) of one
        session, so state the session keeps can be told apart per session."""
        return <size_t>self.session

    def set_ep_dynamic_options(self, options):
        """Pass ``options`` (str -> str) to the session's execution providers while it lives
        (``SetEpDynamicOptions``; OpenVINO's stateful mode takes ``kvcache_rewind``)."""
        cdef const OrtFns* f = self.fn
        if f.SetEpDynamicOptions == NULL:
            raise RuntimeError("execution-provider dynamic options need onnxruntime >= 1.21")
        cdef list keys = [str(k).encode() for k in options]
        cdef list values = [str(v).encode() for v in options.values()]
        cdef Py_ssize_t n = len(keys), i
        cdef const char** ckeys = <const char**>calloc(n + 1, sizeof(char*))
        cdef const char** cvalues = <const char**>calloc(n + 1, sizeof(char*))
        cdef OrtStatus* st
        if ckeys == NULL or cvalues == NULL:
            free(ckeys)
            free(cvalues)
            raise MemoryError()
        try:
            for i in range(n):
                ckeys[i] = <bytes>keys[i]
                cvalues[i] = <bytes>values[i]
            st = f.SetEpDynamicOptions(self.session, ckeys, cvalues, <size_t>n)
            check_status(st, f"SetEpDynamicOptions({dict(options)})")
        finally:
            free(ckeys)
            free(cvalues)

    cdef object _value_to_array(self, OrtValue* value, str what, bint in_device_memory=False):
        cdef int64_t dims[NS_MAX_DIMS]
        cdef size_t ndim = 0, k
        cdef int elem = 0
        cdef void* data = NULL
        cdef cnp.ndarray out
        cdef OrtValue* host = NULL
        cdef OrtStatus* st = NULL
        if self._tensor_shape(value, &elem, dims, &ndim) != 0:
            self.raise_last_error()
        dtype = ELEM_TO_DTYPE.get(elem)
        if dtype is None:
            raise TypeError(f"{what}: element type {elem} has no numpy dtype")
        out = np.empty(tuple([dims[k] for k in range(ndim)]), dtype=dtype)
        if not out.nbytes:
            return out
        if not in_device_memory:
            check_status(self.fn.GetTensorMutableData(value, &data), "GetTensorMutableData")
            memcpy(cnp.PyArray_DATA(out), data, out.nbytes)
            return out
        # Device memory: copy into a host tensor over `out`.
        cdef OrtEnv* env = ort_env()
        check_status(self.fn.CreateTensorWithDataAsOrtValue(
            self.cpu_info, cnp.PyArray_DATA(out), <size_t>out.nbytes, dims, ndim, elem, &host,
        ), "CreateTensorWithDataAsOrtValue")
        with nogil:
            st = self.fn.CopyTensors(env, <const OrtValue* const*>&value, &host,
                                     NULL, 1)
        self.fn.ReleaseValue(host)
        check_status(st, f"CopyTensors ({what} from device memory)")
        return out

    def get_output(self, str name):
        """A copy (ndarray) of the value output ``name`` holds after run()."""
        cdef Py_ssize_t index = self.output_index(name)
        cdef OrtValue* value = NULL
        if self.binding == NULL:
            raise RuntimeError("NativeSession is not initialised")
        if self.output_bind_pos[index] < 0:
            raise KeyError(f"output {name!r} is not bound")
        if self._output_value(index, &value) != 0:
            self.raise_last_error()
        return self._value_to_array(value, f"output {name!r}",
                                    self.output_in_device_memory[index])

    def input_value(self, str name):
        """A copy (ndarray) of the value bound as input ``name`` (bound from an array, a
        pointer or a rebound output)."""
        cdef Py_ssize_t index = self.input_index(name)
        if self.binding == NULL:
            raise RuntimeError("NativeSession is not initialised")
        if self.input_values[index] == NULL:
            raise KeyError(f"input {name!r} is not bound")
        return self._value_to_array(self.input_values[index], f"input {name!r}",
                                    self.input_in_device_memory[index])

    def output_value_info(self, str name):
        """``(shape, data address)`` of the value output ``name`` holds after run(): the
        Python face of output_value_shape / output_value_data."""
        cdef Py_ssize_t index = self.output_index(name)
        cdef int64_t dims[NS_MAX_DIMS]
        cdef size_t ndim = 0, k
        cdef void* data = NULL
        if self.output_in_device_memory[index]:
            raise ValueError(f"output {name!r} lives in device memory: no host address")
        cdef int rc = self.output_value_shape(index, dims, &ndim)
        if rc == 0:
            rc = self.output_value_data(index, &data)
        if rc != 0:
            self.raise_last_error()
        return tuple([dims[k] for k in range(ndim)]), <size_t>data

    def rebind_outputs_as_inputs_py(self, output_names, input_names):
        """Bind the value each output in ``output_names`` holds (after run()) as the input of
        the same position in ``input_names``, without copying: e.g. ``present.0`` as
        ``past_key_values.0`` for the next step."""
        outs = [self.output_index(str(name)) for name in output_names]
        ins = [self.input_index(str(name)) for name in input_names]
        if len(outs) != len(ins):
            raise ValueError(f"{len(outs)} output names for {len(ins)} input names")
        cdef Py_ssize_t n = len(outs), k
        cdef Py_ssize_t* out_idx = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
        cdef Py_ssize_t* in_idx = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
        cdef int rc
        try:
            if out_idx == NULL or in_idx == NULL:
                raise MemoryError()
            for k in range(n):
                out_idx[k] = outs[k]
                in_idx[k] = ins[k]
            rc = self.rebind_outputs_as_inputs(out_idx, in_idx, n)
        finally:
            free(out_idx)
            free(in_idx)
        if rc != 0:
            self.raise_last_error()
