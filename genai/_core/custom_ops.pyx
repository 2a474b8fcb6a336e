# cython: language_level=3
"""genai's own onnxruntime custom ops (domain ``genai``), registered on the sessions genai creates
when the provider runs attention with onnxruntime's CPU kernels.

``ChunkedGroupQueryAttention`` takes GroupQueryAttention's inputs, outputs and attributes (plus
``genai_chunk_rows``) and runs onnxruntime's own CPU GroupQueryAttention kernel (CreateOp /
InvokeOp) on them: in one call, or, for a long run of one row on a shared past/present buffer,
in consecutive calls over chunks of ``genai_chunk_rows`` query rows (the last one taking the
rest), each on the KV the previous ones wrote.

The kernel computes the whole ``rows x (past + rows)`` score matrix of a call and masks the
causal half, so a 512-token prompt in 8 chunks computes 9/16 of it; its score buffer
(``rows x KV buffer length`` floats per head) also shrinks from megabytes to what stays in
cache. Each row's numbers do not change: the kernel computes a row's scores, softmax and
weighted sum over its own causal prefix in the same order whatever the rows around it, provided
its GEMMs meet the row in the same block of rows. So chunks start at multiples of
``genai_chunk_rows`` (64, a multiple of the 32-row blocks of onnxruntime's AVX-512 SGEMM), and
none is a lone row, which the GEMM multiplies with another kernel.
``tests/test_chunked_attention.py`` compares every output bit with onnxruntime's op on the whole
run. `genai.runtime.chunked_attention` rewrites a graph's GroupQueryAttention nodes to this op.

``QuantizeRows`` is a ``--prefill-int8`` graph's per-row uint8 quantisation in one pass
(`genai.runtime.row_quantization`); ``ScaledSiluMul`` its MLP's row-scale products, gated SiLU
and, optionally, the down projection's QuantizeRows in blocks of rows that stay in cache
(`genai.runtime.gated_silu`). Both round each step as the ops they replace, so the bytes match.

No onnxruntime header is needed: the op table is `ort_custom_op.h`, the API slots `ort_api`.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from genai._core.ort_api cimport (
    ELEM_FLOAT,
    ELEM_INT32,
    ELEM_UINT8,
    ORT_ARENA_ALLOCATOR,
    ORT_FAIL,
    ORT_INVALID_ARGUMENT,
    ORT_MEM_TYPE_DEFAULT,
    OrtCustomOpDomain,
    OrtFns,
    OrtKernelContext,
    OrtKernelInfo,
    OrtMemoryInfo,
    OrtOp,
    OrtOpAttr,
    OrtSessionOptions,
    OrtStatus,
    OrtTensorTypeAndShapeInfo,
    OrtValue,
    check_status,
    ort_fns,
)


cdef extern from "ort_custom_op.h":
    void genai_count(int64_t* counter) noexcept nogil
    int64_t genai_read_count(const int64_t* counter) noexcept nogil
    uint32_t GENAI_CUSTOM_OP_VERSION
    int GENAI_IO_REQUIRED
    int GENAI_IO_OPTIONAL
    ctypedef struct GenaiCustomOp:
        uint32_t version
        void* (*CreateKernel)(const GenaiCustomOp* op, const void* api,
                              const OrtKernelInfo* info) noexcept nogil
        const char* (*GetName)(const GenaiCustomOp* op) noexcept nogil
        const char* (*GetExecutionProviderType)(const GenaiCustomOp* op) noexcept nogil
        int (*GetInputType)(const GenaiCustomOp* op, size_t index) noexcept nogil
        size_t (*GetInputTypeCount)(const GenaiCustomOp* op) noexcept nogil
        int (*GetOutputType)(const GenaiCustomOp* op, size_t index) noexcept nogil
        size_t (*GetOutputTypeCount)(const GenaiCustomOp* op) noexcept nogil
        void (*KernelCompute)(void* kernel, OrtKernelContext* context) noexcept nogil
        void (*KernelDestroy)(void* kernel) noexcept nogil
        int (*GetInputCharacteristic)(const GenaiCustomOp* op, size_t index) noexcept nogil
        int (*GetOutputCharacteristic)(const GenaiCustomOp* op, size_t index) noexcept nogil
        int (*GetInputMemoryType)(const GenaiCustomOp* op, size_t index) noexcept nogil
        int (*GetVariadicInputMinArity)(const GenaiCustomOp* op) noexcept nogil
        int (*GetVariadicInputHomogeneity)(const GenaiCustomOp* op) noexcept nogil
        int (*GetVariadicOutputMinArity)(const GenaiCustomOp* op) noexcept nogil
        int (*GetVariadicOutputHomogeneity)(const GenaiCustomOp* op) noexcept nogil
        OrtStatus* (*CreateKernelV2)(const GenaiCustomOp* op, const void* api,
                                     const OrtKernelInfo* info, void** kernel) noexcept nogil
        OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context) noexcept nogil


cdef extern from "row_quant_kernels.h":
    int genai_row_quant_level() noexcept nogil
    void genai_quantize_rows(const float* x, size_t first, size_t last, size_t n,
                             float floor_value, uint8_t* q, float* scale,
                             int level) noexcept nogil


cdef extern from "thread_state.h":
    float* genai_thread_scratch(size_t count) noexcept nogil
    int genai_single_row_attention(int set) noexcept nogil


cdef extern from "step_rows_kernels.h":
    ctypedef struct GenaiStepRows:
        pass
    int genai_step_rows_level() noexcept nogil
    size_t genai_step_rows_bytes(size_t rows, size_t k) noexcept nogil
    void genai_step_rows_init(GenaiStepRows* s, void* scratch, size_t rows,
                              size_t k) noexcept nogil
    void genai_step_prepare_row(GenaiStepRows* s, size_t r, const float* a,
                                int level) noexcept nogil
    void genai_step_columns(const GenaiStepRows* rs, const uint8_t* b, const float* scales,
                            const uint8_t* zp, size_t n0, size_t n1, size_t n, float* out,
                            int level) noexcept nogil


cdef extern from "decode_attention_kernels.h":
    int genai_decode_attention_level() noexcept nogil
    void genai_decode_attention_row(const float* qkv, size_t pos, size_t heads, size_t kv_heads,
                                    size_t dim, float scale, const float* cos, const float* sin,
                                    float* key_cache, float* value_cache, size_t cache_len,
                                    float* scratch, float* out) noexcept nogil


cdef extern from "row_product_kernels.h":
    void genai_scale_row(const float* x, float factor, float* out, size_t n,
                         int level) noexcept nogil
    void genai_gate_row(const float* a, const float* b, const float* factor, float* out,
                        size_t n, int level) noexcept nogil


cdef const char* _C_DOMAIN = "genai"
cdef const char* _C_NAME = "ChunkedGroupQueryAttention"
cdef const char* _C_CHUNK_ATTRIBUTE = "genai_chunk_rows"
cdef const char* _C_EXACT_DECODE_ATTRIBUTE = "genai_exact_decode"
cdef const char* _C_QUANTIZE = "QuantizeRows"
cdef const char* _C_FLOOR_ATTRIBUTE = "floor"
cdef const char* _C_SILU_MUL = "ScaledSiluMul"
cdef const char* _C_STEP_ROWS = "StepRowsMatMulNBits"
cdef const char* _C_ROWS_MATMUL = "SingleRowsMatMul"
cdef enum:
    CHUNK_ROWS_DEFAULT = 64

#: The op domain and the op's name, as graphs name them (`genai.runtime.chunked_attention`).
DOMAIN = _C_DOMAIN.decode()
CHUNKED_GQA = _C_NAME.decode()
#: The attribute giving the chunk size (query rows per call), and its default.
CHUNK_ATTRIBUTE = _C_CHUNK_ATTRIBUTE.decode()
#: The attribute (1) that lets the op compute single query rows itself
#: (`genai.runtime.decode_attention`).
EXACT_DECODE_ATTRIBUTE = _C_EXACT_DECODE_ATTRIBUTE.decode()
DEFAULT_CHUNK_ROWS = CHUNK_ROWS_DEFAULT
#: The per-row uint8 quantiser (`genai.runtime.row_quantization`) and its attribute.
QUANTIZE_ROWS = _C_QUANTIZE.decode()
FLOOR_ATTRIBUTE = _C_FLOOR_ATTRIBUTE.decode()
#: The gated-linear-unit product (`genai.runtime.gated_silu`).
SCALED_SILU_MUL = _C_SILU_MUL.decode()
#: MatMulNBits with each row computed as in a one-row run (`genai.runtime.verify_rows`).
STEP_ROWS_MATMUL = _C_STEP_ROWS.decode()
#: MatMul on a weight given at run time (a LoRA branch), one row per call inside `single_rows`
#: (`genai.runtime.lora_rows`).
SINGLE_ROWS_MATMUL = _C_ROWS_MATMUL.decode()

# GroupQueryAttention's inputs: query, key, value, past_key, past_value, seqlens_k,
# total_sequence_length, cos_cache, sin_cache; outputs: output, present_key, present_value.
cdef enum:
    GQA_INPUTS = 9
    GQA_OUTPUTS = 3
    IN_QUERY = 0
    IN_KEY = 1
    IN_VALUE = 2
    IN_PAST_KEY = 3
    IN_PAST_VALUE = 4
    IN_SEQLENS = 5
    IN_TOTAL = 6
    N_INT_ATTRS = 6
    N_FLOAT_ATTRS = 2
    ATTR_NUM_HEADS = 0
    ATTR_KV_NUM_HEADS = 1
    IN_COS = 7
    IN_SIN = 8
    ATTR_LOCAL_WINDOW = 2
    ATTR_DO_ROTARY = 3
    ATTR_SCALE = 0
    OP_ATTR_INT = 1
    OP_ATTR_FLOAT = 3

# The attributes passed on to onnxruntime's op (the rewrite only takes nodes with no others).
cdef const char* _INT_ATTRS[N_INT_ATTRS]
_INT_ATTRS[0] = "num_heads"
_INT_ATTRS[1] = "kv_num_heads"
_INT_ATTRS[2] = "local_window_size"
_INT_ATTRS[3] = "do_rotary"
_INT_ATTRS[4] = "rotary_interleaved"
_INT_ATTRS[5] = "smooth_softmax"
cdef const char* _FLOAT_ATTRS[N_FLOAT_ATTRS]
_FLOAT_ATTRS[0] = "scale"
_FLOAT_ATTRS[1] = "softcap"
cdef const char* _TYPE_NAMES[2]
_TYPE_NAMES[0] = "T"
_TYPE_NAMES[1] = "M"
cdef int _TYPE_VALUES[2]
_TYPE_VALUES[0] = ELEM_FLOAT
_TYPE_VALUES[1] = ELEM_INT32

cdef struct KernelWithOp:
    OrtOp* op            # the onnxruntime kernel an op's kernel calls: each one's first field

cdef struct ChunkedGqa:
    OrtOp* op            # onnxruntime's GroupQueryAttention kernel, made for this node
    int64_t num_heads
    int64_t kv_num_heads
    int64_t local_window
    int64_t chunk_rows
    int64_t do_rotary
    int64_t exact        # single query rows by genai_decode_attention_row (see _exact_rows)
    float scale

cdef const OrtFns* _f = NULL
cdef OrtMemoryInfo* _cpu = NULL
cdef OrtCustomOpDomain* _domain = NULL
cdef GenaiCustomOp _op
cdef GenaiCustomOp _quantize_op
cdef GenaiCustomOp _silu_op
cdef GenaiCustomOp _step_rows_op
cdef GenaiCustomOp _rows_matmul_op
cdef int64_t _chunked_calls = 0
cdef int64_t _single_row_calls = 0
cdef int64_t _matmul_row_calls = 0
cdef int64_t _exact_row_calls = 0
cdef int _quant_level = genai_row_quant_level()
cdef int _step_level = genai_step_rows_level()
cdef int _decode_level = genai_decode_attention_level()


def quantize_level() -> int:
    """The QuantizeRows code path this CPU runs: 2 AVX-512, 1 AVX2, 0 scalar."""
    return _quant_level


def chunked_calls() -> int:
    """How many ChunkedGroupQueryAttention calls in this process ran in chunks (for tests and
    benchmarks: a rewritten graph's long prompts should raise it)."""
    return genai_read_count(&_chunked_calls)


def single_row_calls() -> int:
    """How many ChunkedGroupQueryAttention calls in this process ran one query row at a time
    (`single_row_attention`)."""
    return genai_read_count(&_single_row_calls)


def matmul_row_calls() -> int:
    """How many SingleRowsMatMul runs went one row per call (`single_rows`)."""
    return genai_read_count(&_matmul_row_calls)


def exact_row_calls() -> int:
    """How many ChunkedGroupQueryAttention calls in this process computed their query rows
    with genai's decode kernel (`genai.runtime.decode_attention`) instead of onnxruntime's."""
    return genai_read_count(&_exact_row_calls)


def decode_attention_level() -> int:
    """1 where genai's single-row attention kernel can give onnxruntime's bits on this CPU
    (AVX2 and FMA without AVX-512F), else 0."""
    return _decode_level


def decode_attention_row(const float[::1] qkv, Py_ssize_t pos, Py_ssize_t heads,
                         Py_ssize_t kv_heads, float scale, cos, sin, float[:, :, ::1] key_cache,
                         float[:, :, ::1] value_cache):
    """genai's single-row GroupQueryAttention kernel (`decode_attention_kernels.h`): the packed
    query/key/value row ``qkv`` at position ``pos``; ``cos`` / ``sin`` float32 [positions,
    head_size / 2] or None (no rotary); the caches [kv_heads, length, head_size] get the row's
    key and value at ``pos``. Returns the heads x head_size output (for tests and the probe)."""
    import numpy as np

    if _decode_level != 1:
        raise RuntimeError("genai's decode attention kernel needs AVX2 and FMA without AVX-512F")
    cdef Py_ssize_t dim = key_cache.shape[2], length = key_cache.shape[1]
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or heads // kv_heads > 64:
        raise ValueError("heads must be a positive multiple of kv_heads, at most 64 times it")
    if qkv.shape[0] != (heads + 2 * kv_heads) * dim:
        raise ValueError("qkv needs (heads + 2 kv_heads) x head_size values")
    if (key_cache.shape[0] != kv_heads or value_cache.shape[0] != kv_heads
            or value_cache.shape[1] != length or value_cache.shape[2] != dim):
        raise ValueError("the caches need the shape [kv_heads, length, head_size]")
    if not 0 <= pos < length:
        raise ValueError(f"pos must be in [0, {length})")
    cdef const float[:, ::1] c
    cdef const float[:, ::1] sn
    cdef const float* c_data = NULL
    cdef const float* s_data = NULL
    if cos is not None:
        c = cos
        sn = sin
        if (c.shape[1] * 2 != dim or c.shape[0] <= pos or sn.shape[0] != c.shape[0]
                or sn.shape[1] != c.shape[1]):
            raise ValueError("cos and sin need [positions > pos, head_size / 2]")
        c_data = &c[0, 0]
        s_data = &sn[0, 0]
    out = np.empty(heads * dim, np.float32)
    scratch_array = np.empty(heads * dim + (heads // kv_heads) * (pos + 1), np.float32)
    cdef float[::1] o = out
    cdef float[::1] scratch = scratch_array
    with nogil:
        genai_decode_attention_row(&qkv[0], <size_t>pos, <size_t>heads, <size_t>kv_heads,
                                   <size_t>dim, scale, c_data, s_data, &key_cache[0, 0, 0],
                                   &value_cache[0, 0, 0], <size_t>length, &scratch[0], &o[0])
    return out


def single_row_attention(bint on) -> bool:
    """Whether this thread's runs from now on compute attention one query row per call, as
    one-token steps would (each row then gets a one-token step's numbers): for speculative
    verification, whose tokens must be plain decoding's. Runs of one row of the batch on a
    shared past/present buffer or a growing past only (genai's CPU sessions); returns the
    previous setting."""
    return genai_single_row_attention(1 if on else 0) == 1


cdef const char* _name(const GenaiCustomOp* op) noexcept nogil:
    return _C_NAME


cdef const char* _provider(const GenaiCustomOp* op) noexcept nogil:
    return NULL  # the CPU execution provider


cdef int _input_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_INT32 if index == IN_SEQLENS or index == IN_TOTAL else ELEM_FLOAT


cdef size_t _input_count(const GenaiCustomOp* op) noexcept nogil:
    return GQA_INPUTS


cdef int _output_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_FLOAT


cdef size_t _output_count(const GenaiCustomOp* op) noexcept nogil:
    return GQA_OUTPUTS


cdef int _input_characteristic(const GenaiCustomOp* op, size_t index) noexcept nogil:
    if index == IN_QUERY or index == IN_SEQLENS or index == IN_TOTAL:
        return GENAI_IO_REQUIRED
    return GENAI_IO_OPTIONAL


cdef int _output_characteristic(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return GENAI_IO_REQUIRED


cdef int _memory_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return 0  # OrtMemTypeDefault


cdef int _one(const GenaiCustomOp* op) noexcept nogil:
    return 1


cdef OrtStatus* _error(int code, const char* message) noexcept nogil:
    return _f.CreateStatus(code, message)


cdef OrtStatus* _create(const GenaiCustomOp* op, const void* api, const OrtKernelInfo* info,
                        void** out) noexcept nogil:
    """One kernel per graph node: its attributes, and onnxruntime's kernel made with them."""
    cdef const OrtFns* f = _f
    cdef OrtOpAttr* attrs[N_INT_ATTRS + N_FLOAT_ATTRS]
    cdef int n = 0, i
    cdef int64_t ivalue
    cdef float fvalue
    cdef OrtStatus* st = NULL
    cdef ChunkedGqa* k = <ChunkedGqa*>calloc(1, sizeof(ChunkedGqa))
    if k == NULL:
        return _error(ORT_FAIL, "ChunkedGroupQueryAttention: out of memory")
    cdef bint plain = True  # no softcap, smooth softmax or interleaved rotary
    k.local_window = -1
    k.chunk_rows = CHUNK_ROWS_DEFAULT
    st = f.KernelInfoGetAttribute_int64(info, _C_CHUNK_ATTRIBUTE, &ivalue)
    if st == NULL:
        k.chunk_rows = ivalue
    else:
        f.ReleaseStatus(st)
        st = NULL
    st = f.KernelInfoGetAttribute_int64(info, _C_EXACT_DECODE_ATTRIBUTE, &ivalue)
    if st == NULL:
        k.exact = ivalue == 1 and _decode_level == 1
    else:
        f.ReleaseStatus(st)
        st = NULL
    for i in range(N_INT_ATTRS):
        st = f.KernelInfoGetAttribute_int64(info, _INT_ATTRS[i], &ivalue)
        if st != NULL:  # absent: onnxruntime's default
            f.ReleaseStatus(st)
            st = NULL
            continue
        if i == ATTR_NUM_HEADS:
            k.num_heads = ivalue
        elif i == ATTR_KV_NUM_HEADS:
            k.kv_num_heads = ivalue
        elif i == ATTR_LOCAL_WINDOW:
            k.local_window = ivalue
        elif i == ATTR_DO_ROTARY:
            k.do_rotary = ivalue
        elif ivalue != 0:  # rotary_interleaved, smooth_softmax
            plain = False
        st = f.CreateOpAttr(_INT_ATTRS[i], &ivalue, 1, OP_ATTR_INT, &attrs[n])
        if st != NULL:
            break
        n += 1
    if st == NULL:
        for i in range(N_FLOAT_ATTRS):
            st = f.KernelInfoGetAttribute_float(info, _FLOAT_ATTRS[i], &fvalue)
            if st != NULL:
                f.ReleaseStatus(st)
                st = NULL
                continue
            if i == ATTR_SCALE:
                k.scale = fvalue
            elif fvalue != 0.0:  # softcap
                plain = False
            st = f.CreateOpAttr(_FLOAT_ATTRS[i], &fvalue, 1, OP_ATTR_FLOAT, &attrs[n])
            if st != NULL:
                break
            n += 1
    if not plain or k.local_window > 0:
        k.exact = 0
    if st == NULL and (k.num_heads <= 0 or k.kv_num_heads <= 0 or k.chunk_rows <= 0
                       or k.num_heads % k.kv_num_heads != 0):
        st = _error(ORT_INVALID_ARGUMENT, "ChunkedGroupQueryAttention: num_heads and "
                    "kv_num_heads must be positive, num_heads a multiple of kv_num_heads, "
                    "genai_chunk_rows positive")
    if st == NULL:
        st = f.CreateOp(info, "GroupQueryAttention", "com.microsoft", 1, _TYPE_NAMES,
                        _TYPE_VALUES, 2, <const OrtOpAttr* const*>attrs, n, GQA_INPUTS,
                        GQA_OUTPUTS, &k.op)
    for i in range(n):
        f.ReleaseOpAttr(attrs[i])
    if st != NULL:
        free(k)
        return st
    out[0] = k
    return NULL


cdef void _destroy(void* kernel) noexcept nogil:
    """Release a kernel that starts with the onnxruntime kernel it calls (`KernelWithOp`)."""
    cdef KernelWithOp* k = <KernelWithOp*>kernel
    if k == NULL:
        return
    if k.op != NULL:
        _f.ReleaseOp(k.op)
    free(k)


cdef enum:
    MAX_RANK = 8         # the most dimensions the element-wise ops take


cdef OrtStatus* _shape(const OrtValue* value, int64_t* dims, size_t* rank,
                       const char* message) noexcept nogil:
    """``value``'s rank (1 to MAX_RANK, else an error with ``message``) and dimensions."""
    cdef OrtTensorTypeAndShapeInfo* info = NULL
    cdef OrtStatus* st = _f.GetTensorTypeAndShape(value, &info)
    if st != NULL:
        return st
    st = _f.GetDimensionsCount(info, rank)
    if st == NULL and (rank[0] < 1 or rank[0] > MAX_RANK):
        st = _error(ORT_INVALID_ARGUMENT, message)
    if st == NULL:
        st = _f.GetDimensions(info, dims, rank[0])
    _f.ReleaseTensorTypeAndShapeInfo(info)
    return st


cdef OrtStatus* _dims(const OrtValue* value, int64_t* out, size_t rank) noexcept nogil:
    """``value``'s dimensions into ``out``, which has room for ``rank``: an error unless the
    tensor has exactly that rank."""
    cdef const OrtFns* f = _f
    cdef OrtTensorTypeAndShapeInfo* info = NULL
    cdef size_t count = 0
    cdef OrtStatus* st = f.GetTensorTypeAndShape(value, &info)
    if st != NULL:
        return st
    st = f.GetDimensionsCount(info, &count)
    if st == NULL and count != rank:
        st = _error(ORT_INVALID_ARGUMENT, "ChunkedGroupQueryAttention: an input has the wrong "
                    "rank (query: 3, past key/value: 4)")
    if st == NULL:
        st = f.GetDimensions(info, out, rank)
    f.ReleaseTensorTypeAndShapeInfo(info)
    return st


cdef inline char* _data(const OrtValue* value) noexcept nogil:
    cdef void* p = NULL
    if _f.GetTensorMutableData(<OrtValue*>value, &p) != NULL:
        return NULL  # (only on a non-tensor, which the schema's types rule out)
    return <char*>p


cdef OrtStatus* _view(char* data, int64_t rows, int64_t width, int elem, size_t elem_bytes,
                      OrtValue** out) noexcept nogil:
    """A ``[1, rows, width]`` tensor over ``data`` (no copy)."""
    cdef int64_t shape[3]
    shape[0] = 1
    shape[1] = rows
    shape[2] = width
    return _f.CreateTensorWithDataAsOrtValue(_cpu, data, <size_t>(rows * width) * elem_bytes,
                                             shape, 3, elem, out)


cdef OrtStatus* _run_chunks(ChunkedGqa* k, OrtKernelContext* ctx, const OrtValue** ins,
                            OrtValue** outs, int64_t rows, int64_t q_width, int64_t kv_width,
                            int64_t out_width, int32_t last_seqlen,
                            int64_t chunk_rows) noexcept nogil:
    """onnxruntime's kernel over consecutive chunks of ``chunk_rows`` query rows of a one-row
    batch (the last one taking the rest), each on the shared past/present buffer the chunks
    before it filled."""
    cdef const OrtFns* f = _f
    cdef int64_t start = 0, count, end
    cdef int32_t seqlen[1]
    cdef int32_t total[1]
    cdef int64_t one = 1
    cdef const OrtValue* chunk_in[GQA_INPUTS]
    cdef OrtValue* chunk_out[GQA_OUTPUTS]
    cdef OrtValue* views[6]
    cdef int n_views, i
    cdef OrtStatus* st = NULL
    cdef char* bases[3]
    cdef int64_t widths[3]
    cdef char* out = _data(outs[0])
    cdef size_t fbytes = sizeof(float)
    for i in range(3):
        bases[i] = _data(ins[IN_QUERY + i]) if ins[IN_QUERY + i] != NULL else NULL
        widths[i] = q_width if i == 0 else kv_width
    for i in range(GQA_INPUTS):
        chunk_in[i] = ins[i]
    chunk_out[1] = outs[1]
    chunk_out[2] = outs[2]
    while start < rows:
        # Chunks of exactly chunk_rows from the first row, the last one taking what remains
        # (chunk_rows to 2 chunk_rows - 1 rows): the kernel's GEMMs then meet each row in the
        # same block of rows as in one call, and no chunk is a single row (onnxruntime's GEMM
        # takes another kernel for a one-row product, whose last bits differ).
        count = rows - start if rows - start < 2 * chunk_rows else chunk_rows
        end = start + count
        seqlen[0] = last_seqlen - <int32_t>(rows - end)
        total[0] = seqlen[0] + 1
        n_views = 0
        for i in range(3):  # the query, key and value rows of the chunk (key, value: if given)
            if st != NULL or bases[i] == NULL:
                continue
            st = _view(bases[i] + start * widths[i] * fbytes, count, widths[i], ELEM_FLOAT,
                       fbytes, &views[n_views])
            if st == NULL:
                chunk_in[IN_QUERY + i] = views[n_views]
                n_views += 1
        if st == NULL:
            st = f.CreateTensorWithDataAsOrtValue(_cpu, seqlen, sizeof(int32_t), &one, 1,
                                                  ELEM_INT32, &views[n_views])
            if st == NULL:
                chunk_in[IN_SEQLENS] = views[n_views]
                n_views += 1
        if st == NULL:
            st = f.CreateTensorWithDataAsOrtValue(_cpu, total, sizeof(int32_t), NULL, 0,
                                                  ELEM_INT32, &views[n_views])
            if st == NULL:
                chunk_in[IN_TOTAL] = views[n_views]
                n_views += 1
        if st == NULL:
            st = _view(out + start * out_width * fbytes, count, out_width, ELEM_FLOAT, fbytes,
                       &views[n_views])
            if st == NULL:
                chunk_out[0] = views[n_views]
                n_views += 1
        if st == NULL:
            st = f.InvokeOp(ctx, k.op, chunk_in, GQA_INPUTS, chunk_out, GQA_OUTPUTS)
        for i in range(n_views):
            f.ReleaseValue(views[i])
        if st != NULL:
            return st
        start = end
    return NULL


cdef int _exact_rows(ChunkedGqa* k, const OrtValue** ins, OrtValue** outs, int64_t rows,
                     int64_t width, int64_t head_size, int32_t total, int64_t cache_len,
                     OrtStatus** st) noexcept nogil:
    """A batch-1 run's ``rows`` query rows, one at a time, by genai's decode kernel on the
    shared past/present buffer: 1 when done, 0 when the run is not one it takes (rotary caches
    missing or too short), -1 with ``st`` on failure."""
    cdef int64_t cos_dims[2]
    cdef OrtStatus* shape
    cdef const float* cos = NULL
    cdef const float* sin = NULL
    cdef int64_t r, pos
    cdef float scale = k.scale if k.scale != 0.0 else (<float>1.0) / sqrtf(<float>head_size)
    if k.do_rotary:
        if ins[IN_COS] == NULL or ins[IN_SIN] == NULL:
            return 0
        shape = _dims(ins[IN_COS], cos_dims, 2)
        if shape != NULL:  # another rank: onnxruntime's kernel says what is wrong
            _f.ReleaseStatus(shape)
            return 0
        if cos_dims[1] * 2 != head_size or cos_dims[0] < total:
            return 0
        cos = <const float*>_data(ins[IN_COS])
        sin = <const float*>_data(ins[IN_SIN])
    cdef int64_t group = k.num_heads // k.kv_num_heads
    if group > 64:  # (the kernel's per-group sums)
        return 0
    cdef float* scratch = <float*>malloc(
        <size_t>(k.num_heads * head_size + group * total) * sizeof(float))
    if scratch == NULL:
        st[0] = _error(ORT_FAIL, "ChunkedGroupQueryAttention: out of memory")
        return -1
    cdef const float* query = <const float*>_data(ins[IN_QUERY])
    cdef float* out = <float*>_data(outs[0])
    cdef float* keys = <float*>_data(outs[1])
    cdef float* values = <float*>_data(outs[2])
    for r in range(rows):
        pos = total - rows + r
        genai_decode_attention_row(query + r * width, <size_t>pos, <size_t>k.num_heads,
                                   <size_t>k.kv_num_heads, <size_t>head_size, scale, cos, sin,
                                   keys, values, <size_t>cache_len, scratch,
                                   out + r * k.num_heads * head_size)
    free(scratch)
    genai_count(&_exact_row_calls)
    return 1


cdef OrtStatus* _inputs(OrtKernelContext* ctx, const OrtValue** ins, size_t count) noexcept nogil:
    """The node's inputs into ``ins[0:count]`` (NULL for those it leaves out); an error when it
    has more than ``count``."""
    cdef size_t n_in = 0, i
    cdef OrtStatus* st = _f.KernelContext_GetInputCount(ctx, &n_in)
    if st == NULL and n_in > count:
        st = _error(ORT_INVALID_ARGUMENT, "a genai op was given more inputs than it takes")
    for i in range(count):
        ins[i] = NULL
        if st == NULL and i < n_in:
            st = _f.KernelContext_GetInput(ctx, i, &ins[i])
    return st


cdef bint _grow_into_present(const OrtValue** ins, OrtValue** outs, const int64_t* past_dims,
                             const int64_t* kv_dims, int64_t rows, int32_t total,
                             int64_t head_size) noexcept nogil:
    """For a batch-1 run on a growing past (``past_key`` / ``past_value`` buffers of their own,
    holding exactly the ``total - rows`` positions before the run; the present ones ``total``
    long): copies the past to the head of each present head and returns True, so that the run
    can go on the present buffers as on a shared one; False (nothing copied) for other runs."""
    cdef int64_t past_len, heads, h
    cdef size_t part
    cdef char* present
    cdef const char* past
    cdef int which
    if (ins[IN_PAST_KEY] == NULL or ins[IN_PAST_VALUE] == NULL
            or _data(ins[IN_PAST_KEY]) == _data(outs[1])
            or _data(ins[IN_PAST_VALUE]) == _data(outs[2])):
        return False
    past_len = past_dims[2]
    heads = kv_dims[1]
    if (past_dims[0] != 1 or past_dims[1] != heads or past_dims[3] != head_size
            or kv_dims[2] != total or past_len + rows != total
            or (<int32_t*>_data(ins[IN_SEQLENS]))[0] + 1 != total):
        return False
    part = <size_t>(past_len * head_size) * sizeof(float)
    if part:
        for which in range(2):
            past = _data(ins[IN_PAST_KEY + which])
            present = _data(outs[1 + which])
            for h in range(heads):
                memcpy(present + <size_t>(h * total * head_size) * sizeof(float),
                       past + <size_t>h * part, part)
    return True


cdef OrtStatus* _compute(void* kernel, OrtKernelContext* ctx) noexcept nogil:
    cdef ChunkedGqa* k = <ChunkedGqa*>kernel
    cdef const OrtFns* f = _f
    cdef const OrtValue* ins[GQA_INPUTS]
    cdef OrtValue* outs[GQA_OUTPUTS]
    cdef int64_t q_dims[3]
    cdef int64_t past_dims[4]
    cdef int64_t out_dims[3]
    cdef int64_t kv_dims[4]
    cdef int64_t batch, rows, width, heads, head_size, present_len
    cdef int32_t total, last_seqlen
    cdef bint single
    cdef OrtStatus* st = _inputs(ctx, ins, GQA_INPUTS)
    if st != NULL:
        return st
    if ins[IN_QUERY] == NULL or ins[IN_SEQLENS] == NULL or ins[IN_TOTAL] == NULL:
        return _error(ORT_INVALID_ARGUMENT, "ChunkedGroupQueryAttention needs query, seqlens_k "
                      "and total_sequence_length")
    st = _dims(ins[IN_QUERY], q_dims, 3)
    if st != NULL:
        return st
    batch = q_dims[0]
    rows = q_dims[1]
    width = q_dims[2]
    heads = k.num_heads + (2 * k.kv_num_heads if ins[IN_KEY] == NULL else 0)
    if width % heads != 0:
        return _error(ORT_INVALID_ARGUMENT, "ChunkedGroupQueryAttention: the query's width is "
                      "not a multiple of its heads")
    head_size = width // heads
    total = (<int32_t*>_data(ins[IN_TOTAL]))[0]
    present_len = total
    if ins[IN_PAST_KEY] != NULL:
        st = _dims(ins[IN_PAST_KEY], past_dims, 4)
        if st != NULL:
            return st
        if past_dims[2] > present_len:
            present_len = past_dims[2]
    out_dims[0] = batch
    out_dims[1] = rows
    out_dims[2] = k.num_heads * head_size
    kv_dims[0] = batch
    kv_dims[1] = k.kv_num_heads
    kv_dims[2] = present_len
    kv_dims[3] = head_size
    st = f.KernelContext_GetOutput(ctx, 0, out_dims, 3, &outs[0])
    if st == NULL:
        st = f.KernelContext_GetOutput(ctx, 1, kv_dims, 4, &outs[1])
    if st == NULL:
        st = f.KernelContext_GetOutput(ctx, 2, kv_dims, 4, &outs[2])
    if st != NULL:
        return st
    # Runs of one row of the batch on the shared past/present buffer can go in chunks: long
    # prompts in chunks of chunk_rows, and, when the thread asks for it (speculative
    # verification), any run in single rows: each row then gets a one-token step's numbers
    # (onnxruntime's kernel computes a run of several rows in another order, which changes
    # the last bits). Single rows on a growing past too, after _grow_into_present.
    single = genai_single_row_attention(-1) == 1 and rows >= 2
    cdef int done
    if ((single or (k.exact and rows == 1)) and batch == 1
            and _grow_into_present(ins, outs, past_dims, kv_dims, rows, total, head_size)):
        # A growing past (its own buffer, the present one position per row longer) now
        # lies at the head of the present buffer: the rows run on that as on a shared one.
        ins[IN_PAST_KEY] = outs[1]
        ins[IN_PAST_VALUE] = outs[2]
        past_dims[2] = kv_dims[2]
    if (k.exact and (rows == 1 or single) and batch == 1 and ins[IN_KEY] == NULL
            and ins[IN_VALUE] == NULL and ins[IN_PAST_KEY] != NULL
            and ins[IN_PAST_VALUE] != NULL
            and _data(ins[IN_PAST_KEY]) == _data(outs[1])
            and _data(ins[IN_PAST_VALUE]) == _data(outs[2])
            and (<int32_t*>_data(ins[IN_SEQLENS]))[0] + 1 == total
            and rows <= total <= past_dims[2]):
        done = _exact_rows(k, ins, outs, rows, width, head_size, total, past_dims[2], &st)
        if done < 0:
            return st
        if done:
            if single:
                genai_count(&_single_row_calls)
            return NULL
    if ((single or rows >= 2 * k.chunk_rows) and batch == 1 and k.local_window <= 0
            and ins[IN_PAST_KEY] != NULL and ins[IN_PAST_VALUE] != NULL
            and _data(ins[IN_PAST_KEY]) == _data(outs[1])
            and _data(ins[IN_PAST_VALUE]) == _data(outs[2])):
        last_seqlen = (<int32_t*>_data(ins[IN_SEQLENS]))[0]
        if last_seqlen + 1 == total and total >= rows and total <= present_len:
            genai_count(&_single_row_calls if single else &_chunked_calls)
            return _run_chunks(k, ctx, ins, outs, rows, width, k.kv_num_heads * head_size,
                               out_dims[2], last_seqlen, 1 if single else k.chunk_rows)
    return f.InvokeOp(ctx, k.op, ins, GQA_INPUTS, outs, GQA_OUTPUTS)


# --- SingleRowsMatMul ------------------------------------------------------------------------
# a (float32 [..., M, K]), b (float32 [K, N]: a weight bound at run time, a LoRA branch's A or B)
# -> y (float32 [..., M, N]): onnxruntime's own MatMul kernel, in one call, or, inside
# `single_rows` for a run whose leading dimensions are 1, one row per call. onnxruntime's
# MatMul multiplies a lone row of an unpacked weight with another kernel (MLAS's one-row SGEMM)
# than a run of rows, whose sums round otherwise; row by row, each row of a speculative verify
# run gets a one-token step's numbers.

cdef const char* _MATMUL_TYPE_NAMES[1]
_MATMUL_TYPE_NAMES[0] = "T"


cdef const char* _rows_matmul_name(const GenaiCustomOp* op) noexcept nogil:
    return _C_ROWS_MATMUL


cdef OrtStatus* _rows_matmul_create(const GenaiCustomOp* op, const void* api,
                                    const OrtKernelInfo* info, void** out) noexcept nogil:
    cdef KernelWithOp* k = <KernelWithOp*>calloc(1, sizeof(KernelWithOp))
    cdef int elem = ELEM_FLOAT
    cdef OrtStatus* st
    if k == NULL:
        return _error(ORT_FAIL, "SingleRowsMatMul: out of memory")
    st = _f.CreateOp(info, "MatMul", "", 13, _MATMUL_TYPE_NAMES, &elem, 1, NULL, 0, 2, 1, &k.op)
    if st != NULL:
        free(k)
        return st
    out[0] = k
    return NULL


cdef OrtStatus* _rows_matmul_compute(void* kernel, OrtKernelContext* ctx) noexcept nogil:
    cdef KernelWithOp* k = <KernelWithOp*>kernel
    cdef const OrtFns* f = _f
    cdef const OrtValue* ins[2]
    cdef const OrtValue* row_in[2]
    cdef OrtValue* outs[1]
    cdef OrtValue* views[2]
    cdef int64_t a_dims[MAX_RANK]
    cdef int64_t b_dims[2]
    cdef size_t a_rank = 0, i
    cdef int64_t rows = 1, r, width, n
    cdef char* a_data
    cdef char* y_data
    cdef OrtStatus* st = _inputs(ctx, ins, 2)
    if st == NULL and (ins[0] == NULL or ins[1] == NULL):
        st = _error(ORT_INVALID_ARGUMENT, "SingleRowsMatMul needs two inputs")
    if st == NULL:
        st = _shape(ins[0], a_dims, &a_rank, "SingleRowsMatMul: the first input has rank 1-8")
    if st == NULL:
        st = _matmul_weight_dims(ins[1], b_dims)
    if st == NULL and a_dims[a_rank - 1] != b_dims[0]:
        st = _error(ORT_INVALID_ARGUMENT, "SingleRowsMatMul: the inputs' inner dimensions "
                    "differ")
    if st != NULL:
        return st
    width = b_dims[0]
    n = b_dims[1]
    for i in range(a_rank - 1):
        rows *= a_dims[i]
    a_dims[a_rank - 1] = n  # the output's shape
    st = f.KernelContext_GetOutput(ctx, 0, a_dims, a_rank, &outs[0])
    if st != NULL:
        return st
    if (genai_single_row_attention(-1) != 1 or rows < 2 or a_rank < 2
            or rows != a_dims[a_rank - 2] or n == 0):
        return f.InvokeOp(ctx, k.op, ins, 2, outs, 1)
    a_data = _data(ins[0])
    y_data = _data(outs[0])
    row_in[1] = ins[1]
    for r in range(rows):
        views[0] = NULL
        views[1] = NULL
        st = _view(a_data + <size_t>(r * width) * sizeof(float), 1, width, ELEM_FLOAT,
                   sizeof(float), &views[0])
        if st == NULL:
            st = _view(y_data + <size_t>(r * n) * sizeof(float), 1, n, ELEM_FLOAT,
                       sizeof(float), &views[1])
        if st == NULL:
            row_in[0] = views[0]
            st = f.InvokeOp(ctx, k.op, row_in, 2, &views[1], 1)
        for i in range(2):
            if views[i] != NULL:
                f.ReleaseValue(views[i])
        if st != NULL:
            return st
    genai_count(&_matmul_row_calls)
    return NULL


cdef OrtStatus* _matmul_weight_dims(const OrtValue* value, int64_t* out) noexcept nogil:
    """A SingleRowsMatMul weight's two dimensions, or an error for another rank."""
    cdef size_t rank = 0
    cdef int64_t dims[MAX_RANK]
    cdef OrtStatus* st = _shape(value, dims, &rank, "SingleRowsMatMul: the weight has rank 2")
    if st == NULL and rank != 2:
        st = _error(ORT_INVALID_ARGUMENT, "SingleRowsMatMul: the weight has rank 2")
    if st == NULL:
        out[0] = dims[0]
        out[1] = dims[1]
    return st


# --- QuantizeRows -----------------------------------------------------------------------------
# x (float32 [..., n]) -> q (uint8, x's shape), scale (float32 [..., 1]): row_quant_kernels.h.

cdef enum:
    QUANT_BLOCK_ELEMENTS = 16384  # elements per parallel task (a few microseconds of work)

cdef struct RowQuant:
    float floor_value

cdef struct RowQuantJob:
    const float* x
    uint8_t* q
    float* scale
    size_t rows
    size_t n
    size_t block
    float floor_value


cdef const char* _quantize_name(const GenaiCustomOp* op) noexcept nogil:
    return _C_QUANTIZE


cdef int _float_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_FLOAT


cdef size_t _one_count(const GenaiCustomOp* op) noexcept nogil:
    return 1


cdef int _quantize_output_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_UINT8 if index == 0 else ELEM_FLOAT


cdef size_t _two_count(const GenaiCustomOp* op) noexcept nogil:
    return 2


cdef int _required(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return GENAI_IO_REQUIRED


cdef OrtStatus* _quantize_create(const GenaiCustomOp* op, const void* api,
                                 const OrtKernelInfo* info, void** out) noexcept nogil:
    cdef RowQuant* k = <RowQuant*>calloc(1, sizeof(RowQuant))
    cdef float value = 0
    if k == NULL:
        return _error(ORT_FAIL, "QuantizeRows: out of memory")
    cdef OrtStatus* st = _f.KernelInfoGetAttribute_float(info, _C_FLOOR_ATTRIBUTE, &value)
    if st != NULL or not value > 0:
        if st != NULL:
            _f.ReleaseStatus(st)
        free(k)
        return _error(ORT_INVALID_ARGUMENT, "QuantizeRows needs a positive float attribute "
                      "'floor'")
    k.floor_value = value
    out[0] = k
    return NULL


cdef void _quantize_destroy(void* kernel) noexcept nogil:
    free(kernel)


cdef void _quantize_block(void* data, size_t index) noexcept nogil:
    cdef RowQuantJob* job = <RowQuantJob*>data
    cdef size_t first = index * job.block
    cdef size_t last = first + job.block
    if last > job.rows:
        last = job.rows
    genai_quantize_rows(job.x, first, last, job.n, job.floor_value, job.q, job.scale,
                        _quant_level)


@cython.cdivision(True)
cdef OrtStatus* _quantize_compute(void* kernel, OrtKernelContext* ctx) noexcept nogil:
    cdef RowQuant* k = <RowQuant*>kernel
    cdef const OrtFns* f = _f
    cdef const OrtValue* x = NULL
    cdef OrtValue* q = NULL
    cdef OrtValue* scale = NULL
    cdef int64_t dims[MAX_RANK]
    cdef size_t rank = 0, i, blocks
    cdef RowQuantJob job
    cdef OrtStatus* st = f.KernelContext_GetInput(ctx, 0, &x)
    if st == NULL:
        st = _shape(x, dims, &rank, "QuantizeRows takes a tensor of rank 1 to 8")
    if st != NULL:
        return st
    job.n = <size_t>dims[rank - 1]
    job.rows = 1
    for i in range(rank - 1):
        job.rows *= <size_t>dims[i]
    st = f.KernelContext_GetOutput(ctx, 0, dims, rank, &q)
    if st != NULL:
        return st
    dims[rank - 1] = 1
    st = f.KernelContext_GetOutput(ctx, 1, dims, rank, &scale)
    if st != NULL or job.rows == 0 or job.n == 0:
        return st
    job.x = <const float*>_data(x)
    job.q = <uint8_t*>_data(q)
    job.scale = <float*>_data(scale)
    job.floor_value = k.floor_value
    job.block = QUANT_BLOCK_ELEMENTS // job.n
    if job.block < 1:
        job.block = 1
    blocks = (job.rows + job.block - 1) // job.block
    if blocks > 1 and f.KernelContext_ParallelFor != NULL:
        return f.KernelContext_ParallelFor(ctx, _quantize_block, blocks, 0, &job)
    for i in range(blocks):
        _quantize_block(&job, i)
    return NULL


def quantize_rows(const float[:, ::1] x, float floor_value, int level=-1):
    """The QuantizeRows kernel on a ``[rows, n]`` matrix: ``(q, scale)``, uint8 ``[rows, n]``
    and float32 ``[rows, 1]`` (for tests and its NumPy twin, `genai._core.reference`).
    ``level``: the code path, 2 AVX-512, 1 AVX2, 0 scalar (-1: this CPU's best, what the op
    runs; a level above it is refused)."""
    import numpy as np

    if level < 0:
        level = _quant_level
    elif level > _quant_level:
        raise ValueError(f"this CPU runs quantisation level {_quant_level} at most, not {level}")
    cdef Py_ssize_t rows = x.shape[0], n = x.shape[1]
    q_array = np.empty((rows, n), np.uint8)
    scale_array = np.empty((rows, 1), np.float32)
    cdef uint8_t[:, ::1] q = q_array
    cdef float[:, ::1] scale = scale_array
    if rows and n:
        with nogil:
            genai_quantize_rows(&x[0, 0], 0, <size_t>rows, <size_t>n, floor_value, &q[0, 0],
                                &scale[0, 0], level)
    return q_array, scale_array


# --- ScaledSiluMul ----------------------------------------------------------------------------
# gate, up (float32 [..., n]); gate_scale, up_scale (optional, float32, one value per row) ->
# out = QuickGelu(g) * u, g = gate * gate_scale, u = up * up_scale: the MLP's
#   g = Mul(gate, gate_scale); u = Mul(up, up_scale); Mul(Mul(g, Sigmoid(g)), u)
# once onnxruntime has fused Mul(g, Sigmoid(g)) into QuickGelu (its default optimisation level).
# Blocks of rows stay in cache: each product is rounded as its Mul op rounds it, and QuickGelu
# is onnxruntime's own kernel (CreateOp / InvokeOp), so ``out`` is the same bytes. With the
# ``floor`` attribute the op gives, instead of ``out`` (output 0 left out), the QuantizeRows
# of it (outputs 1 and 2: uint8 rows and their scales), without writing ``out`` to memory.

cdef enum:
    # Elements per block of rows: its two scratch blocks (512 KB each) stay in a core's L2, and
    # 2 threads get work enough per parallel call (65536 was 10 % faster at 1 thread, no faster
    # at 2: docs/benchmarks.md)
    SILU_BLOCK_ELEMENTS = 131072
    SILU_TASK_ELEMENTS = 32768    # elements per parallel task
    SILU_INPUTS = 4
    SILU_OUTPUTS = 3
    IN_GATE = 0
    IN_UP = 1
    IN_GATE_SCALE = 2
    IN_UP_SCALE = 3

cdef struct SiluMul:
    OrtOp* op            # onnxruntime's QuickGelu kernel (alpha 1: x * sigmoid(x))
    float floor_value    # > 0: the outputs are out's QuantizeRows

cdef struct SiluJob:
    const float* gate
    const float* up
    const float* gate_scale   # NULL: 1
    const float* up_scale     # NULL: 1
    float* out                # the product (NULL when quantised)
    uint8_t* q                # its QuantizeRows (NULL unless quantised)
    float* q_scale
    float floor_value
    float* scaled             # the block's g rows (scratch), or gate itself without a scale
    float* gelu               # the block's QuickGelu(g) rows (scratch)
    size_t n
    size_t first              # the block's first row
    size_t rows               # the block's rows
    size_t task_rows


cdef const char* _silu_name(const GenaiCustomOp* op) noexcept nogil:
    return _C_SILU_MUL


cdef size_t _silu_input_count(const GenaiCustomOp* op) noexcept nogil:
    return SILU_INPUTS


cdef int _silu_input_characteristic(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return GENAI_IO_REQUIRED if index == IN_GATE or index == IN_UP else GENAI_IO_OPTIONAL


cdef size_t _three_count(const GenaiCustomOp* op) noexcept nogil:
    return SILU_OUTPUTS


cdef int _silu_output_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_UINT8 if index == 1 else ELEM_FLOAT


cdef int _optional(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return GENAI_IO_OPTIONAL


cdef const char* _GELU_TYPE_NAMES[1]
_GELU_TYPE_NAMES[0] = "T"
cdef int _GELU_TYPE_VALUES[1]
_GELU_TYPE_VALUES[0] = ELEM_FLOAT


cdef OrtStatus* _silu_create(const GenaiCustomOp* op, const void* api,
                             const OrtKernelInfo* info, void** out) noexcept nogil:
    cdef SiluMul* k = <SiluMul*>calloc(1, sizeof(SiluMul))
    cdef float alpha = 1.0, value = 0
    cdef OrtOpAttr* attr = NULL
    if k == NULL:
        return _error(ORT_FAIL, "ScaledSiluMul: out of memory")
    cdef OrtStatus* st = _f.KernelInfoGetAttribute_float(info, _C_FLOOR_ATTRIBUTE, &value)
    if st != NULL:  # absent: the product itself is the output
        _f.ReleaseStatus(st)
        st = NULL
    elif not value > 0:
        st = _error(ORT_INVALID_ARGUMENT, "ScaledSiluMul: 'floor' must be positive")
    k.floor_value = value
    if st == NULL:
        st = _f.CreateOpAttr("alpha", &alpha, 1, OP_ATTR_FLOAT, &attr)
    if st == NULL:
        st = _f.CreateOp(info, "QuickGelu", "com.microsoft", 1, _GELU_TYPE_NAMES,
                         _GELU_TYPE_VALUES, 1, <const OrtOpAttr* const*>&attr, 1, 1, 1,
                         &k.op)
        _f.ReleaseOpAttr(attr)
    if st != NULL:
        free(k)
        return st
    out[0] = k
    return NULL


cdef void _silu_scale_task(void* data, size_t index) noexcept nogil:
    """A task's rows of the block: ``scaled = gate * gate_scale``."""
    cdef SiluJob* job = <SiluJob*>data
    cdef size_t first = index * job.task_rows, last = first + job.task_rows, r, n = job.n
    if last > job.rows:
        last = job.rows
    for r in range(first, last):
        genai_scale_row(job.gate + (job.first + r) * n, job.gate_scale[job.first + r],
                        job.scaled + r * n, n, _quant_level)


cdef void _silu_product_task(void* data, size_t index) noexcept nogil:
    """A task's rows of the block: ``out = gelu * (up * up_scale)``, each product rounded to
    float32 on its own (as the Mul ops); quantised in cache when the op gives QuantizeRows."""
    cdef SiluJob* job = <SiluJob*>data
    cdef size_t first = index * job.task_rows, last = first + job.task_rows, r, n = job.n
    cdef float* gelu
    if last > job.rows:
        last = job.rows
    for r in range(first, last):
        gelu = job.gelu + r * n
        genai_gate_row(gelu, job.up + (job.first + r) * n,
                       job.up_scale + job.first + r if job.up_scale != NULL else NULL,
                       gelu if job.out == NULL else job.out + (job.first + r) * n, n,
                       _quant_level)
    if job.out == NULL and last > first:
        genai_quantize_rows(job.gelu, first, last, n, job.floor_value,
                            job.q + job.first * n, job.q_scale + job.first, _quant_level)


cdef OrtStatus* _parallel(OrtKernelContext* ctx, void (*fn)(void*, size_t) noexcept nogil,
                          size_t tasks, void* job) noexcept nogil:
    cdef size_t i
    if tasks > 1 and _f.KernelContext_ParallelFor != NULL:
        return _f.KernelContext_ParallelFor(ctx, fn, tasks, 0, job)
    for i in range(tasks):
        fn(job, i)
    return NULL


@cython.cdivision(True)
cdef OrtStatus* _silu_outputs(SiluMul* k, OrtKernelContext* ctx, int64_t* dims, size_t rank,
                              SiluJob* job) noexcept nogil:
    """The op's outputs, ``dims`` the product's shape: the product, or its QuantizeRows."""
    cdef OrtValue* value = NULL
    cdef OrtStatus* st
    job.out = NULL
    job.q = NULL
    job.q_scale = NULL
    job.floor_value = k.floor_value
    if k.floor_value == 0:
        st = _f.KernelContext_GetOutput(ctx, 0, dims, rank, &value)
        if st == NULL:
            job.out = <float*>_data(value)
        return st
    st = _f.KernelContext_GetOutput(ctx, 1, dims, rank, &value)
    if st != NULL:
        return st
    job.q = <uint8_t*>_data(value)
    dims[rank - 1] = 1
    st = _f.KernelContext_GetOutput(ctx, 2, dims, rank, &value)
    if st == NULL:
        job.q_scale = <float*>_data(value)
    return st


@cython.cdivision(True)
cdef OrtStatus* _silu_compute(void* kernel, OrtKernelContext* ctx) noexcept nogil:
    cdef SiluMul* k = <SiluMul*>kernel
    cdef const OrtFns* f = _f
    cdef const OrtValue* ins[SILU_INPUTS]
    cdef OrtValue* views[2]
    cdef int64_t dims[MAX_RANK]
    cdef int64_t up_dims[MAX_RANK]
    cdef int64_t scale_dims[MAX_RANK]
    cdef size_t rank = 0, up_rank = 0, scale_rank = 0, i, j, rows, block, tasks, count
    cdef float* scratch = NULL
    cdef SiluJob job
    cdef OrtStatus* st = _inputs(ctx, ins, SILU_INPUTS)
    if st != NULL:
        return st
    if ins[IN_GATE] == NULL or ins[IN_UP] == NULL:
        return _error(ORT_INVALID_ARGUMENT, "ScaledSiluMul needs gate and up")
    st = _shape(ins[IN_GATE], dims, &rank, "ScaledSiluMul takes tensors of rank 1 to 8")
    if st == NULL:
        st = _shape(ins[IN_UP], up_dims, &up_rank, "ScaledSiluMul takes tensors of rank 1 to 8")
    if st != NULL:
        return st
    if up_rank != rank:
        return _error(ORT_INVALID_ARGUMENT, "ScaledSiluMul: gate and up differ in shape")
    for i in range(rank):
        if up_dims[i] != dims[i]:
            return _error(ORT_INVALID_ARGUMENT, "ScaledSiluMul: gate and up differ in shape")
    job.n = <size_t>dims[rank - 1]
    rows = 1
    for i in range(rank - 1):
        rows *= <size_t>dims[i]
    for i in range(IN_GATE_SCALE, SILU_INPUTS):
        if ins[i] == NULL:
            continue
        st = _shape(ins[i], scale_dims, &scale_rank, "ScaledSiluMul: a scale needs one value "
                    "per row")
        if st != NULL:
            return st
        count = 1
        for j in range(scale_rank):
            count *= <size_t>scale_dims[j]
        if count != rows:
            return _error(ORT_INVALID_ARGUMENT, "ScaledSiluMul: a scale needs one value per row")
    st = _silu_outputs(k, ctx, dims, rank, &job)
    if st != NULL or rows == 0 or job.n == 0:
        return st
    job.gate = <const float*>_data(ins[IN_GATE])
    job.up = <const float*>_data(ins[IN_UP])
    job.gate_scale = <const float*>_data(ins[IN_GATE_SCALE]) if ins[IN_GATE_SCALE] != NULL else NULL
    job.up_scale = <const float*>_data(ins[IN_UP_SCALE]) if ins[IN_UP_SCALE] != NULL else NULL
    block = SILU_BLOCK_ELEMENTS // job.n
    if block < 1:
        block = 1
    if block > rows:
        block = rows
    job.task_rows = SILU_TASK_ELEMENTS // job.n
    if job.task_rows < 1:
        job.task_rows = 1
    scratch = genai_thread_scratch(2 * block * job.n)
    if scratch == NULL:
        return _error(ORT_FAIL, "ScaledSiluMul: out of memory")
    job.gelu = scratch + block * job.n
    job.first = 0
    while job.first < rows and st == NULL:
        job.rows = rows - job.first if rows - job.first < block else block
        tasks = (job.rows + job.task_rows - 1) // job.task_rows
        if job.gate_scale != NULL:
            job.scaled = scratch
            st = _parallel(ctx, _silu_scale_task, tasks, &job)
        else:
            job.scaled = <float*>(job.gate + job.first * job.n)
        views[0] = views[1] = NULL
        if st == NULL:
            st = _view(<char*>job.scaled, 1, <int64_t>(job.rows * job.n), ELEM_FLOAT,
                       sizeof(float), &views[0])
        if st == NULL:
            st = _view(<char*>job.gelu, 1, <int64_t>(job.rows * job.n), ELEM_FLOAT,
                       sizeof(float), &views[1])
        if st == NULL:
            st = f.InvokeOp(ctx, k.op, <const OrtValue* const*>views, 1, &views[1], 1)
        for i in range(2):
            if views[i] != NULL:
                f.ReleaseValue(views[i])
        if st == NULL:
            st = _parallel(ctx, _silu_product_task, tasks, &job)
        job.first += job.rows
    return st


def row_products(const float[:, ::1] a, const float[:, ::1] b, const float[::1] factors,
                 int level=-1):
    """ScaledSiluMul's row kernels on ``[rows, n]`` matrices with one factor per row:
    ``(a * factor, a * (b * factor), a * b)``, each product rounded to float32 (for tests
    against NumPy). ``level``: 2 AVX-512, 1 AVX2, 0 scalar (-1: this CPU's best)."""
    import numpy as np

    if level < 0:
        level = _quant_level
    elif level > _quant_level:
        raise ValueError(f"this CPU runs level {_quant_level} at most, not {level}")
    cdef Py_ssize_t rows = a.shape[0], n = a.shape[1], r
    if b.shape[0] != rows or b.shape[1] != n or factors.shape[0] != rows:
        raise ValueError("a and b need the same shape, and factors one value per row")
    out = [np.empty((rows, n), np.float32) for _ in range(3)]
    cdef float[:, ::1] scaled = out[0]
    cdef float[:, ::1] gated = out[1]
    cdef float[:, ::1] plain = out[2]
    if n:
        with nogil:
            for r in range(rows):
                genai_scale_row(&a[r, 0], factors[r], &scaled[r, 0], <size_t>n, level)
                genai_gate_row(&a[r, 0], &b[r, 0], &factors[r], &gated[r, 0], <size_t>n, level)
                genai_gate_row(&a[r, 0], &b[r, 0], NULL, &plain[r, 0], <size_t>n, level)
    return tuple(out)


# --- StepRowsMatMulNBits ----------------------------------------------------------------------
# MatMulNBits' inputs A (float32 [..., K]), B (uint8 [N, K / 32, 16]), scales (float32,
# N * K / 32), zero_points (optional, uint8, N * ceil(K / 64)) and attributes (K, N; bits 4,
# block_size 32) -> Y (float32 [..., N]), every row with the numbers onnxruntime's MatMulNBits
# gives a run of that row alone at accuracy level 4 on AVX2 CPUs (step_rows_kernels.h): a
# speculative verify run then computes its rows as decoding's one-token steps did, in one pass
# over the weights. Parallel over blocks of columns.

cdef enum:
    STEP_INPUTS = 4
    STEP_COLUMNS = 32      # columns per parallel task
    # rows x columns x blocks below which a call runs on its own thread: ~100 us of work (a
    # decoder layer's linears for a few rows of a small model), where waking the pool's
    # threads cost more than they gave (2-core Zen 3, docs/benchmarks.md)
    STEP_PARALLEL_WORK = 262144
    IN_A = 0
    IN_B = 1
    IN_SCALES = 2
    IN_ZERO_POINTS = 3

cdef struct StepRows:
    int64_t k
    int64_t n

cdef struct StepJob:
    const GenaiStepRows* rows
    const uint8_t* b
    const float* scales
    const uint8_t* zp
    size_t n
    float* out


cdef const char* _step_name(const GenaiCustomOp* op) noexcept nogil:
    return _C_STEP_ROWS


cdef int _step_input_type(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return ELEM_UINT8 if index == IN_B or index == IN_ZERO_POINTS else ELEM_FLOAT


cdef size_t _step_input_count(const GenaiCustomOp* op) noexcept nogil:
    return STEP_INPUTS


cdef int _step_input_characteristic(const GenaiCustomOp* op, size_t index) noexcept nogil:
    return GENAI_IO_OPTIONAL if index == IN_ZERO_POINTS else GENAI_IO_REQUIRED


cdef OrtStatus* _step_attribute(const OrtKernelInfo* info, const char* name,
                                int64_t* value) noexcept nogil:
    cdef OrtStatus* st = _f.KernelInfoGetAttribute_int64(info, name, value)
    if st != NULL:
        _f.ReleaseStatus(st)
        return _error(ORT_INVALID_ARGUMENT, "StepRowsMatMulNBits needs MatMulNBits' int "
                      "attributes K, N, bits and block_size")
    return NULL


cdef OrtStatus* _step_create(const GenaiCustomOp* op, const void* api,
                             const OrtKernelInfo* info, void** out) noexcept nogil:
    cdef int64_t bits = 0, block = 0
    cdef StepRows* k = <StepRows*>calloc(1, sizeof(StepRows))
    if k == NULL:
        return _error(ORT_FAIL, "StepRowsMatMulNBits: out of memory")
    cdef OrtStatus* st = _step_attribute(info, "K", &k.k)
    if st == NULL:
        st = _step_attribute(info, "N", &k.n)
    if st == NULL:
        st = _step_attribute(info, "bits", &bits)
    if st == NULL:
        st = _step_attribute(info, "block_size", &block)
    if st == NULL and (bits != 4 or block != 32 or k.k <= 0 or k.n <= 0 or k.k % 32):
        st = _error(ORT_INVALID_ARGUMENT, "StepRowsMatMulNBits takes 4-bit weights in blocks "
                    "of 32 (K a positive multiple of 32, N positive)")
    if st != NULL:
        free(k)
        return st
    out[0] = k
    return NULL


cdef void _step_block(void* data, size_t index) noexcept nogil:
    cdef StepJob* job = <StepJob*>data
    cdef size_t first = index * STEP_COLUMNS
    cdef size_t last = first + STEP_COLUMNS
    if last > job.n:
        last = job.n
    genai_step_columns(job.rows, job.b, job.scales, job.zp, first, last, job.n, job.out,
                       _step_level)


cdef OrtStatus* _element_count(const OrtValue* value, int64_t expected,
                               const char* message) noexcept nogil:
    cdef int64_t dims[MAX_RANK]
    cdef size_t rank = 0, i
    cdef int64_t count = 1
    cdef OrtStatus* st = _shape(value, dims, &rank, message)
    if st != NULL:
        return st
    for i in range(rank):
        count *= dims[i]
    return NULL if count == expected else _error(ORT_INVALID_ARGUMENT, message)


@cython.cdivision(True)
cdef OrtStatus* _step_compute(void* kernel, OrtKernelContext* ctx) noexcept nogil:
    cdef StepRows* k = <StepRows*>kernel
    cdef const OrtFns* f = _f
    cdef const OrtValue* ins[STEP_INPUTS]
    cdef OrtValue* y = NULL
    cdef int64_t dims[MAX_RANK]
    cdef size_t rank = 0, i, tasks, blocks = <size_t>(k.k // 32)
    cdef StepJob job
    cdef OrtStatus* st = _inputs(ctx, ins, STEP_INPUTS)
    if st != NULL:
        return st
    if ins[IN_A] == NULL or ins[IN_B] == NULL or ins[IN_SCALES] == NULL:
        return _error(ORT_INVALID_ARGUMENT, "StepRowsMatMulNBits needs A, B and scales")
    st = _shape(ins[IN_A], dims, &rank, "StepRowsMatMulNBits: A has rank 1 to 8")
    if st == NULL and dims[rank - 1] != k.k:
        st = _error(ORT_INVALID_ARGUMENT, "StepRowsMatMulNBits: A's last dimension is not K")
    if st == NULL:
        st = _element_count(ins[IN_B], k.n * <int64_t>blocks * 16,
                            "StepRowsMatMulNBits: B does not hold N * K / 2 bytes")
    if st == NULL:
        st = _element_count(ins[IN_SCALES], k.n * <int64_t>blocks,
                            "StepRowsMatMulNBits: scales does not hold N * K / 32 values")
    if st == NULL and ins[IN_ZERO_POINTS] != NULL:
        st = _element_count(ins[IN_ZERO_POINTS], k.n * <int64_t>((blocks + 1) // 2),
                            "StepRowsMatMulNBits: zero_points does not hold "
                            "N * ceil(K / 64) bytes")
    if st != NULL:
        return st
    cdef size_t rows = 1
    for i in range(rank - 1):
        rows *= <size_t>dims[i]
    dims[rank - 1] = k.n
    st = f.KernelContext_GetOutput(ctx, 0, dims, rank, &y)
    if st != NULL or rows == 0:
        return st
    job.n = <size_t>k.n
    job.b = <const uint8_t*>_data(ins[IN_B])
    job.scales = <const float*>_data(ins[IN_SCALES])
    job.zp = NULL if ins[IN_ZERO_POINTS] == NULL else <const uint8_t*>_data(ins[IN_ZERO_POINTS])
    job.out = <float*>_data(y)
    # the rows quantised once, in one allocation
    cdef size_t k_len = <size_t>k.k
    cdef void* scratch = malloc(genai_step_rows_bytes(rows, k_len))
    if scratch == NULL:
        return _error(ORT_FAIL, "StepRowsMatMulNBits: out of memory")
    cdef GenaiStepRows prepared
    genai_step_rows_init(&prepared, scratch, rows, k_len)
    cdef const float* a = <const float*>_data(ins[IN_A])
    for i in range(rows):
        genai_step_prepare_row(&prepared, i, a + i * k_len, _step_level)
    job.rows = &prepared
    tasks = (job.n + STEP_COLUMNS - 1) // STEP_COLUMNS
    if (tasks > 1 and f.KernelContext_ParallelFor != NULL
            and rows * job.n * (k_len // 32) >= STEP_PARALLEL_WORK):
        st = f.KernelContext_ParallelFor(ctx, _step_block, tasks, 0, &job)
    else:
        for i in range(tasks):
            _step_block(&job, i)
    free(scratch)
    return st


def step_rows_level() -> int:
    """The StepRowsMatMulNBits kernel's code path on this CPU: 1 AVX2, 0 scalar."""
    return _step_level


def step_rows_matmul(const float[:, ::1] a, const uint8_t[:, :, ::1] b,
                     const float[:, ::1] scales, zero_points=None, int level=-1):
    """The StepRowsMatMulNBits kernel: ``a`` float32 [rows, K], ``b`` uint8 [N, K / 32, 16],
    ``scales`` float32 [N, K / 32], ``zero_points`` None or uint8 [N, ceil(K / 64)] ->
    float32 [rows, N] (for tests and its NumPy twin, `genai._core.reference`). ``level``: the
    code path, 1 AVX2, 0 scalar (-1: this CPU's, what the op runs; above it is refused)."""
    import numpy as np

    if level < 0:
        level = _step_level
    elif level > _step_level:
        raise ValueError(f"this CPU runs level {_step_level} at most, not {level}")
    cdef Py_ssize_t rows = a.shape[0], k = a.shape[1], n = b.shape[0], i
    cdef Py_ssize_t blocks = k // 32
    if k % 32 or k == 0 or b.shape[1] != blocks or b.shape[2] != 16:
        raise ValueError("a needs K a positive multiple of 32 columns and b [N, K / 32, 16]")
    if scales.shape[0] != n or scales.shape[1] != blocks:
        raise ValueError("scales needs the shape [N, K / 32]")
    cdef const uint8_t[:, ::1] zp
    cdef const uint8_t* zp_data = NULL
    if zero_points is not None:
        zp = zero_points
        if zp.shape[0] != n or zp.shape[1] != (blocks + 1) // 2:
            raise ValueError("zero_points needs the shape [N, ceil(K / 64)]")
        zp_data = &zp[0, 0]
    out = np.empty((rows, n), np.float32)
    cdef float[:, ::1] y = out
    scratch_array = np.empty(genai_step_rows_bytes(<size_t>rows, <size_t>k) + 1, np.uint8)
    cdef uint8_t[::1] scratch = scratch_array
    cdef GenaiStepRows prepared
    if rows and n:
        with nogil:
            genai_step_rows_init(&prepared, &scratch[0], <size_t>rows, <size_t>k)
            for i in range(rows):
                genai_step_prepare_row(&prepared, <size_t>i, &a[i, 0], level)
            genai_step_columns(&prepared, &b[0, 0, 0], &scales[0, 0], zp_data, 0, <size_t>n,
                               <size_t>n, &y[0, 0], level)
    return out


ctypedef const char* (*_NameFn)(const GenaiCustomOp* op) noexcept nogil
ctypedef int (*_IndexFn)(const GenaiCustomOp* op, size_t index) noexcept nogil
ctypedef size_t (*_CountFn)(const GenaiCustomOp* op) noexcept nogil
ctypedef void (*_DestroyFn)(void* kernel) noexcept nogil
ctypedef OrtStatus* (*_CreateFn)(const GenaiCustomOp* op, const void* api,
                                 const OrtKernelInfo* info, void** out) noexcept nogil
ctypedef OrtStatus* (*_ComputeFn)(void* kernel, OrtKernelContext* ctx) noexcept nogil


cdef void _fill(GenaiCustomOp* op, _NameFn name, _IndexFn input_type, _CountFn inputs,
                _IndexFn output_type, _CountFn outputs, _IndexFn input_kind,
                _IndexFn output_kind, _CreateFn create, _ComputeFn compute,
                _DestroyFn destroy) noexcept:
    """An op's callback table: its own callbacks, and those every genai op shares (CPU, default
    memory, no variadic inputs)."""
    op.version = GENAI_CUSTOM_OP_VERSION
    op.CreateKernel = NULL
    op.GetExecutionProviderType = _provider
    op.KernelCompute = NULL
    op.GetInputMemoryType = _memory_type
    op.GetVariadicInputMinArity = _one
    op.GetVariadicInputHomogeneity = _one
    op.GetVariadicOutputMinArity = _one
    op.GetVariadicOutputHomogeneity = _one
    op.GetName = name
    op.GetInputType = input_type
    op.GetInputTypeCount = inputs
    op.GetOutputType = output_type
    op.GetOutputTypeCount = outputs
    op.GetInputCharacteristic = input_kind
    op.GetOutputCharacteristic = output_kind
    op.CreateKernelV2 = create
    op.KernelComputeV2 = compute
    op.KernelDestroy = destroy


cdef int add_genai_ops(OrtSessionOptions* options) except -1:
    global _f, _cpu, _domain
    cdef OrtCustomOpDomain* domain = NULL
    if _domain == NULL:
        _f = ort_fns()
        if _cpu == NULL:
            check_status(_f.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &_cpu),
                         "CreateCpuMemoryInfo")
        _fill(&_op, _name, _input_type, _input_count, _output_type, _output_count,
              _input_characteristic, _output_characteristic, _create, _compute, _destroy)
        _fill(&_quantize_op, _quantize_name, _float_type, _one_count, _quantize_output_type,
              _two_count, _required, _required, _quantize_create, _quantize_compute,
              _quantize_destroy)
        _fill(&_silu_op, _silu_name, _float_type, _silu_input_count, _silu_output_type,
              _three_count, _silu_input_characteristic, _optional, _silu_create,
              _silu_compute, _destroy)
        _fill(&_rows_matmul_op, _rows_matmul_name, _float_type, _two_count, _float_type,
              _one_count, _required, _required, _rows_matmul_create, _rows_matmul_compute,
              _destroy)
        _fill(&_step_rows_op, _step_name, _step_input_type, _step_input_count, _float_type,
              _one_count, _step_input_characteristic, _required, _step_create, _step_compute,
              _quantize_destroy)
        check_status(_f.CreateCustomOpDomain(_C_DOMAIN, &domain), "CreateCustomOpDomain")
        check_status(_f.CustomOpDomain_Add(domain, &_op), "CustomOpDomain_Add")
        check_status(_f.CustomOpDomain_Add(domain, &_quantize_op), "CustomOpDomain_Add")
        check_status(_f.CustomOpDomain_Add(domain, &_silu_op), "CustomOpDomain_Add")
        check_status(_f.CustomOpDomain_Add(domain, &_step_rows_op), "CustomOpDomain_Add")
        check_status(_f.CustomOpDomain_Add(domain, &_rows_matmul_op), "CustomOpDomain_Add")
        _domain = domain
    check_status(_f.AddCustomOpDomain(options, _domain), "AddCustomOpDomain")
    return 0
