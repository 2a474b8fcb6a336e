"""Constrained decoding: a token mask per batch row from a JSON schema, a regex or a Lark grammar.

`TokenConstraint` wraps one `llguidance.LLMatcher` built over the model's ``tokenizer.json``
(as onnxruntime-genai's ``set_guidance`` does). The generator calls, for every row of every step:

1. `TokenConstraint.fill_mask` on the row's logits: disallowed ids become the lowest float
   (the first stage of the logits chain, before min_length, penalties and the choice);
2. `TokenConstraint.advance` with the chosen token: the matcher consumes it and, when
   fast-forward is on, returns the tokens the grammar forces next.

Once the grammar is complete (`TokenConstraint.is_finished`) the mask allows only the
end-of-sequence token, as the reference: the row then ends with EOS.

The next mask is computed on a worker thread as soon as a token is consumed, so with the
generator's order (advance, run the model, fill the mask) llguidance's work overlaps the model
run instead of adding to it (llguidance releases the GIL while it computes).

``llguidance`` is an optional dependency (``pip install genai-runtime[guidance]``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from genai.errors import ArgumentTypeError, GenaiError, InvalidArgumentError
from genai.text.token_bytes import TokenBytes

if TYPE_CHECKING:
    from genai.text.tokenizer import Tokenizer

__all__ = [
    "GUIDANCE_TYPES",
    "LOWEST",
    "GrammarLookahead",
    "GuidanceError",
    "TokenConstraint",
    "apply_bitmask",
    "check_guidance",
    "load_llguidance",
]

#: The guidance types onnxruntime-genai accepts, in its order.
GUIDANCE_TYPES = ("json_schema", "regex", "lark_grammar")

#: Value written to disallowed logits (the reference's ``numeric_limits<float>::lowest()``).
LOWEST = float(np.finfo(np.float32).min)

_TOKENIZERS: dict[tuple[str, int, int], Any] = {}
_TOKENIZERS_LOCK = threading.Lock()
_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


_LOWEST_BITS = np.float32(LOWEST).view(np.uint32)


def apply_bitmask(logits_row: np.ndarray, bitmask: np.ndarray) -> None:
    """Set the ids whose bit is clear in ``bitmask`` (int32 [ceil(vocab / 32)], llguidance's
    layout: bit j of word w is id 32 w + j) to the lowest float in ``logits_row`` (float32
    [vocab], contiguous), in place.

    Branch-free over the whole row (a handful of NumPy passes, ~50 us at vocab 49152 on a slow
    core, whatever the mask): each bit becomes a 32-bit AND mask that keeps an allowed logit
    and clears a banned one, whose bits are then OR-ed with those of the lowest float.
    """
    vocab = logits_row.shape[0]
    keep = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab].astype(np.uint32)
    np.negative(keep, out=keep)  # 1 -> 0xFFFFFFFF, 0 -> 0
    as_bits = logits_row.view(np.uint32)
    as_bits &= keep
    np.invert(keep, out=keep)
    keep &= _LOWEST_BITS
    as_bits |= keep


def _fill_row(matcher: Any, bits: np.ndarray, logits_row: np.ndarray, eos_token_id: int) -> None:
    """Mask ``logits_row`` by ``matcher``'s state: only EOS once it stopped, else the ids
    whose bit is set in ``bits`` (its mask, computed already when it did not stop)."""
    if matcher.is_stopped():
        eos = logits_row[eos_token_id]
        logits_row.fill(LOWEST)
        logits_row[eos_token_id] = eos
        return
    apply_bitmask(logits_row, bits)


class GuidanceError(GenaiError, ValueError):
    """Bad guidance: unknown type, invalid schema / regex / grammar, or a token the grammar
    does not allow."""


def load_llguidance() -> Any:
    """Import ``llguidance`` or explain how to install it."""
    try:
        import llguidance  # lazy: llguidance is the optional 'guidance' extra
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "constrained decoding needs llguidance: pip install 'genai-runtime[guidance]'"
        ) from exc
    return llguidance


def _grammar(kind: str, data: str) -> str:
    """The llguidance grammar (JSON string) for ``kind`` / ``data``; raises `GuidanceError`."""
    llg = load_llguidance()
    if not isinstance(kind, str) or kind not in GUIDANCE_TYPES:
        raise GuidanceError(
            f"unsupported guidance type {kind!r} (only json_schema, regex and lark_grammar are "
            "supported)"
        )
    if not isinstance(data, str):
        raise ArgumentTypeError(f"guidance data must be a str, got {type(data).__name__}")
    if not data:
        raise GuidanceError(f"{kind} guidance needs non-empty data")
    if kind == "json_schema":
        try:
            schema = json.loads(data)
        except json.JSONDecodeError as exc:
            raise GuidanceError(f"json_schema guidance is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise GuidanceError("json_schema guidance must be a JSON object")
        return llg.LLMatcher.grammar_from_json_schema(data)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(data)
    return llg.LLMatcher.grammar_from_lark(data)


def check_guidance(kind: str, data: str, tokenizer: Any | None = None) -> str:
    """Validate guidance without a model: returns the llguidance grammar, raises
    `GuidanceError` with llguidance's message for an invalid schema, regex or grammar."""
    grammar = _grammar(kind, data)
    llg = load_llguidance()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise GuidanceError(f"invalid {kind} guidance: {messages[0] if messages else grammar}")
    return grammar


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="genai-guidance")
        return _EXECUTOR


def llg_tokenizer(path: str | Path, vocab_size: int, eos_token_id: int) -> Any:
    """The `llguidance.LLTokenizer` of a ``tokenizer.json`` (built once per file, vocabulary
    size and EOS id: building one takes a few hundred milliseconds).

    llguidance reads the file itself, as the reference does; a file whose decoder it does not
    recognise (e.g. a bare ``Replace`` + ``Fuse`` sequence) is read through `tokenizers`
    instead, with each token's bytes taken from its vocabulary entry (see `TokenBytes`).
    """
    key = (str(Path(path).resolve()), int(vocab_size), int(eos_token_id))
    with _TOKENIZERS_LOCK:
        found = _TOKENIZERS.get(key)
        if found is None:
            llg = load_llguidance()
            try:
                found = llg.LLTokenizer(key[0], n_vocab=key[1], eos_token=key[2])
            except ValueError:
                found = _wrapped_tokenizer(Path(key[0]), key[1], key[2])
            _TOKENIZERS[key] = found
        return found


def _wrapped_tokenizer(file: Path, vocab_size: int, eos_token_id: int) -> Any:
    """An LLTokenizer over `tokenizers` for a tokenizer.json llguidance cannot read."""
    llg = load_llguidance()
    hf = HFTokenizer.from_file(str(file))
    token_bytes = TokenBytes(hf)
    special = token_bytes.special_ids
    tokens = [token_bytes(i) for i in range(vocab_size)]

    class _Vocabulary:
        def __init__(self) -> None:
            self.eos_token_id = eos_token_id
            self.bos_token_id = None
            self.special_token_ids = sorted(i for i in special if i < vocab_size)
            self.tokens = tokens

        def __call__(self, text: str) -> list[int]:
            if not isinstance(text, str):
                raise ArgumentTypeError("text only")
            return hf.encode(text, add_special_tokens=False).ids

    return llg.LLTokenizer(
        llg.TokenizerWrapper(_Vocabulary()), n_vocab=vocab_size, eos_token=eos_token_id
    )


class TokenConstraint:
    """The token constraint of one batch row: which tokens may come next.

    Create with `create`; then per step `fill_mask` (before the choice) and `advance` (with
    the chosen token). Not thread-safe: one row, one caller.
    """

    #: Compute the next mask on a worker thread as soon as a token is consumed (True), or in
    #: `fill_mask` (False).
    overlap = True

    def __init__(
        self,
        matcher: Any,
        vocab_size: int,
        eos_token_id: int,
        *,
        kind: str = "",
        enable_ff_tokens: bool = False,
    ) -> None:
        self._matcher = matcher
        self.kind = kind
        self.vocab_size = int(vocab_size)
        self.eos_token_id = int(eos_token_id)
        self.enable_ff_tokens = bool(enable_ff_tokens)
        self._bits = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self._pending: Future[None] | None = None
        self._stale = True  # _bits is not the mask of the current state yet
        self._ended = False  # EOS consumed: nothing may follow
        self._consumed = 0  # tokens consumed since the start (or the last reset)
        self._start_mask()

    @classmethod
    def create(
        cls,
        tokenizer: Tokenizer,
        kind: str,
        data: str,
        *,
        enable_ff_tokens: bool = False,
        vocab_size: int | None = None,
        eos_token_id: int | None = None,
    ) -> TokenConstraint:
        """A constraint over ``tokenizer``'s vocabulary (its folder's ``tokenizer.json``).

        ``kind``: ``json_schema`` (a JSON schema as a string), ``regex`` or ``lark_grammar``
        (llguidance's Lark dialect). ``vocab_size`` (default: the tokenizer's, i.e. the
        model's) and ``eos_token_id`` (default: the first EOS id, the token allowed once the
        grammar is complete) may be overridden. Raises `GuidanceError` with llguidance's
        message for an invalid schema, regex or grammar.
        """
        file = Path(tokenizer.path) / "tokenizer.json"
        if not file.is_file():
            raise GuidanceError(f"guidance needs the model's tokenizer.json; {file} is missing")
        vocab = int(vocab_size if vocab_size is not None else tokenizer.vocab_size)
        eos = int(eos_token_id if eos_token_id is not None else tokenizer.eos_token_ids[0])
        return cls.from_llg_tokenizer(
            llg_tokenizer(file, vocab, eos), kind, data, enable_ff_tokens=enable_ff_tokens
        )

    @classmethod
    def from_llg_tokenizer(
        cls, llg_tok: Any, kind: str, data: str, *, enable_ff_tokens: bool = False
    ) -> TokenConstraint:
        """A constraint over an existing `llguidance.LLTokenizer` (its vocabulary size and EOS
        token are used)."""
        llg = load_llguidance()
        grammar = _grammar(kind, data)
        matcher = llg.LLMatcher(llg_tok, grammar, log_level=0)
        if matcher.is_error():
            raise GuidanceError(f"invalid {kind} guidance: {matcher.get_error()}")
        return cls(
            matcher,
            llg_tok.vocab_size,
            llg_tok.eos_token,
            kind=kind,
            enable_ff_tokens=enable_ff_tokens,
        )

    # --- the mask ----------------------------------------------------------------------------
    def _compute(self) -> None:
        # llguidance releases the GIL while it computes: this overlaps the model run
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def _start_mask(self) -> None:
        self._stale = not self._matcher.is_stopped()
        if self._stale and self.overlap:
            # RuntimeError: the interpreter is shutting down (a thread outlives main) and makes
            # no new threads; `_ensure_mask` then computes the mask on this one
            with contextlib.suppress(RuntimeError):
                self._pending = _executor().submit(self._compute)

    def _wait(self) -> None:
        """Wait for a mask computation in flight (before the matcher is touched)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
            self._stale = False

    def _ensure_mask(self) -> None:
        self._wait()
        if self._stale:
            self._compute()
            self._stale = False

    def allowed_tokens(self) -> np.ndarray:
        """The ids allowed next, int64 ascending (for tests and debugging)."""
        row = np.zeros(self.vocab_size, dtype=np.float32)
        self.fill_mask(row)
        return np.flatnonzero(row != LOWEST)

    def fill_mask(self, logits_row: np.ndarray) -> None:
        """Set every disallowed id of ``logits_row`` (float32 [vocab], writable) to the lowest
        float, in place. Once the grammar is complete only the EOS token stays allowed."""
        if logits_row.shape != (self.vocab_size,):
            raise InvalidArgumentError(
                f"logits row must have shape ({self.vocab_size},), got {logits_row.shape}"
            )
        if self._ended:
            raise GuidanceError("the constrained sequence already ended with EOS")
        self._ensure_mask()
        matcher = self._matcher
        if matcher.is_error():
            raise GuidanceError(f"guidance failed: {matcher.get_error()}")
        _fill_row(matcher, self._bits, logits_row, self.eos_token_id)

    # --- consuming tokens --------------------------------------------------------------------
    def advance(self, token: int) -> list[int]:
        """Consume the chosen ``token``; returns the tokens the grammar forces next when
        fast-forward is enabled (already consumed here: append them to the sequence), else
        ``[]``. Raises `GuidanceError` if the grammar does not allow ``token``."""
        self._wait()
        matcher = self._matcher
        token = int(token)
        if self._ended:
            raise GuidanceError("the constrained sequence already ended with EOS")
        if token == self.eos_token_id and matcher.is_stopped():
            self._ended = True  # the matcher ignores it (not one of its tokens)
            return []
        self._consumed += 1
        if not matcher.consume_token(token):
            error = matcher.get_error()
            message = error.splitlines()[0] if error else ""
            if not self._stale and not self._bits.any():  # the mask of that step was empty
                message = (
                    "the grammar allows no token of this vocabulary here (it needs text the "
                    f"tokenizer cannot produce); {message}"
                )
            raise GuidanceError(
                f"token {token} is not allowed by the {self.kind or 'guidance'} grammar: {message}"
            )
        if token == self.eos_token_id:
            self._ended = True
            return []
        forced: list[int] = []
        if self.enable_ff_tokens and not matcher.is_stopped():
            forced = [int(t) for t in matcher.compute_ff_tokens()]
            if forced and not matcher.consume_tokens(forced):
                raise GuidanceError(f"guidance failed: {matcher.get_error()}")
            self._consumed += len(forced)
        self._start_mask()
        return forced

    def continue_proposal(self, tokens: Sequence[int], limit: int) -> tuple[list[int], int, bool]:
        """A speculative proposal as the grammar continues it, nothing consumed: the longest
        prefix of ``tokens`` it allows, and with fast-forward on, after the first of them that
        leaves tokens forced (or before any, when tokens are forced now) those forced tokens
        instead of the rest; at most ``limit``. Returns (the proposal, how many of ``tokens``
        it keeps, True when the grammar refused one of them)."""
        tokens = [int(t) for t in tokens[:limit]]
        if self._ended or limit <= 0:
            return [], 0, bool(tokens)
        self._wait()
        matcher = self._matcher
        if not self.enable_ff_tokens or matcher.is_stopped():
            kept = int(matcher.validate_tokens(tokens)) if tokens else 0
            return tokens[:kept], kept, kept < len(tokens)
        forced = [int(t) for t in matcher.compute_ff_tokens()]
        if forced:
            return forced[:limit], 0, False
        clone = matcher.deep_copy()
        out: list[int] = []
        for token in tokens:
            if not clone.consume_token(token):
                return out, len(out), True
            out.append(token)
            if clone.is_stopped():
                break
            forced = [int(t) for t in clone.compute_ff_tokens()]
            if forced:
                kept = len(out)
                return (out + forced)[:limit], kept, False
        return out, len(out), False

    def lookahead(self) -> GrammarLookahead:
        """A copy of the grammar's state that a speculative proposal walks forward (masking a
        draft model's rows, consuming its choices), this constraint left as it is."""
        self._wait()
        return GrammarLookahead(self._matcher.deep_copy(), self, self._ended)

    def mark(self) -> tuple[int, bool]:
        """The state so far, for `restore` (tokens consumed, ended with EOS)."""
        return self._consumed, self._ended

    def restore(self, mark: tuple[int, bool]) -> None:
        """Go back to ``mark`` (from `mark`, with tokens consumed since): undoes the tokens
        of a speculative round that were not emitted, forced ones included."""
        consumed, ended = mark
        count = self._consumed - consumed
        if count < 0:
            raise GuidanceError(f"cannot restore to {consumed} consumed tokens: {self._consumed}")
        self._wait()
        if count and not self._matcher.rollback(count):
            raise GuidanceError(f"guidance rollback failed: {self._matcher.get_error()}")
        self._consumed, self._ended = consumed, ended
        self._start_mask()

    @property
    def is_finished(self) -> bool:
        """True once the grammar is complete: no token but EOS may follow (stop this row)."""
        self._wait()
        return self._ended or self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """True when the text so far is a complete match (EOS would be allowed)."""
        self._wait()
        return bool(self._matcher.is_accepting())

    def reset(self) -> None:
        """Back to the start of the grammar (a new sequence)."""
        if self._consumed == 0:  # already there (its first mask may be on its way)
            return
        self._consumed = 0
        self._wait()
        self._matcher.reset()
        self._ended = False
        self._start_mask()

    def close(self) -> None:
        """Wait for a mask computation still running (call before dropping the constraint
        mid-computation, e.g. in tests that count threads)."""
        self._wait()


class GrammarLookahead:
    """A `TokenConstraint`'s grammar copied for a speculative proposal (`TokenConstraint.
    lookahead`): `forced` gives the tokens forced now, `fill_mask` masks a proposer's logits
    row, `advance` consumes its choice. Masks are computed when asked, on the caller's
    thread."""

    def __init__(self, matcher: Any, constraint: TokenConstraint, ended: bool) -> None:
        self._matcher = matcher
        self.vocab_size = constraint.vocab_size
        self.eos_token_id = constraint.eos_token_id
        self._fast_forward = constraint.enable_ff_tokens
        self._bits = np.zeros_like(constraint._bits)
        #: no token may follow (the sequence ended with EOS, or the grammar refused one)
        self.ended = ended

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (fast-forward on), consumed here; [] else."""
        matcher = self._matcher
        if self.ended or not self._fast_forward or matcher.is_stopped():
            return []
        forced = [int(t) for t in matcher.compute_ff_tokens()]
        if forced and not matcher.consume_tokens(forced):
            self.ended = True
            return []
        return forced

    def fill_mask(self, logits_row: np.ndarray) -> None:
        """Set the ids the grammar does not allow next in ``logits_row`` (float32, at least
        the grammar's vocabulary; ids past it are never allowed) to the lowest float; once
        the grammar is complete only EOS stays."""
        matcher = self._matcher
        vocab = self.vocab_size
        if logits_row.shape[0] > vocab:
            logits_row[vocab:] = LOWEST
        if not matcher.is_stopped():
            matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        _fill_row(matcher, self._bits, logits_row[:vocab], self.eos_token_id)

    def advance(self, token: int) -> list[int]:
        """Consume ``token``; returns the tokens the grammar then forces (`forced`). EOS, or
        a token the grammar refuses, ends the lookahead."""
        if self.ended:
            return []
        if int(token) == self.eos_token_id or not self._matcher.consume_token(int(token)):
            self.ended = True
            return []
        return self.forced()
