# cython: language_level=3
"""Logits processing and sampling: one decoding step's choice, without the GIL.

The chain, per row, in this order (the guidance mask is applied by the caller before it):

1. ``min_length``: while the row's sequence (prompt included) is shorter than ``min_length``,
   every EOS logit becomes the lowest float (-FLT_MAX).
2. ``repetition_penalty`` p (skipped when p == 1): each DISTINCT token id of the whole sequence
   gets ``logit < 0 ? logit * p : logit / p``.
3. ``no_repeat_ngram_size`` n (skipped when 0): each token that followed an earlier occurrence
   of the row's last n - 1 tokens becomes the lowest float (n == 1: every token already in the
   sequence).
4. presence / frequency penalties (OpenAI): ``logit -= presence * (count > 0) + frequency *
   count`` with counts over the GENERATED tokens only (from a per-row start offset).
5. logit bias: sparse ``(id, bias)`` pairs added to the logits.
6. the choice (`sample_row`): greedy argmax (ties -> lowest id) when sampling is off,
   temperature == 0 or top_k == 1; otherwise temperature, top-k, top-p, min-p and a draw from
   the row's uniform u in [0, 1).

Stages 1-5 modify the logits IN PLACE; the choice reads them only. Every stage has a
``cdef ... noexcept nogil`` function on one row (the C-level API in ``sampling.pxd``) and a
Python wrapper over a [rows, vocab] float32 batch that releases the GIL.
`genai._core.sampling_reference` is the NumPy twin of every public name here. The exact rules
(rank order, tie breaks, log-probabilities, RNG streams) are in ``docs/sampling.md``.
"""

import math
import numbers
import operator
import os

import numpy as np

from genai.errors import NonFiniteLogitsError

cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY, isfinite, log
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

cnp.import_array()

cdef extern from "sampling_kernels.h":
    float block_max "genai_block_max"(const float* x, Py_ssize_t n, int* has_nan) noexcept nogil
    float copy_block_max "genai_copy_block_max"(
        const float* src, float* dst, Py_ssize_t n, int* has_nan,
    ) noexcept nogil
    double exp_neg "genai_exp_neg1"(double d) noexcept nogil
    void exp_rel "genai_exp_rel"(
        const float* x, Py_ssize_t n, double m, double inv_t, double* d, double* e,
    ) noexcept nogil

# Block length of the top-k scan: blocks whose maximum is not above the k-th best are skipped.
cdef enum:
    SCAN_BLOCK = 64
    CHUNK = 256  # tokens per exp batch of the full-vocabulary passes

#: Lowest float32, the value of banned logits (min_length, no_repeat_ngram), as the reference.
LOWEST = float(np.finfo(np.float32).min)

# ---------------------------------------------------------------------------------------------
# RNG: splitmix64 seeding + xoshiro256**
# ---------------------------------------------------------------------------------------------

cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef inline uint64_t _splitmix64(uint64_t* x) noexcept nogil:
    x[0] += <uint64_t>0x9E3779B97F4A7C15ULL
    cdef uint64_t z = x[0]
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef void rng_seed(RngState* state, uint64_t seed, uint64_t stream) noexcept nogil:
    """Stream ``stream`` of ``seed``: xoshiro256** state = the first four splitmix64 outputs
    from ``seed + stream * 0xD1B54A32D192ED03`` (mod 2**64)."""
    cdef uint64_t x = seed + stream * <uint64_t>0xD1B54A32D192ED03ULL
    cdef int i
    for i in range(4):
        state.s[i] = _splitmix64(&x)
    if (state.s[0] | state.s[1] | state.s[2] | state.s[3]) == 0:
        state.s[0] = 1  # the all-zero state is xoshiro's only fixed point


cdef uint64_t rng_next(RngState* state) noexcept nogil:
    """Next 64-bit output of xoshiro256**."""
    cdef uint64_t* s = state.s
    cdef uint64_t result = _rotl(s[1] * 5, 7) * 9
    cdef uint64_t t = s[1] << 17
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(s[3], 45)
    return result


cdef double rng_uniform(RngState* state) noexcept nogil:
    """Uniform double in [0, 1) from the top 53 bits of the next output."""
    return <double>(rng_next(state) >> 11) * (1.0 / 9007199254740992.0)


def _seed_value(seed):
    """A seed as uint64; -1 draws one from os.urandom."""
    value = operator.index(seed)
    if value == -1:
        return int.from_bytes(os.urandom(8), "little")
    if value < 0:
        raise ValueError(f"seed must be >= 0 or -1 (random), got {value}")
    return value & 0xFFFFFFFFFFFFFFFF


cdef class RowRng:
    """One independent random stream per batch row.

    Row r's stream is derived from ``(seed, r)`` only (splitmix64 seeding of xoshiro256**),
    so a row's draws do not depend on the batch size or on its neighbours. ``seed=-1`` takes the
    seed from ``os.urandom``. Reproducible across runs and machines.
    """

    def __cinit__(self, Py_ssize_t rows, seed=-1):
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self.rows = rows
        self.states = <RngState*>PyMem_Malloc(rows * sizeof(RngState))
        if self.states == NULL:
            raise MemoryError()
        self.seed(seed)

    def __dealloc__(self):
        PyMem_Free(self.states)

    def seed(self, seed=-1, rows=None):
        """Row r (for r < ``rows``, default all) gets stream r of ``seed`` (-1: os.urandom)."""
        cdef uint64_t value = _seed_value(seed)
        cdef Py_ssize_t r, n = self.rows if rows is None else rows
        if not 0 <= n <= self.rows:
            raise ValueError(f"rows ({n}) must be in [0, {self.rows}]")
        for r in range(n):
            rng_seed(&self.states[r], value, <uint64_t>r)

    def seed_row(self, Py_ssize_t row, seed=-1, stream=None):
        """Row ``row`` gets stream ``stream`` (default: ``row``) of ``seed``."""
        self._check(row)
        cdef uint64_t value = _seed_value(seed)
        cdef uint64_t index = <uint64_t>(row if stream is None else stream)
        rng_seed(&self.states[row], value, index)

    def uniform(self, Py_ssize_t row):
        """Next uniform float in [0, 1) of row ``row``."""
        self._check(row)
        return rng_uniform(&self.states[row])

    def next_u64(self, Py_ssize_t row):
        """Next raw 64-bit output of row ``row`` (for test vectors)."""
        self._check(row)
        return rng_next(&self.states[row])

    def draw(self, rows=None):
        """One uniform per row for rows 0..rows-1 (default all), as a float64 array."""
        cdef Py_ssize_t r, n = self.rows if rows is None else rows
        if not 0 <= n <= self.rows:
            raise ValueError(f"rows ({n}) must be in [0, {self.rows}]")
        out = np.empty(n, np.float64)
        cdef double[::1] view = out
        for r in range(n):
            view[r] = rng_uniform(&self.states[r])
        return out

    def get_state(self):
        """Copy of every row's state, uint64 [rows, 4]."""
        out = np.empty((self.rows, 4), np.uint64)
        cdef uint64_t[:, ::1] view = out
        cdef Py_ssize_t r, i
        for r in range(self.rows):
            for i in range(4):
                view[r, i] = self.states[r].s[i]
        return out

    def set_state(self, state):
        """Restore states saved by `get_state`."""
        cdef uint64_t[:, ::1] view = np.ascontiguousarray(state, dtype=np.uint64)
        if view.shape[0] != self.rows or view.shape[1] != 4:
            raise ValueError(f"state must have shape ({self.rows}, 4)")
        cdef Py_ssize_t r, i
        for r in range(self.rows):
            for i in range(4):
                self.states[r].s[i] = view[r, i]

    cdef _check(self, Py_ssize_t row):
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")


# ---------------------------------------------------------------------------------------------
# Stages on one row
# ---------------------------------------------------------------------------------------------

cdef void min_length_row(
    float* row, Py_ssize_t vocab, Py_ssize_t length, Py_ssize_t min_length,
    const int32_t* eos_ids, Py_ssize_t n_eos,
) noexcept nogil:
    """Every EOS logit -> lowest float while ``length < min_length``."""
    cdef Py_ssize_t e
    if length >= min_length:
        return
    for e in range(n_eos):
        if 0 <= eos_ids[e] < vocab:
            row[eos_ids[e]] = -FLT_MAX


cdef void repetition_penalty_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t length, float penalty,
    uint8_t* seen,
) noexcept nogil:
    """Penalise each distinct id of ``seq[:length]`` once. ``seen`` ([vocab], all zero) is
    left all zero again: O(length), no pass over the vocabulary."""
    cdef Py_ssize_t i
    cdef int32_t t
    cdef float v
    if penalty == 1.0:
        return
    for i in range(length):
        t = seq[i]
        if 0 <= t < vocab and not seen[t]:
            seen[t] = 1
            v = row[t]
            row[t] = v * penalty if v < 0 else v / penalty
    for i in range(length):
        t = seq[i]
        if 0 <= t < vocab:
            seen[t] = 0


cdef void no_repeat_ngram_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t length, Py_ssize_t n,
) noexcept nogil:
    """Ban (-> lowest) ``seq[i + n - 1]`` for every i <= length - n whose ``seq[i:i + n - 1]``
    equals the last n - 1 tokens. n == 1 bans every token of the sequence; n == 0 or a
    sequence shorter than n bans nothing."""
    cdef Py_ssize_t i, j, m = n - 1
    cdef int32_t t
    cdef const int32_t* tail
    if n <= 0 or length < n:
        return
    tail = seq + length - m
    for i in range(length - n + 1):
        if m > 0 and seq[i + m - 1] != tail[m - 1]:
            continue  # cheap filter on the last token of the window
        j = 0
        while j < m - 1 and seq[i + j] == tail[j]:
            j += 1
        if m == 0 or j >= m - 1:
            t = seq[i + m]
            if 0 <= t < vocab:
                row[t] = -FLT_MAX


cdef void presence_frequency_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t start, Py_ssize_t length,
    float presence, float frequency, int32_t* counts,
) noexcept nogil:
    """``logit -= presence * (count > 0) + frequency * count`` with counts over
    ``seq[start:length]``. ``counts`` ([vocab], all zero) is left all zero again."""
    cdef Py_ssize_t i
    cdef int32_t t
    if presence == 0.0 and frequency == 0.0:
        return
    if start < 0:
        start = 0
    for i in range(start, length):
        t = seq[i]
        if 0 <= t < vocab:
            counts[t] += 1
    for i in range(start, length):
        t = seq[i]
        if 0 <= t < vocab and counts[t] > 0:
            row[t] -= presence + frequency * <float>counts[t]
            counts[t] = 0


cdef void logit_bias_row(
    float* row, Py_ssize_t vocab, const int32_t* ids, const float* biases, Py_ssize_t n,
) noexcept nogil:
    """``row[ids[j]] += biases[j]``; ids outside [0, vocab) (padding: -1) are skipped."""
    cdef Py_ssize_t j
    for j in range(n):
        if 0 <= ids[j] < vocab:
            row[ids[j]] += biases[j]


# ---------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------

cdef inline bint _worse(Candidate a, Candidate b) noexcept nogil:
    """Rank order: higher value first, ties -> lower index first."""
    return a.value < b.value or (a.value == b.value and a.index > b.index)


cdef void _sift_down(Candidate* h, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """Min-heap on rank (root = worst candidate)."""
    cdef Candidate item = h[i]
    cdef Py_ssize_t c
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _worse(h[c + 1], h[c]):
            c += 1
        if _worse(h[c], item):
            h[i] = h[c]
            i = c
        else:
            break
    h[i] = item


cdef void _heapify(Candidate* h, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = n // 2 - 1
    while i >= 0:
        _sift_down(h, n, i)
        i -= 1


cdef void _heap_to_rank_order(Candidate* h, Py_ssize_t n) noexcept nogil:
    """Heap sort of a worst-first heap: ``h`` ends best first."""
    cdef Py_ssize_t end = n - 1
    cdef Candidate tmp
    while end > 0:
        tmp = h[0]
        h[0] = h[end]
        h[end] = tmp
        _sift_down(h, end, 0)
        end -= 1


cdef Py_ssize_t _select_top(
    const float* row, Py_ssize_t vocab, Py_ssize_t k, Candidate* h,
) noexcept nogil:
    """The k best of ``row`` in rank order into ``h[:k]`` (1 <= k <= vocab), one pass with a
    k-heap; blocks whose maximum does not beat the current k-th best are skipped. Returns -1
    when the row holds a NaN."""
    cdef Py_ssize_t i, j, nb
    cdef float v, thr
    cdef int bad = 0
    for i in range(k):
        v = row[i]
        if v != v:
            return -1
        h[i].value = v
        h[i].index = <int32_t>i
    _heapify(h, k)
    thr = h[0].value
    i = k
    while i < vocab:
        nb = vocab - i if vocab - i < SCAN_BLOCK else SCAN_BLOCK
        if block_max(row + i, nb, &bad) > thr:
            for j in range(i, i + nb):
                v = row[j]
                if v > thr:
                    # scanning in index order: an equal value later is worse, so strict >
                    h[0].value = v
                    h[0].index = <int32_t>j
                    _sift_down(h, k, 0)
                    thr = h[0].value
        if bad:
            return -1
        i += SCAN_BLOCK
    _heap_to_rank_order(h, k)
    return k


cdef float _kth_largest(float* a, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """The k-th largest (1-based) of ``a[:n]`` (no NaN), by quickselect; reorders ``a``."""
    cdef Py_ssize_t lo = 0, hi = n - 1, target = k - 1, i, j
    cdef float pivot, tmp
    while lo < hi:
        pivot = a[lo + (hi - lo) // 2]
        i, j = lo, hi
        while i <= j:  # descending Hoare partition
            while a[i] > pivot:
                i += 1
            while a[j] < pivot:
                j -= 1
            if i <= j:
                tmp = a[i]
                a[i] = a[j]
                a[j] = tmp
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break
    return a[target]


cdef Py_ssize_t _select_top_blocks(
    const float* row, Py_ssize_t vocab, Py_ssize_t k, Candidate* h, float* work,
    const float* given,
) noexcept nogil:
    """`_select_top` for k much smaller than the number of 64-logit blocks: the k-th largest
    block maximum is a lower bound of the k-th best logit (the block maxima are k distinct
    entries), so one pass computes the block maxima, a quickselect finds that bound, and only
    the blocks reaching it are scanned -- the heap sees ~k insertions instead of ~k ln(V/k).
    ``work`` holds 2 * ceil(vocab / 64) floats. ``given`` (may be NULL): the block maxima,
    exact and NaN-free, computed while the row was copied in (`Sampler.load_logits`). Same
    result and tie order as `_select_top`."""
    cdef Py_ssize_t nblocks = (vocab + SCAN_BLOCK - 1) // SCAN_BLOCK, b, j, start, stop, n = 0
    cdef float* maxima = work
    cdef float* sel = work + nblocks
    cdef float bound, thr = 0.0, v
    cdef int bad = 0
    if given != NULL:
        maxima = <float*>given
        memcpy(sel, given, nblocks * sizeof(float))
    else:
        for b in range(nblocks):
            start = b * SCAN_BLOCK
            stop = start + SCAN_BLOCK if start + SCAN_BLOCK < vocab else vocab
            maxima[b] = block_max(row + start, stop - start, &bad)
            if bad:  # checked per block: block_max reports on the block it was given
                return -1
            sel[b] = maxima[b]
    bound = _kth_largest(sel, nblocks, k)
    for b in range(nblocks):
        if maxima[b] < bound or (n == k and maxima[b] <= thr):
            continue
        start = b * SCAN_BLOCK
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < vocab else vocab
        for j in range(start, stop):
            v = row[j]
            if v < bound:
                continue
            if n < k:
                h[n].value = v
                h[n].index = <int32_t>j
                n += 1
                if n == k:
                    _heapify(h, k)
                    thr = h[0].value
            elif v > thr:  # index order: an equal value later is worse
                h[0].value = v
                h[0].index = <int32_t>j
                _sift_down(h, k, 0)
                thr = h[0].value
    _heap_to_rank_order(h, k)
    return k


cdef Py_ssize_t _first_index_of(const float* row, Py_ssize_t vocab, float value) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(vocab):
        if row[i] == value:
            return i
    return 0


cdef Py_ssize_t _argmax(const float* row, Py_ssize_t vocab, float* best) noexcept nogil:
    """Index of the largest value (ties: lowest index) in one blocked pass, its value into
    ``best``; -1 when the row holds a NaN."""
    cdef Py_ssize_t i = 0, nb, start = 0
    cdef float bm, m = -INFINITY
    cdef int bad = 0
    while i < vocab:
        nb = vocab - i if vocab - i < SCAN_BLOCK else SCAN_BLOCK
        bm = block_max(row + i, nb, &bad)
        if bad:
            return -1
        if bm > m:  # strict: the first block holding the maximum wins
            m = bm
            start = i
        i += SCAN_BLOCK
    best[0] = m
    return start + _first_index_of(row + start, vocab - start, m)


cdef Py_ssize_t _gather_bucket(
    const float* row, const uint16_t* key, Py_ssize_t vocab, uint16_t bucket, double md,
    double inv_t, Candidate* out, double* mass,
) noexcept nogil:
    """Tokens of one bucket (in index order) and their unnormalised probabilities."""
    cdef Py_ssize_t i, n = 0
    for i in range(vocab):
        if key[i] == bucket:
            out[n].value = row[i]
            out[n].index = <int32_t>i
            mass[n] = exp_neg((md - <double>row[i]) * inv_t)
            n += 1
    return n


cdef inline void _swap(Candidate* a, double* e, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    cdef Candidate t = a[i]
    cdef double te = e[i]
    a[i] = a[j]
    e[i] = e[j]
    a[j] = t
    e[j] = te


cdef Py_ssize_t _crossing(
    Candidate* a, double* e, Py_ssize_t n, double base, double target, bint inclusive,
    double* acc_out,
) noexcept nogil:
    """The rank-order crossing point of ``a[:n]`` (masses ``e``), in expected O(n) without
    sorting: the smallest j such that ``base`` + the mass of the j + 1 best tokens reaches
    ``target`` (``>=`` when ``inclusive``, else ``>``). On return ``a[:j + 1]`` holds those
    tokens, ``a[j]`` the crossing one, and ``acc_out`` that mass. Returns -1 (``acc_out`` =
    base + all) when the target is not reached. Quickselect on the rank order, median-of-3
    pivots, insertion sort below 32 tokens."""
    cdef Py_ssize_t lo = 0, hi = n, mid, i, j
    cdef double acc = base, part
    cdef Candidate pivot, item
    cdef double item_e
    while hi - lo > 32:
        mid = lo + (hi - lo) // 2
        if _worse(a[lo], a[mid]):
            _swap(a, e, lo, mid)
        if _worse(a[mid], a[hi - 1]):
            _swap(a, e, mid, hi - 1)
            if _worse(a[lo], a[mid]):
                _swap(a, e, lo, mid)
        _swap(a, e, mid, hi - 1)  # the median (by rank) is the pivot, parked at hi - 1
        pivot = a[hi - 1]
        i = lo
        part = 0.0
        for j in range(lo, hi - 1):
            if _worse(pivot, a[j]):  # a[j] ranks before the pivot
                part += e[j]
                _swap(a, e, i, j)
                i += 1
        _swap(a, e, i, hi - 1)
        if (acc + part >= target) if inclusive else (acc + part > target):
            hi = i
            continue
        acc += part
        if (acc + e[i] >= target) if inclusive else (acc + e[i] > target):
            acc_out[0] = acc + e[i]
            return i
        acc += e[i]
        lo = i + 1
    for i in range(lo + 1, hi):  # insertion sort of the last few by rank
        item = a[i]
        item_e = e[i]
        j = i - 1
        while j >= lo and _worse(a[j], item):
            a[j + 1] = a[j]
            e[j + 1] = e[j]
            j -= 1
        a[j + 1] = item
        e[j + 1] = item_e
    for i in range(lo, hi):
        acc += e[i]
        if (acc >= target) if inclusive else (acc > target):
            acc_out[0] = acc
            return i
    acc_out[0] = acc
    return -1


cdef Py_ssize_t _last_positive(const Candidate* a, const double* e, Py_ssize_t n) noexcept nogil:
    """Position of the worst-ranked token with positive mass in ``a[:n]`` (-1 if none)."""
    cdef Py_ssize_t i, best = -1
    for i in range(n):
        if e[i] > 0.0 and (best < 0 or _worse(a[i], a[best])):
            best = i
    return best


cdef double _log_normalizer(const float* row, Py_ssize_t vocab, float m) noexcept nogil:
    """log sum_i exp(row[i] - m) (temperature 1, whole vocabulary)."""
    cdef Py_ssize_t i = 0, j, n
    cdef double z0 = 0.0, z1 = 0.0
    cdef double dbuf[CHUNK]
    cdef double ebuf[CHUNK]
    while i < vocab:
        n = vocab - i if vocab - i < CHUNK else CHUNK
        exp_rel(row + i, n, m, 1.0, dbuf, ebuf)
        for j in range(0, n - 1, 2):
            z0 += ebuf[j]
            z1 += ebuf[j + 1]
        if n % 2:
            z0 += ebuf[n - 1]
        i += n
    return log(z0 + z1)


cdef Py_ssize_t _sample_full(
    const float* row, Py_ssize_t vocab, float m, double u, double inv_t, float top_p,
    float min_p, ChoiceScratch* s, double* z_out,
) noexcept nogil:
    """Top-p / min-p / draw over the whole vocabulary without a full sort.

    One pass computes each token's unnormalised probability e = exp(-(m - x) / T), its bucket
    (1/8 nat wide; min-p exclusions in an extra bucket) and the mass per bucket; the nucleus
    boundary and the draw are then located bucket by bucket, and only the (at most two)
    buckets that hold them are gathered and searched with `_crossing` (no sort)."""
    cdef Py_ssize_t i, j, n, n_cut = 0, j_cut = -1
    cdef double d, e, z = 0.0, kept = 0.0, cum = 0.0, c, target, md = m, pmin = min_p
    cdef double limit = <double>N_BUCKETS / BUCKETS_PER_NAT
    cdef int b, b_cut = -1, b_last = -1
    cdef bint p_active = 0.0 < top_p < 1.0
    cdef Candidate* cand = s.cand
    cdef double* mass = s.mass
    cdef uint16_t* key = s.key
    cdef double* hist = s.hist
    cdef double dbuf[CHUNK]
    cdef double ebuf[CHUNK]
    memset(hist, 0, (N_BUCKETS + 1) * sizeof(double))
    i = 0
    while i < vocab:
        n = vocab - i if vocab - i < CHUNK else CHUNK
        exp_rel(row + i, n, md, inv_t, dbuf, ebuf)
        for j in range(n):
            d = dbuf[j]
            e = ebuf[j]
            if e >= pmin:
                b = <int>(d * BUCKETS_PER_NAT) if d < limit else N_BUCKETS - 1
            else:
                b = N_BUCKETS
            key[i + j] = <uint16_t>b
            hist[b] += e
        i += n
    for b in range(N_BUCKETS + 1):
        z += hist[b]
    z_out[0] = z
    # nucleus: the shortest rank-order prefix whose mass reaches top_p * z
    if p_active:
        target = <double>top_p * z
        for b in range(N_BUCKETS):
            if cum + hist[b] >= target:
                b_cut = b
                n_cut = _gather_bucket(row, key, vocab, <uint16_t>b, md, inv_t, cand, mass)
                j_cut = _crossing(cand, mass, n_cut, cum, target, True, &kept)
                if j_cut < 0:  # rounding: the whole bucket
                    j_cut = n_cut - 1
                break
            cum += hist[b]
    if b_cut < 0:
        kept = 0.0
        for b in range(N_BUCKETS):
            kept += hist[b]
    # the draw, in rank order over the kept tokens
    target = u * kept
    cum = 0.0
    for b in range(N_BUCKETS):
        if b == b_cut:
            n = j_cut + 1  # cand[:n] still holds the kept part of the cut bucket
        elif cum + hist[b] > target:
            n = _gather_bucket(row, key, vocab, <uint16_t>b, md, inv_t, cand, mass)
        else:
            if hist[b] > 0.0:
                b_last = b
            cum += hist[b]
            continue
        j = _crossing(cand, mass, n, cum, target, False, &c)
        if j < 0:  # rounding left the target unreached: the last positive token here
            j = _last_positive(cand, mass, n)
        if j >= 0:
            return cand[j].index
        if b == b_cut:
            break
        cum += hist[b]
    # rounding fallback: the last token with positive mass
    if b_last >= 0:
        n = _gather_bucket(row, key, vocab, <uint16_t>b_last, md, inv_t, cand, mass)
        j = _last_positive(cand, mass, n)
        if j >= 0:
            return cand[j].index
    return _first_index_of(row, vocab, m)


cdef Py_ssize_t sample_row(
    const float* row, Py_ssize_t vocab, double u, bint greedy, float temperature,
    Py_ssize_t top_k, float top_p, float min_p, ChoiceScratch* scratch,
    float* logprob, int32_t* top_ids, float* top_logprobs, Py_ssize_t n_top,
) noexcept nogil:
    return _sample_row(row, vocab, u, greedy, temperature, top_k, top_p, min_p, scratch,
                       logprob, top_ids, top_logprobs, n_top, NULL)


cdef inline bint _takes_block_bound(Py_ssize_t vocab, bint greedy, Py_ssize_t top_k) noexcept nogil:
    """Whether the choice runs the block-bounded top-k (the one user of block maxima)."""
    return not greedy and 0 < top_k < vocab and vocab >= 8 * SCAN_BLOCK * top_k


cdef Py_ssize_t _sample_row(
    const float* row, Py_ssize_t vocab, double u, bint greedy, float temperature,
    Py_ssize_t top_k, float top_p, float min_p, ChoiceScratch* scratch,
    float* logprob, int32_t* top_ids, float* top_logprobs, Py_ssize_t n_top,
    const float* maxima,
) noexcept nogil:
    """`sample_row` with optional precomputed block maxima (see `_select_top_blocks`).

    Choose one token from a processed row; -1 when the row holds a NaN.

    Greedy: argmax, ties -> lowest id. Sampling: top-k (0 or >= vocab: off) by a k-heap,
    probabilities ``exp((x - max) / T)``, top-p (only for 0 < p < 1: shortest rank-order prefix
    whose mass reaches p), min-p (keep ``p_i >= min_p * p_max``), then the first kept token in
    rank order (logit descending, ties -> lower id) whose cumulative mass exceeds ``u * kept``.
    A row whose maximum is +-inf falls back to greedy.

    ``logprob`` (may be NULL) gets the chosen token's log-softmax of the processed row at
    temperature 1 over the whole vocabulary; ``top_ids``/``top_logprobs`` the ``n_top`` best
    tokens of that distribution in rank order (ids -1 / logprob -inf past the vocabulary)."""
    cdef Py_ssize_t j, k, n, token = -1
    cdef Py_ssize_t n_sel = 0  # cand[:n_sel] holds the top n_sel in rank order
    cdef float m
    cdef double inv_t, z, c, target, log_z = 0.0, z_full = -1.0
    cdef bint degenerate
    cdef Candidate* cand = scratch.cand
    cdef double* mass = scratch.mass
    if top_k >= vocab:
        top_k = 0
    if not greedy and top_k > 0:
        if _takes_block_bound(vocab, greedy, top_k):
            if _select_top_blocks(row, vocab, top_k, cand, <float*>mass, maxima) < 0:
                return -1
        elif _select_top(row, vocab, top_k, cand) < 0:
            return -1
        n_sel = top_k
        m = cand[0].value
    else:
        token = _argmax(row, vocab, &m)  # the greedy choice, and the maximum for the rest
        if token < 0:
            return -1
    degenerate = not isfinite(m)
    if greedy or degenerate:
        token = cand[0].index if n_sel > 0 else token
    elif top_k > 0:
        inv_t = 1.0 / <double>temperature
        z = 0.0
        for j in range(top_k):
            mass[j] = exp_neg((<double>m - <double>cand[j].value) * inv_t)
            z += mass[j]
        k = top_k
        if 0.0 < top_p < 1.0:
            target = <double>top_p * z
            c = 0.0
            for j in range(top_k):
                c += mass[j]
                if c >= target:
                    k = j + 1
                    break
        if min_p > 0.0:
            j = 0
            while j < k and mass[j] >= <double>min_p:
                j += 1
            k = j
        z = 0.0
        for j in range(k):
            z += mass[j]
        target = u * z
        c = 0.0
        for j in range(k):
            c += mass[j]
            if c > target:
                token = cand[j].index
                break
        if token < 0:  # rounding: the last kept token with positive mass
            j = k - 1
            while j > 0 and mass[j] <= 0.0:
                j -= 1
            token = cand[j].index
    else:
        inv_t = 1.0 / <double>temperature
        token = _sample_full(row, vocab, m, u, inv_t, top_p, min_p, scratch, &z)
        n_sel = 0  # cand was reused for buckets
        if inv_t == 1.0:
            z_full = z
    if logprob == NULL and n_top <= 0:
        return token
    if degenerate:
        if logprob != NULL:
            logprob[0] = 0.0
    else:
        log_z = log(z_full) if z_full > 0.0 else _log_normalizer(row, vocab, m)
        if logprob != NULL:
            logprob[0] = <float>((<double>row[token] - <double>m) - log_z)
    if n_top > 0:
        n = n_top if n_top < vocab else vocab
        if n_sel < n:
            _select_top(row, vocab, n, cand)
        for j in range(n):
            top_ids[j] = cand[j].index
            if degenerate:
                top_logprobs[j] = 0.0 if cand[j].index == token else -INFINITY
            else:
                top_logprobs[j] = <float>((<double>cand[j].value - <double>m) - log_z)
        for j in range(n, n_top):
            top_ids[j] = -1
            top_logprobs[j] = -INFINITY
    return token


cdef int scratch_alloc(ChoiceScratch* scratch, Py_ssize_t vocab) noexcept nogil:
    scratch.vocab = vocab
    scratch.cand = <Candidate*>malloc(vocab * sizeof(Candidate))
    scratch.mass = <double*>malloc(vocab * sizeof(double))
    scratch.key = <uint16_t*>malloc(vocab * sizeof(uint16_t))
    scratch.hist = <double*>malloc((N_BUCKETS + 1) * sizeof(double))
    if scratch.cand == NULL or scratch.mass == NULL or scratch.key == NULL:
        return -1
    return -1 if scratch.hist == NULL else 0


cdef void scratch_free(ChoiceScratch* scratch) noexcept nogil:
    free(scratch.cand)
    free(scratch.mass)
    free(scratch.key)
    free(scratch.hist)
    scratch.cand = NULL
    scratch.mass = NULL
    scratch.key = NULL
    scratch.hist = NULL


# ---------------------------------------------------------------------------------------------
# The whole chain over a batch
# ---------------------------------------------------------------------------------------------

cdef inline void _mark_block(Sampler sp, Py_ssize_t token, Py_ssize_t* n_dirty) noexcept nogil:
    cdef Py_ssize_t b
    if 0 <= token < sp.vocab:
        b = token // SCAN_BLOCK
        if not sp.block_dirty[b]:
            sp.block_dirty[b] = 1
            sp.dirty_list[n_dirty[0]] = <int32_t>b
            n_dirty[0] += 1


cdef int _refresh_maxima(
    Sampler sp, Py_ssize_t r, const float* row, const int32_t* seq, Py_ssize_t length,
    const int32_t* eos, Py_ssize_t n_eos, float* maxima,
) noexcept nogil:
    """Recompute the block maxima of row ``r`` over the blocks the processing stages may
    have changed (history tokens, EOS ids, logit-bias ids); -1 when one now holds a NaN."""
    cdef RowParams* p = &sp.params[r]
    cdef Py_ssize_t i, b, start, stop, n_dirty = 0
    cdef int bad = 0, any_bad = 0
    if (p.repetition_penalty != 1.0 or p.no_repeat_ngram_size > 0
            or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
        for i in range(length):
            _mark_block(sp, seq[i], &n_dirty)
    if p.min_length > 0:
        for i in range(n_eos):
            _mark_block(sp, eos[i], &n_dirty)
    for i in range(sp.bias_count[r]):
        _mark_block(sp, sp.bias_ids[r * sp.bias_capacity + i], &n_dirty)
    for i in range(n_dirty):
        b = sp.dirty_list[i]
        sp.block_dirty[b] = 0
        start = b * SCAN_BLOCK
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < sp.vocab else sp.vocab
        maxima[b] = block_max(row + start, stop - start, &bad)
        any_bad |= bad
    return -1 if any_bad else 0


cdef Py_ssize_t _chain_rows(
    Sampler sp, float* logits, Py_ssize_t rows, const int32_t* seqs, Py_ssize_t seq_stride,
    const int32_t* lengths, const int32_t* starts, const int32_t* eos, Py_ssize_t n_eos,
    const uint8_t* done, int32_t* out, float* logprobs, int32_t* top_ids, float* top_lps,
    Py_ssize_t n_top,
) noexcept nogil:
    """Run the chain on every row not flagged done; returns the first row holding a NaN or -1.

    When ``logits`` are the rows `Sampler.load_logits` just filled, the block maxima it
    computed are used (after refreshing the blocks the stages touched) and then dropped."""
    cdef Py_ssize_t r, token, vocab = sp.vocab
    cdef Py_ssize_t nblocks = (vocab + SCAN_BLOCK - 1) // SCAN_BLOCK
    cdef float* row
    cdef float* maxima = NULL
    cdef const int32_t* seq
    cdef RowParams* p
    cdef double u
    cdef bint greedy, use_maxima = sp.maxima_valid and logits == sp.maxima_of
    sp.maxima_valid = 0  # good for this call only
    for r in range(rows):
        if done != NULL and done[r]:
            continue
        p = &sp.params[r]
        row = logits + r * vocab
        seq = seqs + r * seq_stride
        u = rng_uniform(&sp.rng.states[r])  # one draw per active row per step, greedy or not
        min_length_row(row, vocab, lengths[r], p.min_length, eos, n_eos)
        repetition_penalty_row(row, vocab, seq, lengths[r], p.repetition_penalty, sp.seen)
        no_repeat_ngram_row(row, vocab, seq, lengths[r], p.no_repeat_ngram_size)
        presence_frequency_row(
            row, vocab, seq, starts[r], lengths[r], p.presence_penalty, p.frequency_penalty,
            sp.counts,
        )
        logit_bias_row(
            row, vocab, sp.bias_ids + r * sp.bias_capacity,
            sp.bias_values + r * sp.bias_capacity, sp.bias_count[r],
        )
        greedy = not p.do_sample or p.temperature == 0.0 or p.top_k == 1
        maxima = NULL
        if use_maxima and not sp.maxima_nan[r] and _takes_block_bound(vocab, greedy, p.top_k):
            maxima = sp.maxima + r * nblocks
            if _refresh_maxima(sp, r, row, seq, lengths[r], eos, n_eos, maxima) < 0:
                maxima = NULL  # a stage made a NaN: the plain path reports it
        token = _sample_row(
            row, vocab, u, greedy, p.temperature, p.top_k, p.top_p, p.min_p, &sp.scratch,
            logprobs + r if logprobs != NULL else NULL,
            top_ids + r * n_top if n_top > 0 else NULL,
            top_lps + r * n_top if n_top > 0 else NULL, n_top, maxima,
        )
        if token < 0:
            return r
        out[r] = <int32_t>token
    return -1


def check_logits(logits, Py_ssize_t rows, Py_ssize_t vocab):
    """``logits`` as a C-contiguous float32 [rows, vocab] array: [rows, vocab], [rows, 1, vocab]
    or flat input; TypeError for another dtype, ValueError for another size."""
    array = np.asarray(logits)
    if array.dtype != np.float32:
        raise TypeError(f"logits must be float32, got {array.dtype}")
    if array.size != rows * vocab or array.ndim not in (1, 2, 3):
        raise ValueError(f"logits must hold [rows={rows}, vocab={vocab}], got shape {array.shape}")
    return np.ascontiguousarray(array).reshape(rows, vocab)


_OPTION_NAMES = (
    "do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "no_repeat_ngram_size", "min_length",
)


def check_options(options):
    """Validate sampling options by name (the names of `Sampler.configure`); returns them
    converted (bools, ints, floats). Raises ValueError / TypeError naming the option."""
    converted = {}
    for name, value in options.items():
        if name not in _OPTION_NAMES:
            raise TypeError(f"unknown sampling option {name!r}; known: {', '.join(_OPTION_NAMES)}")
        if name == "do_sample":
            converted[name] = bool(value)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} expects a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        if name in ("top_k", "no_repeat_ngram_size", "min_length"):
            if value != int(value) or value < 0 or value > 2**31 - 1:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
            converted[name] = int(value)
            continue
        value = float(value)
        if name == "temperature" and value < 0:
            raise ValueError(f"temperature must be >= 0, got {value}")
        if name in ("top_p", "min_p") and not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
        if name == "repetition_penalty" and value <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {value}")
        converted[name] = value
    return converted


def _per_row(values, Py_ssize_t rows, str name):
    """An int or a per-row sequence as a contiguous int32 array of ``rows`` entries."""
    if np.ndim(values) == 0:
        return np.full(rows, int(values), np.int32)
    out = np.ascontiguousarray(values, dtype=np.int32)
    if out.ndim != 1 or out.shape[0] < rows:
        raise ValueError(f"{name} must be an int or hold one entry per row ({rows})")
    return out


cdef class Sampler:
    """Per-row sampling options, per-row RNG streams and every scratch buffer of the chain,
    allocated once for ``rows`` x ``vocab``: `sample_batch` allocates nothing.

    Options default to the reference's search defaults (``do_sample`` False, ``top_k`` 50,
    ``top_p`` 0, ``temperature`` 1, penalties off). Row r's stream is stream r of ``seed``
    (-1: random), so a row draws the same whatever the batch size.
    """

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t vocab, seed=-1):
        if rows < 1 or vocab < 1 or vocab > 2**31 - 1:
            raise ValueError(f"need rows >= 1 and 1 <= vocab < 2**31, got {rows}, {vocab}")
        self.rows = rows
        self.vocab = vocab
        self.rng = RowRng(rows, seed)
        self.params = <RowParams*>PyMem_Malloc(rows * sizeof(RowParams))
        self.seen = <uint8_t*>PyMem_Malloc(vocab * sizeof(uint8_t))
        self.counts = <int32_t*>PyMem_Malloc(vocab * sizeof(int32_t))
        self.length_buf = <int32_t*>PyMem_Malloc(rows * sizeof(int32_t))
        self.start_buf = <int32_t*>PyMem_Malloc(rows * sizeof(int32_t))
        self.bias_count = <int32_t*>PyMem_Malloc(rows * sizeof(int32_t))
        cdef Py_ssize_t nblocks = (vocab + SCAN_BLOCK - 1) // SCAN_BLOCK
        self.maxima = <float*>PyMem_Malloc(rows * nblocks * sizeof(float))
        self.maxima_nan = <uint8_t*>PyMem_Malloc(rows * sizeof(uint8_t))
        self.block_dirty = <uint8_t*>PyMem_Malloc(nblocks * sizeof(uint8_t))
        self.dirty_list = <int32_t*>PyMem_Malloc(nblocks * sizeof(int32_t))
        self.maxima_valid = 0
        self.maxima_of = NULL
        self.bias_capacity = 0
        self.bias_ids = NULL
        self.bias_values = NULL
        if (scratch_alloc(&self.scratch, vocab) != 0 or self.params == NULL
                or self.seen == NULL or self.counts == NULL or self.length_buf == NULL
                or self.start_buf == NULL or self.bias_count == NULL or self.maxima == NULL
                or self.maxima_nan == NULL or self.block_dirty == NULL
                or self.dirty_list == NULL):
            raise MemoryError()
        memset(self.block_dirty, 0, nblocks * sizeof(uint8_t))
        memset(self.seen, 0, vocab * sizeof(uint8_t))
        memset(self.counts, 0, vocab * sizeof(int32_t))
        memset(self.bias_count, 0, rows * sizeof(int32_t))
        cdef Py_ssize_t r
        for r in range(rows):
            self.params[r] = RowParams(
                temperature=1.0, top_p=0.0, min_p=0.0, repetition_penalty=1.0,
                presence_penalty=0.0, frequency_penalty=0.0, top_k=50, no_repeat_ngram_size=0,
                min_length=0, do_sample=0,
            )

    def __dealloc__(self):
        scratch_free(&self.scratch)
        PyMem_Free(self.params)
        PyMem_Free(self.seen)
        PyMem_Free(self.counts)
        PyMem_Free(self.length_buf)
        PyMem_Free(self.start_buf)
        PyMem_Free(self.bias_count)
        PyMem_Free(self.bias_ids)
        PyMem_Free(self.bias_values)
        PyMem_Free(self.maxima)
        PyMem_Free(self.maxima_nan)
        PyMem_Free(self.block_dirty)
        PyMem_Free(self.dirty_list)

    def load_logits(self, logits, cnp.ndarray rows_out not None):
        """Copy ``logits`` ([rows, vocab], [rows, 1, vocab] or flat; float32) into
        ``rows_out`` (C-contiguous float32 [rows, vocab]) and record each 64-logit block's
        maximum on the way, so the next `sample_rows_nogil` on ``rows_out`` skips that pass
        (the maxima hold for that one call; any other write to ``rows_out`` must be followed
        by `forget_logits`). Raises TypeError / ValueError for a wrong dtype or shape."""
        cdef cnp.ndarray src
        cdef Py_ssize_t r, b, start, stop, vocab = self.vocab
        cdef Py_ssize_t nblocks = (vocab + SCAN_BLOCK - 1) // SCAN_BLOCK
        cdef const float* sp
        cdef float* dp
        cdef float* mx
        cdef int bad = 0, any_bad
        if (cnp.PyArray_Check(logits) and (<cnp.ndarray>logits).dtype.num == cnp.NPY_FLOAT32
                and (<cnp.ndarray>logits).size == self.rows * vocab
                and 1 <= (<cnp.ndarray>logits).ndim <= 3
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>logits)):
            src = <cnp.ndarray>logits  # the common case, checked without Python calls
        else:
            src = check_logits(logits, self.rows, vocab)
        if (rows_out.dtype.num != cnp.NPY_FLOAT32 or rows_out.size != self.rows * vocab
                or not cnp.PyArray_IS_C_CONTIGUOUS(rows_out)):
            raise ValueError("rows_out must be C-contiguous float32 [rows, vocab]")
        sp = <const float*>cnp.PyArray_DATA(src)
        dp = <float*>cnp.PyArray_DATA(rows_out)
        with nogil:
            for r in range(self.rows):
                mx = self.maxima + r * nblocks
                any_bad = 0
                for b in range(nblocks):
                    start = r * vocab + b * SCAN_BLOCK
                    stop = SCAN_BLOCK if (b + 1) * SCAN_BLOCK <= vocab else vocab - b * SCAN_BLOCK
                    mx[b] = copy_block_max(sp + start, dp + start, stop, &bad)
                    any_bad |= bad
                self.maxima_nan[r] = <uint8_t>any_bad
        self.maxima_of = dp
        self.maxima_valid = 1

    def forget_logits(self):
        """Drop the block maxima of `load_logits` (call after writing the rows otherwise)."""
        self.maxima_valid = 0

    def configure(self, row=None, **options):
        """Set options of one row (``row``) or of every row (None); options not named keep
        their value. Names: do_sample, temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, no_repeat_ngram_size, min_length."""
        options = check_options(options)
        cdef Py_ssize_t r
        cdef dict current
        for r in self._rows_of(row):
            current = self.params[r]
            current.update(options)
            self.params[r] = current

    def options(self, Py_ssize_t row):
        """The options of row ``row`` as a dict."""
        self._rows_of(row)
        p = dict(self.params[row])
        p["do_sample"] = bool(p["do_sample"])
        return p

    def set_logit_bias(self, row, ids, biases):
        """Replace the sparse logit bias of ``row`` (None: every row) by ``ids``/``biases``
        (equal lengths; ids in [0, vocab); repeated ids add up). Empty lists clear it."""
        id_arr = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        bias_arr = np.ascontiguousarray(biases, dtype=np.float32).reshape(-1)
        if id_arr.shape[0] != bias_arr.shape[0]:
            raise ValueError("ids and biases must have the same length")
        if id_arr.size and (id_arr.min() < 0 or id_arr.max() >= self.vocab):
            raise ValueError(f"logit bias ids must be in [0, {self.vocab})")
        if not np.isfinite(bias_arr).all():
            raise ValueError("logit biases must be finite")
        cdef Py_ssize_t n = id_arr.shape[0], r, j
        if n > self.bias_capacity:
            self._grow_bias(n)
        for r in self._rows_of(row):
            for j in range(n):
                self.bias_ids[r * self.bias_capacity + j] = <int32_t>id_arr[j]
                self.bias_values[r * self.bias_capacity + j] = <float>bias_arr[j]
            self.bias_count[r] = <int32_t>n

    cdef _grow_bias(self, Py_ssize_t capacity):
        cdef int32_t* ids = <int32_t*>PyMem_Malloc(self.rows * capacity * sizeof(int32_t))
        cdef float* values = <float*>PyMem_Malloc(self.rows * capacity * sizeof(float))
        cdef Py_ssize_t r, j
        if ids == NULL or values == NULL:
            PyMem_Free(ids)
            PyMem_Free(values)
            raise MemoryError()
        for r in range(self.rows):
            for j in range(self.bias_count[r]):
                ids[r * capacity + j] = self.bias_ids[r * self.bias_capacity + j]
                values[r * capacity + j] = self.bias_values[r * self.bias_capacity + j]
        PyMem_Free(self.bias_ids)
        PyMem_Free(self.bias_values)
        self.bias_ids = ids
        self.bias_values = values
        self.bias_capacity = capacity

    def seed(self, seed=-1, row=None, stream=None):
        """Reseed every row (row None: row r gets stream r of ``seed``) or one row (stream
        ``stream``, default ``row``). -1 seeds from os.urandom."""
        if row is None:
            self.rng.seed(seed)
        else:
            self.rng.seed_row(row, seed, stream)

    def _rows_of(self, row):
        if row is None:
            return range(self.rows)
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")
        return (row,)

    def sample_batch(
        self, float[:, ::1] logits, const int32_t[:, ::1] sequences, lengths, eos_ids,
        int32_t[::1] out, *, done=None,
        prompt_lengths=0, float[::1] logprobs=None, int32_t[:, ::1] top_ids=None,
        float[:, ::1] top_logprobs=None,
    ):
        """Choose the next token of every row; returns ``out``.

        ``logits`` float32 [batch, vocab] (batch <= rows; row b uses the options and RNG stream
        of row b) is MODIFIED IN PLACE by the processing stages (min_length, repetition
        penalty, no_repeat_ngram, presence/frequency, logit bias). ``sequences`` int32
        [batch, max_len] holds each row's tokens (prompt included) in its first ``lengths``
        entries (an int for all rows or one per row). ``prompt_lengths`` (int or per row):
        where the generated tokens start (presence/frequency count from there). ``eos_ids``:
        the EOS ids for min_length. ``out`` int32 [batch] receives the tokens. Rows with
        ``done[b]`` set (uint8 or bool [batch]) are skipped: their logits, ``out[b]`` and RNG
        stream stay as they were; every other row consumes exactly one uniform, greedy or not.
        Optional: ``logprobs`` float32 [batch] (log-softmax of the processed logits at
        temperature 1), ``top_ids`` int32 / ``top_logprobs`` float32 [batch, n] (the n best
        tokens of that distribution). Raises ValueError naming the first row holding a NaN.
        """
        cdef Py_ssize_t batch = logits.shape[0], vocab = logits.shape[1], r, bad
        cdef Py_ssize_t max_len = sequences.shape[1], n_top = 0
        cdef const int32_t[::1] eos = np.ascontiguousarray(eos_ids, dtype=np.int32)
        cdef const uint8_t[::1] done_view = None
        if done is not None:
            done = np.ascontiguousarray(done)
            done_view = done.view(np.uint8) if done.dtype == np.bool_ else done
        if vocab != self.vocab:
            raise ValueError(f"logits have {vocab} columns, the sampler {self.vocab}")
        if batch > self.rows:
            raise ValueError(f"{batch} logit rows exceed the sampler's {self.rows} rows")
        if sequences.shape[0] < batch or out.shape[0] < batch:
            raise ValueError("sequences and out need one row per logits row")
        if done is not None and done_view.shape[0] < batch:
            raise ValueError("done needs one entry per logits row")
        if logprobs is not None and logprobs.shape[0] < batch:
            raise ValueError("logprobs needs one entry per logits row")
        if (top_ids is None) != (top_logprobs is None):
            raise ValueError("pass top_ids and top_logprobs together")
        if top_ids is not None:
            n_top = top_ids.shape[1]
            if (top_ids.shape[0] < batch or top_logprobs.shape[0] < batch
                    or top_logprobs.shape[1] != n_top):
                raise ValueError("top_ids / top_logprobs must both be [batch, n]")
        self._fill(self.length_buf, lengths, batch, "lengths")
        self._fill(self.start_buf, prompt_lengths, batch, "prompt_lengths")
        for r in range(batch):
            if not 0 <= self.length_buf[r] <= max_len:
                raise ValueError(f"row {r}: length {self.length_buf[r]} outside [0, {max_len}]")
        for r in range(eos.shape[0]):
            if not 0 <= eos[r] < vocab:
                raise ValueError(f"eos id {eos[r]} outside the vocabulary ({vocab})")
        if batch == 0:
            return out
        cdef const int32_t* seq_ptr = &sequences[0, 0] if max_len > 0 else NULL
        cdef const int32_t* eos_ptr = &eos[0] if eos.shape[0] > 0 else NULL
        cdef const uint8_t* done_ptr = &done_view[0] if done is not None else NULL
        cdef float* lp_ptr = &logprobs[0] if logprobs is not None else NULL
        cdef int32_t* ti_ptr = &top_ids[0, 0] if n_top > 0 else NULL
        cdef float* tl_ptr = &top_logprobs[0, 0] if n_top > 0 else NULL
        with nogil:
            bad = _chain_rows(
                self, &logits[0, 0], batch, seq_ptr, max_len, self.length_buf, self.start_buf,
                eos_ptr, eos.shape[0], done_ptr, &out[0], lp_ptr, ti_ptr, tl_ptr, n_top,
            )
        if bad >= 0:
            raise NonFiniteLogitsError(f"logits of row {bad} contain NaN")
        return out

    cdef Py_ssize_t sample_rows_nogil(
        self, float* logits, Py_ssize_t rows, const int32_t* seqs, Py_ssize_t seq_stride,
        Py_ssize_t length, Py_ssize_t prompt_length, const int32_t* eos, Py_ssize_t n_eos,
        const uint8_t* done, int32_t* out, float* logprobs, int32_t* top_ids, float* top_lps,
        Py_ssize_t n_top,
    ) noexcept nogil:
        cdef Py_ssize_t r
        for r in range(rows):
            self.length_buf[r] = <int32_t>length
            self.start_buf[r] = <int32_t>prompt_length
        return _chain_rows(
            self, logits, rows, seqs, seq_stride, self.length_buf, self.start_buf, eos, n_eos,
            done, out, logprobs, top_ids, top_lps, n_top,
        )

    cdef _fill(self, int32_t* buf, values, Py_ssize_t batch, str name):
        cdef Py_ssize_t r
        cdef int32_t value
        cdef const int32_t[::1] view
        if isinstance(values, int) or np.ndim(values) == 0:
            value = int(values)
            for r in range(batch):
                buf[r] = value
            return
        view = np.ascontiguousarray(values, dtype=np.int32)
        if view.shape[0] < batch:
            raise ValueError(f"{name} needs one entry per logits row")
        for r in range(batch):
            buf[r] = view[r]


# ---------------------------------------------------------------------------------------------
# Python wrappers of the single stages, over a [rows, vocab] batch
# ---------------------------------------------------------------------------------------------

def _check_history(logits, sequences, lengths):
    rows = logits.shape[0]
    if sequences.shape[0] < rows:
        raise ValueError("sequences need one row per logits row")
    lengths = _per_row(lengths, rows, "lengths")
    if rows and (lengths[:rows].min() < 0 or lengths[:rows].max() > sequences.shape[1]):
        raise ValueError(f"lengths must be in [0, {sequences.shape[1]}]")
    return lengths


cdef inline const int32_t* _row_ptr(const int32_t[:, ::1] a, Py_ssize_t r) noexcept nogil:
    return &a[r, 0] if a.shape[1] > 0 else NULL


def apply_min_length(float[:, ::1] logits, lengths, Py_ssize_t min_length,
                     const int32_t[::1] eos_ids):
    """Rows whose ``lengths`` (int or per row; prompt included) < ``min_length`` get every
    ``eos_ids`` logit set to the lowest float (in place)."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1]
    cdef const int32_t[::1] lens = _per_row(lengths, rows, "lengths")
    for r in range(eos_ids.shape[0]):
        if not 0 <= eos_ids[r] < vocab:
            raise ValueError(f"eos id {eos_ids[r]} outside the vocabulary ({vocab})")
    if eos_ids.shape[0] == 0:
        return
    with nogil:
        for r in range(rows):
            min_length_row(&logits[r, 0], vocab, lens[r], min_length, &eos_ids[0],
                           eos_ids.shape[0])


def apply_repetition_penalty(float[:, ::1] logits, const int32_t[:, ::1] sequences, lengths,
                             float penalty):
    """Each distinct id in ``sequences[r, :lengths[r]]`` gets ``logit < 0 ? logit * penalty :
    logit / penalty`` (in place; no-op for penalty 1)."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1]
    cdef const int32_t[::1] lens = _check_history(logits, sequences, lengths)
    if penalty <= 0:
        raise ValueError(f"repetition penalty must be > 0, got {penalty}")
    cdef uint8_t* seen = <uint8_t*>PyMem_Malloc(vocab)
    if seen == NULL:
        raise MemoryError()
    memset(seen, 0, vocab)
    try:
        with nogil:
            for r in range(rows):
                repetition_penalty_row(&logits[r, 0], vocab, _row_ptr(sequences, r), lens[r],
                                       penalty, seen)
    finally:
        PyMem_Free(seen)


def apply_no_repeat_ngram(float[:, ::1] logits, const int32_t[:, ::1] sequences, lengths,
                          Py_ssize_t n):
    """Ban (lowest float, in place) each token that followed an earlier occurrence of the
    row's last ``n - 1`` tokens; n == 1 bans every token of the sequence, n == 0 nothing."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1]
    cdef const int32_t[::1] lens = _check_history(logits, sequences, lengths)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with nogil:
        for r in range(rows):
            no_repeat_ngram_row(&logits[r, 0], vocab, _row_ptr(sequences, r), lens[r], n)


def apply_presence_frequency(float[:, ::1] logits, const int32_t[:, ::1] sequences, lengths,
                             start, float presence, float frequency):
    """``logit -= presence * (count > 0) + frequency * count`` (in place), counting the ids of
    ``sequences[r, start[r]:lengths[r]]`` (``start``: int or per row, the first generated
    position)."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1]
    cdef const int32_t[::1] lens = _check_history(logits, sequences, lengths)
    cdef const int32_t[::1] starts = _per_row(start, rows, "start")
    cdef int32_t* counts = <int32_t*>PyMem_Malloc(vocab * sizeof(int32_t))
    if counts == NULL:
        raise MemoryError()
    memset(counts, 0, vocab * sizeof(int32_t))
    try:
        with nogil:
            for r in range(rows):
                presence_frequency_row(&logits[r, 0], vocab, _row_ptr(sequences, r),
                                       starts[r], lens[r], presence, frequency, counts)
    finally:
        PyMem_Free(counts)


def apply_logit_bias(float[:, ::1] logits, ids, biases):
    """``logits[r, ids[r, j]] += biases[r, j]`` (in place). ``ids``/``biases`` are [n] (same
    for every row) or [rows, n]; ids < 0 are padding and skipped."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1]
    id_arr = np.asarray(ids, dtype=np.int32)
    bias_arr = np.asarray(biases, dtype=np.float32)
    if id_arr.shape != bias_arr.shape or id_arr.ndim not in (1, 2):
        raise ValueError("ids and biases must have the same shape, [n] or [rows, n]")
    if id_arr.ndim == 1:
        id_arr = np.broadcast_to(id_arr, (rows, id_arr.shape[0]))
        bias_arr = np.broadcast_to(bias_arr, (rows, bias_arr.shape[0]))
    elif id_arr.shape[0] < rows:
        raise ValueError("ids / biases need one row per logits row")
    if id_arr.size and id_arr.max() >= vocab:
        raise ValueError(f"logit bias ids must be < vocab ({vocab})")
    cdef const int32_t[:, ::1] id_view = np.ascontiguousarray(id_arr)
    cdef const float[:, ::1] bias_view = np.ascontiguousarray(bias_arr)
    cdef Py_ssize_t n = id_view.shape[1]
    if n == 0:
        return
    with nogil:
        for r in range(rows):
            logit_bias_row(&logits[r, 0], vocab, &id_view[r, 0], &bias_view[r, 0], n)


def sample(const float[:, ::1] logits, const double[::1] uniforms, int32_t[::1] out, *,
           bint do_sample=True, float temperature=1.0, Py_ssize_t top_k=0, float top_p=0.0,
           float min_p=0.0, float[::1] logprobs=None, int32_t[:, ::1] top_ids=None,
           float[:, ::1] top_logprobs=None):
    """The choice stage alone on every row (logits are not modified): row r draws with
    ``uniforms[r]`` in [0, 1). Greedy when not ``do_sample``, temperature == 0 or top_k == 1.
    Optional log-probability outputs as in `Sampler.sample_batch`. Returns ``out``."""
    cdef Py_ssize_t r, rows = logits.shape[0], vocab = logits.shape[1], n_top = 0, bad = -1
    cdef Py_ssize_t token
    cdef ChoiceScratch scratch
    cdef bint greedy
    cdef float* lp_ptr = NULL
    cdef int32_t* ti_ptr = NULL
    cdef float* tl_ptr = NULL
    check_options(dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    greedy = not do_sample or temperature == 0.0 or top_k == 1
    if uniforms.shape[0] < rows or out.shape[0] < rows:
        raise ValueError("uniforms and out need one entry per row")
    if logprobs is not None and logprobs.shape[0] < rows:
        raise ValueError("logprobs needs one entry per row")
    if (top_ids is None) != (top_logprobs is None):
        raise ValueError("pass top_ids and top_logprobs together")
    if top_ids is not None:
        n_top = top_ids.shape[1]
        if (top_ids.shape[0] < rows or top_logprobs.shape[0] < rows
                or top_logprobs.shape[1] != n_top):
            raise ValueError("top_ids / top_logprobs must both be [rows, n]")
    if rows == 0:
        return out
    if vocab == 0:
        raise ValueError("logits have an empty vocabulary axis")
    if logprobs is not None:
        lp_ptr = &logprobs[0]
    if n_top > 0:
        ti_ptr = &top_ids[0, 0]
        tl_ptr = &top_logprobs[0, 0]
    memset(&scratch, 0, sizeof(scratch))
    if scratch_alloc(&scratch, vocab) != 0:
        scratch_free(&scratch)
        raise MemoryError()
    try:
        with nogil:
            for r in range(rows):
                token = sample_row(
                    &logits[r, 0], vocab, uniforms[r], greedy, temperature, top_k, top_p,
                    min_p, &scratch, lp_ptr + r if lp_ptr != NULL else NULL,
                    ti_ptr + r * n_top if n_top > 0 else NULL,
                    tl_ptr + r * n_top if n_top > 0 else NULL, n_top,
                )
                if token < 0:
                    bad = r
                    break
                out[r] = <int32_t>token
    finally:
        scratch_free(&scratch)
    if bad >= 0:
        raise NonFiniteLogitsError(f"logits of row {bad} contain NaN")
    return out


def _exp_neg(const double[::1] d):
    """exp(-d) by the kernels' own exp (SIMD batch path and scalar path), for tests: returns
    (batch, scalar) float64 arrays; the two must be identical."""
    cdef Py_ssize_t i, n = d.shape[0]
    batch = np.empty(n, np.float64)
    scalar = np.empty(n, np.float64)
    dummy = np.empty(n, np.float32)
    cdef double[::1] b = batch, s = scalar
    cdef float[::1] x = dummy
    cdef double[::1] dd = np.empty(n, np.float64)
    for i in range(n):
        x[i] = <float>(-d[i])
    if n:
        # x = -d as float32, m = 0, inv_t = 1: d' = (0 - x) = float32-rounded d
        exp_rel(&x[0], n, 0.0, 1.0, &dd[0], &b[0])
    for i in range(n):
        s[i] = exp_neg(dd[i])
    return batch, scalar, np.asarray(dd)
