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
cdef uint32_t _api_version = 0
# Bumped whenever an execution-provider library is unregistered: EpDevice objects made before
# then may point at freed memory and refuse to be used.
cdef unsigned long _ep_generation = 1
# registration name -> library path, for the libraries registered through this module.
_registered_ep_libraries = {}


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
    _set_slot(&f.EnableProfiling, t, ORT_SLOT_EnableProfiling)
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
    _set_slot(&f.MemoryInfoGetName, t, ORT_SLOT_MemoryInfoGetName)
    _set_slot(&f.MemoryInfoGetId, t, ORT_SLOT_MemoryInfoGetId)
    _set_slot(&f.MemoryInfoGetMemType, t, ORT_SLOT_MemoryInfoGetMemType)
    _set_slot(&f.AddFreeDimensionOverrideByName, t, ORT_SLOT_AddFreeDimensionOverrideByName)
    _set_slot(&f.GetAvailableProviders, t, ORT_SLOT_GetAvailableProviders)
    _set_slot(&f.ReleaseAvailableProviders, t, ORT_SLOT_ReleaseAvailableProviders)
    _set_slot(&f.CreateCustomOpDomain, t, ORT_SLOT_CreateCustomOpDomain)
    _set_slot(&f.CustomOpDomain_Add, t, ORT_SLOT_CustomOpDomain_Add)
    _set_slot(&f.AddCustomOpDomain, t, ORT_SLOT_AddCustomOpDomain)
    _set_slot(&f.ReleaseCustomOpDomain, t, ORT_SLOT_ReleaseCustomOpDomain)
    _set_slot(&f.KernelInfoGetAttribute_float, t, ORT_SLOT_KernelInfoGetAttribute_float)
    _set_slot(&f.KernelInfoGetAttribute_int64, t, ORT_SLOT_KernelInfoGetAttribute_int64)
    _set_slot(&f.KernelContext_GetInputCount, t, ORT_SLOT_KernelContext_GetInputCount)
    _set_slot(&f.KernelContext_GetOutputCount, t, ORT_SLOT_KernelContext_GetOutputCount)
    _set_slot(&f.KernelContext_GetInput, t, ORT_SLOT_KernelContext_GetInput)
    _set_slot(&f.KernelContext_GetOutput, t, ORT_SLOT_KernelContext_GetOutput)
    _set_slot(&f.CreateOpAttr, t, ORT_SLOT_CreateOpAttr)
    _set_slot(&f.ReleaseOpAttr, t, ORT_SLOT_ReleaseOpAttr)
    _set_slot(&f.CreateOp, t, ORT_SLOT_CreateOp)
    _set_slot(&f.InvokeOp, t, ORT_SLOT_InvokeOp)
    _set_slot(&f.ReleaseOp, t, ORT_SLOT_ReleaseOp)
    f.RegisterCustomOpsLibrary_V2 = NULL
    f.MemoryInfoGetDeviceType = NULL
    if api_version >= ORT_API_VERSION_CUSTOM_OPS_V2:
        _set_slot(&f.RegisterCustomOpsLibrary_V2, t, ORT_SLOT_RegisterCustomOpsLibrary_V2)
        _set_slot(&f.MemoryInfoGetDeviceType, t, ORT_SLOT_MemoryInfoGetDeviceType)
    f.KernelContext_ParallelFor = NULL
    if api_version >= ORT_API_VERSION_PARALLEL_FOR:
        _set_slot(&f.KernelContext_ParallelFor, t, ORT_SLOT_KernelContext_ParallelFor)
    f.GetKeyValuePairs = NULL
    f.RegisterExecutionProviderLibrary = NULL
    f.UnregisterExecutionProviderLibrary = NULL
    f.GetEpDevices = NULL
    f.SessionOptionsAppendExecutionProvider_V2 = NULL
    f.HardwareDevice_Type = NULL
    f.HardwareDevice_VendorId = NULL
    f.HardwareDevice_Vendor = NULL
    f.HardwareDevice_DeviceId = NULL
    f.HardwareDevice_Metadata = NULL
    f.EpDevice_EpName = NULL
    f.EpDevice_EpVendor = NULL
    f.EpDevice_EpMetadata = NULL
    f.EpDevice_EpOptions = NULL
    f.EpDevice_Device = NULL
    if api_version >= ORT_API_VERSION_PLUGIN_EP:
        _set_slot(&f.GetKeyValuePairs, t, ORT_SLOT_GetKeyValuePairs)
        _set_slot(&f.RegisterExecutionProviderLibrary, t,
                  ORT_SLOT_RegisterExecutionProviderLibrary)
        _set_slot(&f.UnregisterExecutionProviderLibrary, t,
                  ORT_SLOT_UnregisterExecutionProviderLibrary)
        _set_slot(&f.GetEpDevices, t, ORT_SLOT_GetEpDevices)
        _set_slot(&f.SessionOptionsAppendExecutionProvider_V2, t,
                  ORT_SLOT_SessionOptionsAppendExecutionProvider_V2)
        _set_slot(&f.HardwareDevice_Type, t, ORT_SLOT_HardwareDevice_Type)
        _set_slot(&f.HardwareDevice_VendorId, t, ORT_SLOT_HardwareDevice_VendorId)
        _set_slot(&f.HardwareDevice_Vendor, t, ORT_SLOT_HardwareDevice_Vendor)
        _set_slot(&f.HardwareDevice_DeviceId, t, ORT_SLOT_HardwareDevice_DeviceId)
        _set_slot(&f.HardwareDevice_Metadata, t, ORT_SLOT_HardwareDevice_Metadata)
        _set_slot(&f.EpDevice_EpName, t, ORT_SLOT_EpDevice_EpName)
        _set_slot(&f.EpDevice_EpVendor, t, ORT_SLOT_EpDevice_EpVendor)
        _set_slot(&f.EpDevice_EpMetadata, t, ORT_SLOT_EpDevice_EpMetadata)
        _set_slot(&f.EpDevice_EpOptions, t, ORT_SLOT_EpDevice_EpOptions)
        _set_slot(&f.EpDevice_Device, t, ORT_SLOT_EpDevice_Device)
    f.SetEpDynamicOptions = NULL
    if api_version >= ORT_API_VERSION_EP_DYNAMIC_OPTIONS:
        _set_slot(&f.SetEpDynamicOptions, t, ORT_SLOT_SetEpDynamicOptions)
    f.SessionGetMemoryInfoForInputs = NULL
    f.SessionGetMemoryInfoForOutputs = NULL
    f.CopyTensors = NULL
    if api_version >= ORT_API_VERSION_SESSION_DEVICES:
        _set_slot(&f.SessionGetMemoryInfoForInputs, t, ORT_SLOT_SessionGetMemoryInfoForInputs)
        _set_slot(&f.SessionGetMemoryInfoForOutputs, t,
                  ORT_SLOT_SessionGetMemoryInfoForOutputs)
        _set_slot(&f.CopyTensors, t, ORT_SLOT_CopyTensors)


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
    global _loaded, _handle, _library_path, _version, _api_version
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
    cdef uint32_t api_version = _api_version_of(version)
    _fill(&_fns, <const void* const*>api, api_version)
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
    _api_version = api_version if api_version > 0 else ORT_API_VERSION_REQUIRED
    _loaded = True
    return 0


cdef uint32_t ort_api_version() except 0:
    if not _loaded:
        _load()
    return _api_version


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


# ---------------------------------------------------------------- key-value pairs, memory info

cdef dict kvps_to_dict(const OrtKeyValuePairs* kvps):
    cdef const char* const* keys = NULL
    cdef const char* const* values = NULL
    cdef size_t n = 0, i
    if kvps == NULL or _fns.GetKeyValuePairs == NULL:
        return {}
    _fns.GetKeyValuePairs(kvps, &keys, &values, &n)
    out = {}
    for i in range(n):
        if keys[i] != NULL:
            out[keys[i].decode("utf-8", "replace")] = (
                values[i].decode("utf-8", "replace") if values[i] != NULL else "")
    return out


MEMORY_DEVICE_TYPES = {
    ORT_MEMINFO_DEVICE_CPU: "CPU",
    ORT_MEMINFO_DEVICE_GPU: "GPU",
    ORT_MEMINFO_DEVICE_FPGA: "FPGA",
    ORT_MEMINFO_DEVICE_NPU: "NPU",
}


cdef object memory_info_to_dict(const OrtMemoryInfo* info):
    cdef const char* name = NULL
    cdef int ident = 0, mem_type = 0, device_type = -1
    if info == NULL:
        return None
    check_status(_fns.MemoryInfoGetName(info, &name), "MemoryInfoGetName")
    check_status(_fns.MemoryInfoGetId(info, &ident), "MemoryInfoGetId")
    check_status(_fns.MemoryInfoGetMemType(info, &mem_type), "MemoryInfoGetMemType")
    if _fns.MemoryInfoGetDeviceType != NULL:
        _fns.MemoryInfoGetDeviceType(info, &device_type)
    return {
        "name": name.decode("utf-8", "replace") if name != NULL else "",
        "id": ident,
        "mem_type": mem_type,
        "device_type": MEMORY_DEVICE_TYPES.get(device_type, str(device_type)),
    }


# ---------------------------------------------------------------- execution-provider devices

HARDWARE_DEVICE_TYPES = {
    ORT_HW_DEVICE_CPU: "CPU",
    ORT_HW_DEVICE_GPU: "GPU",
    ORT_HW_DEVICE_NPU: "NPU",
}


cdef str _text(const char* s):
    return s.decode("utf-8", "replace") if s != NULL else ""


cdef int _need_plugin_api(str what) except -1:
    ort_fns()
    if _fns.GetEpDevices == NULL:
        raise OrtError(f"{what}: onnxruntime {_version} has no plugin execution-provider API "
                       f"(C API {ORT_API_VERSION_PLUGIN_EP}, onnxruntime >= 1.22)")
    return 0


cdef class EpDevice:
    """One (execution provider, hardware device) pair ORT can run on, from `get_ep_devices`.

    Attributes are read once: ``ep_name``, ``ep_vendor``, ``device_type`` ("CPU", "GPU",
    "NPU"), ``vendor``, ``vendor_id``, ``device_id``, ``ep_metadata``, ``ep_options``,
    ``device_metadata`` (dicts of strings).
    """

    def __cinit__(self):
        self.ptr = NULL
        self.generation = 0

    cdef const OrtEpDevice* checked_ptr(self) except NULL:
        if self.ptr == NULL:
            raise ValueError("EpDevice is empty; get devices from get_ep_devices()")
        if self.generation != _ep_generation:
            raise ValueError(f"EpDevice {self.ep_name!r} is stale: an execution-provider "
                             "library was unregistered since it was listed; list devices again")
        return self.ptr

    def as_dict(self):
        """Every attribute, as a plain dict (for reports and JSON)."""
        return {
            "ep_name": self.ep_name,
            "ep_vendor": self.ep_vendor,
            "device_type": self.device_type,
            "vendor": self.vendor,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "ep_metadata": dict(self.ep_metadata),
            "ep_options": dict(self.ep_options),
            "device_metadata": dict(self.device_metadata),
        }

    def __repr__(self):
        return (f"EpDevice(ep_name={self.ep_name!r}, device_type={self.device_type!r}, "
                f"vendor={self.vendor!r}, device_id={self.device_id})")


cdef EpDevice _make_ep_device(const OrtEpDevice* ptr):
    cdef EpDevice dev = EpDevice.__new__(EpDevice)
    cdef const OrtHardwareDevice* hw = _fns.EpDevice_Device(ptr)
    dev.ptr = ptr
    dev.generation = _ep_generation
    dev.ep_name = _text(_fns.EpDevice_EpName(ptr))
    dev.ep_vendor = _text(_fns.EpDevice_EpVendor(ptr))
    dev.ep_metadata = kvps_to_dict(_fns.EpDevice_EpMetadata(ptr))
    dev.ep_options = kvps_to_dict(_fns.EpDevice_EpOptions(ptr))
    if hw != NULL:
        kind = _fns.HardwareDevice_Type(hw)
        dev.device_type = HARDWARE_DEVICE_TYPES.get(kind, str(kind))
        dev.vendor = _text(_fns.HardwareDevice_Vendor(hw))
        dev.vendor_id = _fns.HardwareDevice_VendorId(hw)
        dev.device_id = _fns.HardwareDevice_DeviceId(hw)
        dev.device_metadata = kvps_to_dict(_fns.HardwareDevice_Metadata(hw))
    else:
        dev.device_type = ""
        dev.vendor = ""
        dev.device_metadata = {}
    return dev


def has_plugin_ep_api():
    """True when the loaded onnxruntime has the plugin execution-provider API (>= 1.22)."""
    ort_fns()
    return _fns.GetEpDevices != NULL


def get_ep_devices():
    """Every (execution provider, device) pair of the process-wide environment: the built-in
    EPs' and those of registered plugin libraries (a list of `EpDevice`)."""
    _need_plugin_api("get_ep_devices")
    cdef OrtEnv* env = ort_env()
    cdef const OrtEpDevice* const* devices = NULL
    cdef size_t n = 0, i
    check_status(_fns.GetEpDevices(env, &devices, &n), "GetEpDevices")
    return [_make_ep_device(devices[i]) for i in range(n)]


def register_execution_provider_library(str registration_name, path):
    """Load a plugin execution-provider library (e.g. a package's ``get_library_path()``)
    under ``registration_name``; its devices then appear in `get_ep_devices`. Registering
    the same name and path again is a no-op; the same name with another path is an error."""
    _need_plugin_api("register_execution_provider_library")
    lib = os.fspath(path)
    known = _registered_ep_libraries.get(registration_name)
    if known is not None:
        if known == lib:
            return
        raise OrtError(f"execution-provider library name {registration_name!r} is already "
                       f"registered for {known}; cannot register {lib} under it")
    if not os.path.isfile(lib):
        raise OrtNoSuchFileError(
            f"execution-provider library {lib} (for {registration_name!r}) does not exist",
            ORT_NO_SUCHFILE)
    cdef OrtEnv* env = ort_env()
    cdef bytes bname = registration_name.encode()
    cdef bytes blib = os.fsencode(lib)
    cdef const char* cname = bname
    cdef const char* clib = blib
    cdef OrtStatus* st
    with nogil:
        st = _fns.RegisterExecutionProviderLibrary(env, cname, clib)
    check_status(st, f"registering execution-provider library {lib} as {registration_name!r}")
    _registered_ep_libraries[registration_name] = lib


def unregister_execution_provider_library(str registration_name):
    """Unload a library registered with `register_execution_provider_library`. Devices listed
    before become stale (using one raises)."""
    global _ep_generation
    _need_plugin_api("unregister_execution_provider_library")
    cdef OrtEnv* env = ort_env()
    cdef bytes bname = registration_name.encode()
    check_status(_fns.UnregisterExecutionProviderLibrary(env, bname),
                 f"unregistering execution-provider library {registration_name!r}")
    _registered_ep_libraries.pop(registration_name, None)
    _ep_generation += 1


def registered_execution_provider_libraries():
    """{registration name: library path} of the libraries registered through this module."""
    return dict(_registered_ep_libraries)


def available_providers():
    """Names of the execution providers compiled into (or bridged by) the loaded library, as
    GetAvailableProviders reports them (e.g. ``["CUDAExecutionProvider", ...]``)."""
    cdef const OrtFns* f = ort_fns()
    cdef char** names = NULL
    cdef int n = 0, i
    check_status(f.GetAvailableProviders(&names, &n), "GetAvailableProviders")
    try:
        return [names[i].decode("utf-8", "replace") for i in range(n)]
    finally:
        check_status(f.ReleaseAvailableProviders(names, n), "ReleaseAvailableProviders")


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


def library_api_version():
    """The C API version of the loaded library (its minor version; loads it on first call)."""
    return ort_api_version()
