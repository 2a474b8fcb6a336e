"""Whisper's audio front end at every sample rate: genai's log-mel features of a file against
the reference's processor (onnxruntime_genai's ``MultiModalProcessor`` on a tiny Whisper folder
from `genai.testing.whisper`) on the same file, written here at 16 to 48 kHz, mono and stereo,
and espeak-ng's own 22,050 Hz speech; the downsampler against a plain sample-by-sample twin of
the reference's AudioDecoder loops; the low-pass filter against what a 4th-order Butterworth
filter is.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.multimodal.audio_features import (
    AudioPipeline,
    butterworth_lowpass,
    downsample,
    kaiser_interpolate,
    lowpass,
)
from genai.testing.whisper import write_whisper_fixture
from tests.conftest import missing_in_ci

og = pytest.importorskip("onnxruntime_genai")
sf = pytest.importorskip("soundfile")

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


def _signal(rate: int, seconds: float, seed: int, channels: int = 1) -> np.ndarray:
    """A chirp, a tone above 8 kHz where the rate allows, and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * (350 + 50 * seed) * t * (1 + 0.03 * t))
    x += 0.15 * np.sin(2 * np.pi * 2300 * t) + 0.05 * rng.standard_normal(t.size)
    if rate > 20000:
        x += 0.1 * np.sin(2 * np.pi * 9100 * t)  # aliases unless low-passed as the reference
    x = x.astype(np.float32)
    if channels == 2:
        return np.stack([x, 0.6 * np.roll(x, rate // 3)], axis=1)
    return x


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_whisper_fixture(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def processors(folder: Path) -> tuple[object, object]:
    return (
        og.Model(str(folder)).create_multimodal_processor(),
        genai.Model(folder).create_multimodal_processor(),
    )


def _features(processors: tuple[object, object], path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(genai's, the reference's) features of the file at ``path``."""
    ref_processor, our_processor = processors
    expected = ref_processor([PROMPT], audios=og.Audios.open(str(path)))["audio_features"]
    ours = our_processor(PROMPT, audios=genai.Audios.open(path))["audio_features"]
    return np.asarray(ours), expected.as_numpy()


def _assert_matches_reference(ours: np.ndarray, expected: np.ndarray, share: float = 1e-3) -> None:
    """Within 1e-4 everywhere, and off by more than 1e-6 in under ``share`` of the values.

    What is left is the reference's float32 FFT (dlib's kissfft) against our float64 one: up
    to 1.6e-5 on these clips, ~2e-5 on speech, more in a pure tone's quiet bins. Measured
    with the mel filters in the reference's float32 order (`mel_filters`): at most 149 of
    the 240,000 values (0.06%, 44.1 kHz stereo 31 s) off by more than 1e-6, none by more
    than 1.6e-5; espeak-ng's speech 391 (0.16%). With NumPy's float32 ``exp`` in the filters
    it was up to 4,653 (1.9%), and 907 (0.38%) on the speech."""
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    off = np.abs(ours.astype(np.float64) - expected) > 1e-6
    assert off.mean() < share, f"{off.sum()} of {off.size} features differ by more than 1e-6"


@pytest.mark.parametrize(
    ("rate", "seconds", "channels", "subtype"),
    [
        (22050, 3.0, 1, "PCM_16"),
        (24000, 2.0, 1, "PCM_16"),
        (32000, 2.0, 1, "FLOAT"),
        (44100, 2.5, 1, "PCM_16"),
        (44100, 2.5, 2, "PCM_16"),
        (48000, 3.0, 1, "PCM_24"),
        (48000, 2.0, 2, "FLOAT"),
        (22050, 2.0, 2, "PCM_16"),
        (96000, 1.0, 2, "PCM_16"),
        (192000, 1.0, 1, "FLOAT"),
        (16001, 1.5, 1, "PCM_16"),  # a filter too slow to decay for a convolution
        (16000, 2.0, 2, "PCM_16"),  # stereo, no resampling
        (22050, 35.0, 1, "PCM_16"),  # past 30 s: float32 positions, the cut at 30 s
        (44100, 31.0, 2, "PCM_16"),
    ],
)
def test_features_of_each_rate_match_the_reference_processor(
    processors: tuple[object, object],
    tmp_path: Path,
    rate: int,
    seconds: float,
    channels: int,
    subtype: str,
) -> None:
    path = tmp_path / f"clip-{rate}.wav"
    sf.write(path, _signal(rate, seconds, seed=rate % 7, channels=channels), rate, subtype=subtype)
    ours, expected = _features(processors, path)
    assert ours.shape == expected.shape == (1, 80, 3000)
    assert ours.dtype == np.float32
    _assert_matches_reference(ours, expected)


def test_flac_at_44_1_khz_matches_the_reference_processor(
    processors: tuple[object, object], tmp_path: Path
) -> None:
    path = tmp_path / "clip.flac"
    sf.write(path, _signal(44100, 2.0, seed=3, channels=2), 44100, subtype="PCM_16")
    ours, expected = _features(processors, path)
    _assert_matches_reference(ours, expected)


def test_espeak_speech_at_its_native_rate_matches_the_reference_processor(
    processors: tuple[object, object], tmp_path: Path
) -> None:
    """espeak-ng speaks at 22,050 Hz: real speech, resampled by both processors."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        missing_in_ci("espeak-ng is not installed (apt-get install espeak-ng)")
    text = "The quick brown fox jumps over the lazy dog. Seven silver swans swam south."
    spoken = subprocess.run([exe, "--stdout", text], capture_output=True, check=True).stdout
    with wave.open(io.BytesIO(spoken)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert rate != 16000  # the point of the test: a rate the processors resample
    path = tmp_path / "speech.wav"
    sf.write(path, pcm, rate, subtype="PCM_16")
    ours, expected = _features(processors, path)
    assert np.ptp(expected) > 1.0  # speech, not silence
    _assert_matches_reference(ours, expected, share=2.5e-3)


@pytest.mark.parametrize("rate", [8000, 11025])
def test_a_rate_below_16_khz_is_upsampled_where_the_reference_refuses(
    processors: tuple[object, object], tmp_path: Path, rate: int
) -> None:
    ref_processor, our_processor = processors
    path = tmp_path / f"low-{rate}.wav"
    sf.write(path, _signal(rate, 2.0, seed=1), rate, subtype="PCM_16")
    with pytest.raises(Exception, match="only down-sampling supported"):
        ref_processor([PROMPT], audios=og.Audios.open(str(path)))
    features = np.asarray(our_processor(PROMPT, audios=genai.Audios.open(path))["audio_features"])
    assert features.shape == (1, 80, 3000)
    assert np.isfinite(features).all()


# --- the downsampler against a sample-by-sample twin of the reference's loops -----------------


def _twin_lowpass(x: np.ndarray, b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Direct form I, one sample at a time in float64, rounded to float32."""
    xs = [0.0] * 5
    ys = [0.0] * 5
    out = np.empty(x.shape[0], np.float32)
    for i, v in enumerate(x.tolist()):
        xs = [v, *xs[:4]]
        y = sum(b[k] * xs[k] for k in range(5)) - sum(a[k] * ys[k - 1] for k in range(1, 5))
        ys = [y, *ys[:4]]
        out[i] = y
    return out


def _twin_kaiser(
    x: np.ndarray, rate: int, target: int, outputs: np.ndarray | None = None
) -> np.ndarray:
    """For each output (or those in ``outputs``): its float32 position, the samples within
    ceil(3 rate / target) of it, a Kaiser window (beta 6, NumPy's I0) over exactly those,
    times sinc."""
    factor = np.float32(target) / np.float32(rate)
    count = math.ceil(np.float32(x.shape[0]) * factor)
    reach = math.ceil(3.0 / float(factor))
    picked = np.arange(count) if outputs is None else outputs
    out = np.empty(picked.shape[0], np.float32)
    for o, i in enumerate(picked.tolist()):
        pos = float(np.float32(i) / factor)
        lo, hi = max(0, int(pos) - reach), min(x.shape[0] - 1, int(pos) + reach)
        j = np.arange(lo, hi + 1)
        u = 2.0 * np.arange(j.size) / (j.size - 1.0) - 1.0
        window = np.i0(6.0 * np.sqrt(1.0 - u * u)) / np.i0(6.0)
        out[o] = np.dot(x[lo : hi + 1].astype(np.float64), window * np.sinc(j - pos))
    return out


@pytest.mark.parametrize("rate", [22050, 44100, 48000, 96000, 16050])
def test_downsample_equals_the_sample_by_sample_twin(rate: int) -> None:
    x = (np.random.default_rng(rate).standard_normal(rate // 4) * 0.3).astype(np.float32)
    b, a = butterworth_lowpass(0.5 * 16000 / rate)
    filtered = _twin_lowpass(x, b, a)
    np.testing.assert_allclose(lowpass(x, b, a), filtered, atol=1e-6, rtol=0)
    expected = _twin_kaiser(filtered, rate, 16000)
    np.testing.assert_allclose(kaiser_interpolate(filtered, rate, 16000), expected, atol=1e-6)
    ours = downsample(x, rate, 16000)
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-6, rtol=0)


def test_a_long_clip_equals_scipy_lfilter_and_the_twin_across_blocks() -> None:
    """70 s at 44.1 kHz: past the filter's batches of FFT blocks and the interpolator's chunks
    of outputs; the filter against SciPy's lfilter (float64), the interpolator against the
    twin around each chunk's edges and at the end."""
    signal = pytest.importorskip("scipy.signal")
    rate = 44100
    x = (np.random.default_rng(7).standard_normal(rate * 70) * 0.3).astype(np.float32)
    b, a = butterworth_lowpass(0.5 * 16000 / rate)
    filtered = lowpass(x, b, a)
    expected = signal.lfilter(b, a, x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(filtered, expected, atol=1e-6, rtol=0)
    ours = kaiser_interpolate(filtered, rate, 16000)
    assert ours.shape == (math.ceil(np.float32(x.size) * (np.float32(16000) / np.float32(rate))),)
    edges = [c + d for c in (1 << 18, 2 << 18, 3 << 18, 4 << 18) for d in (-2, -1, 0, 1)]
    outputs = np.array([0, 1, 2, *edges, ours.size - 2, ours.size - 1])
    twin = _twin_kaiser(filtered, rate, 16000, outputs)
    np.testing.assert_allclose(ours[outputs], twin, atol=1e-6, rtol=0)


def test_a_prefix_of_the_output_needs_only_a_prefix_of_the_input() -> None:
    x = (np.random.default_rng(0).standard_normal(44100 * 3) * 0.3).astype(np.float32)
    full = downsample(x, 44100, 16000)
    np.testing.assert_array_equal(downsample(x, 44100, 16000, count=16000), full[:16000])


@pytest.mark.parametrize("length", [1, 2, 7, 30])
def test_clips_shorter_than_the_interpolation_window(length: int) -> None:
    x = (np.random.default_rng(length).standard_normal(length) * 0.3).astype(np.float32)
    b, a = butterworth_lowpass(0.5 * 16000 / 48000)
    filtered = _twin_lowpass(x, b, a)
    ours = kaiser_interpolate(filtered, 48000, 16000)
    expected = _twin_kaiser(filtered, 48000, 16000) if length > 1 else ours
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert ours.shape == (math.ceil(length / 3),)


@pytest.mark.parametrize("rate", [17000, 22050, 44100, 48000, 192000])
def test_the_lowpass_filter_is_a_4th_order_butterworth_at_half_the_target_rate(
    rate: int,
) -> None:
    """Unity gain at DC, -3 dB at the cut-off, a maximally flat pass band (|H|^2 = 1 / (1 +
    (w / wc)^8) after the bilinear warp), zero at Nyquist, poles inside the unit circle."""
    cutoff = 0.5 * 16000 / rate
    b, a = butterworth_lowpass(cutoff)
    assert b.shape == a.shape == (5,) and a[0] == 1.0

    def gain(f: np.ndarray) -> np.ndarray:
        z = np.exp(-2j * np.pi * np.asarray(f)[:, None] * np.arange(5))
        return np.abs((z @ b) / (z @ a))

    freqs = np.array([0.0, cutoff / 4, cutoff / 2, cutoff, min(0.49, 1.5 * cutoff), 0.5])
    g = gain(freqs)
    assert g[0] == pytest.approx(1.0, abs=1e-12)
    assert g[3] == pytest.approx(1 / math.sqrt(2), abs=1e-9)
    warp = np.tan(np.pi * freqs) / np.tan(np.pi * cutoff)
    np.testing.assert_allclose(g[:5], 1 / np.sqrt(1 + warp[:5] ** 8), atol=1e-9)
    assert g[5] < 1e-9
    assert np.abs(np.roots(a)).max() < 1.0


def test_the_pipeline_resamples_the_first_window_only_when_padding(tmp_path: Path) -> None:
    pipeline = AudioPipeline()
    x = _signal(22050, 32.0, seed=2)
    clip = genai.Audios.from_arrays(x, sample_rate=22050).clips[0]
    full = pipeline.pcm(clip)
    assert full.shape == (math.ceil(np.float32(x.size) * (np.float32(16000) / np.float32(22050))),)
    window = pipeline.pcm(clip, pipeline.window_samples)
    np.testing.assert_array_equal(window, full[: pipeline.window_samples])
    np.testing.assert_array_equal(
        pipeline.features([clip])[0], pipeline.features_of_pcm(full[: pipeline.window_samples])
    )


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_16_bit_files_decode_to_libsndfiles_floats_mixed_as_the_reference(fmt: str) -> None:
    """16-bit files are read as integers and scaled by 1/32768: the same floats libsndfile
    (and the reference's dr_wav / dr_flac) give, stereo mixed to (left + right) / 2."""
    rng = np.random.default_rng(5)
    pcm = rng.integers(-32768, 32768, (40000, 2), dtype=np.int16)
    pcm[:2] = [[-32768, 32767], [32767, -32768]]
    blob = io.BytesIO()
    sf.write(blob, pcm, 22050, format=fmt, subtype="PCM_16")
    floats, _ = sf.read(io.BytesIO(blob.getvalue()), dtype="float32", always_2d=True)
    clip = genai.Audios.open_bytes(blob.getvalue()).clips[0]
    assert clip.sample_rate == 22050
    np.testing.assert_array_equal(clip.samples, (floats[:, 0] + floats[:, 1]) / np.float32(2))
