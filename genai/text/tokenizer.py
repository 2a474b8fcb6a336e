"""Tokenizer and streaming detokenizer with the reference engine's Python API.

``Tokenizer`` wraps a Hugging Face ``tokenizers`` tokenizer loaded from ``tokenizer.json`` in the
model folder, takes its special token ids from the model configuration, and renders chat
templates with :mod:`genai.text.chat_template`. A SentencePiece-style BPE file without a
pre-tokenizer (Llama 2, Mistral, Phi-3) is encoded as the reference reads it (`_SpmEncoder`), not
as ``tokenizers`` does. ``TokenizerStream`` turns generated token ids into
text chunks one token at a time without ever splitting a UTF-8 character.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np
from tokenizers import Regex as _HFRegex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import pre_tokenizers as _hf_pre_tokenizers
from tokenizers.models import BPE as _HFBPE

from genai.boolean_words import parse_bool_word
from genai.compat.tensors import TensorArray
from genai.errors import ArgumentTypeError, InvalidArgumentError, ModelError
from genai.text.chat_template import (
    ChatTemplateError,
    load_chat_template,
    load_tokenizer_config,
    parse_tools,
    read_json_object,
    render_chat_template,
    special_token_strings,
)
from genai.text.token_bytes import TokenBytes

if TYPE_CHECKING:
    import numpy.typing as npt

    from genai.runtime.config import Config
    from genai.runtime.model import Model

__all__ = ["ChatTemplateError", "Tokenizer", "TokenizerStream"]

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
GENAI_CONFIG_FILE = "genai_config.json"

_REPLACEMENT = "\ufffd"
_OPTION_NAMES = ("add_special_tokens", "skip_special_tokens")


_SPM_SPACE = "\u2581"
#: The pre-tokenizer pattern the reference (onnxruntime-extensions) applies to a SentencePiece-style
#: BPE tokenizer.json that has no pre_tokenizer (Llama 3's pattern).
_SPM_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Whitespace an added token's ``lstrip``/``rstrip`` takes from the text beside it (reference).
_STRIP_CHARS = " \n\r\t"
#: Characters at which the reference's character-level SentencePiece path may end a chunk.
_SPM_SPLIT_CHARS = frozenset(" \n\r" + _SPM_SPACE)


class _SpmEncoder:
    """Encodes as the reference does a SentencePiece-style BPE ``tokenizer.json`` without a
    ``pre_tokenizer`` (Llama 2, Mistral, Phi-3 conversions), which ``tokenizers`` reads differently.

    The reference recognises such a file by its decoder (a ``Replace`` of ``▁`` by a space; a
    ``Strip`` of one leading space means a ``▁`` is prepended to each text segment) and ignores
    the normalizer. Between added tokens, a segment that does not start with a space is split
    with Llama 3's regex (on the raw text, spaces becoming ``▁`` afterwards), and each piece
    that is a vocabulary entry is taken whole, others are merged by BPE with byte fallback.
    A segment that starts with a space (when a ``▁`` is prepended) is merged character by
    character in chunks that end before a space once more than 10 symbols are pending (any
    symbol past 100). ``tokenizers`` instead merges the whole normalized text as one word, which
    differs for e.g. ``"'ming"``, runs of spaces before symbols, U+00A0 or a literal ``▁``.
    """

    def __init__(self, hf: _HFTokenizer, add_dummy_prefix: bool) -> None:
        self._hf = hf
        # The same BPE model without normalizer, pre-tokenizer or added tokens: each input
        # string is merged as one word.
        self._bpe = _HFTokenizer(hf.model)
        self._split = _hf_pre_tokenizers.Split(_HFRegex(_SPM_SPLIT_PATTERN), "isolated")
        self._add_dummy_prefix = add_dummy_prefix
        added = sorted(hf.get_added_tokens_decoder().items())
        self._added = {tok.content: (i, tok.lstrip, tok.rstrip) for i, tok in added if tok.content}
        contents = sorted(self._added, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, contents))) if contents else None

    @classmethod
    def for_tokenizer(
        cls, hf: _HFTokenizer, tokenizer_config: Mapping[str, Any]
    ) -> _SpmEncoder | None:
        """The encoder for a tokenizer the reference reads as SentencePiece-style BPE without a
        pre-tokenizer, else ``None`` (``tokenizers`` and the reference agree)."""
        if hf.pre_tokenizer is not None or not isinstance(hf.model, _HFBPE):
            return None
        tokenizer_class = str(tokenizer_config.get("tokenizer_class") or "")
        if tokenizer_class.split("Tokenizer")[0] == "Gemma":
            return None  # the reference merges Gemma's text character by character, as here
        decoder = json.loads(hf.decoder.__getstate__()) if hf.decoder is not None else None
        steps = decoder.get("decoders") if isinstance(decoder, Mapping) else None
        if not isinstance(steps, list):
            return None
        spm = prefix = False
        for step in steps:
            if not isinstance(step, Mapping):
                continue
            kind = step.get("type")
            pattern = step.get("pattern")
            if kind == "Replace" and isinstance(pattern, Mapping):
                spm = spm or pattern.get("String") == _SPM_SPACE
            elif kind == "Metaspace":
                spm = spm or step.get("replacement") == _SPM_SPACE
                prefix = prefix or bool(step.get("add_prefix_space", False))
            elif kind == "Strip":
                prefix = prefix or step.get("content") == " "
        return cls(hf, prefix) if spm else None

    def _segments(self, text: str) -> list[str | int]:
        """``text`` split at added tokens: text pieces and the added tokens' ids."""
        if self._added_re is None:
            return [text] if text else []
        out: list[str | int] = []
        pos = 0
        strip_next = False
        for match in self._added_re.finditer(text):
            token_id, lstrip, rstrip = self._added[match.group()]
            piece = text[pos : match.start()]
            if strip_next:
                piece = piece.lstrip(_STRIP_CHARS)
            if lstrip:
                piece = piece.rstrip(_STRIP_CHARS)
            if piece:
                out.append(piece)
            out.append(token_id)
            pos = match.end()
            strip_next = rstrip
        piece = text[pos:]
        if strip_next:
            piece = piece.lstrip(_STRIP_CHARS)
        if piece:
            out.append(piece)
        return out

    def _chunks(self, text: str) -> list[str]:
        """The reference's chunks of a segment it merges character by character."""
        chunks: list[str] = []
        start = symbols = 0
        for pos, char in enumerate(text):
            if symbols > 10 and (
                (text[pos - 1] not in _SPM_SPLIT_CHARS and char in _SPM_SPLIT_CHARS)
                or symbols > 100
            ):
                chunks.append(text[start:pos])
                start, symbols = pos, 0
            if ord(char) < 128 or self._hf.token_to_id(char) is not None:
                symbols += 1
            else:
                symbols += len(char.encode())  # one byte-fallback symbol per UTF-8 byte
        if start < len(text):
            chunks.append(text[start:])
        return chunks

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS)."""
        ids: list[int] = []
        for segment in self._segments(text):
            if isinstance(segment, int):
                ids.append(segment)
                continue
            whole = False
            if self._add_dummy_prefix:
                whole = segment.startswith(" ")
                segment = _SPM_SPACE + segment
            if whole:
                words = [w.replace(" ", _SPM_SPACE) for w in self._chunks(segment)]
                found: list[int | None] = [None] * len(words)
            else:
                pieces = self._split.pre_tokenize_str(segment)
                words = [w.replace(" ", _SPM_SPACE) for w, _ in pieces]
                found = [self._hf.token_to_id(w) for w in words]  # vocabulary entries whole
            merged = iter(
                self._bpe.encode_batch(
                    [w for w, f in zip(words, found, strict=True) if f is None],
                    add_special_tokens=False,
                )
            )
            for token_id in found:
                ids.extend(next(merged).ids if token_id is None else [token_id])
        return ids


class _FolderConfig:
    """The few ``genai_config.json`` keys a tokenizer needs, for a bare model folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        file = path / GENAI_CONFIG_FILE
        self._data: dict[str, Any] = read_json_object(file)
        self.has_genai_config = file.is_file()

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self._data
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node


def _resolve_config(model: Any) -> tuple[Path, Any, bool]:
    """Return (folder, config, has_model_config) for a model, a config or a folder path."""
    if isinstance(model, (str, os.PathLike)):
        folder = Path(model)
        if not folder.is_dir():
            raise FileNotFoundError(f"model folder not found: {folder}")
        config = _FolderConfig(folder)
        tokenizer_dir = config.get("model.tokenizer_dir")
        if tokenizer_dir:  # relative to the model folder (genai.Config.tokenizer_folder)
            folder = (folder / str(tokenizer_dir)).resolve()
        return folder, config, config.has_genai_config
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get"):
        config = model
    if not hasattr(config, "get") or not hasattr(config, "path"):
        raise ArgumentTypeError(
            "Tokenizer expects a Model (with .config), a Config (with .path and .get) "
            f"or a model folder path, not {type(model).__name__}"
        )
    folder = Path(getattr(config, "tokenizer_folder", config.path))  # model.tokenizer_dir
    if folder.is_file():  # a path to genai_config.json itself
        folder = folder.parent
    return folder, config, True


def _as_bool_option(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, str) and (word := parse_bool_word(value)) is not None:
        return word
    raise InvalidArgumentError(
        f"tokenizer option {name!r} must be a boolean or 'true'/'false', not {value!r}"
    )


#: Delimiter tokens a model's config may name (``model.bot_token_id`` ...): tool call begin/end
#: and reasoning begin/end. Property name -> config key.
DELIMITER_TOKEN_KEYS = {
    "bot_token_id": "model.bot_token_id",
    "eot_token_id": "model.eot_token_id",
    "bor_token_id": "model.bor_token_id",
    "eor_token_id": "model.eor_token_id",
}

#: The reference's defaults for configs written before those keys existed, by ``model.type``:
#: the token each id stands for. The reference hard-codes the ids (Qwen's and Phi-4-mini's);
#: here the token is looked up in the model's own vocabulary, so a tokenizer without it has
#: no default instead of a wrong id.
DELIMITER_TOKEN_DEFAULTS: dict[str, dict[str, str]] = {
    "qwen2": {"bot_token_id": "<tool_call>", "eot_token_id": "</tool_call>"},
    "qwen3": {
        "bot_token_id": "<tool_call>",
        "eot_token_id": "</tool_call>",
        "bor_token_id": "<think>",
        "eor_token_id": "</think>",
    },
    "phi3": {"bot_token_id": "<|tool_call|>", "eot_token_id": "<|/tool_call|>"},
}


def _int_or_none(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{key} must be an integer, not {value!r}")
    return int(value)


def _check_unicode(text: str, what: str) -> None:
    """`InvalidArgumentError` when ``text`` cannot be UTF-8 (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not valid Unicode: {exc.reason} at index {exc.start} "
            f"({text[exc.start : exc.end]!r})"
        ) from None


def _one_token_id(token: Any, what: str) -> int:
    """``token`` (an int, a NumPy integer or a 0-d integer array) as an int; else
    `ArgumentTypeError` naming ``what`` (a bool is no token id)."""
    if isinstance(token, np.ndarray) and token.ndim == 0 and token.dtype.kind in "iu":
        token = int(token)
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
        raise ArgumentTypeError(f"{what} expects one int token id, not {type(token).__name__}")
    return int(token)


def _is_id_sequence(value: Any) -> bool:
    """Whether ``value`` may hold token ids: an array, an array-like or a sequence that is
    not text (``None``, a number, a str or a dict is not)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)):
        return False
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, Sequence) or (
        hasattr(value, "__array__") and not isinstance(value, np.generic)
    )


class Tokenizer:
    """Text <-> token ids for a model folder, API-compatible with ``onnxruntime_genai.Tokenizer``.

    ``model`` is a model object with a ``.config`` attribute, a config object (``.path`` and
    ``.get("model.eos_token_id")``-style lookups), or the path of a model folder. The folder
    must contain ``tokenizer.json``; ``tokenizer_config.json`` and ``chat_template.jinja`` are
    optional.
    """

    def __init__(self, model: Model | Config | str | os.PathLike[str]) -> None:
        folder, config, has_model_config = _resolve_config(model)
        self._path = folder
        file = folder / TOKENIZER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        try:
            self._hf = _HFTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise InvalidArgumentError(f"cannot load {file}: {exc}") from exc
        self._tokenizer_config = load_tokenizer_config(folder)
        self._spm = _SpmEncoder.for_tokenizer(self._hf, self._tokenizer_config)
        self._lock = threading.Lock()
        self._token_bytes: TokenBytes | None = None  # built on first use
        #: whether the model's prompts hold negative image placeholder ids (Phi-3 Vision)
        self._placeholder_ids = has_model_config and config.get("model.type") == "phi3v"
        self._add_special_tokens = False
        self._skip_special_tokens = True

        added = self._hf.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._known_size = max(
            [self._hf.get_vocab_size(with_added_tokens=True), *(i + 1 for i in added)]
        )
        self._load_special_ids(config, has_model_config)
        log.debug("tokenizer loaded from %s (%d tokens)", file, self._known_size)

    # -- configuration ----------------------------------------------------------------------

    def _token_id_of(self, key: str) -> int | None:
        value = self._tokenizer_config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if not isinstance(value, str):
            return None
        return self._hf.token_to_id(value)

    def _load_special_ids(self, config: Any, has_model_config: bool) -> None:
        if has_model_config:
            bos = _int_or_none(config.get("model.bos_token_id"), "model.bos_token_id")
            pad = _int_or_none(config.get("model.pad_token_id"), "model.pad_token_id")
            eos_value = config.get("model.eos_token_id")
            vocab = _int_or_none(config.get("model.vocab_size"), "model.vocab_size")
        else:
            bos = self._token_id_of("bos_token")
            pad = self._token_id_of("pad_token")
            eos_value = self._token_id_of("eos_token")
            vocab = None
        if eos_value is None:
            eos: list[int] = []
        elif isinstance(eos_value, (int, np.integer)) and not isinstance(eos_value, bool):
            eos = [int(eos_value)]
        elif isinstance(eos_value, Iterable) and not isinstance(eos_value, (str, bytes)):
            eos = []
            for value in eos_value:
                if value is None:
                    raise InvalidArgumentError(
                        f"model.eos_token_id entries must be integers: {eos_value!r}"
                    )
                eos.append(int(_int_or_none(value, "model.eos_token_id")))  # type: ignore[arg-type]
        else:
            raise InvalidArgumentError(
                f"model.eos_token_id must be an int or a list, not {eos_value!r}"
            )
        # Defaults as in the reference: pad and bos 0, an empty EOS list becomes [pad].
        self._pad_token_id = 0 if pad is None else pad
        self._bos_token_id = 0 if bos is None else bos
        self._eos_token_ids = np.asarray(eos or [self._pad_token_id], dtype=np.int32)
        self._vocab_size = vocab
        self._id_limit = max(self._known_size, vocab or 0)
        self._delimiter_ids = self._load_delimiter_ids(config if has_model_config else None)

    def _load_delimiter_ids(self, config: Any) -> dict[str, int]:
        """``model.bot_token_id`` and the other delimiter ids the config sets; for a config
        without them, the model type's defaults (`DELIMITER_TOKEN_DEFAULTS`) the vocabulary
        has."""
        found: dict[str, int] = {}
        model_type = config.get("model.type") if config is not None else None
        defaults = DELIMITER_TOKEN_DEFAULTS.get(str(model_type), {})
        for name, key in DELIMITER_TOKEN_KEYS.items():
            value = config.get(key) if config is not None else None
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # JSON 7.0: the reference takes integral numbers
            token_id = _int_or_none(value, key)
            if token_id is None and name in defaults:
                token_id = self._hf.token_to_id(defaults[name])
            if token_id is not None:
                found[name] = int(token_id)
        return found

    def _delimiter_id(self, name: str) -> int:
        token_id = self._delimiter_ids.get(name)
        if token_id is None:
            raise ModelError(
                f"{name} is not defined for this model: {self._path} sets no "
                f"{DELIMITER_TOKEN_KEYS[name]} in genai_config.json and its model type has no "
                "default token for it in the tokenizer"
            )
        return token_id

    @property
    def path(self) -> Path:
        """The folder this tokenizer was loaded from: the model folder, or the one its
        ``model.tokenizer_dir`` names."""
        return self._path

    @property
    def bos_token_id(self) -> int:
        """Beginning-of-sequence token id (``model.bos_token_id``)."""
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> npt.NDArray[np.int32]:
        """End-of-sequence token ids as an int32 array (``model.eos_token_id``)."""
        return self._eos_token_ids.copy()

    @property
    def pad_token_id(self) -> int:
        """Padding token id (``model.pad_token_id``)."""
        return self._pad_token_id

    @property
    def bot_token_id(self) -> int:
        """Tool-call begin token id (``model.bot_token_id``, e.g. ``<tool_call>``); raises
        RuntimeError when the model defines none."""
        return self._delimiter_id("bot_token_id")

    @property
    def eot_token_id(self) -> int:
        """Tool-call end token id (``model.eot_token_id``, e.g. ``</tool_call>``); raises
        RuntimeError when the model defines none."""
        return self._delimiter_id("eot_token_id")

    @property
    def bor_token_id(self) -> int:
        """Reasoning begin token id (``model.bor_token_id``, e.g. ``<think>``); raises
        RuntimeError when the model defines none."""
        return self._delimiter_id("bor_token_id")

    @property
    def eor_token_id(self) -> int:
        """Reasoning end token id (``model.eor_token_id``, e.g. ``</think>``); raises
        RuntimeError when the model defines none."""
        return self._delimiter_id("eor_token_id")

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (special and added tokens included)."""
        return self._known_size

    @property
    def chat_template(self) -> str | None:
        """The model's default chat template text, or ``None`` when it has none."""
        return load_chat_template(self._path, tokenizer_config=self._tokenizer_config)

    def update_options(self, **options: Any) -> None:
        """Set tokenizer options: ``add_special_tokens`` (encode adds e.g. BOS, default off)
        and ``skip_special_tokens`` (decode and streams drop special tokens, default on).

        Values may be booleans or the strings ``"true"``/``"false"``. Unknown names raise.
        """
        if not options:
            raise InvalidArgumentError("update_options: no options provided")
        parsed: dict[str, bool] = {}
        for name, value in options.items():
            if name not in _OPTION_NAMES:
                raise InvalidArgumentError(
                    f"unknown tokenizer option {name!r}; known options: {', '.join(_OPTION_NAMES)}"
                )
            parsed[name] = _as_bool_option(name, value)
        with self._lock:
            if "add_special_tokens" in parsed:
                self._add_special_tokens = parsed["add_special_tokens"]
            if "skip_special_tokens" in parsed:
                self._skip_special_tokens = parsed["skip_special_tokens"]

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str) -> npt.NDArray[np.int32]:
        """Token ids of ``text`` as a 1-D int32 array (no BOS/EOS unless enabled by option)."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"encode expects a str, not {type(text).__name__}")
        return np.asarray(self._encode_ids(text), dtype=np.int32)

    def _encode_ids(self, text: str) -> list[int]:
        _check_unicode(text, "text")
        add_special = self._add_special_tokens
        if self._spm is None:
            return self._hf.encode(text, add_special_tokens=add_special).ids
        ids = self._spm.encode(text)
        if add_special:
            # The post-processor's tokens (e.g. BOS) around the text's, as tokenizers adds them.
            bare = self._hf.encode(text, add_special_tokens=False).ids
            full = self._hf.encode(text, add_special_tokens=True).ids
            for start in range(len(full) - len(bare) + 1):
                if full[start : start + len(bare)] == bare:
                    return full[:start] + ids + full[start + len(bare) :]
        return ids

    def encode_batch(self, texts: Sequence[str]) -> TensorArray:
        """Token ids of several texts as an int32 ``[batch, longest]`` array, right-padded
        with ``pad_token_id`` (a NumPy array with the reference's ``Tensor`` methods
        ``as_numpy``, ``type`` and ``data``, as its result is a ``Tensor``)."""
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise ArgumentTypeError(
                f"encode_batch expects a list of str, not {type(texts).__name__}"
            )
        if len(texts) == 0:
            raise InvalidArgumentError("encode_batch: input strings must not be empty")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ArgumentTypeError(
                    f"encode_batch: texts[{i}] is {type(text).__name__}, not str"
                )
            _check_unicode(text, f"encode_batch: texts[{i}]")
        if self._spm is None:
            encodings = self._hf.encode_batch(
                list(texts), add_special_tokens=self._add_special_tokens
            )
            rows = [encoding.ids for encoding in encodings]
        else:
            rows = [self._encode_ids(text) for text in texts]
        longest = max(len(ids) for ids in rows)
        out = np.full((len(rows), longest), self._pad_token_id, dtype=np.int32)
        for row, ids in enumerate(rows):
            out[row, : len(ids)] = ids
        return out.view(TensorArray)

    def to_token_id(self, token: str) -> int:
        """Id of a vocabulary entry (e.g. ``"<|im_end|>"``), or -1 when there is none."""
        if not isinstance(token, str):
            raise ArgumentTypeError(f"to_token_id expects a str, not {type(token).__name__}")
        found = self._hf.token_to_id(token)
        return -1 if found is None else int(found)

    # -- decoding ---------------------------------------------------------------------------

    def _out_of_range(self, what: str, token: int) -> InvalidArgumentError:
        limit = self._id_limit
        source = "the model's vocab_size" if limit > self._known_size else "this tokenizer"
        return InvalidArgumentError(
            f"{what}: token id {token} is out of range [0, {limit}) for {source}"
        )

    def _check_ids(self, ids: Any, what: str, name: str = "ids") -> list[int]:
        """Validate a 1-D sequence of token ids (argument ``name`` of ``what``) and return it
        as a list of ints."""
        if hasattr(ids, "as_numpy") and not isinstance(ids, np.ndarray):
            ids = ids.as_numpy()
        if not _is_id_sequence(ids):
            raise ArgumentTypeError(
                f"{what}: {name} must be a 1-D sequence of token ids, not {type(ids).__name__}"
            )
        try:
            array = np.asarray(ids)
        except (ValueError, TypeError, OverflowError):  # ragged nested lists
            raise InvalidArgumentError(
                f"{what}: {name} must be a 1-D sequence of token ids, not nested sequences"
            ) from None
        if array.ndim != 1:
            raise InvalidArgumentError(
                f"{what} expects a 1-D sequence of token ids, got shape {array.shape}"
            )
        if array.size == 0:
            return []
        if array.dtype == object:
            # ints past int64 (out of range below) or items that are not ids (None, str, ...)
            for index, value in enumerate(array.tolist()):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise ArgumentTypeError(
                        f"{what}: {name}[{index}] is {type(value).__name__}, "
                        "not an integer token id"
                    )
        elif array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
            raise ArgumentTypeError(f"{what} expects integer token ids, got dtype {array.dtype}")
        values = array.tolist()
        if array.dtype == object:
            values = [int(v) for v in values]
        low, high = min(values), max(values)
        if low < 0 and self._placeholder_ids:
            # a vision prompt's image placeholders (Phi-3 Vision's are negative) stand for no
            # text: get_sequence of an image prompt decodes (the reference writes <unk>s)
            values = [v for v in values if v >= 0]
            if not values:
                return []
            low = min(values)
        if low < 0 or high >= self._id_limit:
            raise self._out_of_range(what, next(v for v in values if v < 0 or v >= self._id_limit))
        return values

    def _decode_ids(self, ids: list[int], skip_special_tokens: bool) -> str:
        # Ids in [tokenizer size, model vocab_size) are unknown to the tokenizer and decode to
        # nothing (a model can emit them: its vocabulary is padded).
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of a 1-D sequence of token ids; special tokens are skipped by default."""
        values = self._check_ids(ids, "decode")
        return self._decode_ids(values, self._skip_special_tokens)

    def decode_batch(self, batch: Sequence[Sequence[int]] | np.ndarray) -> list[str]:
        """Texts of a 2-D ``[batch, length]`` array of token ids (e.g. from ``encode_batch``)."""
        if hasattr(batch, "as_numpy") and not isinstance(batch, np.ndarray):
            batch = batch.as_numpy()
        if not _is_id_sequence(batch):
            raise ArgumentTypeError(
                "decode_batch: batch must be a 2-D [batch, length] array or a list of token id "
                f"sequences, not {type(batch).__name__}"
            )
        if not isinstance(batch, Sequence):
            batch = np.asarray(batch)  # another array-like (``__array__``)
        if isinstance(batch, np.ndarray):
            if batch.ndim != 2:
                raise InvalidArgumentError(
                    f"decode_batch expects a 2-D [batch, length] array, got shape {batch.shape}"
                )
            rows: Iterable[Any] = list(batch)
        else:
            rows = list(batch)
            for index, row in enumerate(rows):
                if isinstance(row, (int, np.integer)):
                    raise InvalidArgumentError(
                        "decode_batch expects a 2-D [batch, length] sequence of ids, got a "
                        "1-D one (decode takes one sequence)"
                    )
                if not _is_id_sequence(row):
                    raise ArgumentTypeError(
                        f"decode_batch: batch[{index}] is {type(row).__name__}, "
                        "not a sequence of token ids"
                    )
        checked = [
            self._check_ids(row, "decode_batch", f"batch[{i}]") for i, row in enumerate(rows)
        ]
        return self._hf.decode_batch(checked, skip_special_tokens=self._skip_special_tokens)

    def token_bytes(self, token: int) -> bytes:
        """The bytes token ``token`` stands for (beyond the reference): part of a character
        for a byte-level or byte-fallback token, where `decode` gives U+FFFD; a special token's
        text; ``b""`` for an id the tokenizer does not know."""
        token = _one_token_id(token, "token_bytes")
        if token < 0 or token >= self._known_size:
            return b""
        if self._token_bytes is None:
            self._token_bytes = TokenBytes(self._hf)
        return self._token_bytes(token)

    def create_stream(self) -> TokenizerStream:
        """A new :class:`TokenizerStream` for decoding generated tokens one at a time."""
        return TokenizerStream(self)

    # -- chat templates ---------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        template_str: str | None = None,
        tools: str | Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render a chat with the model's (or the given) chat template.

        ``template_str`` ``None`` or ``""`` means the model's own template (from
        ``tokenizer_config.json`` or ``chat_template.jinja``), as in the reference.
        ``messages`` is a JSON array of ``{"role", "content"}`` objects as text (as the
        reference takes it) or a list of dicts; ``tools`` likewise. Extra keyword arguments
        become template variables (e.g. ``enable_thinking=False``). Raises
        :class:`ChatTemplateError` when the model has no template or the template fails.
        """
        if template_str is not None and not isinstance(template_str, str):
            raise ArgumentTypeError(
                f"template_str must be a str, not {type(template_str).__name__}"
            )
        if not isinstance(add_generation_prompt, (bool, np.bool_, int, float, np.number)) and (
            add_generation_prompt is not None
        ):
            # as the reference's bool argument: a word such as "false" is not taken as true
            raise ArgumentTypeError(
                f"add_generation_prompt must be a bool, not {type(add_generation_prompt).__name__}"
            )
        tool_list = parse_tools(tools)
        source: str | None
        if template_str:
            source = template_str
        else:  # None or "": the model's own template, as in the reference
            source = load_chat_template(
                self._path, tools=tool_list, tokenizer_config=self._tokenizer_config
            )
        if not source:
            raise ChatTemplateError(
                f"no chat template: {self._path} has no 'chat_template' in tokenizer_config.json "
                "and no chat_template.jinja; pass a non-empty template_str="
            )
        variables = {**special_token_strings(self._tokenizer_config), **template_kwargs}
        return render_chat_template(
            source,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tool_list,
            **variables,
        )

    def __repr__(self) -> str:
        return f"Tokenizer(path={str(self._path)!r}, vocab_size={self._known_size})"


class TokenizerStream:
    """Incremental detokenizer: feed generated ids one by one, get printable text chunks.

    ``decode(token)`` returns ``""`` until the token completes displayable text. A character
    whose UTF-8 bytes are spread over several tokens (byte-level BPE, or SentencePiece
    ``<0xE4>`` byte-fallback tokens) is returned whole, once its last byte arrives; the
    concatenation of all chunks equals ``Tokenizer.decode`` of all the tokens. Special tokens
    are skipped when the tokenizer's ``skip_special_tokens`` option is on (the default).

    Internally the stream keeps a short window of recent ids (the last emitted chunk as
    context, plus pending ids) so each step decodes only a few tokens.
    """

    #: Window length past which already-emitted ids are dropped (kept: the last chunk).
    max_window = 16
    #: Ids without output after which text ending in U+FFFD is released (invalid bytes).
    max_pending = 8

    def __init__(self, tokenizer: Tokenizer) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise ArgumentTypeError(
                f"TokenizerStream expects a Tokenizer, not {type(tokenizer).__name__}"
            )
        self._tokenizer = tokenizer
        self.reset()

    def reset(self) -> None:
        """Forget all state, as for a fresh stream."""
        self._ids: list[int] = []
        self._emitted = 0  # characters of decode(self._ids) already returned
        self._chunk_start = 0  # index in _ids of the last clean boundary before the newest one
        self._since_clean = 0  # ids appended since the last clean boundary
        self._since_output = 0  # ids appended since the last non-empty chunk

    def decode(self, token: SupportsIndex) -> str:
        """Add one generated token id; return the new text it completes (possibly ``""``)."""
        token = _one_token_id(token, "TokenizerStream.decode")
        tok = self._tokenizer
        if token < 0 or token >= tok._id_limit:
            raise tok._out_of_range("TokenizerStream.decode", token)
        skip = tok._skip_special_tokens
        if (skip and token in tok._special_ids) or token >= tok._known_size:
            # Skipped special token, or a padded model-vocabulary id with no text.
            return ""
        self._ids.append(token)
        self._since_clean += 1
        self._since_output += 1
        text = tok._decode_ids(self._ids, skip)
        end = len(text)
        if self._since_output < self.max_pending:
            # Hold back a trailing U+FFFD run: it may be a character whose bytes are not all
            # here yet (byte-level BPE, or a run of <0x..> byte-fallback tokens).
            while end > self._emitted and text[end - 1] == _REPLACEMENT:
                end -= 1
        if end <= self._emitted:
            return ""
        chunk = text[self._emitted : end]
        self._since_output = 0
        if end == len(text):
            # All text so far is out and ends on a character boundary.
            if len(self._ids) > self.max_window:
                # Keep the previous chunk's ids as context: they start on a character boundary
                # and make leading-space rules treat the next token as mid-text.
                self._ids = self._ids[self._chunk_start :]
                end = len(tok._decode_ids(self._ids, skip))
            self._chunk_start = len(self._ids) - self._since_clean
            self._since_clean = 0
        self._emitted = end
        return chunk

    def flush(self) -> str:
        """Return text still held back (an incomplete UTF-8 tail shows as U+FFFD), if any."""
        if not self._ids:
            return ""
        text = self._tokenizer._decode_ids(self._ids, self._tokenizer._skip_special_tokens)
        chunk = text[self._emitted :]
        self._emitted = len(text)
        self._chunk_start = len(self._ids) - self._since_clean
        self._since_clean = 0
        self._since_output = 0
        return chunk
