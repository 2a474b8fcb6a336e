# cython: language_level=3
"""C-level API of the logits-processing and sampling kernels (cimport-able by other kernel
families). See `genai/_core/sampling.pyx` for the semantics and `docs/sampling.md`."""

from libc.stdint cimport int32_t, uint8_t, uint16_t, uint64_t

# Buckets of the full-vocabulary path: BUCKETS_PER_NAT per nat of (max - logit) / T, the last
# regular bucket also takes everything further away; bucket N_BUCKETS holds min-p exclusions.
cdef enum:
    BUCKETS_PER_NAT = 8
    N_BUCKETS = 512


cdef struct RngState:
    # xoshiro256** state of one row's stream
    uint64_t s[4]


cdef struct RowParams:
    # Per-row options of `Sampler` (one struct per batch row).
    float temperature
    float top_p
    float min_p
    float repetition_penalty
    float presence_penalty
    float frequency_penalty
    int32_t top_k
    int32_t no_repeat_ngram_size
    int32_t min_length
    uint8_t do_sample


cdef struct Candidate:
    float value
    int32_t index


cdef struct ChoiceScratch:
    # Buffers of `sample_row`, each sized for one vocabulary row.
    Candidate* cand      # [vocab] heap / gathered bucket members
    double* mass         # [vocab] unnormalised probabilities of `cand`
    uint16_t* key        # [vocab] bucket of every token (full-vocabulary path)
    double* hist         # [N_BUCKETS + 1] probability mass per bucket
    Py_ssize_t vocab


# RNG: splitmix64 seeding + xoshiro256**, one independent stream per (seed, stream index).
cdef void rng_seed(RngState* state, uint64_t seed, uint64_t stream) noexcept nogil
cdef uint64_t rng_next(RngState* state) noexcept nogil
cdef double rng_uniform(RngState* state) noexcept nogil

# Scratch of `sample_row`: allocate with `scratch_alloc` (0 on success), release with
# `scratch_free` (safe on a zeroed struct).
cdef int scratch_alloc(ChoiceScratch* scratch, Py_ssize_t vocab) noexcept nogil
cdef void scratch_free(ChoiceScratch* scratch) noexcept nogil

# Stages on one row of `vocab` float32 logits, in place. Token ids outside [0, vocab) in the
# history are ignored.
cdef void min_length_row(
    float* row, Py_ssize_t vocab, Py_ssize_t length, Py_ssize_t min_length,
    const int32_t* eos_ids, Py_ssize_t n_eos,
) noexcept nogil
cdef void repetition_penalty_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t length, float penalty,
    uint8_t* seen,
) noexcept nogil
cdef void no_repeat_ngram_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t length, Py_ssize_t n,
) noexcept nogil
cdef void presence_frequency_row(
    float* row, Py_ssize_t vocab, const int32_t* seq, Py_ssize_t start, Py_ssize_t length,
    float presence, float frequency, int32_t* counts,
) noexcept nogil
cdef void logit_bias_row(
    float* row, Py_ssize_t vocab, const int32_t* ids, const float* biases, Py_ssize_t n,
) noexcept nogil

# The choice on one processed row: returns the token, or -1 when the row holds a NaN.
# `logprob` may be NULL; `n_top` alternatives go to `top_ids` / `top_logprobs`.
cdef Py_ssize_t sample_row(
    const float* row, Py_ssize_t vocab, double u, bint greedy, float temperature,
    Py_ssize_t top_k, float top_p, float min_p, ChoiceScratch* scratch,
    float* logprob, int32_t* top_ids, float* top_logprobs, Py_ssize_t n_top,
) noexcept nogil


cdef class RowRng:
    cdef RngState* states
    cdef readonly Py_ssize_t rows
    cdef _check(self, Py_ssize_t row)


cdef class Sampler:
    cdef readonly Py_ssize_t rows
    cdef readonly Py_ssize_t vocab
    cdef readonly RowRng rng
    cdef RowParams* params
    cdef ChoiceScratch scratch
    cdef uint8_t* seen
    cdef int32_t* counts
    cdef int32_t* length_buf
    cdef int32_t* start_buf
    cdef int32_t* bias_ids       # [rows, bias_capacity]
    cdef float* bias_values      # [rows, bias_capacity]
    cdef int32_t* bias_count     # [rows]
    cdef Py_ssize_t bias_capacity
    # Block maxima recorded by `load_logits` ([rows, ceil(vocab / 64)]), valid for the next
    # chain call on `maxima_of` only; per-row NaN flags; dirty-block scratch of the refresh.
    cdef float* maxima
    cdef uint8_t* maxima_nan
    cdef uint8_t* block_dirty
    cdef int32_t* dirty_list
    cdef const float* maxima_of
    cdef public bint maxima_valid
    cdef _grow_bias(self, Py_ssize_t capacity)
    # The whole chain for `rows` rows sharing one length (the decode loop's entry point):
    # returns the first row holding a NaN, or -1. Same semantics as `sample_batch`.
    cdef Py_ssize_t sample_rows_nogil(
        self, float* logits, Py_ssize_t rows, const int32_t* seqs, Py_ssize_t seq_stride,
        Py_ssize_t length, Py_ssize_t prompt_length, const int32_t* eos, Py_ssize_t n_eos,
        const uint8_t* done, int32_t* out, float* logprobs, int32_t* top_ids, float* top_lps,
        Py_ssize_t n_top,
    ) noexcept nogil
    cdef _fill(self, int32_t* buf, values, Py_ssize_t batch, str name)
