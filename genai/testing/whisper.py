"""Tiny random-weight Whisper folders, written through the builder's Whisper writer, and a
NumPy forward pass of Whisper to check them against.

* :data:`WHISPER_FIXTURE_CONFIG` -- a small ``WhisperConfig`` (HF ``config.json`` keys);
  30 s windows as the real models (3000 mel frames, 1500 encoder positions) so the audio
  front end's features fit.
* :func:`random_whisper_weights` -- HF-named float32 weights (``model.`` prefix dropped).
* :func:`write_whisper_fixture` -- a model folder (``encoder.onnx``, ``decoder.onnx``,
  ``genai_config.json``, ``audio_processor_config.json``, tokenizer files).
* :func:`write_whisper_hf_checkpoint` -- the same weights as a Hugging Face folder
  (``config.json`` + ``model.safetensors``; needs the ``safetensors`` package).
* :func:`whisper_numpy_encode` / :func:`whisper_numpy_logits` -- the forward pass written from
  HF's ``modeling_whisper`` definitions (not from the writer), so it checks the graphs.
* :func:`synthetic_speech` -- a chirp, a tone and noise: a signal whose spectrum changes over
  time, for front-end and decoding checks without real speech.
* :func:`espeak_pcm`, :func:`speech_clip`, :func:`write_wav`, :func:`content_words` -- speech
  of known text for real-model checks: ``espeak-ng`` (a Debian package) speaks it, and it is
  resampled to 16 kHz here so that every engine's front end reads the same samples.

The tokenizer is a byte-level BPE: the 256 byte symbols, a few merges, then Whisper's special
tokens (``<|endoftext|>``, ``<|startoftranscript|>``, ``<|en|>``, ``<|transcribe|>``,
``<|translate|>``, ``<|notimestamps|>``, ...) at the end of the vocabulary, as in the real ones.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess
import wave
from pathlib import Path
from typing import Any

import numpy as np

from genai.builder.testing import add_merges, byte_level_tokenizer, byte_symbols
from genai.builder.whisper import whisper_tokenizer_config, write_whisper_folder
from genai.builder.whisper_sources import (
    DictWhisperSource,
    WhisperSpec,
    spec_from_hf_whisper_config,
)
from genai.errors import MissingDependencyError

__all__ = [
    "CLIP_SENTENCES",
    "SENTENCE",
    "SPEECH_RATE",
    "WHISPER_FIXTURE_CONFIG",
    "WHISPER_SPECIALS",
    "content_words",
    "espeak_pcm",
    "random_whisper_weights",
    "speech_clip",
    "synthetic_speech",
    "whisper_fixture_spec",
    "whisper_numpy_encode",
    "whisper_numpy_logits",
    "whisper_prompt_ids",
    "write_wav",
    "write_whisper_fixture",
    "write_whisper_hf_checkpoint",
]

#: Whisper's special tokens, in the order they follow the BPE tokens.
WHISPER_SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|fr|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
    "<|0.00|>",
    "<|0.02|>",
)

_BPE_TOKENS = 300  # 256 byte symbols + 44 merges
_VOCAB = _BPE_TOKENS + len(WHISPER_SPECIALS)

WHISPER_FIXTURE_CONFIG: dict[str, Any] = {
    "model_type": "whisper",
    "architectures": ["WhisperForConditionalGeneration"],
    "activation_function": "gelu",
    "vocab_size": _VOCAB,
    "d_model": 64,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "decoder_layers": 2,
    "decoder_attention_heads": 2,
    "decoder_ffn_dim": 128,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 64,
    "scale_embedding": False,
    "tie_word_embeddings": True,
    "bos_token_id": _BPE_TOKENS,
    "eos_token_id": _BPE_TOKENS,
    "pad_token_id": _BPE_TOKENS,
    "decoder_start_token_id": _BPE_TOKENS + 1,
}


def whisper_fixture_spec(config: dict[str, Any] | None = None) -> WhisperSpec:
    """The :class:`WhisperSpec` of ``config`` (default :data:`WHISPER_FIXTURE_CONFIG`)."""
    return spec_from_hf_whisper_config(config or WHISPER_FIXTURE_CONFIG, "fixture")


def whisper_prompt_ids(config: dict[str, Any] | None = None) -> list[int]:
    """``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` as fixture ids."""
    vocab = (config or WHISPER_FIXTURE_CONFIG)["vocab_size"]
    first = vocab - len(WHISPER_SPECIALS)
    return [
        first + WHISPER_SPECIALS.index(t)
        for t in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
    ]


def random_whisper_weights(
    config: dict[str, Any] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """HF-named float32 weights (without ``model.``) for ``config``. Scaled so that greedy
    decoding does not collapse onto one token (std 0.2 linears, norms ``1 + N(0, 0.1)``)."""
    cfg = config or WHISPER_FIXTURE_CONFIG
    s = whisper_fixture_spec(cfg)
    rng = np.random.default_rng(seed)
    d = s.d_model

    def normal(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "encoder.conv1.weight": normal(d, s.num_mel_bins, 3, std=0.1),
        "encoder.conv1.bias": normal(d, std=0.1),
        "encoder.conv2.weight": normal(d, d, 3, std=0.1),
        "encoder.conv2.bias": normal(d, std=0.1),
        "encoder.embed_positions.weight": normal(s.max_source_positions, d, std=0.5),
        "decoder.embed_tokens.weight": normal(s.vocab_size, d, std=0.5),
        "decoder.embed_positions.weight": normal(s.max_target_positions, d, std=0.5),
    }
    for side in ("encoder", "decoder"):
        w[f"{side}.layer_norm.weight"] = 1 + normal(d, std=0.1)
        w[f"{side}.layer_norm.bias"] = normal(d, std=0.1)
        layers = s.encoder_layers if side == "encoder" else s.decoder_layers
        ffn = s.encoder_ffn if side == "encoder" else s.decoder_ffn
        for i in range(layers):
            p = f"{side}.layers.{i}"
            blocks = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            norms = ["self_attn_layer_norm", "final_layer_norm"]
            if side == "decoder":
                norms.append("encoder_attn_layer_norm")
            for block in blocks:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    w[f"{p}.{block}.{proj}.weight"] = normal(d, d)
                    if proj != "k_proj":
                        w[f"{p}.{block}.{proj}.bias"] = normal(d, std=0.1)
            for norm in norms:
                w[f"{p}.{norm}.weight"] = 1 + normal(d, std=0.1)
                w[f"{p}.{norm}.bias"] = normal(d, std=0.1)
            w[f"{p}.fc1.weight"] = normal(ffn, d)
            w[f"{p}.fc1.bias"] = normal(ffn, std=0.1)
            w[f"{p}.fc2.weight"] = normal(d, ffn)
            w[f"{p}.fc2.bias"] = normal(d, std=0.1)
    return w


def synthetic_speech(
    seconds: float, seed: int, rate: int = 16000, *, noise: float = 0.02, channels: int = 1
) -> np.ndarray:
    """A float32 waveform: a chirp, a steady tone and ``noise`` times Gaussian noise (its
    spectrum changes over time; ``seed`` moves the tones). ``channels`` 2: ``[samples, 2]``,
    the second channel half the first reversed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    f0, f1 = 300 + 100 * seed, 1100 + 150 * seed
    x = (
        0.3 * np.sin(2 * np.pi * f0 * t * (1 + 0.05 * t))
        + 0.2 * np.sin(2 * np.pi * f1 * t)
        + noise * rng.standard_normal(t.size)
    ).astype(np.float32)
    return np.stack([x, 0.5 * x[::-1]], axis=1) if channels == 2 else x


def write_whisper_tokenizer(folder: str | Path, config: dict[str, Any] | None = None) -> None:
    """``tokenizer.json`` (byte-level BPE + Whisper's specials) and ``tokenizer_config.json``."""
    cfg = config or WHISPER_FIXTURE_CONFIG
    first_special = cfg["vocab_size"] - len(WHISPER_SPECIALS)
    tokens = byte_symbols()
    merges = add_merges(tokens, first_special)
    if len(tokens) != first_special:
        raise ValueError(f"vocab_size must leave room for 256 bytes + {len(WHISPER_SPECIALS)}")
    tok = byte_level_tokenizer(tokens, merges, WHISPER_SPECIALS)
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    spec = whisper_fixture_spec(cfg)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(whisper_tokenizer_config(spec), indent=2) + "\n", encoding="utf-8"
    )


def write_whisper_fixture(
    out_dir: str | Path,
    name: str = "whisper",
    *,
    seed: int = 0,
    precision: str = "fp32",
    config: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random Whisper model folder into ``out_dir / name``; returns its path."""
    cfg = config or WHISPER_FIXTURE_CONFIG
    folder = Path(out_dir) / name
    source = DictWhisperSource(whisper_fixture_spec(cfg), random_whisper_weights(cfg, seed))
    write_whisper_folder(source, folder, precision=precision)
    write_whisper_tokenizer(folder, cfg)
    return folder


def write_whisper_hf_checkpoint(
    folder: str | Path, config: dict[str, Any] | None = None, seed: int = 0
) -> Path:
    """The fixture's weights as a Hugging Face folder (``config.json``, ``model.safetensors``
    with the ``model.`` prefix and no ``proj_out`` (tied), tokenizer files)."""
    from safetensors.numpy import save_file  # lazy: safetensors is a test-only dependency

    cfg = config or WHISPER_FIXTURE_CONFIG
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    weights = random_whisper_weights(cfg, seed)
    save_file({f"model.{k}": v for k, v in weights.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    write_whisper_tokenizer(out, cfg)
    return out


# --------------------------------------------------------------------------------------------
# NumPy forward pass (HF modeling_whisper: pre-norm layers, exact GELU, q scaled by
# head_dim ** -0.5, k_proj without bias, lm_head tied to the token embedding)
# --------------------------------------------------------------------------------------------


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz and Stegun 7.1.26), vectorised."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    y = x @ w[f"{name}.weight"].astype(np.float64).T
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """q ``[b, h, t, hd]``, k/v ``[b, h, s, hd]`` -> ``[b, t, h * hd]``."""
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        t, s = q.shape[2], k.shape[2]
        allowed = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        scores = np.where(allowed, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    b, h, t, hd = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, t, h * hd)


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """x ``[batch, in, T]``, w ``[out, in, 3]``, padding 1."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    t_out = (x.shape[2] + 2 - 3) // stride + 1
    cols = np.stack([xp[:, :, k : k + stride * t_out : stride] for k in range(3)], axis=-1)
    cols = cols.transpose(0, 2, 1, 3).reshape(x.shape[0], t_out, -1)  # [batch, T, in * 3]
    y = cols @ w.astype(np.float64).reshape(w.shape[0], -1).T  # [batch, T, out]
    return y.transpose(0, 2, 1) + b[None, :, None]


def whisper_numpy_encode(
    weights: dict[str, np.ndarray], spec: WhisperSpec, features: np.ndarray
) -> np.ndarray:
    """The encoder's output ``[batch, max_source_positions, d_model]`` (float64)."""
    w = weights
    x = _gelu(
        _conv1d(features.astype(np.float64), w["encoder.conv1.weight"], w["encoder.conv1.bias"], 1)
    )
    x = _gelu(_conv1d(x, w["encoder.conv2.weight"], w["encoder.conv2.bias"], 2))
    x = x.transpose(0, 2, 1) + w["encoder.embed_positions.weight"]
    for i in range(spec.encoder_layers):
        p = f"encoder.layers.{i}"
        h = _layer_norm(
            x, w[f"{p}.self_attn_layer_norm.weight"], w[f"{p}.self_attn_layer_norm.bias"]
        )
        q, k, v = (
            _heads(_linear(h, w, f"{p}.self_attn.{n}_proj"), spec.encoder_heads) for n in "qkv"
        )
        x = x + _linear(_attention(q, k, v, causal=False), w, f"{p}.self_attn.out_proj")
        h = _layer_norm(x, w[f"{p}.final_layer_norm.weight"], w[f"{p}.final_layer_norm.bias"])
        x = x + _linear(_gelu(_linear(h, w, f"{p}.fc1")), w, f"{p}.fc2")
    return _layer_norm(x, w["encoder.layer_norm.weight"], w["encoder.layer_norm.bias"])


def whisper_numpy_logits(
    weights: dict[str, np.ndarray],
    spec: WhisperSpec,
    encoded: np.ndarray,
    tokens: np.ndarray,
) -> np.ndarray:
    """Decoder logits for every position of ``tokens`` ``[batch, T]`` (no cache), float64."""
    w = weights
    tokens = np.asarray(tokens)
    t = tokens.shape[1]
    x = w["decoder.embed_tokens.weight"][tokens].astype(np.float64)
    x = x + w["decoder.embed_positions.weight"][:t]
    heads = spec.decoder_heads
    for i in range(spec.decoder_layers):
        p = f"decoder.layers.{i}"
        h = _layer_norm(
            x, w[f"{p}.self_attn_layer_norm.weight"], w[f"{p}.self_attn_layer_norm.bias"]
        )
        q, k, v = (_heads(_linear(h, w, f"{p}.self_attn.{n}_proj"), heads) for n in "qkv")
        x = x + _linear(_attention(q, k, v, causal=True), w, f"{p}.self_attn.out_proj")
        h = _layer_norm(
            x, w[f"{p}.encoder_attn_layer_norm.weight"], w[f"{p}.encoder_attn_layer_norm.bias"]
        )
        q = _heads(_linear(h, w, f"{p}.encoder_attn.q_proj"), heads)
        k = _heads(_linear(encoded, w, f"{p}.encoder_attn.k_proj"), heads)
        v = _heads(_linear(encoded, w, f"{p}.encoder_attn.v_proj"), heads)
        x = x + _linear(_attention(q, k, v, causal=False), w, f"{p}.encoder_attn.out_proj")
        h = _layer_norm(x, w[f"{p}.final_layer_norm.weight"], w[f"{p}.final_layer_norm.bias"])
        x = x + _linear(_gelu(_linear(h, w, f"{p}.fc1")), w, f"{p}.fc2")
    x = _layer_norm(x, w["decoder.layer_norm.weight"], w["decoder.layer_norm.bias"])
    head = w.get("proj_out.weight", w["decoder.embed_tokens.weight"])
    return x @ head.astype(np.float64).T


# --------------------------------------------------------------------------------------------
# Speech of known text (espeak-ng)
# --------------------------------------------------------------------------------------------

#: Whisper's sample rate: clips are written at it.
SPEECH_RATE = 16000
#: One sentence with five content words (brother, bought, new, bicycle, market).
SENTENCE = "My brother bought a new bicycle at the market."
#: Sentences (no digits, nothing a transcript could spell two ways) for a 60 s clip.
CLIP_SENTENCES = (
    "The weather was cold and windy on Monday morning.",
    "Please open the window before the meeting starts.",
    "The children played football in the park after school.",
    "She wrote a long letter to her grandmother in London.",
    "We need more coffee, bread and apples for the kitchen.",
    "The train to Paris leaves early tomorrow evening.",
    "Doctors recommend walking every day for good health.",
    "The old library closed last year because of the flood.",
    "Our teacher explained the history of ancient Rome.",
    "The garden is full of roses and tulips in spring.",
    "He forgot his umbrella at the station yesterday.",
    "Fresh fish is sold at the harbour every Friday.",
    "The museum shows paintings from many famous artists.",
)

_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "at",
        "because",
        "before",
        "for",
        "from",
        "her",
        "his",
        "in",
        "is",
        "it",
        "many",
        "more",
        "my",
        "of",
        "on",
        "our",
        "she",
        "the",
        "to",
        "was",
        "we",
        "with",
    ]
)


def content_words(text: str) -> list[str]:
    """The lowercase words of ``text`` without punctuation and common function words."""
    words = re.findall(r"[a-z']+", text.lower())
    return [w for w in words if w not in _STOPWORDS]


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling by zero-padding/truncating the spectrum."""
    if src == dst:
        return x.astype(np.float64)
    n = round(len(x) * dst / src)
    spectrum = np.fft.rfft(x.astype(np.float64))
    out = np.zeros(n // 2 + 1, dtype=complex)
    m = min(len(spectrum), len(out))
    out[:m] = spectrum[:m]
    return np.fft.irfft(out, n) * (n / len(x))


def espeak_pcm(text: str, words_per_minute: int = 150) -> np.ndarray:
    """``text`` spoken by ``espeak-ng``: int16 samples at :data:`SPEECH_RATE`."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingDependencyError("espeak-ng is not installed (apt-get install espeak-ng)")
    result = subprocess.run(
        [exe, "-s", str(words_per_minute), "--stdout", text], capture_output=True, check=True
    )
    with wave.open(io.BytesIO(result.stdout)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return np.clip(np.rint(_resample(pcm, rate, SPEECH_RATE)), -32768, 32767).astype(np.int16)


def speech_clip(
    sentences: tuple[str, ...] | list[str] = CLIP_SENTENCES,
    seconds: float = 60.0,
    window: float = 30.0,
    pause: float = 0.6,
) -> tuple[np.ndarray, list[list[str]]]:
    """``sentences`` spoken one after another, exactly ``seconds`` long, no sentence across a
    ``window`` boundary (each window ends in silence). Returns ``(pcm, sentences of each
    window)``; raises ValueError when they do not fit."""
    win = int(window * SPEECH_RATE)
    total = int(seconds * SPEECH_RATE)
    gap = np.zeros(int(pause * SPEECH_RATE), np.int16)
    windows: list[list[np.ndarray]] = [[gap]]  # each window opens with a pause
    texts: list[list[str]] = [[]]
    used = len(gap)
    for sentence in sentences:
        pcm = np.concatenate([espeak_pcm(sentence), gap])
        if used + len(pcm) > win:
            windows.append([gap])
            texts.append([])
            used = len(gap)
        if len(pcm) > win:
            raise ValueError(f"sentence longer than a window: {sentence!r}")
        windows[-1].append(pcm)
        texts[-1].append(sentence)
        used += len(pcm)
    if len(windows) * win > total:
        raise ValueError(f"the sentences need {len(windows)} windows of {window} s")
    parts = [np.pad(np.concatenate(w), (0, win - sum(len(p) for p in w))) for w in windows]
    pcm = np.concatenate(parts)
    return np.pad(pcm, (0, total - len(pcm))), texts


def write_wav(path: str | Path, pcm: np.ndarray, rate: int = SPEECH_RATE) -> Path:
    """Write mono int16 ``pcm`` as a WAV file."""
    path = Path(path)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(pcm, dtype="<i2").tobytes())
    return path
