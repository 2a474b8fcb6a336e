"""Whisper end to end: the reference (onnxruntime_genai) and genai on the same tiny random
folder (`genai.testing.whisper`, written through the builder's Whisper writer) and the same
audio files.

The audio front end is checked against the reference's processor (log-mel features of the same
file within 1e-4); the model side with each engine's processor output fed to the other's
generator where it matters (greedy tokens, first-step logits, batch 2, beam search, rewind).
Bad input (unreadable or empty audio, wrong shapes, audio for a text model, a Whisper prompt
without audio) raises clear `genai.GenaiError` subclasses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import genai
from genai.errors import (
    ArgumentTypeError,
    GenerationError,
    InvalidArgumentError,
    ModelError,
)
from genai.multimodal.audio_features import AudioPipeline, resample
from genai.multimodal.transcribe import (
    TimestampRules,
    WhisperVocabulary,
    detect_language,
    segments_of,
    transcribe,
)
from genai.testing.whisper import synthetic_speech, write_whisper_fixture

og = pytest.importorskip("onnxruntime_genai")
sf = pytest.importorskip("soundfile")

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
MAX_LENGTH = 32


def _signal(rate: int, seconds: float, seed: int, channels: int = 1) -> np.ndarray:
    """Two chirping tones and noise: a spectrum that changes over time."""
    return synthetic_speech(seconds, seed, rate, noise=0.05, channels=channels)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_whisper_fixture(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio")
    files = {
        "wav": ("a.wav", _signal(16000, 3.3, 0), 16000, "PCM_16"),
        "wav2": ("b.wav", _signal(16000, 5.0, 1), 16000, "PCM_16"),
        "float": ("c.wav", _signal(16000, 2.0, 2), 16000, "FLOAT"),
        "flac": ("d.flac", _signal(16000, 4.0, 3), 16000, None),
        "long": ("e.wav", _signal(16000, 40.0, 4), 16000, "PCM_16"),
        "stereo44": ("f.wav", _signal(44100, 2.5, 5, channels=2), 44100, "PCM_16"),
        "ogg": ("g.ogg", _signal(16000, 3.0, 6), 16000, None),
    }
    paths = {}
    for key, (name, samples, rate, subtype) in files.items():
        path = root / name
        sf.write(path, samples, rate, subtype=subtype)
        paths[key] = path
    empty = root / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000, subtype="PCM_16")
    paths["empty"] = empty
    garbage = root / "garbage.wav"
    garbage.write_bytes(b"RIFF\x00\x00\x00\x00this is not audio at all" * 10)
    paths["garbage"] = garbage
    zero = root / "zero.mp3"
    zero.write_bytes(b"")
    paths["zero"] = zero
    return paths


def _reference_features(folder: Path, *paths: Path) -> tuple[np.ndarray, np.ndarray]:
    model = og.Model(str(folder))
    named = model.create_multimodal_processor()(
        [PROMPT] * len(paths), audios=og.Audios.open(*[str(p) for p in paths])
    )
    return named["audio_features"].as_numpy(), named["input_ids"].as_numpy()


def _start(engine, folder: Path, features, ids, **search) -> tuple[Any, Any, Any]:
    """``engine``'s (model, generator, named tensors) with ``features`` and ``ids`` set as the
    generator's inputs (``max_length`` MAX_LENGTH unless ``search`` says otherwise)."""
    model = engine.Model(str(folder))
    params = engine.GeneratorParams(model)
    params.set_search_options(**{"max_length": MAX_LENGTH, **search})
    generator = engine.Generator(model, params)
    named = engine.NamedTensors()
    named["audio_features"] = np.ascontiguousarray(features)
    named["input_ids"] = np.ascontiguousarray(ids, dtype=np.int32)
    generator.set_inputs(named)
    return model, generator, named


def _generate(engine, folder: Path, features, ids, **search) -> tuple[np.ndarray, list]:
    """First-step logits and every sequence, with ``engine`` on the given inputs."""
    _model, generator, _ = _start(engine, folder, features, ids, **search)
    logits = generator.get_logits()
    while not generator.is_done():
        generator.generate_next_token()
    count = search.get("batch_size", 1) * search.get("num_return_sequences", 1)
    return logits, [np.asarray(generator.get_sequence(i)) for i in range(count)]


# --- the audio front end --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["wav", "float", "flac", "long"])
def test_log_mel_features_match_the_reference_processor(
    folder: Path, audio: dict[str, Path], key: str
) -> None:
    expected, expected_ids = _reference_features(folder, audio[key])
    named = genai.Model(folder).create_multimodal_processor()(
        PROMPT, audios=genai.Audios.open(audio[key])
    )
    features = np.asarray(named["audio_features"])
    assert features.shape == expected.shape == (1, 80, 3000)
    assert features.dtype == np.float32
    np.testing.assert_allclose(features, expected, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(np.asarray(named["input_ids"]), expected_ids)


def test_bytes_and_paths_give_the_same_features(folder: Path, audio: dict[str, Path]) -> None:
    processor = genai.Model(folder).create_multimodal_processor()
    blob = audio["flac"].read_bytes()
    a = np.asarray(processor(PROMPT, audios=genai.Audios.open(audio["flac"]))["audio_features"])
    b = np.asarray(processor(PROMPT, audios=genai.Audios.open_bytes(blob))["audio_features"])
    np.testing.assert_array_equal(a, b)


def test_resampled_stereo_features_match_the_reference(
    folder: Path, audio: dict[str, Path]
) -> None:
    """44.1 kHz stereo: both engines mix to mono and resample to 16 kHz the same way (the
    reference's Butterworth low-pass and Kaiser interpolation), so the features agree to 1e-4."""
    expected, _ = _reference_features(folder, audio["stereo44"])
    named = genai.Model(folder).create_multimodal_processor()(
        PROMPT, audios=genai.Audios.open(audio["stereo44"])
    )
    np.testing.assert_allclose(np.asarray(named["audio_features"]), expected, atol=1e-4, rtol=0)


def test_a_lower_sample_rate_is_upsampled() -> None:
    """8 kHz audio (the reference refuses it: "only down-sampling supported") gives the
    features of the same tones recorded at 16 kHz, below 4 kHz."""
    pipeline = AudioPipeline()
    tones = [(440, 0.3), (1500, 0.2)]

    def at(rate: int) -> np.ndarray:
        t = np.arange(2 * rate) / rate
        x = sum(a * np.sin(2 * np.pi * f * t) for f, a in tones).astype(np.float32)
        return pipeline.features(genai.Audios.from_arrays(x, sample_rate=rate).clips)[0]

    low, high = at(8000), at(16000)
    bins = pipeline.n_mel * 6 // 10  # mel bins below ~3.5 kHz
    np.testing.assert_allclose(low[:bins, 5:195], high[:bins, 5:195], atol=1e-3)


@pytest.mark.parametrize("rate", [44100, 22050, 48000, 8000, 11025, 16001])
def test_resampling_keeps_tones_below_the_new_nyquist(rate: int) -> None:
    """Tones sampled at ``rate`` resampled to 16 kHz equal the same tones sampled at 16 kHz
    (away from the edges), and a tone above 8 kHz is filtered out."""
    tones = [(440.0, 0.4), (1733.0, 0.2), (3500.0, 0.1)]
    n = rate * 2
    t = np.arange(n) / rate
    x = sum(a * np.sin(2 * np.pi * f * t) for f, a in tones)
    if rate > 20000:
        x = x + 0.3 * np.sin(2 * np.pi * 9500.0 * t)  # above 16 kHz's Nyquist: must vanish
    y = resample(x.astype(np.float32), rate, 16000)
    assert y.shape == (int(np.ceil(n * 16000 / rate)),)
    u = np.arange(y.shape[0]) / 16000
    expected = sum(a * np.sin(2 * np.pi * f * u) for f, a in tones)
    inner = slice(400, -400)
    np.testing.assert_allclose(y[inner], expected[inner], atol=3e-3)


def test_an_ogg_file_is_decoded(folder: Path, audio: dict[str, Path]) -> None:
    """OGG/Vorbis (the reference's decoder does not detect it): features of the decoded
    samples, equal to those of the same samples given as an array."""
    samples, rate = sf.read(audio["ogg"], dtype="float32")
    pipeline = AudioPipeline.from_file(folder / "audio_processor_config.json")
    from_file = pipeline.features(genai.Audios.open(audio["ogg"]).clips)
    from_array = pipeline.features(genai.Audios.from_arrays(samples, sample_rate=rate).clips)
    np.testing.assert_array_equal(from_file, from_array)


# --- the model against the reference --------------------------------------------------------


def test_greedy_tokens_and_first_logits_match_the_reference(
    folder: Path, audio: dict[str, Path]
) -> None:
    features, ids = _reference_features(folder, audio["wav"])
    ref_logits, ref_seqs = _generate(og, folder, features, ids)
    logits, seqs = _generate(genai, folder, features, ids)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(seqs[0], ref_seqs[0])
    assert len(seqs[0]) > ids.shape[1] + 4  # it generated, not only the prompt


def test_our_processor_then_generator_equals_the_reference_end_to_end(
    folder: Path, audio: dict[str, Path]
) -> None:
    ref_model = og.Model(str(folder))
    ref_proc = ref_model.create_multimodal_processor()
    params = og.GeneratorParams(ref_model)
    params.set_search_options(max_length=MAX_LENGTH)
    ref = og.Generator(ref_model, params)
    ref.set_inputs(ref_proc(PROMPT, audios=og.Audios.open(str(audio["flac"]))))
    while not ref.is_done():
        ref.generate_next_token()

    model = genai.Model(folder)
    processor = model.create_multimodal_processor()
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    ours = genai.Generator(model, params)
    ours.set_inputs(processor(PROMPT, audios=genai.Audios.open(audio["flac"])))
    while not ours.is_done():
        ours.generate_next_token()
    np.testing.assert_array_equal(ours.get_sequence(0), ref.get_sequence(0))
    # decode skips the special tokens (the random tokens' bytes are not all valid UTF-8,
    # which the reference's decoder truncates at: compare on text tokens of ASCII bytes)
    text = np.asarray([*ours.get_sequence(0)[:4], 35, 36, 72, 105], np.int32)
    assert processor.decode(text) == ref_proc.decode(text)


def test_batch_of_two_audios_matches_the_reference(folder: Path, audio: dict[str, Path]) -> None:
    features, ids = _reference_features(folder, audio["wav"], audio["wav2"])
    ref_logits, ref_seqs = _generate(og, folder, features, ids, batch_size=2)
    logits, seqs = _generate(genai, folder, features, ids, batch_size=2)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
    for ours, ref in zip(seqs, ref_seqs, strict=True):
        np.testing.assert_array_equal(ours, ref)
    assert not np.array_equal(logits[0], logits[1])  # the rows saw different audio


@pytest.mark.parametrize(("beams", "returned"), [(3, 1), (4, 2)])
def test_beam_search_matches_the_reference(
    folder: Path, audio: dict[str, Path], beams: int, returned: int
) -> None:
    features, ids = _reference_features(folder, audio["wav"], audio["wav2"])
    search = {"batch_size": 2, "num_beams": beams, "num_return_sequences": returned}
    _, ref_seqs = _generate(og, folder, features, ids, **search)
    _, seqs = _generate(genai, folder, features, ids, **search)
    for ours, ref in zip(seqs, ref_seqs, strict=True):
        np.testing.assert_array_equal(ours, ref)


def test_rewind_then_continue_gives_the_same_tokens(folder: Path, audio: dict[str, Path]) -> None:
    features, ids = _reference_features(folder, audio["wav"])
    _, (full,) = _generate(genai, folder, features, ids)
    _model, generator, named = _start(genai, folder, features, ids)
    for _ in range(8):
        generator.generate_next_token()
    keep = ids.shape[1] + 3
    generator.rewind_to(keep)
    generator.append_tokens(full[keep : keep + 1])  # continue as the full run did
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0), full)
    # rewind_to(0) and new audio: a new transcription on the same generator
    generator.rewind_to(0)
    generator.set_inputs(named)
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0), full)


def test_encoder_outputs_and_inputs_are_readable(folder: Path, audio: dict[str, Path]) -> None:
    features, ids = _reference_features(folder, audio["wav"])
    _ref_model, ref, _ = _start(og, folder, features, ids)
    _model, ours, _ = _start(genai, folder, features, ids)
    for name in ("present_key_cross_0", "present_value_cross_1", "logits", "present_key_self_0"):
        np.testing.assert_allclose(ours.get_output(name), ref.get_output(name), atol=1e-4)
    np.testing.assert_array_equal(ours.get_input("audio_features"), features)


# --- long audio -----------------------------------------------------------------------------


def test_long_audio_is_transcribed_window_by_window(folder: Path) -> None:
    """70 s without timestamps: three windows (30 + 30 + 10 s), each decoded as the
    processor + generator decode that window alone."""
    samples = _signal(16000, 70.0, 7)
    model = genai.Model(folder)
    result = transcribe(model, genai.Audios.from_arrays(samples), timestamps=False, fallback=False)
    assert [(s.start, s.end) for s in result.segments] == [(0, 30), (30, 60), (60, 70)]
    assert result.duration == pytest.approx(70.0)
    processor = model.create_multimodal_processor()
    second = samples[30 * 16000 : 60 * 16000]
    # an English-only vocabulary (< 51865 ids, as Hugging Face decides): no language or task
    prompt = "<|startoftranscript|><|notimestamps|>"
    named = processor(prompt, audios=genai.Audios.from_arrays(second))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=model.config.context_length)
    generator = genai.Generator(model, params)
    generator.set_inputs(named)
    while not generator.is_done():
        generator.generate_next_token()
    expected = processor.decode(generator.get_sequence(0)).strip()
    assert result.segments[1].text == expected


@pytest.mark.parametrize("key", ["wav", "wav2", "flac"])
def test_detected_language_is_the_reference_decoders_likeliest(
    folder: Path, audio: dict[str, Path], key: str
) -> None:
    """The language the decoder ranks highest after <|startoftranscript|>, read from the
    reference's logits on the same features."""
    features, _ = _reference_features(folder, audio[key])
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=4)
    generator = og.Generator(model, params)
    named = og.NamedTensors()
    named["audio_features"] = features
    named["input_ids"] = np.asarray([[tokenizer.to_token_id("<|startoftranscript|>")]], np.int32)
    generator.set_inputs(named)
    logits = generator.get_logits()[0, 0]
    codes = ["en", "fr"]
    expected = codes[int(np.argmax([logits[tokenizer.to_token_id(f"<|{c}|>")] for c in codes]))]
    ours = genai.Model(folder)
    samples, rate = sf.read(audio[key], dtype="float32")
    assert rate == 16000
    assert detect_language(ours, ours.create_multimodal_processor(), samples) == expected


def test_segments_follow_timestamp_pairs_and_the_next_window_starts_after_the_last() -> None:
    """Hand-worked outputs: ids from 53 are timestamps (20 ms each), 50 is the end."""
    vocab = WhisperVocabulary(
        eot=50, sot=51, no_timestamps=52, timestamp_begin=53, multilingual=False
    )

    def text(tokens: np.ndarray) -> str:
        return "".join(chr(65 + int(t) % 26) for t in tokens)

    def cut(tokens: list[int]) -> tuple[list[tuple[float, float, str]], float]:
        found, consumed = segments_of(np.asarray(tokens), vocab, 10.0, text, 30.0)
        return [(round(s.start, 3), round(s.end, 3), s.text) for s in found], round(consumed, 3)

    # two closed segments, the output ends on a lone timestamp: the whole window is done
    assert cut([53, 10, 11, 78, 78, 12, 103, 50]) == (
        [(10.0, 10.5, "KL"), (10.5, 11.0, "M")],
        30.0,
    )
    # the window ends inside a segment: the next one starts at the last closed timestamp
    assert cut([53, 10, 78, 78, 12]) == ([(10.0, 10.5, "K")], 0.5)
    # no pair: one segment up to the last timestamp, the whole window done
    assert cut([53, 10, 11, 60, 50]) == ([(10.0, 10.14, "KL")], 30.0)
    # no timestamps in the vocabulary: the window is one segment
    plain = WhisperVocabulary(
        eot=50, sot=51, no_timestamps=52, timestamp_begin=-1, multilingual=False
    )
    found, consumed = segments_of(np.asarray([10, 11, 12, 50]), plain, 30.0, text, 12.5)
    assert [(s.start, s.end, s.text) for s in found] == [(30.0, 42.5, "KLM")]
    assert consumed == 12.5


def test_timestamp_rules_keep_timestamps_paired_and_monotonic() -> None:
    """Random logits through the rules, greedy: every output is text between timestamp pairs
    that never go backwards, starting with a timestamp within the first second."""
    vocab = WhisperVocabulary(
        eot=50, sot=51, no_timestamps=52, timestamp_begin=53, multilingual=False
    )
    size = 53 + 120
    rng = np.random.default_rng(0)
    for trial in range(50):
        prompt = np.array([51], np.int32)
        rules = TimestampRules(vocab, prompt_length=1, vocab_size=size)
        tokens = list(prompt)
        for _ in range(40):
            logits = rng.standard_normal(size).astype(np.float32) * 3
            logits[53:] += rng.uniform(-2, 4)  # sometimes timestamps dominate
            rules(np.asarray(tokens, np.int32), logits)
            token = int(np.argmax(logits))
            assert token != vocab.no_timestamps
            tokens.append(token)
            if token == vocab.eot:
                break
        out = np.asarray(tokens[1:])
        assert out[0] >= 53 and out[0] <= 53 + 50, trial
        stamps = out[out >= 53]
        assert (np.diff(stamps) >= 0).all(), trial
        text_run = out < 53
        # a timestamp is followed by text, its partner, or the end; pairs close runs of text
        is_ts = out >= 53
        for i in range(1, len(out)):
            if is_ts[i] and is_ts[i - 1]:
                assert i + 1 >= len(out) or not is_ts[i + 1] or out[i + 1] == vocab.eot, trial
        assert text_run.sum() + is_ts.sum() == len(out)


# --- bad input ------------------------------------------------------------------------------


def test_non_finite_samples_absurd_rates_and_no_channels_are_clear_errors(tmp_path: Path) -> None:
    """A float WAV with one NaN (the features would be NaN and the first step would fail), a
    sample rate that would make the resampling window absurd, an array without channels."""
    soundfile = pytest.importorskip("soundfile")
    samples = np.zeros(1600, np.float32)
    samples[100] = np.nan
    path = tmp_path / "nan.wav"
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    with pytest.raises(InvalidArgumentError, match="has NaN or infinite samples"):
        genai.Audios.open(path)
    with pytest.raises(InvalidArgumentError, match="sample rate 1000000000000 Hz; expected 1 to"):
        genai.Audios.from_arrays(np.zeros(1600, np.float32), sample_rate=10**12)
    with pytest.raises(InvalidArgumentError, match="has no channels"):
        genai.Audios.from_arrays(np.zeros((100, 0), np.float32))
    with pytest.raises(ArgumentTypeError, match="Audios takes AudioClip objects, not str"):
        genai.Audios(["x"])  # type: ignore[list-item]


def test_unreadable_or_empty_audio_is_a_clear_error(audio: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        genai.Audios.open(tmp_path / "missing.wav")
    with pytest.raises(InvalidArgumentError, match="cannot decode"):
        genai.Audios.open(audio["garbage"])
    with pytest.raises(InvalidArgumentError, match="no samples"):
        genai.Audios.open(audio["empty"])
    with pytest.raises(InvalidArgumentError, match="cannot decode"):
        genai.Audios.open(audio["zero"])
    with pytest.raises(InvalidArgumentError, match="empty"):
        genai.Audios.open_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="cannot decode"):
        genai.Audios.open_bytes(b"not audio" * 100)
    with pytest.raises(ArgumentTypeError):
        genai.Audios.open(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        genai.Audios.open()
    with pytest.raises(InvalidArgumentError, match="sample rate 0 Hz"):
        genai.Audios.from_arrays(np.zeros(100, np.float32), sample_rate=0)


def test_a_whisper_prompt_without_audio_is_refused(folder: Path, audio: dict[str, Path]) -> None:
    model = genai.Model(folder)
    processor = model.create_multimodal_processor()
    with pytest.raises(InvalidArgumentError, match="No audios"):
        processor(PROMPT)
    with pytest.raises(InvalidArgumentError, match="No prompt"):
        processor(audios=genai.Audios.open(audio["wav"]))
    with pytest.raises(ArgumentTypeError, match="og.Audios"):
        processor(PROMPT, audios=str(audio["wav"]))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    generator = genai.Generator(model, params)
    with pytest.raises(GenerationError, match="audio"):
        generator.append_tokens(np.asarray([[1, 2, 3]], np.int32))
    named = genai.NamedTensors()
    named["input_ids"] = np.asarray([[1, 2]], np.int32)
    with pytest.raises(InvalidArgumentError, match="audio_features must be provided"):
        generator.set_inputs(named)


def test_features_of_the_wrong_shape_are_refused(folder: Path) -> None:
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    generator = genai.Generator(model, params)
    for shape, message in (
        ((1, 80, 1500), "num_frames = 3000"),
        ((1, 64, 3000), "mel bins"),
        ((2, 80, 3000), "batch_size is 1"),
        ((80, 3000), "rank 3"),
    ):
        named = genai.NamedTensors()
        named["audio_features"] = np.zeros(shape, np.float32)
        named["input_ids"] = np.asarray([[1]], np.int32)
        with pytest.raises(InvalidArgumentError, match=message):
            generator.set_inputs(named)


def test_prompt_rows_that_do_not_fit_the_batch_are_refused(folder: Path) -> None:
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, batch_size=2)
    generator = genai.Generator(model, params)
    for ids in (np.arange(3), np.ones((3, 2)), np.ones((2, 0)), np.full((2, 2), 10**6)):
        named = genai.NamedTensors()
        named["audio_features"] = np.zeros((2, 80, 3000), np.float32)
        named["input_ids"] = np.asarray(ids, np.int32)
        with pytest.raises(InvalidArgumentError):
            generator.set_inputs(named)
    named["input_ids"] = np.ones((2, 2), np.float32)
    with pytest.raises(ArgumentTypeError):
        generator.set_inputs(named)


def test_audio_for_a_text_model_is_refused(
    fixture_folders: dict[str, Path], audio: dict[str, Path]
) -> None:
    model = genai.Model(fixture_folders["gqa"])
    with pytest.raises(ModelError, match="not a registered multi-modal model type"):
        model.create_multimodal_processor()
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=16)
    generator = genai.Generator(model, params)
    named = genai.NamedTensors()
    named["audio_features"] = np.zeros((1, 80, 3000), np.float32)
    with pytest.raises(GenerationError, match="append_tokens"):
        generator.set_inputs(named)
    with pytest.raises(InvalidArgumentError, match="transcribe needs a Whisper model, not"):
        transcribe(model, genai.Audios.open(audio["wav2"]))


@pytest.mark.parametrize("damage", ["missing", "not JSON"])
def test_a_whisper_folder_with_a_broken_processor_config_says_so(
    folder: Path, audio: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    """Was "transcribe needs a Whisper model, not 'whisper'": the real cause was hidden."""
    import shutil

    copy = Path(shutil.copytree(folder, tmp_path / "whisper"))
    config = copy / "audio_processor_config.json"
    if damage == "missing":
        config.unlink()
    else:
        config.write_text("{bad")
    with pytest.raises(genai.GenaiError, match="audio_processor_config.json") as info:
        transcribe(genai.Model(copy), genai.Audios.open(audio["wav2"]))
    assert "needs a Whisper model" not in str(info.value)


# --- the command line -----------------------------------------------------------------------


def test_genai_transcribe_prints_the_transcript(folder: Path, audio: dict[str, Path]) -> None:
    model = genai.Model(folder)
    expected = transcribe(model, genai.Audios.open(audio["wav2"]), timestamps=False).text
    again = transcribe(model, genai.Audios.open(audio["wav2"]), timestamps=False).text
    assert again == expected  # the temperature fallback is seeded
    run = subprocess.run(
        [sys.executable, "-m", "genai", "transcribe", str(audio["wav2"]), "-m", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"
    bad = subprocess.run(
        [sys.executable, "-m", "genai", "transcribe", str(audio["garbage"]), "-m", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "cannot decode audio" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_import_genai_loads_no_audio_decoder() -> None:
    """soundfile (libsndfile) loads only when audio is decoded."""
    code = (
        "import sys, genai, genai.multimodal.transcribe; "
        "print('soundfile' in sys.modules, 'fastapi' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


def test_transcribe_checks_its_argument_types(folder: Path) -> None:
    model = genai.Model(folder)
    with pytest.raises(ArgumentTypeError, match="transcribe takes genai.Audios .* not str"):
        transcribe(model, "speech.wav")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="temperature must be a number, not str"):
        transcribe(model, genai.Audios.from_arrays(np.zeros(1600, np.float32)), temperature="hot")  # type: ignore[arg-type]
