/* A MatMulNBits of several rows (4-bit weights in blocks of 32, accuracy level 4: int8
   activations) that gives each row the numbers onnxruntime gives it in a run of that row
   alone on AVX2 CPUs: MLAS's one-row kernel (onnxruntime 1.32, SQ4BitGemm CompInt8, BlkLen 32,
   CountM 1). A run of several rows there takes another kernel whose float sums come out in
   another order, so a speculative verify run would not reproduce decoding's logits; this op
   (genai's StepRowsMatMulNBits, custom_ops.pyx) does, in one pass over the weights.

   Per row, per block of 32 activations a[j]:
       m = max |a[j]|;  sa = m / 127;  inv = m ? 127 / m : 0;  q[j] = rint(a[j] * inv)  (int8)
   Per column n and block b: s[j] = nibble[j] - zp (zp: 8, or the block's zero point), exact
   integer dot products of q and s over lanes of 4 or 8 elements, c = sa[b] * scale[n][b], and
   eight float lanes acc[l] = fma((float)dot_l, c, acc[l]):
     - without zero points, blocks go in pairs (2p, 2p+1): lane l sums the 8 elements
       (l & 1) * 8 + (l >> 2) * 16 + 0..7 of block 2p + ((l >> 1) & 1), one FMA per lane;
     - with zero points, and for an odd last block, each block on its own: lane l sums its
       elements 4l..4l+3;
   then y = ((((acc0 + acc1) + acc2) + acc3) + (((acc4 + acc5) + acc6) + acc7)) for columns in
   whole groups of 4, ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)) for the
   last N % 4. Each step rounds as written (no contraction but the explicit FMAs), so the AVX2
   path and the scalar one give the same bits; tests/test_step_rows.py checks both against
   onnxruntime's one-row runs and against the NumPy twin (genai/_core/reference.py). */
#ifndef GENAI_STEP_ROWS_KERNELS_H
#define GENAI_STEP_ROWS_KERNELS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "exact_float_begin.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GENAI_STEP_ROWS_X86 1
#include <immintrin.h>
#endif

#define GENAI_STEP_BLOCK 32
#define GENAI_STEP_ROW_GROUP 8 /* rows sharing one unpacked block pair (AVX2 path) */

/* The run-time path: 1 AVX2 with FMA, 0 scalar. */
static inline int genai_step_rows_level(void) {
#ifdef GENAI_STEP_ROWS_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return 1;
    }
#endif
    return 0;
}

/* The rows of a call, quantised once: ``q`` in the weights' element order (the scalar path),
   ``qp`` in the AVX2 path's (per block pair: the even elements of both blocks, then the odd
   ones; a last odd block: its even elements, then its odd ones), ``sa`` the blocks' scales,
   ``pair_sa`` per group of 4 rows (0-3, 4-7, ...) and block pair (sa_i[2p] of the group's
   rows i = 0..3, then their sa_i[2p+1]; zero for rows the last group lacks), ``qsum4`` per
   block the 8 sums of 4 consecutive q, ``qsum8`` per block pair 8 x the sums of 8 (block
   2p's 4, then 2p+1's). */
typedef struct {
    size_t rows, k, blocks, pairs;
    float* sa;
    float* pair_sa;
    int32_t* qsum4;
    int32_t* qsum8;
    int8_t* q;
    int8_t* qp;
} GenaiStepRows;

/* Bytes of scratch `genai_step_rows_init` lays out for ``rows`` rows of ``k`` values. */
static inline size_t genai_step_rows_bytes(size_t rows, size_t k) {
    size_t blocks = k / GENAI_STEP_BLOCK, pairs = blocks / 2;
    return rows * ((blocks + pairs * 8) * sizeof(float) + (blocks + pairs) * 8 * sizeof(int32_t) +
                   2 * k);
}

static inline void genai_step_rows_init(GenaiStepRows* s, void* scratch, size_t rows,
                                        size_t k) {
    s->rows = rows;
    s->k = k;
    s->blocks = k / GENAI_STEP_BLOCK;
    s->pairs = s->blocks / 2;
    s->sa = (float*)scratch;
    s->pair_sa = s->sa + rows * s->blocks;
    s->qsum4 = (int32_t*)(s->pair_sa + rows * s->pairs * 8);
    s->qsum8 = s->qsum4 + rows * s->blocks * 8;
    s->q = (int8_t*)(s->qsum8 + rows * s->pairs * 8);
    s->qp = s->q + rows * k;
    /* the row groups' unused slots (a last group of fewer than 4 rows) */
    memset(s->pair_sa, 0, ((rows + 3) / 4) * s->pairs * 8 * sizeof(float));
}

/* Row ``r`` of ``s`` from the ``k`` floats at ``a``, the scalar path. */
static void genai_step_prepare_row_scalar(GenaiStepRows* s, size_t r, const float* a) {
    size_t blocks = s->blocks, pairs = s->pairs;
    int8_t* q = s->q + r * s->k;
    float* sa = s->sa + r * blocks;
    for (size_t b = 0; b < blocks; b++) {
        const float* x = a + b * GENAI_STEP_BLOCK;
        float m = 0.0f;
        for (size_t j = 0; j < GENAI_STEP_BLOCK; j++) {
            float v = fabsf(x[j]);
            if (v > m) {
                m = v;
            }
        }
        float inv = m != 0.0f ? 127.0f / m : 0.0f;
        sa[b] = m / 127.0f;
        int32_t* sums = s->qsum4 + (r * blocks + b) * 8;
        for (size_t j = 0; j < GENAI_STEP_BLOCK; j++) {
            /* round to nearest even: |x * inv| <= 127, so adding and taking away 1.5 * 2^23
               leaves the integer (one rounding each, nothing contracted), as nearbyintf would
               without its call */
            float v = (x[j] * inv + 12582912.0f) - 12582912.0f;
            if (!(v >= -128.0f)) {
                v = -128.0f; /* (and NaN, as the vector conversion's saturation gives) */
            }
            if (v > 127.0f) {
                v = 127.0f;
            }
            q[b * GENAI_STEP_BLOCK + j] = (int8_t)v;
        }
        for (int l = 0; l < 8; l++) {
            sums[l] = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++) {
                sums[l] += q[b * GENAI_STEP_BLOCK + j];
            }
        }
    }
    int8_t* qp = s->qp + r * s->k;
    for (size_t p = 0; p < pairs; p++) {
        const int8_t* first = q + 2 * p * GENAI_STEP_BLOCK;
        int8_t* out = qp + 2 * p * GENAI_STEP_BLOCK;
        for (int i = 0; i < 16; i++) {
            out[i] = first[2 * i];
            out[16 + i] = first[GENAI_STEP_BLOCK + 2 * i];
            out[32 + i] = first[2 * i + 1];
            out[48 + i] = first[GENAI_STEP_BLOCK + 2 * i + 1];
        }
        float* lanes = s->pair_sa + ((r / 4) * pairs + p) * 8 + r % 4;
        int32_t* sums = s->qsum8 + (r * pairs + p) * 8;
        const int32_t* four = s->qsum4 + (r * blocks + 2 * p) * 8;
        lanes[0] = sa[2 * p];
        lanes[4] = sa[2 * p + 1];
        for (int l = 0; l < 8; l++) {
            /* lane l: 8 elements 8 (l & 3) of block 2p + (l >> 2) */
            sums[l] = 8 * (four[(l >> 2) * 8 + 2 * (l & 3)] + four[(l >> 2) * 8 + 2 * (l & 3) + 1]);
        }
    }
    if (blocks % 2) {
        const int8_t* last = q + (blocks - 1) * GENAI_STEP_BLOCK;
        int8_t* out = qp + (blocks - 1) * GENAI_STEP_BLOCK;
        for (int i = 0; i < 16; i++) {
            out[i] = last[2 * i];
            out[16 + i] = last[2 * i + 1];
        }
    }
}

#ifdef GENAI_STEP_ROWS_X86
/* As genai_step_prepare_row_scalar, 32 values at a time (the same bits: the maximum is exact,
   the products and roundings are the same operations, and the conversion's saturation gives a
   NaN -128 as the scalar path does). */
__attribute__((target("avx2,fma"))) static void genai_step_prepare_row_avx2(GenaiStepRows* s,
                                                                            size_t r,
                                                                            const float* a) {
    size_t blocks = s->blocks, pairs = s->pairs, k = s->k;
    int8_t* q = s->q + r * k;
    int8_t* qp = s->qp + r * k;
    float* sa = s->sa + r * blocks;
    int32_t* qsum4 = s->qsum4 + r * blocks * 8;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    /* per 16 bytes: the even ones, then the odd ones */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i previous = _mm256_setzero_si256();
    for (size_t b = 0; b < blocks; b++) {
        const float* x = a + b * GENAI_STEP_BLOCK;
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        __m256 top = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x0),
                                                 _mm256_andnot_ps(sign, x1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, x2),
                                                 _mm256_andnot_ps(sign, x3)));
        __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        t = _mm_max_ps(t, _mm_movehl_ps(t, t));
        t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
        float m = _mm_cvtss_f32(t);
        float inv_value = m != 0.0f ? 127.0f / m : 0.0f;
        sa[b] = m / 127.0f;
        __m256 inv = _mm256_set1_ps(inv_value);
        const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x0, inv), mode));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x1, inv), mode));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x2, inv), mode));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x3, inv), mode));
        __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), order);
        _mm256_storeu_si256((__m256i*)(q + b * GENAI_STEP_BLOCK), bytes);
        /* the sums of 4 from the saturated bytes, as the scalar path sums them */
        __m256i w0 = _mm256_cvtepi8_epi32(_mm256_castsi256_si128(bytes));
        __m256i w1 = _mm256_cvtepi8_epi32(_mm_srli_si128(_mm256_castsi256_si128(bytes), 8));
        __m256i w2 = _mm256_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1));
        __m256i w3 = _mm256_cvtepi8_epi32(_mm_srli_si128(_mm256_extracti128_si256(bytes, 1), 8));
        __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(w0, w1), _mm256_hadd_epi32(w2, w3));
        sums = _mm256_permutevar8x32_epi32(sums, order);
        _mm256_storeu_si256((__m256i*)(qsum4 + b * 8), sums);
        /* (the block's even elements | its odd ones) */
        __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xD8);
        if (b % 2 == 0) {
            previous = halves;
            if (b + 1 == blocks) {
                _mm256_storeu_si256((__m256i*)(qp + b * GENAI_STEP_BLOCK), halves);
            }
            continue;
        }
        int8_t* out = qp + (b - 1) * GENAI_STEP_BLOCK;
        _mm256_storeu_si256((__m256i*)out, _mm256_permute2x128_si256(previous, halves, 0x20));
        _mm256_storeu_si256((__m256i*)(out + 32),
                            _mm256_permute2x128_si256(previous, halves, 0x31));
    }
    for (size_t p = 0; p < pairs; p++) {
        float* lanes = s->pair_sa + ((r / 4) * pairs + p) * 8 + r % 4;
        lanes[0] = sa[2 * p];
        lanes[4] = sa[2 * p + 1];
        __m256i s0 = _mm256_loadu_si256((const __m256i*)(qsum4 + 2 * p * 8));
        __m256i s1 = _mm256_loadu_si256((const __m256i*)(qsum4 + 2 * p * 8 + 8));
        __m256i eight = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s0, s1), 0xD8);
        _mm256_storeu_si256((__m256i*)(s->qsum8 + (r * pairs + p) * 8),
                            _mm256_slli_epi32(eight, 3));
    }
}
#endif

/* Row ``r`` of ``s`` from the ``k`` floats at ``a``, on path ``level``. */
static inline void genai_step_prepare_row(GenaiStepRows* s, size_t r, const float* a,
                                          int level) {
#ifdef GENAI_STEP_ROWS_X86
    if (level == 1) {
        genai_step_prepare_row_avx2(s, r, a);
        return;
    }
#endif
    (void)level;
    genai_step_prepare_row_scalar(s, r, a);
}

static inline int genai_step_zero_point(const uint8_t* zp, size_t b) {
    if (zp == NULL) {
        return 8;
    }
    return (b & 1) ? zp[b >> 1] >> 4 : zp[b >> 1] & 15;
}

static inline float genai_step_fold(const float* acc, int whole_group) {
    if (whole_group) {
        float lo = acc[0] + acc[1];
        lo = lo + acc[2];
        lo = lo + acc[3];
        float hi = acc[4] + acc[5];
        hi = hi + acc[6];
        hi = hi + acc[7];
        return lo + hi;
    }
    float r0 = acc[0] + acc[4], r1 = acc[1] + acc[5], r2 = acc[2] + acc[6], r3 = acc[3] + acc[7];
    return (r0 + r2) + (r1 + r3);
}

static inline void genai_step_unpack_scalar(const uint8_t* packed, int zp, int8_t* s) {
    for (int i = 0; i < 16; i++) {
        s[2 * i] = (int8_t)((packed[i] & 15) - zp);
        s[2 * i + 1] = (int8_t)((packed[i] >> 4) - zp);
    }
}

/* acc[l] += fma of the 4-element lanes of one block. */
static inline void genai_step_block_scalar(const int8_t* q, const int8_t* s, float c,
                                           float* acc) {
    for (int l = 0; l < 8; l++) {
        int32_t dot = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++) {
            dot += (int32_t)q[j] * s[j];
        }
        acc[l] = fmaf((float)dot, c, acc[l]);
    }
}

/* Rows [0, rows) x columns [n0, n1) of ``out`` (rows x n), the scalar path. ``rs``: the rows
   (`genai_step_prepare_row`); ``b``: [n, blocks, 16] packed nibbles;
   ``scales``: [n, blocks]; ``zp``: NULL or [n, (blocks + 1) / 2] packed zero points. */
static void genai_step_columns_scalar(const GenaiStepRows* rs, const uint8_t* b,
                                      const float* scales, const uint8_t* zp, size_t n0,
                                      size_t n1, size_t n, float* out) {
    const int8_t* q = rs->q;
    const float* sa = rs->sa;
    size_t rows = rs->rows, blocks = rs->blocks, k = rs->k, whole = n - n % 4;
    size_t zp_stride = (blocks + 1) / 2;
    int8_t s0[GENAI_STEP_BLOCK], s1[GENAI_STEP_BLOCK];
    for (size_t col = n0; col < n1; col++) {
        const uint8_t* packed = b + col * blocks * 16;
        const float* sb = scales + col * blocks;
        const uint8_t* z = zp == NULL ? NULL : zp + col * zp_stride;
        for (size_t r = 0; r < rows; r++) {
            const int8_t* qr = q + r * k;
            const float* sr = sa + r * blocks;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            size_t blk = 0;
            for (; blk + 1 < blocks; blk += 2) {
                genai_step_unpack_scalar(packed + blk * 16, genai_step_zero_point(z, blk), s0);
                genai_step_unpack_scalar(packed + (blk + 1) * 16,
                                         genai_step_zero_point(z, blk + 1), s1);
                float c0 = sr[blk] * sb[blk];
                float c1 = sr[blk + 1] * sb[blk + 1];
                if (z != NULL) {
                    genai_step_block_scalar(qr + blk * GENAI_STEP_BLOCK, s0, c0, acc);
                    genai_step_block_scalar(qr + (blk + 1) * GENAI_STEP_BLOCK, s1, c1, acc);
                    continue;
                }
                for (int l = 0; l < 8; l++) {
                    int second = (l >> 1) & 1;
                    int first = (l & 1) * 8 + (l >> 2) * 16;
                    const int8_t* qq = qr + (blk + second) * GENAI_STEP_BLOCK + first;
                    const int8_t* ss = (second ? s1 : s0) + first;
                    int32_t dot = 0;
                    for (int j = 0; j < 8; j++) {
                        dot += (int32_t)qq[j] * ss[j];
                    }
                    acc[l] = fmaf((float)dot, second ? c1 : c0, acc[l]);
                }
            }
            if (blk < blocks) {
                genai_step_unpack_scalar(packed + blk * 16, genai_step_zero_point(z, blk), s0);
                genai_step_block_scalar(qr + blk * GENAI_STEP_BLOCK, s0, sr[blk] * sb[blk], acc);
            }
            out[r * n + col] = genai_step_fold(acc, col < whole);
        }
    }
}

#ifdef GENAI_STEP_ROWS_X86
/* One row's step over block pair ``p`` without zero points: the dot products of the unsigned
   nibbles ``lo``/``hi`` with the row's ``qp`` bytes, less 8 x the sums of q, times the pair's
   scale products, added to ``acc`` with one FMA. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 genai_step_pair_avx2(
    __m256 acc, __m256i lo, __m256i hi, __m256 c, const int8_t* qr, const int32_t* q8) {
    __m256i sum = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)qr)),
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(qr + 32))));
    __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(sum, _mm256_set1_epi16(1)),
                                   _mm256_loadu_si256((const __m256i*)q8));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), c, acc);
}

/* One row's step over blocks (blk, blk + 1) with zero points ``zp0``/``zp1``: each block on
   its own, lanes of 4. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 genai_step_pair_zp_avx2(
    __m256 acc, __m256i lo, __m256i hi, __m256i zp0, __m256i zp1, const int8_t* qr,
    const int32_t* four, float c0, float c1) {
    __m256i sum = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)qr)),
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(qr + 32))));
    __m256i d0 = _mm256_sub_epi32(
        _mm256_cvtepi16_epi32(_mm256_castsi256_si128(sum)),
        _mm256_mullo_epi32(zp0, _mm256_loadu_si256((const __m256i*)four)));
    __m256i d1 = _mm256_sub_epi32(
        _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sum, 1)),
        _mm256_mullo_epi32(zp1, _mm256_loadu_si256((const __m256i*)(four + 8))));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(c0), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_set1_ps(c1), acc);
}

/* One row's step over a last odd block ``blk`` (lanes of 4). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 genai_step_last_avx2(
    __m256 acc, __m128i lo, __m128i hi, __m256i zp0, const int8_t* qr, const int32_t* four,
    float c) {
    __m128i sum = _mm_add_epi16(
        _mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i*)qr)),
        _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i*)(qr + 16))));
    __m256i d0 = _mm256_sub_epi32(
        _mm256_cvtepi16_epi32(sum),
        _mm256_mullo_epi32(zp0, _mm256_loadu_si256((const __m256i*)four)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(c), acc);
}

/* X(i) for the rows i < R of a group (R a constant where inlined: each row's accumulator is
   a named value, acc0..acc7, not an array element, so that it stays in a register). */
#define GENAI_STEP_EACH_ROW(R, X) \
    X(0)                          \
    if (R > 1) { X(1) }           \
    if (R > 2) { X(2) }           \
    if (R > 3) { X(3) }           \
    if (R > 4) { X(4) }           \
    if (R > 5) { X(5) }           \
    if (R > 6) { X(6) }           \
    if (R > 7) { X(7) }

/* One column's eight lanes for ``R`` rows, 1 to 8, into lanes[i * 32 + 0..7], in the scalar
   path's lane order. A block pair's 32 packed bytes load as one vector: the low nibbles are
   both blocks' even elements, the high nibbles their odd ones, which ``qp`` matches. Without
   zero points the nibbles stay unsigned (0..15) and the dot products lose 8 x the sums of q
   (``qsum8``); a row's scale products for the pair come out of one product for 4 rows
   (``pair_sa`` x the column's two scales) by an in-lane broadcast; the eight 8-element sums
   come out as (block 2p: 0-7, 8-15, 16-23, 24-31, block 2p+1: the same), the scalar path's
   lanes (0, 1, 4, 5, 2, 3, 6, 7), put back in order after the last pair. */
__attribute__((target("avx2,fma"), always_inline)) static inline void genai_step_column_avx2(
    const int R, const GenaiStepRows* rs, size_t r0, const uint8_t* packed, const float* sb,
    const uint8_t* z, float* lanes) {
    size_t blocks = rs->blocks, pairs = rs->pairs, k = rs->k;
    const int8_t* qp = rs->qp + r0 * k;
    const __m256i nibble = _mm256_set1_epi8(15);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m256 acc4 = acc0, acc5 = acc0, acc6 = acc0, acc7 = acc0;
    size_t pair_step = pairs * 8, block_step = blocks * 8;
    const float* group_sa = rs->pair_sa + (r0 / 4) * pair_step;
    for (size_t p = 0; p < pairs; p++) {
        size_t blk = 2 * p;
        __m256i x = _mm256_loadu_si256((const __m256i*)(packed + blk * 16));
        __m256i lo = _mm256_and_si256(x, nibble);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
        const int8_t* qr = qp + blk * GENAI_STEP_BLOCK;
        if (z == NULL) {
            /* (sb[blk] x 4, sb[blk + 1] x 4) */
            __m256 sb_lanes = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(
                    _mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)(sb + blk)))),
                spread);
            const int32_t* q8 = rs->qsum8 + (r0 * pairs + p) * 8;
            /* 4 rows' scale products: (sa_i[blk] sb[blk], i = 0..3 | sa_i[blk+1] sb[blk+1]) */
            __m256 c4 = _mm256_mul_ps(_mm256_loadu_ps(group_sa + p * 8), sb_lanes);
            __m256 c8 = c4;
            if (R > 4) {
                c8 = _mm256_mul_ps(_mm256_loadu_ps(group_sa + pair_step + p * 8), sb_lanes);
            }
#define GENAI_STEP_PAIR_ROW(i)                                                               \
    acc##i = genai_step_pair_avx2(                                                           \
        acc##i, lo, hi, _mm256_permute_ps((i) < 4 ? c4 : c8, ((i) % 4) * 0x55), qr + (i) * k, \
        q8 + (i) * pair_step);
            GENAI_STEP_EACH_ROW(R, GENAI_STEP_PAIR_ROW)
#undef GENAI_STEP_PAIR_ROW
            continue;
        }
        __m256i zp0 = _mm256_set1_epi32(genai_step_zero_point(z, blk));
        __m256i zp1 = _mm256_set1_epi32(genai_step_zero_point(z, blk + 1));
        const int32_t* four = rs->qsum4 + (r0 * blocks + blk) * 8;
        const float* sr = rs->sa + r0 * blocks + blk;
#define GENAI_STEP_ZP_ROW(i)                                                                 \
    acc##i = genai_step_pair_zp_avx2(acc##i, lo, hi, zp0, zp1, qr + (i) * k,                 \
                                     four + (i) * block_step, sr[(i) * blocks] * sb[blk],    \
                                     sr[(i) * blocks + 1] * sb[blk + 1]);
        GENAI_STEP_EACH_ROW(R, GENAI_STEP_ZP_ROW)
#undef GENAI_STEP_ZP_ROW
    }
    if (z == NULL && pairs) {
#define GENAI_STEP_ORDER_ROW(i) \
    acc##i = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc##i), 0xD8));
        GENAI_STEP_EACH_ROW(R, GENAI_STEP_ORDER_ROW)
#undef GENAI_STEP_ORDER_ROW
    }
    if (blocks % 2) {
        size_t blk = blocks - 1;
        __m128i x = _mm_loadu_si128((const __m128i*)(packed + blk * 16));
        __m128i lo = _mm_and_si128(x, _mm256_castsi256_si128(nibble));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm256_castsi256_si128(nibble));
        __m256i zp0 = _mm256_set1_epi32(genai_step_zero_point(z, blk));
        const int8_t* qr = qp + blk * GENAI_STEP_BLOCK;
        const int32_t* four = rs->qsum4 + (r0 * blocks + blk) * 8;
        const float* sr = rs->sa + r0 * blocks + blk;
#define GENAI_STEP_LAST_ROW(i)                                                         \
    acc##i = genai_step_last_avx2(acc##i, lo, hi, zp0, qr + (i) * k,                   \
                                  four + (i) * block_step, sr[(i) * blocks] * sb[blk]);
        GENAI_STEP_EACH_ROW(R, GENAI_STEP_LAST_ROW)
#undef GENAI_STEP_LAST_ROW
    }
#define GENAI_STEP_STORE_ROW(i) _mm256_storeu_ps(lanes + (i) * 32, acc##i);
    GENAI_STEP_EACH_ROW(R, GENAI_STEP_STORE_ROW)
#undef GENAI_STEP_STORE_ROW
}
#undef GENAI_STEP_EACH_ROW

/* genai_step_fold of 4 columns' lanes (lanes[c * 8 + 0..7]) into out[0..3], as vectors. */
__attribute__((target("avx2,fma"))) static inline void genai_step_fold4_avx2(const float* lanes,
                                                                             float* out) {
    __m256 c0 = _mm256_loadu_ps(lanes), c1 = _mm256_loadu_ps(lanes + 8);
    __m256 c2 = _mm256_loadu_ps(lanes + 16), c3 = _mm256_loadu_ps(lanes + 24);
    __m256 t0 = _mm256_unpacklo_ps(c0, c1), t1 = _mm256_unpackhi_ps(c0, c1);
    __m256 t2 = _mm256_unpacklo_ps(c2, c3), t3 = _mm256_unpackhi_ps(c2, c3);
    /* w_l: lane l (low half) and lane l + 4 (high half) of the 4 columns */
    __m256 w0 = _mm256_shuffle_ps(t0, t2, 0x44), w1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 w2 = _mm256_shuffle_ps(t1, t3, 0x44), w3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 x = _mm256_add_ps(w0, w1);
    x = _mm256_add_ps(x, w2);
    x = _mm256_add_ps(x, w3);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}

#define GENAI_STEP_COLUMN_CASE(R)                                                 \
    case R:                                                                       \
        genai_step_column_avx2(R, rs, r0, packed, sb, z, lanes + c * 8); \
        break;

/* As genai_step_columns_scalar (``n0`` a multiple of 4), 8 rows at a time sharing each
   unpacked block pair, 4 columns' sums folded together. */
__attribute__((target("avx2,fma"))) static void genai_step_columns_avx2(
    const GenaiStepRows* rs, const uint8_t* b, const float* scales, const uint8_t* zp,
    size_t n0, size_t n1, size_t n, float* out) {
    size_t rows = rs->rows, blocks = rs->blocks, whole = n - n % 4;
    size_t zp_stride = (blocks + 1) / 2;
    float lanes[GENAI_STEP_ROW_GROUP * 32];
    for (size_t col = n0; col < n1; col += 4) {
        size_t cols = n1 - col < 4 ? n1 - col : 4;
        for (size_t r0 = 0; r0 < rows; r0 += GENAI_STEP_ROW_GROUP) {
            size_t count = rows - r0 < GENAI_STEP_ROW_GROUP ? rows - r0 : GENAI_STEP_ROW_GROUP;
            for (size_t c = 0; c < cols; c++) {
                const uint8_t* packed = b + (col + c) * blocks * 16;
                const float* sb = scales + (col + c) * blocks;
                const uint8_t* z = zp == NULL ? NULL : zp + (col + c) * zp_stride;
                switch (count) {
                    GENAI_STEP_COLUMN_CASE(1)
                    GENAI_STEP_COLUMN_CASE(2)
                    GENAI_STEP_COLUMN_CASE(3)
                    GENAI_STEP_COLUMN_CASE(4)
                    GENAI_STEP_COLUMN_CASE(5)
                    GENAI_STEP_COLUMN_CASE(6)
                    GENAI_STEP_COLUMN_CASE(7)
                    default:
                        genai_step_column_avx2(GENAI_STEP_ROW_GROUP, rs, r0, packed, sb, z,
                                               lanes + c * 8);
                }
            }
            for (size_t i = 0; i < count; i++) {
                float* row = out + (r0 + i) * n + col;
                if (cols == 4 && col + 4 <= whole) {
                    genai_step_fold4_avx2(lanes + i * 32, row);
                    continue;
                }
                for (size_t c = 0; c < cols; c++) {
                    row[c] = genai_step_fold(lanes + i * 32 + c * 8, col + c < whole);
                }
            }
        }
    }
}
#undef GENAI_STEP_COLUMN_CASE
#endif

/* Columns [n0, n1) of every row of ``rs``, on path ``level`` (genai_step_rows_level). */
static inline void genai_step_columns(const GenaiStepRows* rs, const uint8_t* b,
                                      const float* scales, const uint8_t* zp, size_t n0,
                                      size_t n1, size_t n, float* out, int level) {
#ifdef GENAI_STEP_ROWS_X86
    if (level == 1) {
        genai_step_columns_avx2(rs, b, scales, zp, n0, n1, n, out);
        return;
    }
#endif
    (void)level;
    genai_step_columns_scalar(rs, b, scales, zp, n0, n1, n, out);
}

#include "exact_float_end.h"
#endif
