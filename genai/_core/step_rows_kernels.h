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

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

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

/* One row's int8 blocks: ``a`` has ``k`` floats (a multiple of 32); ``q`` gets k int8, ``sa``
   k / 32 scales, ``pair_scales`` 8 floats per block pair, the lanes' activation scales
   (sa[2p], sa[2p], sa[2p+1], sa[2p+1], sa[2p], sa[2p], sa[2p+1], sa[2p+1]). */
static void genai_step_quantize_row(const float* a, size_t k, int8_t* q, float* sa,
                                    float* pair_scales) {
    size_t blocks = k / GENAI_STEP_BLOCK;
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
        for (size_t j = 0; j < GENAI_STEP_BLOCK; j++) {
            float v = nearbyintf(x[j] * inv);
            if (!(v >= -128.0f)) {
                v = -128.0f; /* (and NaN, as the vector conversion's saturation gives) */
            }
            if (v > 127.0f) {
                v = 127.0f;
            }
            q[b * GENAI_STEP_BLOCK + j] = (int8_t)v;
        }
    }
    for (size_t p = 0; p + 1 < blocks; p += 2) {
        float* lanes = pair_scales + (p / 2) * 8;
        for (int l = 0; l < 8; l++) {
            lanes[l] = sa[p + ((l >> 1) & 1)];
        }
    }
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

/* Rows [0, rows) x columns [n0, n1) of ``out`` (rows x n), the scalar path. ``q``, ``sa``:
   the rows' `genai_step_quantize_row` blocks; ``b``: [n, blocks, 16] packed nibbles;
   ``scales``: [n, blocks]; ``zp``: NULL or [n, (blocks + 1) / 2] packed zero points. */
static void genai_step_columns_scalar(const int8_t* q, const float* sa, size_t rows,
                                      size_t blocks, const uint8_t* b, const float* scales,
                                      const uint8_t* zp, size_t n0, size_t n1, size_t n,
                                      float* out) {
    size_t k = blocks * GENAI_STEP_BLOCK, whole = n - n % 4;
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
__attribute__((target("avx2,fma"))) static inline __m256i genai_step_unpack_avx2(
    const uint8_t* packed, int zp) {
    __m128i x = _mm_loadu_si128((const __m128i*)packed);
    __m128i mask = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(x, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
    __m256i u = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    return _mm256_sub_epi8(u, _mm256_set1_epi8((char)zp));
}

/* The exact int32 sums of 4 consecutive products q[j] * s[j] (lane l: j = 4l..4l+3). */
__attribute__((target("avx2,fma"))) static inline __m256i genai_step_dot4_avx2(__m256i q,
                                                                                __m256i s,
                                                                                __m256i abs_s) {
    __m256i pairs = _mm256_maddubs_epi16(abs_s, _mm256_sign_epi8(q, s));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* As genai_step_columns_scalar, 8 rows at a time sharing each unpacked block pair. */
__attribute__((target("avx2,fma"))) static void genai_step_columns_avx2(
    const int8_t* q, const float* sa, const float* pair_scales, size_t rows, size_t blocks,
    const uint8_t* b, const float* scales, const uint8_t* zp, size_t n0, size_t n1, size_t n,
    float* out) {
    size_t k = blocks * GENAI_STEP_BLOCK, whole = n - n % 4, pairs = blocks / 2;
    size_t zp_stride = (blocks + 1) / 2;
    float lanes[8];
    for (size_t col = n0; col < n1; col++) {
        const uint8_t* packed = b + col * blocks * 16;
        const float* sb = scales + col * blocks;
        const uint8_t* z = zp == NULL ? NULL : zp + col * zp_stride;
        for (size_t r0 = 0; r0 < rows; r0 += GENAI_STEP_ROW_GROUP) {
            size_t count = rows - r0 < GENAI_STEP_ROW_GROUP ? rows - r0 : GENAI_STEP_ROW_GROUP;
            __m256 acc[GENAI_STEP_ROW_GROUP];
            for (size_t i = 0; i < count; i++) {
                acc[i] = _mm256_setzero_ps();
            }
            size_t blk = 0;
            for (; blk + 1 < blocks; blk += 2) {
                __m256i s0 = genai_step_unpack_avx2(packed + blk * 16,
                                                    genai_step_zero_point(z, blk));
                __m256i s1 = genai_step_unpack_avx2(packed + (blk + 1) * 16,
                                                    genai_step_zero_point(z, blk + 1));
                __m256i a0 = _mm256_sign_epi8(s0, s0), a1 = _mm256_sign_epi8(s1, s1);
                __m256 sb_lanes = _mm256_setr_ps(sb[blk], sb[blk], sb[blk + 1], sb[blk + 1],
                                                 sb[blk], sb[blk], sb[blk + 1], sb[blk + 1]);
                for (size_t i = 0; i < count; i++) {
                    const int8_t* qr = q + (r0 + i) * k + blk * GENAI_STEP_BLOCK;
                    __m256i d0 = genai_step_dot4_avx2(_mm256_loadu_si256((const __m256i*)qr),
                                                      s0, a0);
                    __m256i d1 = genai_step_dot4_avx2(
                        _mm256_loadu_si256((const __m256i*)(qr + GENAI_STEP_BLOCK)), s1, a1);
                    if (z != NULL) {
                        const float* sr = sa + (r0 + i) * blocks + blk;
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0),
                                                 _mm256_set1_ps(sr[0] * sb[blk]), acc[i]);
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1),
                                                 _mm256_set1_ps(sr[1] * sb[blk + 1]), acc[i]);
                        continue;
                    }
                    __m256 c = _mm256_mul_ps(
                        _mm256_loadu_ps(pair_scales + ((r0 + i) * pairs + blk / 2) * 8),
                        sb_lanes);
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(d0, d1)), c,
                                             acc[i]);
                }
            }
            if (blk < blocks) {
                __m256i s0 = genai_step_unpack_avx2(packed + blk * 16,
                                                    genai_step_zero_point(z, blk));
                __m256i a0 = _mm256_sign_epi8(s0, s0);
                for (size_t i = 0; i < count; i++) {
                    const int8_t* qr = q + (r0 + i) * k + blk * GENAI_STEP_BLOCK;
                    __m256i d0 = genai_step_dot4_avx2(_mm256_loadu_si256((const __m256i*)qr),
                                                      s0, a0);
                    float c = sa[(r0 + i) * blocks + blk] * sb[blk];
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(c), acc[i]);
                }
            }
            for (size_t i = 0; i < count; i++) {
                _mm256_storeu_ps(lanes, acc[i]);
                out[(r0 + i) * n + col] = genai_step_fold(lanes, col < whole);
            }
        }
    }
}
#endif

/* Columns [n0, n1) of every row, on path ``level`` (genai_step_rows_level). */
static inline void genai_step_columns(const int8_t* q, const float* sa,
                                      const float* pair_scales, size_t rows, size_t blocks,
                                      const uint8_t* b, const float* scales, const uint8_t* zp,
                                      size_t n0, size_t n1, size_t n, float* out, int level) {
#ifdef GENAI_STEP_ROWS_X86
    if (level == 1) {
        genai_step_columns_avx2(q, sa, pair_scales, rows, blocks, b, scales, zp, n0, n1, n, out);
        return;
    }
#endif
    (void)pair_scales;
    (void)level;
    genai_step_columns_scalar(q, sa, rows, blocks, b, scales, zp, n0, n1, n, out);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
#endif
