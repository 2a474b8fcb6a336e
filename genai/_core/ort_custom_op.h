/* The leading members of onnxruntime's struct OrtCustomOp, the table of callbacks a custom op
   registers (CustomOpDomain_Add). Written for this project from the C API's documented layout:
   onnxruntime reads a member only when `version` says the op knows it, so an op declaring
   version 16 is read up to KernelComputeV2 (the status-returning kernel calls) and no further.
   Enum-typed results (ONNXTensorElementDataType, OrtCustomOpInputOutputCharacteristic,
   OrtMemType) are returned as int: the same ABI. */
#ifndef GENAI_ORT_CUSTOM_OP_H
#define GENAI_ORT_CUSTOM_OP_H
#include <stddef.h>
#include <stdint.h>
#include "ort_opaque_types.h"

#define GENAI_CUSTOM_OP_VERSION 16

/* OrtCustomOpInputOutputCharacteristic */
#define GENAI_IO_REQUIRED 0
#define GENAI_IO_OPTIONAL 1

typedef struct GenaiCustomOp GenaiCustomOp;
struct GenaiCustomOp {
    uint32_t version;
    void* (*CreateKernel)(const GenaiCustomOp* op, const void* api, const OrtKernelInfo* info);
    const char* (*GetName)(const GenaiCustomOp* op);
    const char* (*GetExecutionProviderType)(const GenaiCustomOp* op);
    int (*GetInputType)(const GenaiCustomOp* op, size_t index);
    size_t (*GetInputTypeCount)(const GenaiCustomOp* op);
    int (*GetOutputType)(const GenaiCustomOp* op, size_t index);
    size_t (*GetOutputTypeCount)(const GenaiCustomOp* op);
    void (*KernelCompute)(void* kernel, OrtKernelContext* context);
    void (*KernelDestroy)(void* kernel);
    int (*GetInputCharacteristic)(const GenaiCustomOp* op, size_t index);
    int (*GetOutputCharacteristic)(const GenaiCustomOp* op, size_t index);
    int (*GetInputMemoryType)(const GenaiCustomOp* op, size_t index);
    int (*GetVariadicInputMinArity)(const GenaiCustomOp* op);
    int (*GetVariadicInputHomogeneity)(const GenaiCustomOp* op);
    int (*GetVariadicOutputMinArity)(const GenaiCustomOp* op);
    int (*GetVariadicOutputHomogeneity)(const GenaiCustomOp* op);
    OrtStatus* (*CreateKernelV2)(const GenaiCustomOp* op, const void* api,
                                 const OrtKernelInfo* info, void** kernel);
    OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
};

/* A counter bumped from onnxruntime's threads (relaxed: a statistic, not a lock). */
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
static inline void genai_count(int64_t* counter) {
    _InterlockedExchangeAdd64((volatile long long*)counter, 1);
}
static inline int64_t genai_read_count(const int64_t* counter) {
    return *(const volatile int64_t*)counter;
}
#else
static inline void genai_count(int64_t* counter) {
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}
static inline int64_t genai_read_count(const int64_t* counter) {
    return __atomic_load_n(counter, __ATOMIC_RELAXED);
}
#endif

/* The offsets onnxruntime reads (x86-64 and other LP64 targets: 8-byte pointers). */
_Static_assert(offsetof(GenaiCustomOp, GetInputMemoryType) == 12 * sizeof(void*),
               "OrtCustomOp layout: GetInputMemoryType");
_Static_assert(offsetof(GenaiCustomOp, CreateKernelV2) == 17 * sizeof(void*),
               "OrtCustomOp layout: CreateKernelV2");
_Static_assert(offsetof(GenaiCustomOp, KernelComputeV2) == 18 * sizeof(void*),
               "OrtCustomOp layout: KernelComputeV2");
#endif
