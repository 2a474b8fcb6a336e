# cython: language_level=3
"""Load onnxruntime's shared library (``libonnxruntime.so``) and expose its C API to Cython.

The library is found next to the installed ``onnxruntime`` Python package
(``onnxruntime/capi/libonnxruntime.so*``) without importing that package, or at the path in
the ``GENAI_ORT_LIBRARY`` environment variable. ``ort_fns()`` returns a table of typed function
pointers that other Cython modules call without the GIL.

Note: onnxruntime's own Python extension (``onnxruntime_pybind11_state``) links onnxruntime
statically and does not load ``libonnxruntime.so``; a process that uses both holds two copies of
onnxruntime (separate environments, thread pools and allocators). Sessions and values are not
shared between the two.
"""

import glob
import importlib.util
import os

from libc.stdint cimport uint32_t
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym


cdef struct OrtApiBase:
    const void* (*GetApi)(uint32_t version) noexcept nogil
    const char* (*GetVersionString)() noexcept nogil

ctypedef const OrtApiBase* (*GetApiBaseFn)() noexcept nogil


class OrtError(RuntimeError):
    """An error reported by onnxruntime's C API; ``code`` is its OrtErrorCode."""

    def __init__(self, message, code=ORT_FAIL):
        super().__init__(message)
        self.code = code


class OrtNoSuchFileError(OrtError, FileNotFoundError):
    """ORT_NO_SUCHFILE (e.g. a missing model file)."""


class OrtInvalidArgumentError(OrtError, ValueError):
    """ORT_INVALID_ARGUMENT."""


ERROR_CODE_NAMES = {
    ORT_OK: "ORT_OK",
    ORT_FAIL: "ORT_FAIL",
    ORT_INVALID_ARGUMENT: "ORT_INVALID_ARGUMENT",
    ORT_NO_SUCHFILE: "ORT_NO_SUCHFILE",
    ORT_NO_MODEL: "ORT_NO_MODEL",
    ORT_ENGINE_ERROR: "ORT_ENGINE_ERROR",
    ORT_RUNTIME_EXCEPTION: "ORT_RUNTIME_EXCEPTION",
    ORT_INVALID_PROTOBUF: "ORT_INVALID_PROTOBUF",
    ORT_MODEL_LOADED: "ORT_MODEL_LOADED",
    ORT_NOT_IMPLEMENTED: "ORT_NOT_IMPLEMENTED",
    ORT_INVALID_GRAPH: "ORT_INVALID_GRAPH",
    ORT_EP_FAIL: "ORT_EP_FAIL",
}


cdef OrtFns _fns
cdef bint _loaded = False
cdef void* _handle = NULL
cdef OrtEnv* _env = NULL
cdef OrtAllocator* _allocator = NULL
cdef str _library_path = None
cdef str _version = None


cdef inline void _set_slot(void* field, const void* const* table, int slot) noexcept:
    # Copy OrtApi slot `slot` into the typed OrtFns member whose address is `field`.
    (<const void**>field)[0] = table[slot]


cdef void _fill(OrtFns* f, const void* const* t, uint32_t api_version) noexcept:
    _set_slot(&f.CreateStatus, t, ORT_SLOT_CreateStatus)
    _set_slot(&f.GetErrorCode, t, ORT_SLOT_GetErrorCode)
    _set_slot(&f.GetErrorMessage, t, ORT_SLOT_GetErrorMessage)
    _set_slot(&f.CreateEnv, t, ORT_SLOT_CreateEnv)
    _set_slot(&f.CreateSession, t, ORT_SLOT_CreateSession)
    _set_slot(&f.CreateSessionFromArray, t, ORT_SLOT_CreateSessionFromArray)
    _set_slot(&f.CreateSessionOptions, t, ORT_SLOT_CreateSessionOptions)
    _set_slot(&f.EnableMemPattern, t, ORT_SLOT_EnableMemPattern)
    _set_slot(&f.DisableMemPattern, t, ORT_SLOT_DisableMemPattern)
    _set_slot(&f.EnableCpuMemArena, t, ORT_SLOT_EnableCpuMemArena)
    _set_slot(&f.DisableCpuMemArena, t, ORT_SLOT_DisableCpuMemArena)
    _set_slot(&f.SetSessionLogId, t, ORT_SLOT_SetSessionLogId)
    _set_slot(&f.SetSessionLogSeverityLevel, t, ORT_SLOT_SetSessionLogSeverityLevel)
    _set_slot(&f.SetSessionGraphOptimizationLevel, t, ORT_SLOT_SetSessionGraphOptimizationLevel)
    _set_slot(&f.SetIntraOpNumThreads, t, ORT_SLOT_SetIntraOpNumThreads)
    _set_slot(&f.SetInterOpNumThreads, t, ORT_SLOT_SetInterOpNumThreads)
    _set_slot(&f.SessionGetInputCount, t, ORT_SLOT_SessionGetInputCount)
    _set_slot(&f.SessionGetOutputCount, t, ORT_SLOT_SessionGetOutputCount)
    _set_slot(&f.SessionGetInputTypeInfo, t, ORT_SLOT_SessionGetInputTypeInfo)
    _set_slot(&f.SessionGetOutputTypeInfo, t, ORT_SLOT_SessionGetOutputTypeInfo)
    _set_slot(&f.SessionGetInputName, t, ORT_SLOT_SessionGetInputName)
    _set_slot(&f.SessionGetOutputName, t, ORT_SLOT_SessionGetOutputName)
    _set_slot(&f.CreateRunOptions, t, ORT_SLOT_CreateRunOptions)
    _set_slot(&f.CreateTensorWithDataAsOrtValue, t, ORT_SLOT_CreateTensorWithDataAsOrtValue)
    _set_slot(&f.IsTensor, t, ORT_SLOT_IsTensor)
    _set_slot(&f.GetTensorMutableData, t, ORT_SLOT_GetTensorMutableData)
    _set_slot(&f.CastTypeInfoToTensorInfo, t, ORT_SLOT_CastTypeInfoToTensorInfo)
    _set_slot(&f.GetOnnxTypeFromTypeInfo, t, ORT_SLOT_GetOnnxTypeFromTypeInfo)
    _set_slot(&f.GetTensorElementType, t, ORT_SLOT_GetTensorElementType)
    _set_slot(&f.GetDimensionsCount, t, ORT_SLOT_GetDimensionsCount)
    _set_slot(&f.GetDimensions, t, ORT_SLOT_GetDimensions)
    _set_slot(&f.GetSymbolicDimensions, t, ORT_SLOT_GetSymbolicDimensions)
    _set_slot(&f.GetTensorTypeAndShape, t, ORT_SLOT_GetTensorTypeAndShape)
    _set_slot(&f.CreateCpuMemoryInfo, t, ORT_SLOT_CreateCpuMemoryInfo)
    _set_slot(&f.AllocatorFree, t, ORT_SLOT_AllocatorFree)
    _set_slot(&f.GetAllocatorWithDefaultOptions, t, ORT_SLOT_GetAllocatorWithDefaultOptions)
    _set_slot(&f.ReleaseEnv, t, ORT_SLOT_ReleaseEnv)
    _set_slot(&f.ReleaseStatus, t, ORT_SLOT_ReleaseStatus)
    _set_slot(&f.ReleaseMemoryInfo, t, ORT_SLOT_ReleaseMemoryInfo)
    _set_slot(&f.ReleaseSession, t, ORT_SLOT_ReleaseSession)
    _set_slot(&f.ReleaseValue, t, ORT_SLOT_ReleaseValue)
    _set_slot(&f.ReleaseRunOptions, t, ORT_SLOT_ReleaseRunOptions)
    _set_slot(&f.ReleaseTypeInfo, t, ORT_SLOT_ReleaseTypeInfo)
    _set_slot(&f.ReleaseTensorTypeAndShapeInfo, t, ORT_SLOT_ReleaseTensorTypeAndShapeInfo)
    _set_slot(&f.ReleaseSessionOptions, t, ORT_SLOT_ReleaseSessionOptions)
    _set_slot(&f.AddSessionConfigEntry, t, ORT_SLOT_AddSessionConfigEntry)
    _set_slot(&f.RunWithBinding, t, ORT_SLOT_RunWithBinding)
    _set_slot(&f.CreateIoBinding, t, ORT_SLOT_CreateIoBinding)
    _set_slot(&f.ReleaseIoBinding, t, ORT_SLOT_ReleaseIoBinding)
    _set_slot(&f.BindInput, t, ORT_SLOT_BindInput)
    _set_slot(&f.BindOutput, t, ORT_SLOT_BindOutput)
    _set_slot(&f.BindOutputToDevice, t, ORT_SLOT_BindOutputToDevice)
    _set_slot(&f.GetBoundOutputNames, t, ORT_SLOT_GetBoundOutputNames)
    _set_slot(&f.GetBoundOutputValues, t, ORT_SLOT_GetBoundOutputValues)
    _set_slot(&f.ClearBoundInputs, t, ORT_SLOT_ClearBoundInputs)
    _set_slot(&f.ClearBoundOutputs, t, ORT_SLOT_ClearBoundOutputs)
    _set_slot(&f.AddRunConfigEntry, t, ORT_SLOT_AddRunConfigEntry)
    _set_slot(&f.SessionOptionsAppendExecutionProvider_CUDA_V2, t,
              ORT_SLOT_SessionOptionsAppendExecutionProvider_CUDA_V2)
    _set_slot(&f.CreateCUDAProviderOptions, t, ORT_SLOT_CreateCUDAProviderOptions)
    _set_slot(&f.UpdateCUDAProviderOptions, t, ORT_SLOT_UpdateCUDAProviderOptions)
    _set_slot(&f.ReleaseCUDAProviderOptions, t, ORT_SLOT_ReleaseCUDAProviderOptions)
    _set_slot(&f.SessionOptionsAppendExecutionProvider, t,
              ORT_SLOT_SessionOptionsAppendExecutionProvider)
    # Slots past the required version: only where the library's table is long enough.
    f.RegisterCustomOpsLibrary_V2 = NULL
    if api_version >= ORT_API_VERSION_CUSTOM_OPS_V2:
        _set_slot(&f.RegisterCustomOpsLibrary_V2, t, ORT_SLOT_RegisterCustomOpsLibrary_V2)


cdef uint32_t _api_version_of(str version) noexcept:
    # The C API version of an onnxruntime release "1.N.x" is N (true since 1.0 and C API 1).
    cdef list parts = version.split(".")
    try:
        if int(parts[0]) > 1:
            return 1000
        return <uint32_t>int(parts[1])
    except (ValueError, IndexError):
        return 0


def find_library():
    """Path of the libonnxruntime shared library this module loads (without loading it)."""
    env_path = os.environ.get("GENAI_ORT_LIBRARY")
    if env_path:
        if not os.path.isfile(env_path):
            raise ImportError(f"GENAI_ORT_LIBRARY={env_path!r} is not a file")
        return env_path
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the onnxruntime package is not installed: no libonnxruntime to load")
    candidates = []
    for folder in spec.submodule_search_locations:
        candidates += glob.glob(os.path.join(folder, "capi", "libonnxruntime.so*"))
        candidates += glob.glob(os.path.join(folder, "capi", "libonnxruntime*.dylib"))
    if not candidates:
        raise ImportError(
            "no libonnxruntime.so* in the onnxruntime package at "
            f"{list(spec.submodule_search_locations)!r}; set GENAI_ORT_LIBRARY to its path"
        )
    # Prefer the fully versioned file (libonnxruntime.so.1.32.0) over symlinks.
    candidates.sort(key=lambda p: (os.path.islink(p), -len(p)))
    return candidates[0]


cdef int _load() except -1:
    global _loaded, _handle, _library_path, _version
    if _loaded:
        return 0
    path = find_library()
    cdef bytes bpath = os.fsencode(path)
    cdef void* handle = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
    cdef const char* err
    if handle == NULL:
        err = dlerror()
        msg = err.decode("utf-8", "replace") if err != NULL else "unknown error"
        raise ImportError(f"cannot load {path}: {msg}")
    cdef void* sym = dlsym(handle, b"OrtGetApiBase")
    if sym == NULL:
        raise ImportError(f"{path} does not export OrtGetApiBase")
    cdef const OrtApiBase* base = (<GetApiBaseFn>sym)()
    if base == NULL:
        raise ImportError(f"OrtGetApiBase() returned NULL in {path}")
    cdef const char* ver = base.GetVersionString()
    version = ver.decode("utf-8", "replace") if ver != NULL else "unknown"
    cdef const void* api = base.GetApi(ORT_API_VERSION_REQUIRED)
    if api == NULL:
        raise ImportError(
            f"onnxruntime {version} at {path} does not provide C API version "
            f"{ORT_API_VERSION_REQUIRED} (onnxruntime >= 1.12 is required)"
        )
    _fill(&_fns, <const void* const*>api, _api_version_of(version))
    # Self-test of the first slots and ReleaseStatus: a wrong layout fails here, not later.
    cdef OrtStatus* st = _fns.CreateStatus(ORT_INVALID_ARGUMENT, b"genai-ort-selftest")
    if st == NULL:
        raise ImportError(f"onnxruntime {version}: C API self-test failed (CreateStatus)")
    ok = (_fns.GetErrorCode(st) == ORT_INVALID_ARGUMENT
          and _fns.GetErrorMessage(st) == b"genai-ort-selftest")
    _fns.ReleaseStatus(st)
    if not ok:
        raise ImportError(f"onnxruntime {version}: C API self-test failed (status round trip)")
    _handle = handle
    _library_path = path
    _version = version
    _loaded = True
    return 0


cdef const OrtFns* ort_fns() except NULL:
    if not _loaded:
        _load()
    return &_fns


cdef OrtEnv* ort_env() except NULL:
    global _env
    if _env != NULL:
        return _env
    cdef const OrtFns* f = ort_fns()
    cdef OrtEnv* env = NULL
    check_status(f.CreateEnv(ORT_LOGGING_LEVEL_WARNING, b"genai", &env), "CreateEnv")
    _env = env
    return _env


cdef OrtAllocator* ort_default_allocator() except NULL:
    global _allocator
    if _allocator != NULL:
        return _allocator
    cdef const OrtFns* f = ort_fns()
    cdef OrtAllocator* alloc = NULL
    check_status(f.GetAllocatorWithDefaultOptions(&alloc), "GetAllocatorWithDefaultOptions")
    _allocator = alloc
    return _allocator


cdef object status_to_exception(OrtStatus* status, str context=None):
    if status == NULL:
        return None
    cdef int code = _fns.GetErrorCode(status)
    cdef const char* cmsg = _fns.GetErrorMessage(status)
    msg = cmsg.decode("utf-8", "replace") if cmsg != NULL else ""
    _fns.ReleaseStatus(status)
    name = ERROR_CODE_NAMES.get(code, f"ORT error {code}")
    text = f"[{name}] {msg}" if not context else f"{context}: [{name}] {msg}"
    if code == ORT_NO_SUCHFILE:
        return OrtNoSuchFileError(text, code)
    if code == ORT_INVALID_ARGUMENT:
        return OrtInvalidArgumentError(text, code)
    return OrtError(text, code)


cdef int check_status(OrtStatus* status, str context=None) except -1:
    if status == NULL:
        return 0
    raise status_to_exception(status, context)


cdef size_t elem_size(int elem_type) noexcept nogil:
    if elem_type == ELEM_FLOAT or elem_type == ELEM_INT32 or elem_type == ELEM_UINT32:
        return 4
    if elem_type == ELEM_INT64 or elem_type == ELEM_UINT64 or elem_type == ELEM_DOUBLE:
        return 8
    if elem_type == ELEM_COMPLEX64:
        return 8
    if elem_type == ELEM_COMPLEX128:
        return 16
    if elem_type == ELEM_FLOAT16 or elem_type == ELEM_BFLOAT16:
        return 2
    if elem_type == ELEM_INT16 or elem_type == ELEM_UINT16:
        return 2
    if elem_type == ELEM_UINT8 or elem_type == ELEM_INT8 or elem_type == ELEM_BOOL:
        return 1
    return 0


def load():
    """Load the library now (idempotent); returns its path."""
    ort_fns()
    return _library_path


def library_path():
    """Path of the loaded library (loads it on first call)."""
    ort_fns()
    return _library_path


def version():
    """Version string of the loaded onnxruntime library (loads it on first call)."""
    ort_fns()
    return _version


def api_version():
    """The C API version this module requests from GetApi."""
    return ORT_API_VERSION_REQUIRED
