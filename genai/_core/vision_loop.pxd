# cython: language_level=3
"""C-level state of the vision-language decode loop (see vision_loop.pyx)."""

from libc.stdint cimport int64_t

from genai._core.decoder_loop cimport DecoderLoop
from genai._core.native_session cimport NativeSession


cdef class EmbedDecoderLoop(DecoderLoop):
    # the embedding graph (ids -> inputs_embeds) and the decoder fed inputs_embeds; `failed`:
    # the one whose nogil call failed last (1: embedding, 2: decoder; its error is raised)
    cdef NativeSession embedding
    cdef NativeSession decoder
    cdef int failed
    cdef Py_ssize_t dec_mask_in
    # the runner's one-token buffers, bound once by its first one-token run (see attach):
    # ids [batch, 1] (the embedding's input), positions [3, batch, 1] (mRoPE decoders, else
    # NULL), float32 logits [batch, 1, vocab] (the decoder's output)
    cdef void* step_ids
    cdef bint ids_wide
    cdef void* step_positions
    cdef bint pos_wide
    cdef const float* step_logits_f32
    cdef int64_t* rope_deltas          # [batch]: Qwen-VL's position offsets
    # decode steps may run natively: every one-token buffer is bound (the runner sets it)
    cdef public bint step_ready
    # the mask of a one-token step is all ones (batch 1, mRoPE decoders), else each row grows
    # by a trailing 1; `ones_filled`: leading mask elements known to hold 1
    cdef bint ones_mask
    cdef Py_ssize_t ones_filled
    # fallback(prompt): runs the pending tokens from Python when they cannot run natively
    cdef public object fallback

    cdef int run_embedded_step(self) noexcept nogil
