"""Transcribing whole recordings with a Whisper model: 30-second windows, timestamps and
segments (used by ``genai transcribe`` and ``POST /v1/audio/transcriptions``).

Whisper sees 30 seconds at a time. `transcribe` walks a recording as OpenAI's reference
implementation does: decode the window at the current position with timestamp tokens; each
pair of timestamps closes a segment; when the window ends inside a segment (the output does
not end on a lone timestamp), the next window starts at the last closed segment's end, so no
word is cut between windows; otherwise it starts after the whole window. A model whose
vocabulary has no timestamp tokens is decoded window by window with ``<|notimestamps|>``.

Decoding with timestamps follows Whisper's rules (`TimestampRules`, a logits processor of the
generator's chain): timestamps come in pairs and never go backwards, the first token is a
timestamp no later than 1 s, and a timestamp wins when the timestamps together are more
likely than any text token. The search is greedy (``temperature`` 0) or samples at
``temperature``.

A greedy window whose text repeats itself (zlib compression ratio above 2.4) or that the
model is unsure of (mean token log-probability below -1) is decoded again at rising
temperatures (`FALLBACK_TEMPERATURES`, seeded: the same file gives the same transcript), as
OpenAI's implementation does. When no decoding passes with timestamps, the window is decoded
once more without them, as one segment, or in halves (down to 7.5 s) while a part decodes
badly: a segment that closes far beyond its words (small models do this) would otherwise
make the next window skip the speech between.
The transcript is not conditioned on the previous window's text (that made tiny.en repeat
itself across windows).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import ArgumentTypeError, GenaiError, InvalidArgumentError
from genai.generation.generator import Generator
from genai.generation.generator_params import GeneratorParams
from genai.multimodal.audios import AudioClip, Audios
from genai.multimodal.processor import MultiModalProcessor
from genai.multimodal.whisper import AUDIO_FEATURES, INPUT_IDS, WhisperProcessor, whisper_prompt

if TYPE_CHECKING:
    from genai.runtime.model import Model

__all__ = [
    "Segment",
    "TimestampRules",
    "Transcript",
    "format_timestamp",
    "segments_of",
    "to_srt",
    "to_vtt",
    "transcribe",
    "whisper_vocabulary",
]

log = logging.getLogger(__name__)

#: Seconds one timestamp token step stands for (Whisper's 20 ms: 2 encoder frames).
TIME_PRECISION = 0.02
#: The latest first timestamp the rules allow (seconds).
MAX_INITIAL_TIMESTAMP = 1.0
#: Temperatures a window is decoded at, in turn, until its text looks right (OpenAI's).
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Segment:
    """A piece of the transcript: ``start`` and ``end`` in seconds from the recording's start."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()


@dataclass
class Transcript:
    """What `transcribe` returns: the text, its timed segments, and the audio's duration."""

    text: str
    segments: list[Segment] = field(default_factory=list)
    duration: float = 0.0
    language: str | None = None


@dataclass(frozen=True)
class WhisperVocabulary:
    """The special token ids transcription needs (-1 where the vocabulary has none)."""

    eot: int
    sot: int
    no_timestamps: int
    #: The id of ``<|0.00|>``; every id from it on is a timestamp.
    timestamp_begin: int
    multilingual: bool
    #: The ids of " " (suppressed as the first generated token, as OpenAI's SuppressBlank).
    blank: tuple[int, ...] = ()

    @property
    def has_timestamps(self) -> bool:
        """True when the vocabulary has Whisper's timestamp tokens."""
        return self.timestamp_begin >= 0


def whisper_vocabulary(model: Model, processor: MultiModalProcessor) -> WhisperVocabulary:
    """The ids of ``<|endoftext|>``, ``<|startoftranscript|>``, ``<|notimestamps|>`` and
    ``<|0.00|>`` in ``processor``'s tokenizer; multilingual as Hugging Face decides it
    (vocabulary of at least 51865 ids: the ``.en`` models have 51864)."""
    tokenizer = processor.tokenizer
    eos = model.config.eos_token_ids
    eot = tokenizer.to_token_id("<|endoftext|>")
    return WhisperVocabulary(
        eot=eot if eot >= 0 else int(eos[0]),
        sot=tokenizer.to_token_id("<|startoftranscript|>"),
        no_timestamps=tokenizer.to_token_id("<|notimestamps|>"),
        timestamp_begin=tokenizer.to_token_id("<|0.00|>"),
        multilingual=model.io.vocab_size >= 51865,
        blank=tuple(int(t) for t in tokenizer.encode(" ")),
    )


class SuppressSpecial:
    """A logits processor that keeps Whisper's special tokens out of the text (every id after
    ``<|endoftext|>`` and before the timestamps; with no timestamps, every id after it) and a
    blank or the end out of the first generated position (OpenAI's SuppressTokens and
    SuppressBlank)."""

    def __init__(self, vocab: WhisperVocabulary, prompt_length: int) -> None:
        self.vocab = vocab
        self.prompt_length = prompt_length

    def __call__(self, token_ids: np.ndarray, logits: np.ndarray) -> None:
        low = np.finfo(np.float32).min
        eot, begin = self.vocab.eot, self.vocab.timestamp_begin
        logits[eot + 1 : begin if begin > eot else logits.shape[0]] = low
        if token_ids.shape[0] == self.prompt_length:
            logits[list(self.vocab.blank)] = low
            logits[eot] = low


class TimestampRules:
    """Whisper's timestamp rules as a logits processor (``processor(token_ids, logits)``,
    `genai.GeneratorParams.add_logits_processor`) for a prompt of ``prompt_length`` tokens."""

    def __init__(self, vocab: WhisperVocabulary, prompt_length: int, vocab_size: int) -> None:
        self.vocab = vocab
        self.prompt_length = prompt_length
        self.vocab_size = vocab_size
        self.max_initial = vocab.timestamp_begin + round(MAX_INITIAL_TIMESTAMP / TIME_PRECISION)

    def __call__(self, token_ids: np.ndarray, logits: np.ndarray) -> None:
        begin, low = self.vocab.timestamp_begin, np.finfo(np.float32).min
        if self.vocab.no_timestamps >= 0:
            logits[self.vocab.no_timestamps] = low
        sampled = token_ids[self.prompt_length :]
        last_ts = sampled.size >= 1 and sampled[-1] >= begin
        before_ts = sampled.size < 2 or sampled[-2] >= begin
        if last_ts:
            if before_ts:  # a pair just closed: text (or the end) follows
                logits[begin:] = low
            else:  # an opening timestamp: its closing one (or the end) follows
                logits[: self.vocab.eot] = low
        stamps = sampled[sampled >= begin]
        if stamps.size:
            # never backwards; after a closed pair strictly forwards
            floor = stamps[-1] if last_ts and not before_ts else stamps[-1] + 1
            logits[begin : int(floor)] = low
        if sampled.size == 0:  # the first token: a timestamp, at most 1 s in
            logits[:begin] = low
            logits[self.max_initial + 1 :] = low
        # a timestamp when the timestamps together are likelier than any text token
        shifted = logits.astype(np.float64) - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        stamp_mass = np.logaddexp.reduce(logprobs[begin:])
        if stamp_mass > logprobs[:begin].max():
            logits[:begin] = low


def segments_of(
    tokens: np.ndarray,
    vocab: WhisperVocabulary,
    offset: float,
    decode: Callable[[np.ndarray], str],
    window: float,
) -> tuple[list[Segment], float]:
    """The segments of one window's generated ``tokens`` (EOT dropped) and how many seconds
    of the window they consumed (where the next window starts)."""
    begin = vocab.timestamp_begin
    tokens = tokens[tokens != vocab.eot]
    if not vocab.has_timestamps:
        text = decode(tokens).strip()
        return ([Segment(offset, offset + window, text, tuple(int(t) for t in tokens))], window)
    is_ts = tokens >= begin
    single_end = tokens.size >= 2 and not is_ts[-2] and is_ts[-1]
    pairs = np.nonzero(is_ts[:-1] & is_ts[1:])[0] + 1
    segments: list[Segment] = []
    if pairs.size:
        cuts = [*pairs.tolist(), tokens.size] if single_end else pairs.tolist()
        last = 0
        for cut in cuts:
            piece = tokens[last:cut]
            last = cut
            stamps = piece[piece >= begin]
            text_tokens = piece[piece < begin]
            if stamps.size < 1 or not text_tokens.size:
                continue
            start = (int(stamps[0]) - begin) * TIME_PRECISION
            end = (int(stamps[-1]) - begin) * TIME_PRECISION if stamps.size > 1 else start
            segments.append(
                Segment(
                    offset + start,
                    offset + end,
                    decode(text_tokens).strip(),
                    tuple(int(t) for t in text_tokens),
                )
            )
        last_stamp = (int(tokens[cuts[-1] - 1]) - begin) * TIME_PRECISION
        consumed = window if single_end else last_stamp
    else:
        stamps = tokens[is_ts]
        end = (int(stamps[-1]) - begin) * TIME_PRECISION if stamps.size else window
        text_tokens = tokens[~is_ts]
        if text_tokens.size:
            segments.append(
                Segment(
                    offset,
                    offset + end,
                    decode(text_tokens).strip(),
                    tuple(int(t) for t in text_tokens),
                )
            )
        consumed = window
    if consumed <= 0:  # no progress (a degenerate output): move on by the whole window
        consumed = window
    return [s for s in segments if s.text], consumed


def _decode(
    model: Model,
    inputs: NamedTensors,
    prompt_length: int,
    rules: TimestampRules | None,
    temperature: float,
    vocab: WhisperVocabulary | None = None,
) -> tuple[np.ndarray, float]:
    """One decoding of a window: the generated tokens and their mean log-probability
    (`SuppressSpecial` for ``vocab``, then the timestamp ``rules``)."""
    params = GeneratorParams(model)
    params.set_search_options(
        max_length=int(model.config.context_length),
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=0 if temperature > 0 else 1,
        random_seed=0,
        logprobs=True,
    )
    if vocab is not None:
        params.add_logits_processor(SuppressSpecial(vocab, prompt_length))
    if rules is not None:
        params.add_logits_processor(rules)
    generator = Generator(model, params)
    generator.set_inputs(inputs)
    total, steps = 0.0, 0
    while not generator.is_done():
        generator.generate_next_token()
        total += float(generator.get_next_logprobs()[0][0])
        steps += 1
    return generator.get_sequence(0)[prompt_length:], total / max(steps, 1)


def compression_ratio(text: str) -> float:
    """Bytes of ``text`` over bytes of its zlib compression (repetitive text compresses well)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _decode_with_fallback(
    model: Model,
    inputs: NamedTensors,
    prompt_length: int,
    rules: TimestampRules | None,
    temperature: float,
    processor: MultiModalProcessor,
    fallback: bool = True,
    vocab: WhisperVocabulary | None = None,
) -> tuple[np.ndarray, bool]:
    """Decode a window at ``temperature``; from a greedy start, decode again at the higher
    `FALLBACK_TEMPERATURES` (seeded) while the text repeats itself (compression ratio above
    2.4) or the model is unsure of it (mean log-probability below -1), as OpenAI's
    implementation does; when none passes, the likeliest decoding. Returns the tokens and
    whether they passed."""
    schedule = FALLBACK_TEMPERATURES if temperature == 0 and fallback else (float(temperature),)
    best: tuple[float, np.ndarray, float] | None = None
    for step in schedule:
        tokens, mean_logprob = _decode(model, inputs, prompt_length, rules, step, vocab)
        ratio = compression_ratio(processor.decode(tokens))
        if ratio <= 2.4 and mean_logprob >= -1.0:
            return tokens, True
        log.debug(
            "window decoded at temperature %.1f: compression %.2f, mean logprob %.2f",
            step,
            ratio,
            mean_logprob,
        )
        if best is None or mean_logprob > best[0]:
            best = (mean_logprob, tokens, step)
    assert best is not None
    return best[1], False


#: The shortest part `_plain_segments` splits a badly decoded window into (seconds).
MIN_PART_SECONDS = 7.5


def _plain_segments(
    model: Model,
    processor: MultiModalProcessor,
    chunk: np.ndarray,
    start: float,
    prompt: np.ndarray,
    vocab: WhisperVocabulary,
    temperature: float,
) -> list[Segment]:
    """``chunk`` (samples from ``start`` seconds) decoded without timestamps, as one segment;
    when that decoding does not pass (see `_decode_with_fallback`), its two halves, down to
    `MIN_PART_SECONDS`."""
    kind = processor.kind
    rate = kind.pipeline.sample_rate
    inputs = NamedTensors()
    inputs[AUDIO_FEATURES] = kind.pipeline.features_of_pcm(chunk)[None].astype(kind.dtype)
    inputs[INPUT_IDS] = prompt
    tokens, mean_logprob = _decode(model, inputs, prompt.shape[1], None, temperature, vocab)
    seconds = chunk.shape[0] / rate
    passed = mean_logprob >= -1.0 and compression_ratio(processor.decode(tokens)) <= 2.4
    if passed or seconds < 2 * MIN_PART_SECONDS:
        found, _ = segments_of(tokens, vocab, start, processor.decode, seconds)
        return found
    half = chunk.shape[0] // 2
    return [
        *_plain_segments(model, processor, chunk[:half], start, prompt, vocab, temperature),
        *_plain_segments(
            model, processor, chunk[half:], start + half / rate, prompt, vocab, temperature
        ),
    ]


#: Whisper's language codes, in its token order.
# fmt: off
LANGUAGES = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv",
    "it", "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr",
    "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu",
    "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)
# fmt: on


def language_tokens(processor: MultiModalProcessor) -> dict[str, int]:
    """Whisper's language tokens the model's vocabulary has: code -> id of ``<|code|>``."""
    tokenizer = processor.tokenizer
    found = {code: tokenizer.to_token_id(f"<|{code}|>") for code in LANGUAGES}
    return {code: token for code, token in found.items() if token >= 0}


def detect_language(model: Model, processor: MultiModalProcessor, samples: np.ndarray) -> str:
    """The likeliest language of ``samples`` (the first 30 s are heard) for a multilingual
    model: the language token the decoder ranks highest after ``<|startoftranscript|>``."""
    languages = language_tokens(processor)
    if not languages:
        raise InvalidArgumentError("the model has no language tokens to detect a language with")
    kind = processor.kind
    inputs = NamedTensors()
    inputs[AUDIO_FEATURES] = kind.pipeline.features_of_pcm(samples)[None].astype(kind.dtype)
    inputs[INPUT_IDS] = np.asarray(
        [[processor.tokenizer.to_token_id("<|startoftranscript|>")]], np.int32
    )
    params = GeneratorParams(model)
    params.set_search_options(max_length=2)
    generator = Generator(model, params)
    generator.set_inputs(inputs)
    logits = generator.get_logits()[0, 0]
    codes = list(languages)
    ids = np.asarray([languages[c] for c in codes])
    return codes[int(np.argmax(logits[ids]))]


def transcribe(
    model: Model,
    audio: Audios | AudioClip,
    *,
    language: str | None = "en",
    task: str = "transcribe",
    temperature: float = 0.0,
    processor: MultiModalProcessor | None = None,
    timestamps: bool = True,
    fallback: bool = True,
) -> Transcript:
    """Transcribe one recording of any length with a Whisper ``model`` (see the module
    docstring). ``language`` None: a multilingual model detects it (`detect_language`; an
    English-only model takes no language token); ``task`` ``"transcribe"`` or
    ``"translate"``; ``timestamps`` False decodes fixed 30 s windows with
    ``<|notimestamps|>``; ``fallback`` False keeps every window's first decoding (no
    temperature fallback)."""
    wrong = InvalidArgumentError(f"transcribe needs a Whisper model, not {model.type!r}")
    if processor is None:
        try:
            processor = model.create_multimodal_processor()
        except GenaiError:  # a text model has no processor: say what transcribe needs
            if model.type != "whisper":
                raise wrong from None
            raise  # a Whisper folder whose processor config is missing or broken: say that
    kind = processor.kind
    if not isinstance(kind, WhisperProcessor):
        raise wrong
    if isinstance(audio, Audios):
        if len(audio) != 1:
            raise InvalidArgumentError("transcribe takes one recording at a time")
        clip = audio.clips[0]
    elif isinstance(audio, AudioClip):
        clip = audio
    else:
        raise ArgumentTypeError(
            f"transcribe takes genai.Audios (e.g. Audios.open(path)) or an AudioClip, not "
            f"{type(audio).__name__}"
        )
    if task not in ("transcribe", "translate"):
        raise InvalidArgumentError(f"task must be 'transcribe' or 'translate', not {task!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise ArgumentTypeError(f"temperature must be a number, not {type(temperature).__name__}")
    if not 0.0 <= float(temperature) <= 2.0:
        raise InvalidArgumentError(f"temperature must be in [0, 2], got {temperature}")
    vocab = whisper_vocabulary(model, processor)
    use_timestamps = timestamps and vocab.has_timestamps
    tokenizer = processor.tokenizer
    known = language is None or tokenizer.to_token_id(f"<|{language}|>") >= 0
    if vocab.multilingual and not known:
        raise InvalidArgumentError(f"the model has no language token <|{language}|>")
    pipeline = kind.pipeline
    pcm = pipeline.pcm(clip)
    if vocab.multilingual and language is None:
        language = detect_language(model, processor, pcm[: pipeline.window_samples])
    prompt_text = whisper_prompt(
        language if vocab.multilingual else None, task, timestamps=use_timestamps
    )
    if not vocab.multilingual:
        prompt_text = prompt_text.replace(f"<|{task}|>", "")
    prompt = np.asarray([tokenizer.encode(prompt_text)], np.int32)
    plain_text = whisper_prompt(language if vocab.multilingual else None, task, timestamps=False)
    if not vocab.multilingual:
        plain_text = plain_text.replace(f"<|{task}|>", "")
    plain = np.asarray([tokenizer.encode(plain_text)], np.int32)
    plain_vocab = replace(vocab, timestamp_begin=-1)
    rate = pipeline.sample_rate
    window = pipeline.window_samples
    seek = 0
    segments: list[Segment] = []
    while seek < pcm.shape[0]:
        chunk = pcm[seek : seek + window]
        chunk_seconds = chunk.shape[0] / rate
        if chunk_seconds < 0.1 and segments:
            break  # a sliver at the end: nothing to hear
        inputs = NamedTensors()
        inputs[AUDIO_FEATURES] = pipeline.features_of_pcm(chunk)[None].astype(kind.dtype)
        inputs[INPUT_IDS] = prompt
        rules = (
            TimestampRules(vocab, prompt.shape[1], model.io.vocab_size) if use_timestamps else None
        )
        window_vocab = vocab if use_timestamps else plain_vocab
        tokens, passed = _decode_with_fallback(
            model, inputs, prompt.shape[1], rules, temperature, processor, fallback, window_vocab
        )
        if use_timestamps and not passed and fallback:
            # timestamps went wrong (e.g. a segment closed far beyond its words, which
            # would skip the speech after it): the window without timestamps, in halves
            # while a part decodes badly
            found = _plain_segments(
                model, processor, chunk, seek / rate, plain, plain_vocab, float(temperature)
            )
            consumed = chunk_seconds
        else:
            found, consumed = segments_of(
                tokens,
                window_vocab,
                seek / rate,
                processor.decode,
                min(chunk_seconds, window / rate),
            )
        segments.extend(found)
        advance = max(1, round(min(consumed, chunk_seconds) * rate))
        log.debug(
            "window at %.2f s: %d segments, advance %.2f s", seek / rate, len(found), advance / rate
        )
        seek += advance
    text = " ".join(s.text for s in segments).strip()
    return Transcript(text=text, segments=segments, duration=pcm.shape[0] / rate, language=language)


def format_timestamp(seconds: float, separator: str = ".", hours: bool = True) -> str:
    """``HH:MM:SS.mmm`` (``separator`` "," for SRT; ``hours`` False drops a zero hour)."""
    millis = round(max(0.0, seconds) * 1000)
    h, rest = divmod(millis, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    head = f"{h:02d}:" if hours or h else ""
    return f"{head}{m:02d}:{s:02d}{separator}{ms:03d}"


def to_srt(segments: list[Segment]) -> str:
    """The segments as SubRip subtitles."""
    blocks = [
        f"{i}\n{format_timestamp(s.start, ',')} --> {format_timestamp(s.end, ',')}\n{s.text}\n"
        for i, s in enumerate(segments, 1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: list[Segment]) -> str:
    """The segments as WebVTT subtitles."""
    cues = [
        f"{format_timestamp(s.start)} --> {format_timestamp(s.end)}\n{s.text}\n" for s in segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)
