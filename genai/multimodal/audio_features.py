"""The audio feature pipeline a speech model's ``audio_processor_config.json`` names, computed
as the reference's processor (onnxruntime-extensions' speech feature extractor) computes it.

The config lists ``feature_extraction.sequence``, each ``{"operation": {"type": ..., "attrs":
{...}}}``. Whisper's (what the reference's builder writes) is:

* ``AudioDecoder`` (attrs ``target_sample_rate`` / ``target_sample_rates``,
  ``stereo_to_mono``): the clip, mono, resampled to the target rate (16 kHz unless named);
* ``STFTNorm`` (``n_fft``, ``frame_length``, ``hop_length``, ``hann_win`` or ``win_fn``): the
  power spectrum ``|STFT|^2`` of the clip zero-padded by ``n_fft // 2`` on both sides, a
  periodic Hann window, one frame every ``hop_length`` samples;
* ``LogMelSpectrum`` (``n_fft``, ``n_mel``, ``hop_length``, ``chunk_size``, ``feature_first``,
  ``no_padding``): Slaney-scale mel filters (librosa's, as Whisper's), ``log10`` clamped at
  1e-10 and to 8 below the maximum, ``(x + 4) / 4``; without ``no_padding`` the clip is cut at
  ``chunk_size`` seconds and the features padded to ``chunk_size * 16000 / hop_length``
  frames with the clamp value: ``[n_mel, 3000]`` for Whisper's 30 seconds.

Everything is vectorised NumPy; the log-mel features agree with the reference's within 1e-4
on the same 16 kHz file (``tests/test_whisper.py``). Resampling is a Kaiser-windowed sinc
(`resample`); the reference low-passes and interpolates differently and refuses to upsample
(genai upsamples), so features of other rates agree with its only approximately.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from genai.errors import ConfigError, InvalidArgumentError, UnsupportedFeatureError
from genai.multimodal.audios import AudioClip

__all__ = ["AudioPipeline", "hann_window", "log_mel", "mel_filters", "resample", "stft_power"]

#: The rate LogMelSpectrum's filters and chunk length assume (the reference fixes it).
MEL_SAMPLE_RATE = 16000


def hann_window(length: int) -> np.ndarray:
    """The periodic Hann window, float32 (``sin(pi n / N) ** 2``, as the reference)."""
    s = np.sin(np.pi * np.arange(length) / length)
    return (s * s).astype(np.float32)


def mel_filters(n_fft: int, n_mels: int, sample_rate: int = MEL_SAMPLE_RATE) -> np.ndarray:
    """Slaney-scale triangular mel filters ``[n_mels, n_fft // 2 + 1]``, area-normalised
    (librosa's ``mel(htk=False, norm="slaney")``, float32 as the reference computes them)."""
    f32 = np.float32
    bins = (np.arange(n_fft // 2 + 1) * sample_rate / f32(n_fft)).astype(f32)
    max_mel = 45.245640471924965  # the mel of 8 kHz
    mels = (np.arange(n_mels + 2) * (max_mel / (n_mels + 1))).astype(f32)
    f_sp = f32(200.0 / 3.0)
    min_log_mel = f32(1000.0) / f_sp
    logstep = f32(math.log(6.4) / 27.0)
    freqs = np.where(
        mels >= min_log_mel, f32(1000.0) * np.exp(logstep * (mels - min_log_mel)), f_sp * mels
    ).astype(f32)
    spacing = np.diff(freqs)
    ramps = freqs[:, None] - bins[None, :]
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    filters = np.maximum(0.0, np.minimum(lower, upper))
    filters *= (2.0 / (freqs[2:] - freqs[:-2]))[:, None]
    return filters.astype(f32)


def stft_power(samples: np.ndarray, n_fft: int, hop_length: int, window: np.ndarray) -> np.ndarray:
    """``|STFT|^2`` ``[n_fft // 2 + 1, frames]`` of ``samples`` zero-padded by ``n_fft // 2``
    on both sides (``frames = 1 + len // hop_length``)."""
    pad = n_fft // 2
    padded = np.zeros(samples.shape[0] + 2 * pad, np.float32)
    padded[pad : pad + samples.shape[0]] = samples
    frames = 1 + (padded.shape[0] - n_fft) // hop_length
    if frames < 1:
        raise InvalidArgumentError("the audio is too short for one STFT frame")
    strided = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:frames]
    win = np.zeros(n_fft, np.float32)
    win[: window.shape[0]] = window[:n_fft]
    spectrum = np.fft.rfft(strided * win, axis=1)
    power = spectrum.real**2 + spectrum.imag**2
    return power.T.astype(np.float32)


def log_mel(
    power: np.ndarray, filters: np.ndarray, frames: int | None, feature_first: bool = True
) -> np.ndarray:
    """Whisper's log-mel features of a power spectrum (its last frame dropped, as the
    reference): ``[n_mel, frames]`` padded (or cut) to ``frames`` with the clamp value, or
    every frame when ``frames`` is None; ``[frames, n_mel]`` when not ``feature_first``."""
    if power.shape[1] < 2:
        raise InvalidArgumentError("the audio is too short for log-mel features")
    mel = filters @ power[: filters.shape[1], :-1]
    log = np.log10(np.maximum(mel, np.float32(1e-10)))
    floor = log.max() - np.float32(8.0)
    log = (np.maximum(log, floor) + np.float32(4.0)) / np.float32(4.0)
    if frames is not None:
        out = np.full((log.shape[0], frames), (floor + 4.0) / 4.0, np.float32)
        kept = min(frames, log.shape[1])
        out[:, :kept] = log[:, :kept]
        log = out
    log = log.astype(np.float32)
    return log if feature_first else np.ascontiguousarray(log.T)


def resample(samples: np.ndarray, rate: int, target: int, zeros: int = 16) -> np.ndarray:
    """``samples`` at ``rate`` Hz resampled to ``target`` Hz: a Kaiser-windowed sinc
    (``zeros`` zero crossings each side, cut-off at the lower Nyquist frequency). Output
    length ``ceil(len * target / rate)``.

    With ``target / rate = up / down`` in lowest terms, output ``q * up + r`` is a dot product
    of the input from ``q * down`` on with phase ``r``'s filter: one matrix product of the
    input's strided windows ``[Q, span]`` with the ``[span, up]`` filters (BLAS, blocked)."""
    if rate == target:
        return np.ascontiguousarray(samples, dtype=np.float32)
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    cutoff = min(1.0, up / down)
    half = math.ceil(zeros / cutoff)
    taps = np.arange(-half + 1, half + 1)
    phase = np.arange(up)
    # Output q * up + r sits (r * down) % up / up of a sample after input q * down + shift[r].
    shift = (phase * down) // up
    offsets = taps[None, :] - ((phase * down % up) / up)[:, None]  # input minus output position
    beta = 8.6
    ratio = np.clip(offsets / (half + 1), -1.0, 1.0)
    kaiser = np.i0(beta * np.sqrt(1.0 - ratio**2)) / np.i0(beta)
    filters = cutoff * np.sinc(cutoff * offsets) * kaiser  # [up, 2 * half]
    count = math.ceil(samples.shape[0] * up / down)
    span = int(shift[-1]) + 2 * half
    if span * up > 1 << 22:  # rates without a small ratio: gather the taps of each output
        return _resample_gather(samples, up, down, half, filters, count)
    bank = np.zeros((span, up), np.float32)
    rows = shift[:, None] + np.arange(2 * half)[None, :]
    bank[rows, phase[:, None]] = filters
    groups = -(-count // up)
    padded = np.zeros((groups - 1) * down + span, np.float32)
    head = half - 1
    length = min(samples.shape[0], padded.shape[0] - head)
    padded[head : head + length] = samples[:length]
    windows = np.lib.stride_tricks.sliding_window_view(padded, span)[::down]
    out = np.empty((groups, up), np.float32)
    block = max(1, (1 << 22) // span)
    for start in range(0, groups, block):
        np.matmul(windows[start : start + block], bank, out=out[start : start + block])
    return out.reshape(-1)[:count]


def _resample_gather(
    samples: np.ndarray, up: int, down: int, half: int, filters: np.ndarray, count: int
) -> np.ndarray:
    """`resample` for ratios whose filter bank would be large: each output gathers its taps."""
    taps = np.arange(-half + 1, half + 1)
    padded = np.zeros(samples.shape[0] + 2 * half + 1, np.float32)
    padded[half : half + samples.shape[0]] = samples
    filters = filters.astype(np.float32)
    out = np.empty(count, np.float32)
    block = 1 << 15
    for start in range(0, count, block):
        k = np.arange(start, min(count, start + block))
        base = (k * down) // up
        index = base[:, None] + taps[None, :] + half
        rows = filters[k % up]
        out[start : start + k.shape[0]] = np.einsum("ij,ij->i", padded[index], rows)
    return out


@dataclass
class AudioPipeline:
    """The feature pipeline of one ``audio_processor_config.json`` (see the module docstring)."""

    #: AudioDecoder: the rates a clip may be resampled to (sorted).
    target_rates: tuple[int, ...] = (MEL_SAMPLE_RATE,)
    n_fft: int = 400
    hop_length: int = 160
    frame_length: int = 400
    window: np.ndarray = field(default_factory=lambda: hann_window(400))
    n_mel: int = 80
    chunk_size: int = 30
    feature_first: bool = True
    no_padding: bool = False

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], where: str = "the audio config"
    ) -> AudioPipeline:
        """The pipeline a parsed config describes; ConfigError / UnsupportedFeatureError name
        what it cannot run."""
        try:
            sequence = config["feature_extraction"]["sequence"]
            ops = [
                (step["operation"]["type"], step["operation"].get("attrs") or {})
                for step in sequence
            ]
        except (KeyError, TypeError) as exc:
            raise ConfigError(
                f"{where}: expected feature_extraction.sequence of operations ({exc})"
            ) from None
        types = [kind for kind, _ in ops]
        if types != ["AudioDecoder", "STFTNorm", "LogMelSpectrum"]:
            raise UnsupportedFeatureError(
                f"{where}: the audio pipeline {types} is not supported (genai runs "
                "AudioDecoder -> STFTNorm -> LogMelSpectrum, Whisper's)"
            )
        (_, dec), (_, stft), (_, mel) = ops
        pipeline = cls()
        try:
            if "target_sample_rates" in dec:
                pipeline.target_rates = tuple(sorted(int(r) for r in dec["target_sample_rates"]))
            elif "target_sample_rate" in dec:
                pipeline.target_rates = (int(dec["target_sample_rate"]),)
            pipeline.n_fft = int(stft.get("n_fft", 400))
            pipeline.hop_length = int(stft.get("hop_length", 160))
            pipeline.frame_length = int(stft.get("frame_length", pipeline.n_fft))
            if "hann_win" in stft:
                pipeline.window = np.asarray(stft["hann_win"], np.float32)
            elif stft.get("win_fn", "hann") == "hamming":
                n = np.arange(pipeline.frame_length)
                s = np.sin(np.pi * n / (pipeline.frame_length - 1))
                pipeline.window = (0.08 + 0.92 * s * s).astype(np.float32)
            else:
                pipeline.window = hann_window(pipeline.frame_length)
            pipeline.n_mel = int(mel["n_mel"])
            pipeline.chunk_size = int(mel.get("chunk_size", 30))
            pipeline.feature_first = bool(mel.get("feature_first", 1))
            pipeline.no_padding = bool(mel.get("no_padding", 0))
            if int(mel.get("n_fft", pipeline.n_fft)) != pipeline.n_fft:
                raise ConfigError(f"{where}: STFTNorm and LogMelSpectrum disagree on n_fft")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: bad audio pipeline attribute ({exc})") from None
        if pipeline.frame_length != pipeline.n_fft:
            raise UnsupportedFeatureError(
                f"{where}: STFTNorm with frame_length != n_fft is not supported (nor by the "
                "reference)"
            )
        return pipeline

    @classmethod
    def from_file(cls, path: str | Path) -> AudioPipeline:
        """The pipeline of the config file at ``path``."""
        path = Path(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"the audio processor config {path} does not exist") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the audio processor config {path}: {exc}") from None
        return cls.from_config(config, where=str(path))

    @property
    def sample_rate(self) -> int:
        """The rate the features are computed at (16 kHz for Whisper)."""
        return MEL_SAMPLE_RATE if MEL_SAMPLE_RATE in self.target_rates else self.target_rates[0]

    @property
    def frames(self) -> int | None:
        """Feature frames per clip (3000 for Whisper's 30 s), None without padding."""
        return None if self.no_padding else MEL_SAMPLE_RATE * self.chunk_size // self.hop_length

    @property
    def window_samples(self) -> int:
        """Samples one padded chunk covers at `sample_rate` (480000 for Whisper)."""
        return self.sample_rate * self.chunk_size

    def pcm(self, clip: AudioClip) -> np.ndarray:
        """AudioDecoder: the clip's mono samples at the pipeline's rate."""
        return resample(clip.samples, clip.sample_rate, self.sample_rate)

    def features_of_pcm(self, samples: np.ndarray) -> np.ndarray:
        """STFTNorm + LogMelSpectrum of samples at `sample_rate`: ``[n_mel, frames]``."""
        if not self.no_padding:
            samples = samples[: self.window_samples]
        power = stft_power(samples, self.n_fft, self.hop_length, self.window)
        filters = _filters(self.n_fft, self.n_mel)
        return log_mel(power, filters, self.frames, self.feature_first)

    def features(self, clips: Sequence[AudioClip]) -> np.ndarray:
        """The features of each clip, stacked: ``[clips, n_mel, frames]`` (float32)."""
        arrays = [self.features_of_pcm(self.pcm(clip)) for clip in clips]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InvalidArgumentError(
                "clips of different lengths cannot be batched without padding "
                "(LogMelSpectrum no_padding)"
            )
        return np.stack(arrays)


_FILTERS: dict[tuple[int, int], np.ndarray] = {}


def _filters(n_fft: int, n_mel: int) -> np.ndarray:
    found = _FILTERS.get((n_fft, n_mel))
    if found is None:
        found = _FILTERS[(n_fft, n_mel)] = mel_filters(n_fft, n_mel)
    return found
