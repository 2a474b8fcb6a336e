/* One query row of GroupQueryAttention (packed QKV, rotary non-interleaved or none, a shared
   past/present buffer) with onnxruntime 1.32's CPU decode arithmetic on AVX2 CPUs, so that a
   decode step or a speculative verify row gets the bits onnxruntime's kernel gives it:
   - rotary (MLAS's AVX2 kernel): out_lo = x_lo * cos - round(x_hi * sin) (one FMA),
     out_hi = x_lo * sin + round(x_hi * cos) (one FMA), cos/sin the cache rows at the position;
   - scores (MlasGQADecodeQK): per position, eight lanes a_j += q[h] * k[h] (h = j mod 8, a
     product then a sum), folded ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), times the
     scale;
   - exponentials (MLAS's AVX2 sum-of-exponentials kernel, its constants): exp(s - max) by the
     kernel's polynomial, their sum over eight lanes in order, folded (4 + 5) + (6 + 7) plus
     (0 + 1) + (2 + 3);
   - out[h] += e_t * v_t[h] over the positions in order (a product then a sum), then times
     1 / sum.
   onnxruntime computes the row without its SGEMM packing (and, through genai's op, without a
   kernel call per row); where a CPU or onnxruntime build takes another path, genai's probe
   (`genai.runtime.decode_attention`) finds other bits and the op keeps onnxruntime's kernel.
   Checked against onnxruntime's GroupQueryAttention in tests/test_decode_attention.py. */
#ifndef GENAI_DECODE_ATTENTION_KERNELS_H
#define GENAI_DECODE_ATTENTION_KERNELS_H
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "exact_float_begin.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GENAI_DECODE_X86 1
#include <immintrin.h>
#endif

/* 1 where this code reproduces onnxruntime's kernel (AVX2 and FMA without AVX-512F: MLAS
   then takes the AVX2 exponential kernel); else 0. */
static inline int genai_decode_attention_level(void) {
#ifdef GENAI_DECODE_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        !__builtin_cpu_supports("avx512f")) {
        return 1;
    }
#endif
    return 0;
}

#ifdef GENAI_DECODE_X86
/* ``dim`` values of ``x`` rotated (non-interleaved halves) into ``out``. */
__attribute__((target("avx2,fma"))) static void genai_decode_rope(const float* x,
                                                                  const float* cos_row,
                                                                  const float* sin_row,
                                                                  size_t dim, float* out) {
    size_t half = dim / 2, i = 0;
    for (; i + 8 <= half; i += 8) {
        __m256 re = _mm256_loadu_ps(x + i), im = _mm256_loadu_ps(x + half + i);
        __m256 c = _mm256_loadu_ps(cos_row + i), s = _mm256_loadu_ps(sin_row + i);
        _mm256_storeu_ps(out + i, _mm256_fmsub_ps(re, c, _mm256_mul_ps(im, s)));
        _mm256_storeu_ps(out + half + i, _mm256_fmadd_ps(re, s, _mm256_mul_ps(im, c)));
    }
    for (; i < half; i++) {
        float re = x[i], im = x[half + i];
        float a = im * sin_row[i], b = im * cos_row[i];
        out[i] = __builtin_fmaf(re, cos_row[i], -a);
        out[half + i] = __builtin_fmaf(re, sin_row[i], b);
    }
}

/* MLAS's exp(p[i] + negmax) for 8 values, as its AVX2 kernel computes them. */
__attribute__((target("avx2,fma"))) static inline __m256 genai_decode_exp8(__m256 x,
                                                                           __m256 negmax) {
    const __m256 bias = _mm256_set1_ps(12582912.0f);
    x = _mm256_max_ps(_mm256_set1_ps(-88.3762626647949f), _mm256_add_ps(negmax, x));
    __m256 biased = _mm256_fmadd_ps(_mm256_set1_ps(1.44269504088896341f), x, bias);
    __m256 m = _mm256_sub_ps(biased, bias);
    x = _mm256_fmadd_ps(m, _mm256_set1_ps(-6.93145752e-1f), x);
    x = _mm256_fmadd_ps(m, _mm256_set1_ps(-1.42860677e-6f), x);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0x1.694000p-10f), x, _mm256_set1_ps(0x1.125edcp-7f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.555b5ap-5f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.555450p-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.fffff6p-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f));
    __m256i scale = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(biased), 23),
                                     _mm256_set1_epi32(0x3F800000));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

/* p[0..n) = exp(p - max), returning their sum, as MLAS's AVX2 kernel does. */
__attribute__((target("avx2,fma"))) static float genai_decode_sum_exp(float* p, size_t n,
                                                                      float max) {
    __m256 negmax = _mm256_set1_ps(-max), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = genai_decode_exp8(_mm256_loadu_ps(p + i), negmax);
        acc = _mm256_add_ps(acc, e);
        _mm256_storeu_ps(p + i, e);
    }
    if (i < n) {
        float rest[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(rest, p + i, (n - i) * sizeof(float));
        __m256 e = genai_decode_exp8(_mm256_loadu_ps(rest), negmax);
        _mm256_storeu_ps(rest, e);
        memset(rest + (n - i), 0, (8 - (n - i)) * sizeof(float));
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(rest));
        memcpy(p + i, rest, (n - i) * sizeof(float));
    }
    float a[8];
    _mm256_storeu_ps(a, acc);
    float low = (a[0] + a[1]) + (a[2] + a[3]);
    float high = (a[4] + a[5]) + (a[6] + a[7]);
    return high + low;
}

/* The eight lanes' fold of each of 8 vectors, ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 +
   a7)), as one vector (horizontal adds pair the same lanes in the same order). */
__attribute__((target("avx2,fma"))) static inline __m256 genai_decode_fold8(const __m256* a) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    /* (t0 low, t1 low, t2 low, t3 low | the same high), then t4..t7 */
    __m256 x = _mm256_hadd_ps(h01, h23), y = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}

/* scores[i * count + t] for ``heads`` query heads (``q``: heads x dim) sharing ``keys``
   (``count`` rows of ``dim`` values): 8 positions at a time, each block of keys read by every
   head while it is in cache. */
__attribute__((target("avx2,fma"))) static void genai_decode_scores(const float* q,
                                                                    size_t heads,
                                                                    const float* keys,
                                                                    size_t count, size_t dim,
                                                                    float scale,
                                                                    float* scores) {
    size_t whole = dim - dim % 8, t = 0;
    __m256 factor = _mm256_set1_ps(scale);
    if (whole == dim) {
        for (; t + 8 <= count; t += 8) {
            for (size_t i = 0; i < heads; i++) {
                const float* qi = q + i * dim;
                __m256 acc[8];
                for (int j = 0; j < 8; j++) {
                    const float* k = keys + (t + j) * dim;
                    __m256 a = _mm256_setzero_ps();
                    for (size_t h = 0; h < dim; h += 8) {
                        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(qi + h),
                                                           _mm256_loadu_ps(k + h)));
                    }
                    acc[j] = a;
                }
                _mm256_storeu_ps(scores + i * count + t,
                                 _mm256_mul_ps(genai_decode_fold8(acc), factor));
            }
        }
    }
    for (; t < count; t++) {
        const float* k = keys + t * dim;
        for (size_t i = 0; i < heads; i++) {
            const float* qi = q + i * dim;
            __m256 acc = _mm256_setzero_ps();
            for (size_t h = 0; h < whole; h += 8) {
                acc = _mm256_add_ps(acc,
                                    _mm256_mul_ps(_mm256_loadu_ps(qi + h), _mm256_loadu_ps(k + h)));
            }
            float a[8];
            _mm256_storeu_ps(a, acc);
            float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
            for (size_t h = whole; h < dim; h++) {
                float m = qi[h] * k[h];
                s = s + m;
            }
            scores[i * count + t] = s * scale;
        }
    }
}

#define GENAI_DECODE_SPAN 32 /* positions each head sums while a block of values is in cache */

/* out[i * dim + 0..dim) = sum over t of e[i * count + t] * values[t] (in order), times
   1 / sums[i], for ``heads`` heads sharing ``values``. */
__attribute__((target("avx2,fma"))) static void genai_decode_values(const float* e,
                                                                    size_t heads,
                                                                    const float* values,
                                                                    size_t count, size_t dim,
                                                                    const float* sums,
                                                                    float* out) {
    memset(out, 0, heads * dim * sizeof(float));
    size_t wide = dim - dim % 64;
    for (size_t t0 = 0; t0 < count; t0 += GENAI_DECODE_SPAN) {
        size_t t1 = t0 + GENAI_DECODE_SPAN < count ? t0 + GENAI_DECODE_SPAN : count;
        for (size_t i = 0; i < heads; i++) {
            const float* ei = e + i * count;
            float* oi = out + i * dim;
            for (size_t h0 = 0; h0 < wide; h0 += 64) {
                float* o = oi + h0;
                __m256 o0 = _mm256_loadu_ps(o), o1 = _mm256_loadu_ps(o + 8);
                __m256 o2 = _mm256_loadu_ps(o + 16), o3 = _mm256_loadu_ps(o + 24);
                __m256 o4 = _mm256_loadu_ps(o + 32), o5 = _mm256_loadu_ps(o + 40);
                __m256 o6 = _mm256_loadu_ps(o + 48), o7 = _mm256_loadu_ps(o + 56);
                for (size_t t = t0; t < t1; t++) {
                    __m256 p = _mm256_set1_ps(ei[t]);
                    const float* v = values + t * dim + h0;
                    o0 = _mm256_add_ps(o0, _mm256_mul_ps(p, _mm256_loadu_ps(v)));
                    o1 = _mm256_add_ps(o1, _mm256_mul_ps(p, _mm256_loadu_ps(v + 8)));
                    o2 = _mm256_add_ps(o2, _mm256_mul_ps(p, _mm256_loadu_ps(v + 16)));
                    o3 = _mm256_add_ps(o3, _mm256_mul_ps(p, _mm256_loadu_ps(v + 24)));
                    o4 = _mm256_add_ps(o4, _mm256_mul_ps(p, _mm256_loadu_ps(v + 32)));
                    o5 = _mm256_add_ps(o5, _mm256_mul_ps(p, _mm256_loadu_ps(v + 40)));
                    o6 = _mm256_add_ps(o6, _mm256_mul_ps(p, _mm256_loadu_ps(v + 48)));
                    o7 = _mm256_add_ps(o7, _mm256_mul_ps(p, _mm256_loadu_ps(v + 56)));
                }
                _mm256_storeu_ps(o, o0);
                _mm256_storeu_ps(o + 8, o1);
                _mm256_storeu_ps(o + 16, o2);
                _mm256_storeu_ps(o + 24, o3);
                _mm256_storeu_ps(o + 32, o4);
                _mm256_storeu_ps(o + 40, o5);
                _mm256_storeu_ps(o + 48, o6);
                _mm256_storeu_ps(o + 56, o7);
            }
            for (size_t t = t0; t < t1; t++) {
                const float* v = values + t * dim;
                for (size_t h = wide; h < dim; h++) {
                    float m = ei[t] * v[h];
                    oi[h] = oi[h] + m;
                }
            }
        }
    }
    for (size_t i = 0; i < heads; i++) {
        float inv = sums[i] > 0.0f ? 1.0f / sums[i] : 0.0f;
        for (size_t h = 0; h < dim; h++) {
            out[i * dim + h] = out[i * dim + h] * inv;
        }
    }
}

/* One query row at position ``pos`` (the row's past is positions 0..pos-1 of the caches):
   ``qkv`` its packed query, key and value (heads, then kv_heads, then kv_heads rows of
   ``dim``); the rotated key and the value are written at ``pos`` of ``key_cache`` /
   ``value_cache`` ([kv_heads, cache_len, dim]); ``out`` the heads x dim result. ``cos`` /
   ``sin``: the rotary caches ([positions, dim / 2]), or NULL for none. ``scratch``: heads x
   dim + (heads / kv_heads) x (pos + 1) floats; at most 64 query heads per KV head. */
__attribute__((target("avx2,fma"))) static void genai_decode_attention_row(
    const float* qkv, size_t pos, size_t heads, size_t kv_heads, size_t dim, float scale,
    const float* cos, const float* sin, float* key_cache, float* value_cache,
    size_t cache_len, float* scratch, float* out) {
    float* q = scratch;
    float* scores = scratch + heads * dim;
    size_t half = dim / 2, group = heads / kv_heads, count = pos + 1;
    for (size_t h = 0; h < kv_heads; h++) {
        float* key = key_cache + (h * cache_len + pos) * dim;
        const float* k_in = qkv + (heads + h) * dim;
        if (cos != NULL) {
            genai_decode_rope(k_in, cos + pos * half, sin + pos * half, dim, key);
        } else {
            memmove(key, k_in, dim * sizeof(float));
        }
        memmove(value_cache + (h * cache_len + pos) * dim, qkv + (heads + kv_heads + h) * dim,
                dim * sizeof(float));
    }
    for (size_t h = 0; h < heads; h++) {
        if (cos != NULL) {
            genai_decode_rope(qkv + h * dim, cos + pos * half, sin + pos * half, dim, q + h * dim);
        } else {
            memcpy(q + h * dim, qkv + h * dim, dim * sizeof(float));
        }
    }
    float sums[64];
    for (size_t kv = 0; kv < kv_heads; kv++) {
        const float* keys = key_cache + kv * cache_len * dim;
        genai_decode_scores(q + kv * group * dim, group, keys, count, dim, scale, scores);
        for (size_t i = 0; i < group; i++) {
            float* si = scores + i * count;
            float max = -FLT_MAX;
            for (size_t t = 0; t < count; t++) {
                max = si[t] > max ? si[t] : max;
            }
            sums[i] = genai_decode_sum_exp(si, count, max);
        }
        genai_decode_values(scores, group, value_cache + kv * cache_len * dim, count, dim, sums,
                            out + kv * group * dim);
    }
}
#endif

#include "exact_float_end.h"
#endif
