"""`Audios`: audio clips decoded for a speech model's prompt (the reference's ``og.Audios``).

``Audios.open(*paths)`` and ``Audios.open_bytes(*blobs)`` decode WAV, FLAC, OGG/Vorbis and MP3
with `soundfile` (libsndfile, bundled in its wheels on every platform; the ``speech`` extra:
``pip install 'genai-runtime[speech]'``). Each clip keeps its own sample rate and is mixed
down to one channel (the mean of the channels); the processor resamples it to the rate its
pipeline names (16 kHz for Whisper). ``Audios.from_arrays`` takes samples already in memory
(beyond the reference).

Decoding happens when the `Audios` is made, so a missing, unreadable or empty file raises
`genai.errors.InvalidArgumentError` naming it there.
"""

from __future__ import annotations

import io
import numbers
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from genai.errors import ArgumentTypeError, InvalidArgumentError, MissingDependencyError

__all__ = ["AudioClip", "Audios", "decode_audio"]


@dataclass(frozen=True)
class AudioClip:
    """One decoded clip: mono float32 samples in [-1, 1] at ``sample_rate`` Hz."""

    samples: np.ndarray
    sample_rate: int
    #: Where it came from (a path, ``"<bytes #i>"`` or ``"<array #i>"``), for messages.
    source: str = ""

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return self.samples.shape[0] / self.sample_rate


#: The highest sample rate taken (Hz): above any audio format's (DXD is 352.8 kHz), below
#: what would make the resampling filter's window absurd.
MAX_SAMPLE_RATE = 768_000

#: The most channels `Audios.from_arrays` takes (7.1 surround is 8): more is taken for a
#: ``[channels, frames]`` array given the wrong way round.
MAX_ARRAY_CHANNELS = 8


def _check_clip(samples: np.ndarray, rate: int, source: str) -> None:
    """`InvalidArgumentError` for a clip the features cannot be made of: no samples, no
    channels, a sample rate outside [1, `MAX_SAMPLE_RATE`], NaN or infinite samples."""
    if samples.ndim == 2 and samples.shape[1] == 0:
        raise InvalidArgumentError(f"audio {source} has no channels")
    if samples.shape[0] == 0:
        raise InvalidArgumentError(f"audio {source} has no samples")
    if not 0 < rate <= MAX_SAMPLE_RATE:
        raise InvalidArgumentError(
            f"audio {source} has sample rate {rate} Hz; expected 1 to {MAX_SAMPLE_RATE}"
        )
    if samples.dtype.kind == "f" and not np.isfinite(samples).all():
        raise InvalidArgumentError(f"audio {source} has NaN or infinite samples")


def _soundfile() -> Any:
    try:
        import soundfile  # lazy: libsndfile (the speech extra) loads only to decode audio
    except ImportError:
        raise MissingDependencyError(
            "decoding audio files needs soundfile: pip install 'genai-runtime[speech]'"
        ) from None
    except OSError as exc:  # the package without its libsndfile
        raise MissingDependencyError(f"soundfile cannot load libsndfile: {exc}") from None
    return soundfile


def _mono(samples: np.ndarray) -> np.ndarray:
    """[frames] or [frames, channels] -> contiguous float32 [frames]: the channels' sum, in
    order, over their count (stereo: ``(left + right) / 2`` in float32, as the reference's
    decoder mixes it). Column by column: NumPy's mean over a short last axis is ~15x slower."""
    if samples.ndim == 1:
        return np.ascontiguousarray(samples, dtype=np.float32)
    out = np.array(samples[:, 0], dtype=np.float32)
    for channel in range(1, samples.shape[1]):
        out += samples[:, channel]
    if samples.shape[1] > 1:
        out /= np.float32(samples.shape[1])
    return out


#: dr_wav's u8 -> float32 factor, ``0.00784313725490196078f`` (2/255 as the nearest float).
_U8_TO_F32 = np.float32(0.00784313725490196078)

#: Frames read at a time from a file libsndfile cannot seek in.
_BLOCK_FRAMES = 1 << 18


def _read_all(f: Any, dtype: str) -> np.ndarray:
    """Every frame of the open `soundfile.SoundFile` ``f``, [frames, channels]. A file
    libsndfile cannot seek in (e.g. GSM 6.10 WAV) takes no "read to the end": it is read in
    blocks until none is left (its stated length is not trusted)."""
    if f.seekable():
        return f.read(dtype=dtype, always_2d=True)
    parts = []
    while True:
        block = f.read(frames=_BLOCK_FRAMES, dtype=dtype, always_2d=True)
        if not block.shape[0]:
            break
        parts.append(block)
    if not parts:
        return np.zeros((0, f.channels), dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _u8_samples(f: Any) -> np.ndarray:
    """An 8-bit unsigned file's samples as the reference's dr_wav maps them:
    ``x * 0.00784313725490196078f - 1`` in float32 (silence, 128, is +0.0039; libsndfile's
    ``(x - 128) / 128`` would be 0). libsndfile gives the bytes as int16 ``(x - 128) << 8``."""
    raw = _read_all(f, "int16")
    samples = ((raw >> 8) + 128).astype(np.float32)
    samples *= _U8_TO_F32
    samples -= np.float32(1.0)
    return samples


def _decode_reason(exc: BaseException, target: Any, source: str) -> str:
    """libsndfile's reason for ``exc``, without soundfile's "Error opening <object at 0x...>"
    prefix (the in-memory file's repr names nothing the caller knows)."""
    reason = getattr(exc, "error_string", None)
    if not isinstance(reason, str) or not reason:
        reason = str(exc)
    return reason.replace(repr(target), source)


def decode_audio(data: bytes | str | os.PathLike[str], source: str = "") -> AudioClip:
    """Decode one file (a path, or its bytes) to a mono `AudioClip`."""
    soundfile = _soundfile()
    source = source or str(data)
    target: Any = io.BytesIO(data) if isinstance(data, bytes | bytearray | memoryview) else data
    try:
        with soundfile.SoundFile(target) as f:
            rate = f.samplerate
            if f.subtype == "PCM_16":
                # libsndfile's own float conversion is this scaling, ~4x slower
                samples = _read_all(f, "int16").astype(np.float32)
                samples *= np.float32(1.0 / 32768.0)
            elif f.subtype == "PCM_U8":
                samples = _u8_samples(f)
            else:
                samples = _read_all(f, "float32")
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        reason = _decode_reason(exc, target, source)
        raise InvalidArgumentError(
            f"cannot decode audio {source}: {reason} (WAV, FLAC, OGG and MP3 are supported)"
        ) from None
    _check_clip(samples, int(rate), source)
    return AudioClip(_mono(samples), int(rate), source)


class Audios:
    """Decoded audio clips for a speech model's prompt, in order (one per batch row)."""

    __slots__ = ("clips",)

    def __init__(self, clips: Sequence[AudioClip]) -> None:
        if not clips:
            raise InvalidArgumentError("Audios needs at least one clip")
        for clip in clips:
            if not isinstance(clip, AudioClip):
                raise ArgumentTypeError(
                    f"Audios takes AudioClip objects, not {type(clip).__name__} (use Audios.open "
                    "for files, Audios.from_arrays for samples)"
                )
        #: The clips, mono float32 at their own sample rates.
        self.clips: tuple[AudioClip, ...] = tuple(clips)

    @staticmethod
    def open(*paths: str | os.PathLike[str]) -> Audios:
        """Decode the audio files at ``paths`` (WAV, FLAC, OGG, MP3)."""
        if not paths:
            raise InvalidArgumentError("Audios.open needs at least one path")
        clips = []
        for path in paths:
            if not isinstance(path, str | os.PathLike):
                raise ArgumentTypeError("Audio paths must be strings.")
            name = os.fspath(path)
            if os.path.isdir(name):
                raise InvalidArgumentError(f"{name!r} is a directory, not an audio file")
            if not os.path.isfile(name):
                raise InvalidArgumentError(f"audio file {name!r} does not exist")
            clips.append(decode_audio(name, source=repr(name)))
        return Audios(clips)

    @staticmethod
    def open_bytes(*blobs: bytes) -> Audios:
        """Decode audio files given as bytes (WAV, FLAC, OGG, MP3)."""
        if not blobs:
            raise InvalidArgumentError("Audios.open_bytes needs at least one bytes object")
        clips = []
        for i, blob in enumerate(blobs):
            if not isinstance(blob, bytes | bytearray | memoryview):
                raise ArgumentTypeError("Audio data must be bytes.")
            if not len(blob):
                raise InvalidArgumentError(f"audio <bytes #{i}> is empty")
            clips.append(decode_audio(bytes(blob), source=f"<bytes #{i}>"))
        return Audios(clips)

    @staticmethod
    def from_arrays(*arrays: np.ndarray, sample_rate: int = 16000) -> Audios:
        """Clips from samples in memory (beyond the reference): each 1-D ``[frames]`` or 2-D
        ``[frames, channels]`` (at most `MAX_ARRAY_CHANNELS`, and no more channels than
        frames: a ``[channels, frames]`` array is refused, to be transposed), float in [-1, 1]
        (integers are scaled from their range). ``sample_rate``: any integral number."""
        if not arrays:
            raise InvalidArgumentError("Audios.from_arrays needs at least one array")
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral):
            raise InvalidArgumentError(f"sample_rate must be a positive int, got {sample_rate!r}")
        rate = int(sample_rate)
        clips = []
        for i, array in enumerate(arrays):
            samples = np.asarray(array)
            if samples.ndim not in (1, 2) or samples.shape[0] == 0:
                raise InvalidArgumentError(
                    f"audio <array #{i}> must be [frames] or [frames, channels] with at least "
                    f"one frame, got shape {samples.shape}"
                )
            frames, channels = samples.shape[0], samples.shape[-1] if samples.ndim == 2 else 1
            if channels > frames or channels > MAX_ARRAY_CHANNELS:
                raise InvalidArgumentError(
                    f"audio <array #{i}> of shape {samples.shape} would be {frames} frames of "
                    f"{channels} channels (at most {MAX_ARRAY_CHANNELS}, and no more than "
                    "frames): arrays are [frames] or [frames, channels]; transpose a [channels, "
                    "frames] array (array.T)"
                )
            if samples.dtype.kind in "iu":
                info = np.iinfo(samples.dtype)
                samples = (samples.astype(np.float64) - (info.max + info.min + 1) / 2) / (
                    (info.max - info.min + 1) / 2
                )
            elif samples.dtype.kind != "f":
                raise ArgumentTypeError(f"audio <array #{i}> has dtype {samples.dtype}")
            _check_clip(samples, rate, f"<array #{i}>")
            clips.append(AudioClip(_mono(samples), rate, f"<array #{i}>"))
        return Audios(clips)

    def __len__(self) -> int:
        return len(self.clips)

    def __iter__(self) -> Iterator[AudioClip]:
        return iter(self.clips)

    def __repr__(self) -> str:
        inner = ", ".join(f"{c.duration:.2f} s @ {c.sample_rate} Hz" for c in self.clips)
        return f"Audios([{inner}])"
