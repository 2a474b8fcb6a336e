/* Sampling kernels of genai/_core/sampling.pyx: block maxima (with NaN detection) and a
   vectorised exp(-d), SSE2 where the target has it, with scalar twins that give the same bits.
   Declared to Cython in sampling.pyx (`cdef extern from "sampling_kernels.h"`). */
#ifndef GENAI_SAMPLING_KERNELS_H
#define GENAI_SAMPLING_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define GENAI_SAMPLING_SSE2 1
#endif

/* Largest value of src[0..n) (-inf when n == 0); *has_nan = 1 when any value is NaN.
   When dst is not NULL the values are also copied there, in the same pass. */
static float genai_copy_block_max(const float* src, float* dst, ptrdiff_t n,
                                  int* has_nan) {
    ptrdiff_t i = 0;
    float best = -INFINITY;
    int bad = 0;
#ifdef GENAI_SAMPLING_SSE2
    if (n >= 16) {
        __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        __m128 u = _mm_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
            __m128 c = _mm_loadu_ps(src + i + 8), d = _mm_loadu_ps(src + i + 12);
            if (dst) {
                _mm_storeu_ps(dst + i, a);
                _mm_storeu_ps(dst + i + 4, b);
                _mm_storeu_ps(dst + i + 8, c);
                _mm_storeu_ps(dst + i + 12, d);
            }
            u = _mm_or_ps(u, _mm_or_ps(_mm_or_ps(_mm_cmpunord_ps(a, a),
                                                 _mm_cmpunord_ps(b, b)),
                                       _mm_or_ps(_mm_cmpunord_ps(c, c),
                                                 _mm_cmpunord_ps(d, d))));
            m0 = _mm_max_ps(m0, a);
            m1 = _mm_max_ps(m1, b);
            m2 = _mm_max_ps(m2, c);
            m3 = _mm_max_ps(m3, d);
        }
        m0 = _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
        m0 = _mm_max_ps(m0, _mm_shuffle_ps(m0, m0, _MM_SHUFFLE(1, 0, 3, 2)));
        m0 = _mm_max_ps(m0, _mm_shuffle_ps(m0, m0, _MM_SHUFFLE(2, 3, 0, 1)));
        best = _mm_cvtss_f32(m0);
        bad = _mm_movemask_ps(u) != 0;
    }
#endif
    for (; i < n; i++) {
        float v = src[i];
        if (dst) dst[i] = v;
        bad |= v != v;
        best = v > best ? v : best;
    }
    *has_nan = bad;
    return best;
}

static inline float genai_block_max(const float* x, ptrdiff_t n, int* has_nan) {
    return genai_copy_block_max(x, NULL, n, has_nan);
}

/* exp(-d) for d >= 0: Cody-Waite reduction by ln 2 and a degree-12 Taylor polynomial
   (~2 ulp), 2^k built in the exponent bits. Valid for d <= 708; callers send larger d
   (and inf) to libm. The SSE2 and scalar paths perform the same IEEE operations, so they
   give identical bits. */
#define GENAI_EXP_LIMIT 708.0
#define GENAI_LOG2E 1.4426950408889634
#define GENAI_LN2_HI 6.93147180369123816490e-01
#define GENAI_LN2_LO 1.90821492927058770002e-10
#define GENAI_MAGIC 6755399441055744.0 /* 1.5 * 2**52: round to nearest integer */

static inline double genai_exp_neg1(double d) {
    double x, t, k, r, p, scale;
    uint64_t bits;
    if (!(d <= GENAI_EXP_LIMIT))
        return exp(-d);
    x = -d;
    t = x * GENAI_LOG2E + GENAI_MAGIC;
    k = t - GENAI_MAGIC;
    r = (x - k * GENAI_LN2_HI) - k * GENAI_LN2_LO;
    p = 2.08767569878680989792e-09;            /* 1/12! */
    p = p * r + 2.50521083854417187751e-08;    /* 1/11! */
    p = p * r + 2.75573192239858906526e-07;
    p = p * r + 2.75573192239858906526e-06;
    p = p * r + 2.48015873015873015873e-05;
    p = p * r + 1.98412698412698412698e-04;
    p = p * r + 1.38888888888888888889e-03;
    p = p * r + 8.33333333333333333333e-03;
    p = p * r + 4.16666666666666666667e-02;
    p = p * r + 1.66666666666666666667e-01;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4338000000000000ULL + 1023) << 52;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* d[i] = (m - x[i]) * inv_t and e[i] = exp(-d[i]) for i < n (x holds no NaN, x <= m). */
static void genai_exp_rel(const float* x, ptrdiff_t n, double m, double inv_t,
                          double* d, double* e) {
    ptrdiff_t i = 0;
#ifdef GENAI_SAMPLING_SSE2
    const __m128d vm = _mm_set1_pd(m), vt = _mm_set1_pd(inv_t);
    const __m128d lim = _mm_set1_pd(-GENAI_EXP_LIMIT), magic = _mm_set1_pd(GENAI_MAGIC);
    const __m128i bias = _mm_set1_epi64x(1023 - 0x4338000000000000LL);
    int bad;
    for (; i + 2 <= n; i += 2) {
        __m128d xd = _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)(x + i))));
        __m128d dd = _mm_mul_pd(_mm_sub_pd(vm, xd), vt);
        __m128d xx = _mm_max_pd(_mm_sub_pd(_mm_setzero_pd(), dd), lim);
        __m128d t = _mm_add_pd(_mm_mul_pd(xx, _mm_set1_pd(GENAI_LOG2E)), magic);
        __m128d k = _mm_sub_pd(t, magic);
        __m128d r = _mm_sub_pd(_mm_sub_pd(xx, _mm_mul_pd(k, _mm_set1_pd(GENAI_LN2_HI))),
                               _mm_mul_pd(k, _mm_set1_pd(GENAI_LN2_LO)));
        __m128d p = _mm_set1_pd(2.08767569878680989792e-09);
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(2.50521083854417187751e-08));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(2.75573192239858906526e-07));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(2.75573192239858906526e-06));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(2.48015873015873015873e-05));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(1.98412698412698412698e-04));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(1.38888888888888888889e-03));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(8.33333333333333333333e-03));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(4.16666666666666666667e-02));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(1.66666666666666666667e-01));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(0.5));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(1.0));
        p = _mm_add_pd(_mm_mul_pd(p, r), _mm_set1_pd(1.0));
        __m128i s = _mm_slli_epi64(_mm_add_epi64(_mm_castpd_si128(t), bias), 52);
        __m128d ee = _mm_mul_pd(p, _mm_castsi128_pd(s));
        _mm_storeu_pd(d + i, dd);
        _mm_storeu_pd(e + i, ee);
        bad = _mm_movemask_pd(_mm_cmpgt_pd(dd, _mm_set1_pd(GENAI_EXP_LIMIT)));
        if (bad & 1) e[i] = exp(-d[i]);
        if (bad & 2) e[i + 1] = exp(-d[i + 1]);
    }
#endif
    for (; i < n; i++) {
        d[i] = (m - (double)x[i]) * inv_t;
        e[i] = genai_exp_neg1(d[i]);
    }
}

#endif /* GENAI_SAMPLING_KERNELS_H */
