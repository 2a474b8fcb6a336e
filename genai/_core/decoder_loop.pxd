# cython: language_level=3
"""C-level state of the decode loop (see decoder_loop.pyx)."""

from libc.stdint cimport int32_t, int64_t, uint8_t

from genai._core.native_session cimport DeviceTensor, NativeSession
from genai._core.sampling cimport Sampler


cdef class DecoderLoop:
    cdef NativeSession sess
    cdef object __weakref__          # the KV cache follows its loop weakly (no reference cycle)
    cdef dict _arrays                # numpy buffers the loop points into, by name

    # graph I/O: indices into the session (-1 when the graph lacks the input)
    cdef Py_ssize_t ids_in, mask_in, pos_in, logits_out
    cdef int ids_elem, mask_elem, logits_elem

    cdef Py_ssize_t batch, vocab, max_length
    cdef int32_t pad_id
    #: the id a prompt's trailing padding has (NO_PAD, -2^31: no padding, batch size 1)
    cdef public int32_t prompt_pad

    # buffers (owned by numpy arrays in _keep)
    cdef int32_t[:, ::1] sequences   # [batch, max_length]
    cdef void* ids_buf               # [batch * max_length] of ids_elem
    cdef void* mask_buf              # [batch * max_length] of mask_elem
    cdef void* pos_buf               # [batch * max_length] of mask_elem
    cdef int64_t* next_position      # [batch]
    cdef int32_t* last_index         # [batch]
    cdef float[:, ::1] logits_rows   # [batch, vocab]: what the next token is chosen from
    cdef void* step_logits           # [batch, 1, vocab] of logits_elem: decode-step output
    cdef int32_t[::1] next_tokens    # [batch]
    cdef uint8_t[::1] done           # [batch]
    cdef int32_t[::1] eos_ids

    # the choice: None = plain argmax; else the sampler runs the logits-processing chain
    cdef Sampler sampler
    cdef readonly Py_ssize_t prompt_length   # where generated tokens start (presence/frequency)
    cdef Py_ssize_t n_top
    cdef float* logprobs                     # [batch] or NULL
    cdef int32_t* top_ids                    # [batch, n_top] or NULL
    cdef float* top_logprobs                 # [batch, n_top] or NULL

    # shared-buffer KV that grows on demand: positions it holds now (-1: no limit), and the
    # Python callable that grows it: grow(needed, filled) -> new capacity
    cdef public Py_ssize_t kv_capacity
    cdef object grow
    # called as kv_rewind(before, after) with each row's token count before a rewind changes
    # anything (sliding-window caches re-lay their rows; raising refuses the rewind)
    cdef public object kv_rewind

    # growing (past/present) KV: present output i is re-bound as past input i after each run
    cdef Py_ssize_t n_kv_pairs
    cdef Py_ssize_t* kv_out
    cdef Py_ssize_t* kv_in

    # graph capture (use_graph_capture): single-token steps at batch 1 copy ids / mask /
    # positions into tensors at fixed addresses (where the session wants them), run with the
    # binding's graph id and copy the logits back; other runs are plain (gpu_graph_id -1)
    cdef readonly bint capture
    cdef bint static_bound              # the static tensors are the bound ones
    cdef DeviceTensor ids_t, mask_t, pos_t, logits_t

    # state
    cdef readonly Py_ssize_t length      # tokens in the sequences
    cdef readonly Py_ssize_t computed    # tokens whose KV the cache holds
    cdef readonly Py_ssize_t mask_length
    cdef readonly bint logits_ready      # logits_rows predict the token after `length`
    cdef readonly bint all_done
    cdef readonly bint ran_once
    cdef readonly bint generated
    cdef readonly Py_ssize_t last_run_count  # tokens fed by the last run
    cdef const char* error_message       # our own message for a failure (not ORT's)

    cdef int run_pending(self, bint prompt) noexcept nogil
    cdef int choose_and_commit(self) noexcept nogil
    cdef int step_nogil(self) noexcept nogil
    cdef int run_static(self) noexcept nogil
    cdef object raise_error(self, int rc)
