/* Per-thread state of genai's custom ops (custom_ops.pyx). An op's Compute runs on the thread
   that called the session's Run (onnxruntime's sequential executor), so state kept per thread
   follows one run and is never shared between runs of other threads. */
#ifndef GENAI_THREAD_STATE_H
#define GENAI_THREAD_STATE_H
#include <stddef.h>
#include <stdlib.h>

#if defined(_MSC_VER)
#define GENAI_THREAD_LOCAL __declspec(thread)
#else
#define GENAI_THREAD_LOCAL __thread
#endif

/* A scratch buffer of at least `count` floats owned by the calling thread, kept for its next
   call (NULL when out of memory): a kernel's blocks, without a malloc and its fresh pages on
   every call. Each thread keeps its largest one until it exits. */
static inline float* genai_thread_scratch(size_t count) {
    static GENAI_THREAD_LOCAL float* buffer = NULL;
    static GENAI_THREAD_LOCAL size_t capacity = 0;
    if (count > capacity) {
        free(buffer);
        buffer = (float*)malloc(count * sizeof(float));
        capacity = buffer != NULL ? count : 0;
    }
    return buffer;
}

/* Whether the calling thread's runs compute attention one query row per call (speculative
   verification: each row then gets a one-token step's numbers). Returns the previous value
   when `set` is 0 or 1; -1 only reads it. */
static inline int genai_single_row_attention(int set) {
    static GENAI_THREAD_LOCAL int on = 0;
    int previous = on;
    if (set >= 0) {
        on = set;
    }
    return previous;
}
#endif
