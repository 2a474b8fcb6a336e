# cython: language_level=3
"""C-level state of the vision-language decode loop (see vision_loop.pyx)."""

from libc.stdint cimport int32_t, int64_t

from genai._core.decoder_loop cimport DecoderLoop
from genai._core.native_session cimport NativeSession


cdef class EmbedDecoderLoop(DecoderLoop):
    # the embedding graph (ids -> inputs_embeds) and the decoder fed inputs_embeds; `failed`:
    # the one whose nogil call failed last (1: embedding, 2: decoder, 3: the vision graph of
    # run_prompt; its error is raised)
    cdef NativeSession embedding
    cdef NativeSession decoder
    cdef int failed
    cdef Py_ssize_t dec_mask_in
    # a first prompt's chain (chain_prompt): the vision binding (or None), the vision output
    # bound as the embedding's input, the embedding's output bound as the decoder's, the
    # decoder's logits output and mRoPE positions input (-1: none); Qwen-VL's mRoPE ids
    # (image, video, vision start, pad) and spatial merge size when `mrope`
    cdef NativeSession prompt_vision
    cdef Py_ssize_t features_out, features_in, embeds_out, embeds_in, prompt_logits
    cdef Py_ssize_t dec_pos_in
    cdef int pos_elem
    # the embedding's ids input bound from the loop's input_ids buffer (-1: the runner binds
    # it); a prompt's mRoPE positions [3, batch, seq] (the loop's prompt_positions, or NULL)
    cdef Py_ssize_t emb_ids_in
    cdef void* prompt_positions
    # run_prompt left a growing cache's presents -> pasts hand-over to hand_over_kv
    cdef readonly bint kv_pending
    cdef bint mrope
    cdef int64_t mrope_ids[5]
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
    # a prompt's decoder run and KV hand-over; the logits output's shape and data
    cdef int decoder_prompt_run(self, Py_ssize_t logits_index, int64_t* shape, size_t* ndim,
                                void** data, bint defer_kv) noexcept nogil
    cdef _check_prompt_call(self, Py_ssize_t logits_index)
    cdef object _copy_prompt_rows(self, const int64_t* shape, size_t ndim, void* data,
                                  const int32_t* last, Py_ssize_t count)
