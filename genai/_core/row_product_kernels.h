/* Row-wise float32 products of genai's ScaledSiluMul op (custom_ops.pyx), rounded as
   onnxruntime's Mul ops round them: one multiply per product, each rounded to float32.

       genai_scale_row:  out[k] = x[k] * factor                    Mul(x, row_scale)
       genai_gate_row:   out[k] = a[k] * (b[k] * factor)           Mul(a, Mul(b, row_scale))
                         out[k] = a[k] * b[k]       (factor NULL)  Mul(a, b)

   A product of two floats rounds the same in any vector width, so the AVX-512, AVX2 and scalar
   paths (chosen at run time with genai_row_quant_level) give the same bits. */
#ifndef GENAI_ROW_PRODUCT_KERNELS_H
#define GENAI_ROW_PRODUCT_KERNELS_H
#include <stddef.h>

#include "row_quant_kernels.h"

static void genai_scale_row_scalar(const float* x, float factor, float* out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[i] = x[i] * factor;
    }
}

static void genai_gate_row_scalar(const float* a, const float* b, const float* factor,
                                  float* out, size_t n) {
    if (factor == NULL) {
        for (size_t i = 0; i < n; i++) {
            out[i] = a[i] * b[i];
        }
        return;
    }
    float f = *factor;
    for (size_t i = 0; i < n; i++) {
        float scaled = b[i] * f;
        out[i] = a[i] * scaled;
    }
}

#ifdef GENAI_ROW_QUANT_X86
__attribute__((target("avx512f"))) static void genai_scale_row_avx512(const float* x,
                                                                      float factor, float* out,
                                                                      size_t n) {
    __m512 f = _mm512_set1_ps(factor);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), f));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), f));
    }
}

__attribute__((target("avx512f"))) static void genai_gate_row_avx512(const float* a,
                                                                     const float* b,
                                                                     const float* factor,
                                                                     float* out, size_t n) {
    __m512 f = _mm512_set1_ps(factor == NULL ? 1.0f : *factor);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 vb = _mm512_loadu_ps(b + i);
        if (factor != NULL) {
            vb = _mm512_mul_ps(vb, f);
        }
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(a + i), vb));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 vb = _mm512_maskz_loadu_ps(m, b + i);
        if (factor != NULL) {
            vb = _mm512_mul_ps(vb, f);
        }
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), vb));
    }
}

__attribute__((target("avx2"))) static void genai_scale_row_avx2(const float* x, float factor,
                                                                 float* out, size_t n) {
    __m256 f = _mm256_set1_ps(factor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
    }
    genai_scale_row_scalar(x + i, factor, out + i, n - i);
}

__attribute__((target("avx2"))) static void genai_gate_row_avx2(const float* a, const float* b,
                                                                const float* factor,
                                                                float* out, size_t n) {
    __m256 f = _mm256_set1_ps(factor == NULL ? 1.0f : *factor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vb = _mm256_loadu_ps(b + i);
        if (factor != NULL) {
            vb = _mm256_mul_ps(vb, f);
        }
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), vb));
    }
    genai_gate_row_scalar(a + i, b + i, factor, out + i, n - i);
}
#endif

static inline void genai_scale_row(const float* x, float factor, float* out, size_t n,
                                   int level) {
#ifdef GENAI_ROW_QUANT_X86
    if (level == 2) {
        genai_scale_row_avx512(x, factor, out, n);
        return;
    }
    if (level == 1) {
        genai_scale_row_avx2(x, factor, out, n);
        return;
    }
#endif
    genai_scale_row_scalar(x, factor, out, n);
}

static inline void genai_gate_row(const float* a, const float* b, const float* factor,
                                  float* out, size_t n, int level) {
#ifdef GENAI_ROW_QUANT_X86
    if (level == 2) {
        genai_gate_row_avx512(a, b, factor, out, n);
        return;
    }
    if (level == 1) {
        genai_gate_row_avx2(a, b, factor, out, n);
        return;
    }
#endif
    genai_gate_row_scalar(a, b, factor, out, n);
}
#endif
