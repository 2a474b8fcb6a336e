# cython: language_level=3
"""Minimal declarations of onnxruntime's C API, loaded at run time with dlopen.

Written for this project from the documented layout of ``OrtApi``: a struct of function
pointers to which onnxruntime only ever appends, so a function's position in it never changes.
``ORT_SLOT_*`` below is the one place that names those positions (0-based); ``ort_api.pyx``
copies each slot into a typed field of :c:type:`OrtFns` once, at load time.

All ``OrtFns`` members are plain C function pointers: callable without the GIL.
"""

from libc.stdint cimport int64_t, uint32_t

cdef extern from "ort_opaque_types.h":
    ctypedef struct OrtEnv
    ctypedef struct OrtStatus
    ctypedef struct OrtMemoryInfo
    ctypedef struct OrtIoBinding
    ctypedef struct OrtSession
    ctypedef struct OrtValue
    ctypedef struct OrtRunOptions
    ctypedef struct OrtTypeInfo
    ctypedef struct OrtTensorTypeAndShapeInfo
    ctypedef struct OrtSessionOptions
    ctypedef struct OrtAllocator
    ctypedef struct OrtCUDAProviderOptionsV2
    ctypedef struct OrtKeyValuePairs
    ctypedef struct OrtHardwareDevice
    ctypedef struct OrtEpDevice
    ctypedef struct OrtCustomOpDomain
    ctypedef struct OrtKernelInfo
    ctypedef struct OrtKernelContext
    ctypedef struct OrtOp
    ctypedef struct OrtOpAttr


# The C API version we ask GetApi for: the lowest one that has every slot used below
# (SessionOptionsAppendExecutionProvider arrived in 12; everything else is older) except the
# optional ones listed with the version that added them: those are filled only when the loaded
# library provides that version, and are NULL otherwise.
cdef enum:
    ORT_API_VERSION_REQUIRED = 12
    ORT_API_VERSION_CUSTOM_OPS_V2 = 14   # RegisterCustomOpsLibrary_V2 (onnxruntime 1.14)
    ORT_API_VERSION_PARALLEL_FOR = 17    # KernelContext_ParallelFor (1.17)
    ORT_API_VERSION_EP_DYNAMIC_OPTIONS = 21  # SetEpDynamicOptions (1.21)
    ORT_API_VERSION_PLUGIN_EP = 22       # plugin EP libraries, OrtEpDevice, key-value pairs (1.22)
    ORT_API_VERSION_SESSION_DEVICES = 23  # SessionGetMemoryInfoForInputs/Outputs (1.23)

# OrtHardwareDeviceType
cdef enum:
    ORT_HW_DEVICE_CPU = 0
    ORT_HW_DEVICE_GPU = 1
    ORT_HW_DEVICE_NPU = 2

# OrtMemoryInfoDeviceType
cdef enum:
    ORT_MEMINFO_DEVICE_CPU = 0
    ORT_MEMINFO_DEVICE_GPU = 1
    ORT_MEMINFO_DEVICE_FPGA = 2
    ORT_MEMINFO_DEVICE_NPU = 3

# OrtErrorCode
cdef enum OrtErrorCode:
    ORT_OK = 0
    ORT_FAIL = 1
    ORT_INVALID_ARGUMENT = 2
    ORT_NO_SUCHFILE = 3
    ORT_NO_MODEL = 4
    ORT_ENGINE_ERROR = 5
    ORT_RUNTIME_EXCEPTION = 6
    ORT_INVALID_PROTOBUF = 7
    ORT_MODEL_LOADED = 8
    ORT_NOT_IMPLEMENTED = 9
    ORT_INVALID_GRAPH = 10
    ORT_EP_FAIL = 11

# ONNXTensorElementDataType (= onnx TensorProto.DataType)
cdef enum OrtElemType:
    ELEM_UNDEFINED = 0
    ELEM_FLOAT = 1
    ELEM_UINT8 = 2
    ELEM_INT8 = 3
    ELEM_UINT16 = 4
    ELEM_INT16 = 5
    ELEM_INT32 = 6
    ELEM_INT64 = 7
    ELEM_STRING = 8
    ELEM_BOOL = 9
    ELEM_FLOAT16 = 10
    ELEM_DOUBLE = 11
    ELEM_UINT32 = 12
    ELEM_UINT64 = 13
    ELEM_COMPLEX64 = 14
    ELEM_COMPLEX128 = 15
    ELEM_BFLOAT16 = 16

# ONNXType
cdef enum:
    ONNX_TYPE_TENSOR = 1

# OrtLoggingLevel
cdef enum:
    ORT_LOGGING_LEVEL_VERBOSE = 0
    ORT_LOGGING_LEVEL_INFO = 1
    ORT_LOGGING_LEVEL_WARNING = 2
    ORT_LOGGING_LEVEL_ERROR = 3
    ORT_LOGGING_LEVEL_FATAL = 4

# OrtAllocatorType / OrtMemType
cdef enum:
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1
    ORT_MEM_TYPE_DEFAULT = 0

# Positions of the functions we use in struct OrtApi (0-based; append-only, so fixed).
cdef enum:
    ORT_SLOT_CreateStatus = 0
    ORT_SLOT_GetErrorCode = 1
    ORT_SLOT_GetErrorMessage = 2
    ORT_SLOT_CreateEnv = 3
    ORT_SLOT_CreateSession = 7
    ORT_SLOT_CreateSessionFromArray = 8
    ORT_SLOT_CreateSessionOptions = 10
    ORT_SLOT_EnableProfiling = 14
    ORT_SLOT_EnableMemPattern = 16
    ORT_SLOT_DisableMemPattern = 17
    ORT_SLOT_EnableCpuMemArena = 18
    ORT_SLOT_DisableCpuMemArena = 19
    ORT_SLOT_SetSessionLogId = 20
    ORT_SLOT_SetSessionLogSeverityLevel = 22
    ORT_SLOT_SetSessionGraphOptimizationLevel = 23
    ORT_SLOT_SetIntraOpNumThreads = 24
    ORT_SLOT_SetInterOpNumThreads = 25
    ORT_SLOT_CreateCustomOpDomain = 26
    ORT_SLOT_CustomOpDomain_Add = 27
    ORT_SLOT_AddCustomOpDomain = 28
    ORT_SLOT_SessionGetInputCount = 30
    ORT_SLOT_SessionGetOutputCount = 31
    ORT_SLOT_SessionGetInputTypeInfo = 33
    ORT_SLOT_SessionGetOutputTypeInfo = 34
    ORT_SLOT_SessionGetInputName = 36
    ORT_SLOT_SessionGetOutputName = 37
    ORT_SLOT_CreateRunOptions = 39
    ORT_SLOT_CreateTensorWithDataAsOrtValue = 49
    ORT_SLOT_IsTensor = 50
    ORT_SLOT_GetTensorMutableData = 51
    ORT_SLOT_CastTypeInfoToTensorInfo = 55
    ORT_SLOT_GetOnnxTypeFromTypeInfo = 56
    ORT_SLOT_GetTensorElementType = 60
    ORT_SLOT_GetDimensionsCount = 61
    ORT_SLOT_GetDimensions = 62
    ORT_SLOT_GetSymbolicDimensions = 63
    ORT_SLOT_GetTensorTypeAndShape = 65
    ORT_SLOT_CreateCpuMemoryInfo = 69
    ORT_SLOT_MemoryInfoGetName = 71
    ORT_SLOT_MemoryInfoGetId = 72
    ORT_SLOT_MemoryInfoGetMemType = 73
    ORT_SLOT_AllocatorFree = 76
    ORT_SLOT_GetAllocatorWithDefaultOptions = 78
    ORT_SLOT_KernelInfoGetAttribute_float = 85
    ORT_SLOT_KernelInfoGetAttribute_int64 = 86
    ORT_SLOT_KernelContext_GetInputCount = 88
    ORT_SLOT_KernelContext_GetOutputCount = 89
    ORT_SLOT_KernelContext_GetInput = 90
    ORT_SLOT_KernelContext_GetOutput = 91
    ORT_SLOT_ReleaseEnv = 92
    ORT_SLOT_ReleaseStatus = 93
    ORT_SLOT_ReleaseMemoryInfo = 94
    ORT_SLOT_ReleaseSession = 95
    ORT_SLOT_ReleaseValue = 96
    ORT_SLOT_ReleaseRunOptions = 97
    ORT_SLOT_ReleaseTypeInfo = 98
    ORT_SLOT_ReleaseTensorTypeAndShapeInfo = 99
    ORT_SLOT_ReleaseSessionOptions = 100
    ORT_SLOT_ReleaseCustomOpDomain = 101
    ORT_SLOT_AddFreeDimensionOverrideByName = 124
    ORT_SLOT_GetAvailableProviders = 125
    ORT_SLOT_ReleaseAvailableProviders = 126
    ORT_SLOT_AddSessionConfigEntry = 130
    ORT_SLOT_RunWithBinding = 133
    ORT_SLOT_CreateIoBinding = 134
    ORT_SLOT_ReleaseIoBinding = 135
    ORT_SLOT_BindInput = 136
    ORT_SLOT_BindOutput = 137
    ORT_SLOT_BindOutputToDevice = 138
    ORT_SLOT_GetBoundOutputNames = 139
    ORT_SLOT_GetBoundOutputValues = 140
    ORT_SLOT_ClearBoundInputs = 141
    ORT_SLOT_ClearBoundOutputs = 142
    ORT_SLOT_AddRunConfigEntry = 165
    ORT_SLOT_SessionOptionsAppendExecutionProvider_CUDA_V2 = 204
    ORT_SLOT_CreateCUDAProviderOptions = 205
    ORT_SLOT_UpdateCUDAProviderOptions = 206
    ORT_SLOT_ReleaseCUDAProviderOptions = 208
    ORT_SLOT_CreateOpAttr = 211
    ORT_SLOT_ReleaseOpAttr = 212
    ORT_SLOT_CreateOp = 213
    ORT_SLOT_InvokeOp = 214
    ORT_SLOT_ReleaseOp = 215
    ORT_SLOT_SessionOptionsAppendExecutionProvider = 216
    ORT_SLOT_MemoryInfoGetDeviceType = 225       # API 14 group; NULL below 14
    ORT_SLOT_RegisterCustomOpsLibrary_V2 = 228   # API 14; NULL in OrtFns below 14
    ORT_SLOT_KernelContext_ParallelFor = 274     # API 17; NULL in OrtFns below 17
    ORT_SLOT_SetEpDynamicOptions = 284   # API 21; NULL in OrtFns below 21
    # API 22 (plugin execution providers); NULL in OrtFns below 22.
    ORT_SLOT_GetKeyValuePairs = 298
    ORT_SLOT_RegisterExecutionProviderLibrary = 301
    ORT_SLOT_UnregisterExecutionProviderLibrary = 302
    ORT_SLOT_GetEpDevices = 303
    ORT_SLOT_SessionOptionsAppendExecutionProvider_V2 = 304
    ORT_SLOT_HardwareDevice_Type = 307
    ORT_SLOT_HardwareDevice_VendorId = 308
    ORT_SLOT_HardwareDevice_Vendor = 309
    ORT_SLOT_HardwareDevice_DeviceId = 310
    ORT_SLOT_HardwareDevice_Metadata = 311
    ORT_SLOT_EpDevice_EpName = 312
    ORT_SLOT_EpDevice_EpVendor = 313
    ORT_SLOT_EpDevice_EpMetadata = 314
    ORT_SLOT_EpDevice_EpOptions = 315
    ORT_SLOT_EpDevice_Device = 316
    # API 23; NULL in OrtFns below 23.
    ORT_SLOT_SessionGetMemoryInfoForInputs = 380
    ORT_SLOT_SessionGetMemoryInfoForOutputs = 381
    ORT_SLOT_CopyTensors = 386


# Typed copies of the OrtApi slots above. Enum-typed parameters are passed as int (same ABI).
cdef struct OrtFns:
    OrtStatus* (*CreateStatus)(int code, const char* msg) noexcept nogil
    int (*GetErrorCode)(const OrtStatus* status) noexcept nogil
    const char* (*GetErrorMessage)(const OrtStatus* status) noexcept nogil
    OrtStatus* (*CreateEnv)(int log_level, const char* logid, OrtEnv** out) noexcept nogil
    OrtStatus* (*CreateSession)(const OrtEnv* env, const char* model_path,
                                const OrtSessionOptions* options,
                                OrtSession** out) noexcept nogil
    OrtStatus* (*CreateSessionFromArray)(const OrtEnv* env, const void* model_data,
                                         size_t model_data_length,
                                         const OrtSessionOptions* options,
                                         OrtSession** out) noexcept nogil
    OrtStatus* (*CreateSessionOptions)(OrtSessionOptions** out) noexcept nogil
    OrtStatus* (*EnableProfiling)(OrtSessionOptions* options,
                                  const char* profile_file_prefix) noexcept nogil
    OrtStatus* (*EnableMemPattern)(OrtSessionOptions* options) noexcept nogil
    OrtStatus* (*DisableMemPattern)(OrtSessionOptions* options) noexcept nogil
    OrtStatus* (*EnableCpuMemArena)(OrtSessionOptions* options) noexcept nogil
    OrtStatus* (*DisableCpuMemArena)(OrtSessionOptions* options) noexcept nogil
    OrtStatus* (*SetSessionLogId)(OrtSessionOptions* options, const char* logid) noexcept nogil
    OrtStatus* (*SetSessionLogSeverityLevel)(OrtSessionOptions* options,
                                             int level) noexcept nogil
    OrtStatus* (*SetSessionGraphOptimizationLevel)(OrtSessionOptions* options,
                                                   int level) noexcept nogil
    OrtStatus* (*SetIntraOpNumThreads)(OrtSessionOptions* options, int n) noexcept nogil
    OrtStatus* (*SetInterOpNumThreads)(OrtSessionOptions* options, int n) noexcept nogil
    OrtStatus* (*SessionGetInputCount)(const OrtSession* session, size_t* out) noexcept nogil
    OrtStatus* (*SessionGetOutputCount)(const OrtSession* session, size_t* out) noexcept nogil
    OrtStatus* (*SessionGetInputTypeInfo)(const OrtSession* session, size_t index,
                                          OrtTypeInfo** out) noexcept nogil
    OrtStatus* (*SessionGetOutputTypeInfo)(const OrtSession* session, size_t index,
                                           OrtTypeInfo** out) noexcept nogil
    OrtStatus* (*SessionGetInputName)(const OrtSession* session, size_t index,
                                      OrtAllocator* allocator, char** out) noexcept nogil
    OrtStatus* (*SessionGetOutputName)(const OrtSession* session, size_t index,
                                       OrtAllocator* allocator, char** out) noexcept nogil
    OrtStatus* (*CreateRunOptions)(OrtRunOptions** out) noexcept nogil
    OrtStatus* (*CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo* info, void* data,
                                                 size_t data_len, const int64_t* shape,
                                                 size_t shape_len, int elem_type,
                                                 OrtValue** out) noexcept nogil
    OrtStatus* (*IsTensor)(const OrtValue* value, int* out) noexcept nogil
    OrtStatus* (*GetTensorMutableData)(OrtValue* value, void** out) noexcept nogil
    OrtStatus* (*CastTypeInfoToTensorInfo)(const OrtTypeInfo* type_info,
                                           const OrtTensorTypeAndShapeInfo** out) noexcept nogil
    OrtStatus* (*GetOnnxTypeFromTypeInfo)(const OrtTypeInfo* type_info, int* out) noexcept nogil
    OrtStatus* (*GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info,
                                       int* out) noexcept nogil
    OrtStatus* (*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info,
                                     size_t* out) noexcept nogil
    OrtStatus* (*GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims,
                                size_t dims_len) noexcept nogil
    OrtStatus* (*GetSymbolicDimensions)(const OrtTensorTypeAndShapeInfo* info,
                                        const char** dim_params, size_t n) noexcept nogil
    OrtStatus* (*GetTensorTypeAndShape)(const OrtValue* value,
                                        OrtTensorTypeAndShapeInfo** out) noexcept nogil
    OrtStatus* (*CreateCpuMemoryInfo)(int allocator_type, int mem_type,
                                      OrtMemoryInfo** out) noexcept nogil
    OrtStatus* (*AllocatorFree)(OrtAllocator* allocator, void* p) noexcept nogil
    OrtStatus* (*GetAllocatorWithDefaultOptions)(OrtAllocator** out) noexcept nogil
    void (*ReleaseEnv)(OrtEnv* x) noexcept nogil
    void (*ReleaseStatus)(OrtStatus* x) noexcept nogil
    void (*ReleaseMemoryInfo)(OrtMemoryInfo* x) noexcept nogil
    void (*ReleaseSession)(OrtSession* x) noexcept nogil
    void (*ReleaseValue)(OrtValue* x) noexcept nogil
    void (*ReleaseRunOptions)(OrtRunOptions* x) noexcept nogil
    void (*ReleaseTypeInfo)(OrtTypeInfo* x) noexcept nogil
    void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* x) noexcept nogil
    void (*ReleaseSessionOptions)(OrtSessionOptions* x) noexcept nogil
    OrtStatus* (*AddSessionConfigEntry)(OrtSessionOptions* options, const char* key,
                                        const char* value) noexcept nogil
    OrtStatus* (*RunWithBinding)(OrtSession* session, const OrtRunOptions* run_options,
                                 const OrtIoBinding* binding) noexcept nogil
    OrtStatus* (*CreateIoBinding)(OrtSession* session, OrtIoBinding** out) noexcept nogil
    void (*ReleaseIoBinding)(OrtIoBinding* x) noexcept nogil
    OrtStatus* (*BindInput)(OrtIoBinding* binding, const char* name,
                            const OrtValue* value) noexcept nogil
    OrtStatus* (*BindOutput)(OrtIoBinding* binding, const char* name,
                             const OrtValue* value) noexcept nogil
    OrtStatus* (*BindOutputToDevice)(OrtIoBinding* binding, const char* name,
                                     const OrtMemoryInfo* mem_info) noexcept nogil
    OrtStatus* (*GetBoundOutputNames)(const OrtIoBinding* binding, OrtAllocator* allocator,
                                      char** buffer, size_t** lengths,
                                      size_t* count) noexcept nogil
    OrtStatus* (*GetBoundOutputValues)(const OrtIoBinding* binding, OrtAllocator* allocator,
                                       OrtValue*** values, size_t* count) noexcept nogil
    void (*ClearBoundInputs)(OrtIoBinding* binding) noexcept nogil
    void (*ClearBoundOutputs)(OrtIoBinding* binding) noexcept nogil
    OrtStatus* (*AddRunConfigEntry)(OrtRunOptions* options, const char* key,
                                    const char* value) noexcept nogil
    OrtStatus* (*SessionOptionsAppendExecutionProvider_CUDA_V2)(
        OrtSessionOptions* options, const OrtCUDAProviderOptionsV2* cuda_options) noexcept nogil
    OrtStatus* (*CreateCUDAProviderOptions)(OrtCUDAProviderOptionsV2** out) noexcept nogil
    OrtStatus* (*UpdateCUDAProviderOptions)(OrtCUDAProviderOptionsV2* cuda_options,
                                            const char* const* keys,
                                            const char* const* values,
                                            size_t n) noexcept nogil
    void (*ReleaseCUDAProviderOptions)(OrtCUDAProviderOptionsV2* x) noexcept nogil
    OrtStatus* (*SessionOptionsAppendExecutionProvider)(OrtSessionOptions* options,
                                                        const char* provider_name,
                                                        const char* const* keys,
                                                        const char* const* values,
                                                        size_t n) noexcept nogil
    # Custom op domains and kernels (genai._core.custom_ops).
    OrtStatus* (*CreateCustomOpDomain)(const char* domain,
                                       OrtCustomOpDomain** out) noexcept nogil
    OrtStatus* (*CustomOpDomain_Add)(OrtCustomOpDomain* domain, const void* op) noexcept nogil
    OrtStatus* (*AddCustomOpDomain)(OrtSessionOptions* options,
                                    OrtCustomOpDomain* domain) noexcept nogil
    void (*ReleaseCustomOpDomain)(OrtCustomOpDomain* x) noexcept nogil
    OrtStatus* (*KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name,
                                               float* out) noexcept nogil
    OrtStatus* (*KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name,
                                               int64_t* out) noexcept nogil
    OrtStatus* (*KernelContext_GetInputCount)(const OrtKernelContext* context,
                                              size_t* out) noexcept nogil
    OrtStatus* (*KernelContext_GetOutputCount)(const OrtKernelContext* context,
                                               size_t* out) noexcept nogil
    OrtStatus* (*KernelContext_GetInput)(const OrtKernelContext* context, size_t index,
                                         const OrtValue** out) noexcept nogil
    OrtStatus* (*KernelContext_GetOutput)(OrtKernelContext* context, size_t index,
                                          const int64_t* dims, size_t dim_count,
                                          OrtValue** out) noexcept nogil
    # type: OrtOpAttrType (1 int, 2 ints, 3 float, 4 floats, 5 string, 6 strings)
    OrtStatus* (*CreateOpAttr)(const char* name, const void* data, int length, int type,
                               OrtOpAttr** out) noexcept nogil
    void (*ReleaseOpAttr)(OrtOpAttr* x) noexcept nogil
    OrtStatus* (*CreateOp)(const OrtKernelInfo* info, const char* op_name, const char* domain,
                           int version, const char** type_constraint_names,
                           const int* type_constraint_values, int type_constraint_count,
                           const OrtOpAttr* const* attr_values, int attr_count,
                           int input_count, int output_count, OrtOp** out) noexcept nogil
    OrtStatus* (*InvokeOp)(const OrtKernelContext* context, const OrtOp* op,
                           const OrtValue* const* input_values, int input_count,
                           OrtValue* const* output_values, int output_count) noexcept nogil
    void (*ReleaseOp)(OrtOp* x) noexcept nogil
    # fn(data, i) for i in [0, total) on the session's intra-op threads; NULL below API 17.
    OrtStatus* (*KernelContext_ParallelFor)(const OrtKernelContext* context,
                                            void (*fn)(void*, size_t) noexcept nogil,
                                            size_t total, size_t num_batch,
                                            void* data) noexcept nogil
    # NULL when the loaded library's C API is older than ORT_API_VERSION_CUSTOM_OPS_V2.
    OrtStatus* (*RegisterCustomOpsLibrary_V2)(OrtSessionOptions* options,
                                              const char* library_path) noexcept nogil
    OrtStatus* (*MemoryInfoGetName)(const OrtMemoryInfo* info, const char** out) noexcept nogil
    OrtStatus* (*MemoryInfoGetId)(const OrtMemoryInfo* info, int* out) noexcept nogil
    OrtStatus* (*MemoryInfoGetMemType)(const OrtMemoryInfo* info, int* out) noexcept nogil
    OrtStatus* (*AddFreeDimensionOverrideByName)(OrtSessionOptions* options,
                                                 const char* dim_name,
                                                 int64_t dim_value) noexcept nogil
    OrtStatus* (*GetAvailableProviders)(char*** out, int* length) noexcept nogil
    OrtStatus* (*ReleaseAvailableProviders)(char** ptr, int length) noexcept nogil
    # NULL below API 14.
    void (*MemoryInfoGetDeviceType)(const OrtMemoryInfo* info, int* out) noexcept nogil
    # Plugin execution providers: NULL below API 22.
    void (*GetKeyValuePairs)(const OrtKeyValuePairs* kvps, const char* const** keys,
                             const char* const** values, size_t* num_entries) noexcept nogil
    OrtStatus* (*RegisterExecutionProviderLibrary)(OrtEnv* env, const char* registration_name,
                                                   const char* path) noexcept nogil
    OrtStatus* (*UnregisterExecutionProviderLibrary)(OrtEnv* env,
                                                     const char* registration_name) noexcept nogil
    OrtStatus* (*GetEpDevices)(const OrtEnv* env, const OrtEpDevice* const** ep_devices,
                               size_t* num_ep_devices) noexcept nogil
    OrtStatus* (*SessionOptionsAppendExecutionProvider_V2)(
        OrtSessionOptions* options, OrtEnv* env, const OrtEpDevice* const* ep_devices,
        size_t num_ep_devices, const char* const* keys, const char* const* values,
        size_t num_options) noexcept nogil
    int (*HardwareDevice_Type)(const OrtHardwareDevice* device) noexcept nogil
    uint32_t (*HardwareDevice_VendorId)(const OrtHardwareDevice* device) noexcept nogil
    const char* (*HardwareDevice_Vendor)(const OrtHardwareDevice* device) noexcept nogil
    uint32_t (*HardwareDevice_DeviceId)(const OrtHardwareDevice* device) noexcept nogil
    const OrtKeyValuePairs* (*HardwareDevice_Metadata)(
        const OrtHardwareDevice* device) noexcept nogil
    const char* (*EpDevice_EpName)(const OrtEpDevice* device) noexcept nogil
    const char* (*EpDevice_EpVendor)(const OrtEpDevice* device) noexcept nogil
    const OrtKeyValuePairs* (*EpDevice_EpMetadata)(const OrtEpDevice* device) noexcept nogil
    const OrtKeyValuePairs* (*EpDevice_EpOptions)(const OrtEpDevice* device) noexcept nogil
    const OrtHardwareDevice* (*EpDevice_Device)(const OrtEpDevice* device) noexcept nogil
    # NULL below API 23.
    OrtStatus* (*SessionGetMemoryInfoForInputs)(const OrtSession* session,
                                                const OrtMemoryInfo** out,
                                                size_t num_inputs) noexcept nogil
    OrtStatus* (*SessionGetMemoryInfoForOutputs)(const OrtSession* session,
                                                 const OrtMemoryInfo** out,
                                                 size_t num_outputs) noexcept nogil
    # Options an execution provider takes while a session lives (OpenVINO: kvcache_rewind).
    OrtStatus* (*SetEpDynamicOptions)(OrtSession* session, const char* const* keys,
                                      const char* const* values, size_t count) noexcept nogil
    # Copy tensors between devices (e.g. a device KV value to host memory); stream NULL: sync.
    OrtStatus* (*CopyTensors)(const OrtEnv* env, const OrtValue* const* src_tensors,
                              OrtValue* const* dst_tensors, void* stream,
                              size_t num_tensors) noexcept nogil


# Loads libonnxruntime once (thread-safe under the GIL) and returns the typed table;
# raises ImportError / RuntimeError naming the installed version when it cannot.
cdef const OrtFns* ort_fns() except NULL

# The process-wide OrtEnv (created on first use, never released).
cdef OrtEnv* ort_env() except NULL

# The default CPU allocator of the loaded library (for names/values ORT allocates).
cdef OrtAllocator* ort_default_allocator() except NULL

# Turn a non-NULL OrtStatus into a Python exception (OrtError or a subclass chosen by its code),
# releasing the status. check_status(NULL) returns 0; otherwise it raises and returns -1.
cdef object status_to_exception(OrtStatus* status, str context=*)
cdef int check_status(OrtStatus* status, str context=*) except -1

# C API version of the loaded library (loads it on first call).
cdef uint32_t ort_api_version() except 0

# {key: value} of a key-value-pairs object ORT owns ({} for NULL).
cdef dict kvps_to_dict(const OrtKeyValuePairs* kvps)

# {"name", "id", "mem_type", "device_type"} of a memory info ORT owns (None for NULL).
cdef object memory_info_to_dict(const OrtMemoryInfo* info)


# An execution-provider device (OrtEpDevice) as listed by GetEpDevices. Owned by the process-wide
# OrtEnv; valid until the library that provides it is unregistered (checked through `generation`).
cdef class EpDevice:
    cdef const OrtEpDevice* ptr
    cdef unsigned long generation
    cdef readonly str ep_name
    cdef readonly str ep_vendor
    cdef readonly str device_type
    cdef readonly str vendor
    cdef readonly unsigned int vendor_id
    cdef readonly unsigned int device_id
    cdef readonly dict ep_metadata
    cdef readonly dict ep_options
    cdef readonly dict device_metadata
    # The pointer, after checking that its library is still registered.
    cdef const OrtEpDevice* checked_ptr(self) except NULL


# Size in bytes of one element of a tensor element type; 0 for STRING / unsupported types.
cdef size_t elem_size(int elem_type) noexcept nogil
