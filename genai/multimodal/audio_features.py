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

Everything is vectorised NumPy. A clip above the target rate is brought down as the
reference's AudioDecoder does it (`downsample`: its 4th-order Butterworth low-pass at half the
target rate, then its Kaiser-windowed sinc interpolation with float32 positions), so the
log-mel features of a file at any rate agree with the reference's within 1e-4
(``tests/test_audio_features.py``). A clip below the target rate, which the reference refuses
("only down-sampling supported"), is upsampled by a Kaiser-windowed sinc (`resample`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from genai.errors import ConfigError, InvalidArgumentError, UnsupportedFeatureError
from genai.multimodal.audios import AudioClip

__all__ = [
    "AudioPipeline",
    "butterworth_lowpass",
    "downsample",
    "hann_window",
    "kaiser_interpolate",
    "log_mel",
    "lowpass",
    "mel_filters",
    "resample",
    "stft_power",
]

#: The rate LogMelSpectrum's filters and chunk length assume (the reference fixes it).
MEL_SAMPLE_RATE = 16000


def hann_window(length: int) -> np.ndarray:
    """The periodic Hann window, float32 (``sin(pi n / N) ** 2``, as the reference)."""
    s = np.sin(np.pi * np.arange(length) / length)
    return (s * s).astype(np.float32)


def mel_filters(n_fft: int, n_mels: int, sample_rate: int = MEL_SAMPLE_RATE) -> np.ndarray:
    """Slaney-scale triangular mel filters ``[n_mels, n_fft // 2 + 1]``, area-normalised
    (librosa's ``mel(htk=False, norm="slaney")``), float32 in the reference's order of
    operations: the mel points ``float(i) * 45.24564f / float(n_mels + 1)``, and above 1 kHz
    ``1000f * exp(logstep * (mel - 15))`` with the exponential rounded from double. That is
    what glibc's ``expf`` (the reference's) gives on every point of n_fft 400 with 80 or 128
    mels (it is not correctly rounded everywhere: other sizes may differ in a few points).
    NumPy's own float32 ``exp`` is 1 ulp off glibc's on some of them, which moved whole
    filters, and features by up to 3e-6 (most of those off by more than 1e-6)."""
    f32 = np.float32
    bins = (np.arange(n_fft // 2 + 1) * sample_rate).astype(f32) / f32(n_fft)
    max_mel = f32(45.245640471924965)  # the mel of 8 kHz
    mels = np.arange(n_mels + 2).astype(f32) * max_mel / f32(n_mels + 1)
    f_sp = f32(200.0) / f32(3.0)
    min_log_mel = f32(1000.0) / f_sp
    logstep = f32(math.log(6.4) / 27.0)
    freqs = f_sp * mels
    for i in np.flatnonzero(mels >= min_log_mel).tolist():
        freqs[i] = f32(1000.0) * f32(math.exp(float(logstep * (mels[i] - min_log_mel))))
    spacing = freqs[1:] - freqs[:-1]
    ramps = freqs[:, None] - bins[None, :]
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    filters = np.maximum(f32(0.0), np.minimum(lower, upper))
    filters *= (f32(2.0) / (freqs[2:] - freqs[:-2]))[:, None]
    return filters


def stft_power(samples: np.ndarray, n_fft: int, hop_length: int, window: np.ndarray) -> np.ndarray:
    """``|STFT|^2`` ``[n_fft // 2 + 1, frames]`` float32 of ``samples`` zero-padded by
    ``n_fft // 2`` on both sides (``frames = 1 + len // hop_length``).

    Each frame times the window rounded to float32, as the reference's STFT multiplies them
    (its FFT then runs in float32: kissfft's radix-4/5 float rounding, the difference left
    between our features and the reference's, up to ~2e-5 on speech; an exact float32
    emulation of it costs ~5x this whole front end). Then an rfft of the frames in float64
    (NumPy's pocketfft is faster on it than on float32, and more accurate), a few hundred
    frames at a time so that every temporary stays in cache; each block's power is written
    transposed into the result."""
    pad = n_fft // 2
    padded = np.zeros(samples.shape[0] + 2 * pad, np.float32)
    padded[pad : pad + samples.shape[0]] = samples
    frames = 1 + (padded.shape[0] - n_fft) // hop_length
    if frames < 1:
        raise InvalidArgumentError("the audio is too short for one STFT frame")
    strided = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:frames]
    win = np.zeros(n_fft, np.float32)
    win[: window.shape[0]] = window[:n_fft]
    power = np.empty((n_fft // 2 + 1, frames), np.float32)
    block = 512
    windowed = np.empty((min(block, frames), n_fft), np.float64)
    for start in range(0, frames, block):
        rows = strided[start : start + block]
        # a float32 product (the loop the inputs pick), stored as float64 for the rfft
        np.multiply(rows, win, out=windowed[: rows.shape[0]])
        spectrum = np.fft.rfft(windowed[: rows.shape[0]], axis=1)
        parts = spectrum.view(np.float64)
        parts *= parts
        power[:, start : start + block] = (parts[:, 0::2] + parts[:, 1::2]).T
    return power


def _mel_rows(filters: np.ndarray, power: np.ndarray, bands: list[tuple[int, int]]) -> np.ndarray:
    """``filters @ power`` ``[n_mel, frames]`` for ``power`` ``[bins, frames]`` float32: each
    filter over its band of bins only (the triangles are narrow; ``bands`` from `_bands`), one
    small product per filter (no multi-threaded BLAS call, whose time swings on a busy
    machine)."""
    out = np.zeros((filters.shape[0], power.shape[1]), np.float32)
    for m, (lo, hi) in enumerate(bands):
        if hi > lo:
            np.dot(filters[m, lo:hi], power[lo:hi], out=out[m])
    return out


def _bands(filters: np.ndarray) -> list[tuple[int, int]]:
    """Each filter's first and past-the-last non-zero bin."""
    found = []
    for row in filters:
        nz = np.flatnonzero(row)
        found.append((int(nz[0]), int(nz[-1]) + 1) if nz.size else (0, 0))
    return found


def _log_mel_of_mel(mel: np.ndarray, frames: int | None, feature_first: bool) -> np.ndarray:
    """Clamp, ``log10``, floor at the maximum - 8, ``(x + 4) / 4``, pad or cut to ``frames``."""
    np.maximum(mel, np.float32(1e-10), out=mel)
    log = np.log10(mel)
    floor = log.max() - np.float32(8.0)
    np.maximum(log, floor, out=log)
    log += np.float32(4.0)
    log /= np.float32(4.0)
    if frames is not None:
        out = np.full(
            (log.shape[0], frames), (floor + np.float32(4.0)) / np.float32(4.0), np.float32
        )
        kept = min(frames, log.shape[1])
        out[:, :kept] = log[:, :kept]
        log = out
    return log if feature_first else np.ascontiguousarray(log.T)


def log_mel(
    power: np.ndarray, filters: np.ndarray, frames: int | None, feature_first: bool = True
) -> np.ndarray:
    """Whisper's log-mel features of a power spectrum ``[bins, frames]`` (its last frame
    dropped, as the reference): ``[n_mel, frames]`` padded (or cut) to ``frames`` with the
    clamp value, or every frame when ``frames`` is None; ``[frames, n_mel]`` when not
    ``feature_first``."""
    if power.shape[1] < 2:
        raise InvalidArgumentError("the audio is too short for log-mel features")
    filters = np.asarray(filters, np.float32)
    power = np.asarray(power[: filters.shape[1], :-1], np.float32)
    mel = _mel_rows(filters, power, _bands(filters))
    return _log_mel_of_mel(mel, frames, feature_first)


# --- the reference's downsampler (onnxruntime-extensions' AudioDecoder) ------------------------

#: The Kaiser window's beta in the reference's interpolator.
_KAISER_BETA = 6.0
#: The Butterworth low-pass filter's order in the reference's decoder.
_BUTTER_ORDER = 4
#: Impulse responses longer than this run as the reference's loop (rates just above the target).
_FIR_LIMIT = 16384


def butterworth_lowpass(cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """The reference's 4th-order Butterworth low-pass filter at ``cutoff`` (cycles per
    sample, below 0.5): ``(b, a)`` float64 with ``a[0] == 1`` for
    ``y[n] = sum b[k] x[n-k] - sum_{k>0} a[k] y[n-k]``. Poles from the bilinear transform
    (The Scientist and Engineer's Guide to DSP, ch. 33), cascaded in pairs, unity gain at DC,
    computed in the same order of operations as the reference."""
    order = _BUTTER_ORDER
    t = 2.0 * math.tan(0.5)
    w = 2.0 * math.pi * cutoff
    k = math.sin(0.5 - w / 2.0) / math.sin(0.5 + w / 2.0)
    a = [0.0] * (order + 3)
    b = [0.0] * (order + 3)
    a[2] = b[2] = 1.0
    for pole in range(1, order // 2 + 1):
        angle = math.pi / (order * 2.0) + (pole - 1.0) * math.pi / order
        rp, ip = -math.cos(angle), math.sin(angle)
        m = rp * rp + ip * ip
        d = 4.0 - 4.0 * rp * t + m * t * t
        x0, x1, x2 = t * t / d, 2.0 * t * t / d, t * t / d
        y1 = (8.0 - 2.0 * m * t * t) / d
        y2 = (-4.0 - 4.0 * rp * t - m * t * t) / d
        d = 1.0 + y1 * k - y2 * k * k
        a0 = (x0 - x1 * k + x2 * k * k) / d
        a1 = (-2.0 * x0 * k + x1 + x1 * k * k - 2.0 * x2 * k) / d
        a2 = (x0 * k * k - x1 * k + x2) / d
        b1 = (2.0 * k + y1 + y1 * k * k - 2.0 * y2 * k) / d
        b2 = (-k * k - y1 * k + y2) / d
        ta, tb = a[:], b[:]
        for i in range(2, order + 3):
            a[i] = a0 * ta[i] + a1 * ta[i - 1] + a2 * ta[i - 2]
            b[i] = tb[i] - b1 * tb[i - 1] - b2 * tb[i - 2]
    num = np.array(a[2:], np.float64)
    den = np.array(b[2:], np.float64)
    den[0] = 0.0
    num /= num.sum() / (1.0 + den.sum())
    den[0] = 1.0
    return num, den


def _iir(samples: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """The 4th-order filter run over ``samples`` one by one in float64, as the reference's
    loop computes it."""
    b0, b1, b2, b3, b4 = (float(v) for v in num)
    _, a1, a2, a3, a4 = (float(v) for v in den)
    x1 = x2 = x3 = x4 = y1 = y2 = y3 = y4 = 0.0
    out = []
    for x in samples.tolist():
        y = b0 * x + b1 * x1 + b2 * x2 + b3 * x3 + b4 * x4 - a1 * y1 - a2 * y2 - a3 * y3 - a4 * y4
        x4, x3, x2, x1 = x3, x2, x1, x
        y4, y3, y2, y1 = y3, y2, y1, y
        out.append(y)
    return np.array(out)


def _iir_run(num: np.ndarray, den: np.ndarray, steps: int) -> np.ndarray:
    """The first ``steps`` samples of the filter's impulse response, in float64, as the
    reference's loop computes them."""
    impulse = np.zeros(steps)
    impulse[:1] = 1.0
    return _iir(impulse, num, den)


@lru_cache(maxsize=32)
def _impulse_response(num: tuple[float, ...], den: tuple[float, ...]) -> np.ndarray | None:
    """The filter's impulse response cut where it is below 1e-18 of its peak, or None when
    it is still above that after `_FIR_LIMIT` samples (poles near the unit circle) or its
    magnitudes sum above 1e3 (a convolution would then lose precision the recursion keeps)."""
    h = _iir_run(np.array(num), np.array(den), _FIR_LIMIT)
    big = np.flatnonzero(np.abs(h) > 1e-18 * np.abs(h).max())
    if big[-1] >= _FIR_LIMIT - 64 or np.abs(h).sum() > 1e3:
        return None
    h = h[: big[-1] + 1]
    h.flags.writeable = False  # shared through the cache
    return h


def _fast_length(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= ``n`` (a quick FFT length)."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def lowpass(samples: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """The IIR filter ``(num, den)`` (`butterworth_lowpass`) on ``samples`` from rest, in
    float64, rounded to float32 as the reference's loop.

    A stable filter is its impulse response (cut below 1e-18 of its peak): an overlap-save
    FFT convolution in blocks. One whose response outlasts `_FIR_LIMIT` samples runs as the
    reference's loop, in Python."""
    x = np.asarray(samples, np.float32)
    n = x.shape[0]
    if n == 0:
        return np.zeros(0, np.float32)
    h = _impulse_response(tuple(num.tolist()), tuple(den.tolist()))
    if h is None:
        return _iir_loop(x, num, den)
    taps = h.shape[0]
    size = _fast_length(max(1 << 13, 4 * taps))
    step = size - taps + 1
    spectrum = np.fft.rfft(h, size)
    groups = -(-n // step)
    out = np.empty(groups * step, np.float32)
    batch = max(1, (1 << 17) // size)  # ~1 MB of blocks at a time: they stay in cache
    for start in range(0, groups, batch):
        count = min(batch, groups - start)
        # window g holds x[g * step - taps + 1 :][:size] (zeros before the start and past the end)
        lo = start * step - taps + 1
        padded = np.zeros((count - 1) * step + size, np.float64)
        src = x[max(0, lo) : lo + padded.shape[0]]
        padded[max(0, -lo) : max(0, -lo) + src.shape[0]] = src
        windows = np.lib.stride_tricks.sliding_window_view(padded, size)[::step]
        part = np.fft.rfft(windows, axis=1)
        part *= spectrum
        y = np.fft.irfft(part, size, axis=1)[:, taps - 1 :]
        out[start * step : start * step + y.size] = y.reshape(-1)
    return out[:n]


def _iir_loop(samples: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """`lowpass` sample by sample, as the reference's loop (slow: filters whose impulse
    response outlasts `_FIR_LIMIT` samples: a rate less than about 0.25% above the target)."""
    return _iir(samples, num, den).astype(np.float32)


@lru_cache(maxsize=16)
def _bessel_i0(x: float) -> float:
    """I0 by its power series to a relative 1e-8 (the reference's ``cyl_bessel_i0``)."""
    total, term, quarter, k = 0.0, 1.0, x * x / 4.0, 0
    while term > 1e-8 * total:
        total += term
        k += 1
        term *= quarter / (k * k)
    return total


@lru_cache(maxsize=64)
def _kaiser(length: int) -> np.ndarray:
    """The reference's symmetric Kaiser window of ``length`` points (beta 6); one point is 1
    (the reference's formula divides 0 by 0 there: a NaN output for a one-sample clip)."""
    scale = _bessel_i0(_KAISER_BETA)
    points = [2.0 * i / (length - 1.0) - 1.0 for i in range(length)] if length > 1 else [0.0]
    window = np.array([_bessel_i0(_KAISER_BETA * math.sqrt(1.0 - p * p)) / scale for p in points])
    window.flags.writeable = False  # shared through the cache
    return window


def kaiser_interpolate(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """The reference's interpolator from ``rate`` to ``target`` Hz: output ``i`` sits at
    ``index = i / (target / rate)`` (float32 arithmetic, as the reference), the sum of the
    input around ``int(index)`` (``ceil(3 rate / target)`` samples each side, fewer at the
    ends) weighted by ``sinc(j - index)`` times a Kaiser window over those samples;
    ``ceil(len * target / rate)`` outputs, float32."""
    x = np.ascontiguousarray(samples, np.float32)
    factor = np.float32(target) / np.float32(rate)
    count = int(np.ceil(np.float32(x.shape[0]) * factor))
    out = np.empty(count, np.float32)
    chunk = 1 << 18  # outputs at a time: the positions' arrays stay small for long clips
    for first in range(0, count, chunk):
        _kaiser_outputs(x, factor, first, min(count, first + chunk), out)
    return out


def _kaiser_outputs(
    x: np.ndarray, factor: np.float32, first: int, last: int, out: np.ndarray
) -> None:
    """Outputs ``first`` to ``last`` of `kaiser_interpolate` into ``out``."""
    n = x.shape[0]
    reach = math.ceil(_KAISER_BETA / (2.0 * float(factor)))
    taps = 2 * reach + 1
    index = np.arange(first, last).astype(np.float32) / factor
    whole = index.astype(np.int64)
    frac = index.astype(np.float64) - whole
    kaiser = _kaiser(taps)
    offsets = np.arange(-reach, reach + 1)
    # sinc(k - f) = sin(pi (k - f)) / (pi (k - f)) = -(-1)^k sin(pi f) / (pi (k - f))
    signed = kaiser * np.where(offsets % 2, 1.0, -1.0) / np.pi
    with np.errstate(divide="ignore", invalid="ignore"):
        at_whole = kaiser * np.where(offsets == 0, 1.0, np.sin(np.pi * offsets) / (np.pi * offsets))
    # outputs whose whole window lies inside the clip: a contiguous run (positions increase)
    lo = int(np.searchsorted(whole, reach, side="left"))
    hi = max(lo, int(np.searchsorted(whole, n - 1 - reach, side="right")))
    block = 1 << 15
    picked = np.empty(block, np.float32)
    weight = np.empty(block)
    for start in range(lo, hi, block):
        end = min(hi, start + block)
        m = end - start
        f = frac[start:end]
        base = whole[start:end] - reach
        on_sample = f == 0.0  # an output on an input sample: the fixed weights at_whole
        acc = np.zeros(m)
        if on_sample.all():
            for k in range(taps):
                np.take(x[k:], base, out=picked[:m])
                np.multiply(picked[:m], at_whole[k], out=weight[:m])
                acc += weight[:m]
            out[first + start : first + end] = acc
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            for k in range(taps):
                np.subtract(float(k - reach), f, out=weight[:m])
                np.divide(signed[k], weight[:m], out=weight[:m])
                np.take(x[k:], base, out=picked[:m])
                weight[:m] *= picked[:m]
                acc += weight[:m]
            acc *= np.sin(np.pi * f)
        rows = np.flatnonzero(on_sample)
        if rows.size:
            acc[rows] = np.lib.stride_tricks.sliding_window_view(x, taps)[base[rows]] @ at_whole
        out[first + start : first + end] = acc
    # the ends (a window cut short by the clip) and positions within 1e-6 of a sample (only
    # below index 8.4, where float32 has the resolution): the reference's sum, output by output
    tiny = np.flatnonzero((index < 16.0) & (frac != 0.0) & ((frac < 1e-6) | (frac > 1.0 - 1e-6)))
    exact = np.concatenate([np.arange(0, lo), tiny, np.arange(hi, last - first)])
    for i in exact.tolist():
        a, b = max(0, int(whole[i]) - reach), min(n - 1, int(whole[i]) + reach)
        distance = np.abs(np.arange(a, b + 1, dtype=np.float64) - float(index[i]))
        with np.errstate(divide="ignore", invalid="ignore"):
            sinc = np.where(distance < 1e-6, 1.0, np.sin(np.pi * distance) / (np.pi * distance))
        out[first + i] = np.dot(x[a : b + 1].astype(np.float64), _kaiser(b - a + 1) * sinc)


def downsample(samples: np.ndarray, rate: int, target: int, count: int | None = None) -> np.ndarray:
    """``samples`` at ``rate`` Hz brought down to ``target`` Hz exactly as the reference's
    AudioDecoder does: `butterworth_lowpass` at half the target rate (`lowpass`), then
    `kaiser_interpolate`. ``count``: only the first ``count`` outputs (computed from the
    shortest prefix of the input that gives them unchanged)."""
    if target >= rate:
        raise InvalidArgumentError(f"downsample: {target} Hz is not below {rate} Hz")
    x = np.asarray(samples, np.float32)
    if count is not None:
        factor = np.float32(target) / np.float32(rate)
        last = int(np.float32(max(count - 1, 0)) / factor)
        x = x[: last + math.ceil(_KAISER_BETA / (2.0 * float(factor))) + 1]
    num, den = butterworth_lowpass(0.5 * target / rate)
    out = kaiser_interpolate(lowpass(x, num, den), rate, target)
    return out if count is None else out[:count]


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

    def pcm(self, clip: AudioClip, count: int | None = None) -> np.ndarray:
        """AudioDecoder: the clip's mono samples at the pipeline's rate (only the first
        ``count`` when given). A higher rate is brought down as the reference does
        (`downsample`); a lower one, which the reference refuses, is upsampled (`resample`)."""
        rate, target = clip.sample_rate, self.sample_rate
        if rate > target:
            return self._long_enough(clip, downsample(clip.samples, rate, target, count))
        samples = clip.samples
        if rate < target and count is not None:
            samples = samples[: math.ceil(count * rate / target) + 64]
        out = resample(samples, rate, target)
        return self._long_enough(clip, out if count is None else out[:count])

    def _long_enough(self, clip: AudioClip, pcm: np.ndarray) -> np.ndarray:
        """``pcm``, when it holds the two feature frames the features need (one hop of
        samples); else an error naming the clip."""
        if 0 < pcm.shape[0] < self.hop_length:
            name = clip.source or "the audio"
            raise InvalidArgumentError(
                f"audio {name} is too short for log-mel features: {clip.samples.shape[0]} "
                f"samples at {clip.sample_rate} Hz, at least "
                f"{1000 * self.hop_length / self.sample_rate:g} ms needed"
            )
        return pcm

    def features_of_pcm(self, samples: np.ndarray) -> np.ndarray:
        """STFTNorm + LogMelSpectrum of samples at `sample_rate`: ``[n_mel, frames]``."""
        if not self.no_padding:
            samples = samples[: self.window_samples]
        power = stft_power(samples, self.n_fft, self.hop_length, self.window)
        if power.shape[1] < 2:
            raise InvalidArgumentError("the audio is too short for log-mel features")
        filters, bands = _filters(self.n_fft, self.n_mel)
        mel = _mel_rows(filters, power[: filters.shape[1], :-1], bands)
        return _log_mel_of_mel(mel, self.frames, self.feature_first)

    def features(self, clips: Sequence[AudioClip]) -> np.ndarray:
        """The features of each clip, stacked: ``[clips, n_mel, frames]`` (float32)."""
        count = None if self.no_padding else self.window_samples
        arrays = [self.features_of_pcm(self.pcm(clip, count)) for clip in clips]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise InvalidArgumentError(
                "clips of different lengths cannot be batched without padding "
                "(LogMelSpectrum no_padding)"
            )
        return np.stack(arrays)


_FILTERS: dict[tuple[int, int], tuple[np.ndarray, list[tuple[int, int]]]] = {}


def _filters(n_fft: int, n_mel: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The mel filters of (n_fft, n_mel) and their bands, made once."""
    found = _FILTERS.get((n_fft, n_mel))
    if found is None:
        filters = mel_filters(n_fft, n_mel)
        found = _FILTERS[(n_fft, n_mel)] = (filters, _bands(filters))
    return found
