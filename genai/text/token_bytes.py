"""The bytes each token of a vocabulary stands for (beyond the reference).

A token's text can be part of a character (byte-level BPE splits UTF-8 characters over tokens;
SentencePiece has ``<0xNN>`` byte-fallback tokens), so its decoded text is not its bytes:
OpenAI's log-probabilities report the bytes, and llguidance reads the vocabulary as bytes.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["TokenBytes", "byte_level_table", "piece_bytes"]


@functools.lru_cache(maxsize=1)
def byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def mentions(node: Any, kind: str) -> bool:
    """Whether a ``tokenizer.json`` section (e.g. its decoder) has a step of type ``kind``."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(mentions(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(mentions(v, kind) for v in node)
    return False


def piece_bytes(piece: str, byte_level: dict[str, int] | None) -> bytes:
    """The bytes a vocabulary entry stands for: byte-level BPE maps each character back to a
    byte (``byte_level``: `byte_level_table`); SentencePiece-style entries use ``▁`` for space
    and ``<0xNN>`` for raw bytes."""
    if byte_level is not None:
        try:
            return bytes(byte_level[c] for c in piece)
        except KeyError:
            return piece.encode("utf-8")
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


class TokenBytes:
    """Token id -> bytes for a `tokenizers.Tokenizer` (``hf``): special (added) tokens are
    their text, ids the tokenizer does not know are ``b""``."""

    def __init__(self, hf: Any) -> None:
        spec = json.loads(hf.to_str())
        self._hf = hf
        self._byte_level = (
            byte_level_table() if mentions(spec.get("decoder"), "ByteLevel") else None
        )
        #: the ids of the special (added) tokens
        self.special_ids = frozenset(
            t["id"] for t in spec.get("added_tokens", []) if t.get("special")
        )
        self._cache: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        found = self._cache.get(token)
        if found is None:
            piece = self._hf.id_to_token(token) if token >= 0 else None
            if piece is None:
                found = b""
            elif token in self.special_ids:
                found = piece.encode("utf-8")
            else:
                found = piece_bytes(piece, self._byte_level)
            self._cache[token] = found
        return found
