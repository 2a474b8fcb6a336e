/* Per-row uint8 quantisation of float32 rows, the numbers genai's builder's --prefill-int8
   graphs compute with onnxruntime ops (genai/builder/onnx_writer.py, per_token_matmul):

       top   = max(max_k |x[k]|, floor)        Abs, ReduceMax, Max
       inv   = 127 / top                        Div
       q[k]  = (uint8)(x[k] * inv + 128.5)      Mul, Add, Cast (truncation)
       scale = top / 127                        Div

   Each operation rounds on its own, in that order: no fused multiply-add (the GCC pragma below
   keeps the compiler from contracting the multiply and the add), so every byte and scale
   equals the ops' (tests/test_row_quantization.py). The maximum is exact in any order. A row
   holding a NaN is left to the vector code's max (a NaN quantises to garbage either way).
   AVX-512 and AVX2 paths are chosen at run time; others run the scalar loop. */
#ifndef GENAI_ROW_QUANT_KERNELS_H
#define GENAI_ROW_QUANT_KERNELS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "exact_float_begin.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GENAI_ROW_QUANT_X86 1
#include <immintrin.h>
#endif

static inline float genai_row_quant_finish(float top, float floor_value, float* scale) {
    if (!(top > floor_value)) {
        top = floor_value;
    }
    *scale = top / 127.0f;
    return 127.0f / top;
}

static void genai_quantize_row_scalar(const float* x, size_t n, float floor_value, uint8_t* q,
                                      float* scale) {
    float top = 0.0f;
    size_t i;
    for (i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > top) {
            top = a;
        }
    }
    float inv = genai_row_quant_finish(top, floor_value, scale);
    for (i = 0; i < n; i++) {
        float p = x[i] * inv;
        float s = p + 128.5f;
        q[i] = (uint8_t)s;
    }
}

#ifdef GENAI_ROW_QUANT_X86
__attribute__((target("avx512f"))) static void genai_quantize_row_avx512(
    const float* x, size_t n, float floor_value, uint8_t* q, float* scale) {
    __m512 m = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    }
    float top = _mm512_reduce_max_ps(m);
    for (size_t j = i; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > top) {
            top = a;
        }
    }
    float inv = genai_row_quant_finish(top, floor_value, scale);
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512 voff = _mm512_set1_ps(128.5f);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
        __m512 s = _mm512_add_ps(p, voff);
        _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(s)));
    }
    for (; i < n; i++) {
        float p = x[i] * inv;
        float s = p + 128.5f;
        q[i] = (uint8_t)s;
    }
}

__attribute__((target("avx2"))) static void genai_quantize_row_avx2(
    const float* x, size_t n, float floor_value, uint8_t* q, float* scale) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float top = 0.0f;
    for (size_t j = 0; j < 8; j++) {
        if (lanes[j] > top) {
            top = lanes[j];
        }
    }
    for (size_t j = i; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > top) {
            top = a;
        }
    }
    float inv = genai_row_quant_finish(top, floor_value, scale);
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256 voff = _mm256_set1_ps(128.5f);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
        __m256 s = _mm256_add_ps(p, voff);
        __m256i v = _mm256_cvttps_epi32(s); /* 1..255 */
        __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i*)(q + i), _mm_packus_epi16(w, w));
    }
    for (; i < n; i++) {
        float p = x[i] * inv;
        float s = p + 128.5f;
        q[i] = (uint8_t)s;
    }
}
#endif

/* 2: AVX-512, 1: AVX2, 0: scalar (what this CPU runs). */
static inline int genai_row_quant_level(void) {
#ifdef GENAI_ROW_QUANT_X86
    if (__builtin_cpu_supports("avx512f")) {
        return 2;
    }
    if (__builtin_cpu_supports("avx2")) {
        return 1;
    }
#endif
    return 0;
}

/* Rows [first, last) of a [rows, n] matrix. */
static inline void genai_quantize_rows(const float* x, size_t first, size_t last, size_t n,
                                       float floor_value, uint8_t* q, float* scale, int level) {
    for (size_t r = first; r < last; r++) {
#ifdef GENAI_ROW_QUANT_X86
        if (level == 2) {
            genai_quantize_row_avx512(x + r * n, n, floor_value, q + r * n, scale + r);
            continue;
        }
        if (level == 1) {
            genai_quantize_row_avx2(x + r * n, n, floor_value, q + r * n, scale + r);
            continue;
        }
#endif
        genai_quantize_row_scalar(x + r * n, n, floor_value, q + r * n, scale + r);
    }
}

#include "exact_float_end.h"
#endif
