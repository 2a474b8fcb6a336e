"""``genai transcribe``: speech to text with a Whisper model folder, recordings of any length."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import genai
from genai import hub
from genai.cli.common import UsageError, check_threads
from genai.cli.registry import command
from genai.errors import InvalidArgumentError
from genai.multimodal.audios import decode_audio
from genai.multimodal.transcribe import format_timestamp, to_srt, to_vtt, transcribe

__all__: list[str] = []


@command("transcribe", "transcribe an audio file with a Whisper model")
def _fill_transcribe(sub: argparse.ArgumentParser) -> None:
    sub.description = (
        "Transcribe an audio file (WAV, FLAC, OGG, MP3; any length, in 30 s windows) with a "
        "Whisper model folder (genai build writes one from Hugging Face or CTranslate2 weights)."
    )
    sub.add_argument("file", help="the audio file ('-' reads it from stdin)")
    sub.add_argument("-m", "--model", metavar="DIR", required=True, help="Whisper model folder")
    sub.add_argument(
        "--language",
        default="en",
        help="spoken language code for a multilingual model (default en; 'auto' lets the "
        "model decide); English-only models ignore it",
    )
    sub.add_argument("--translate", action="store_true", help="translate into English")
    sub.add_argument(
        "--timestamps", action="store_true", help="print each segment with its start and end"
    )
    sub.add_argument(
        "--format",
        choices=["text", "srt", "vtt", "json"],
        default="text",
        help="output format (default text)",
    )
    sub.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)"
    )
    sub.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    sub.set_defaults(handler=_transcribe)


def _load(args: argparse.Namespace) -> genai.Model:
    config = genai.Config(hub.resolve_model(args.model))
    if args.threads is not None:
        options = {"session_options": {"intra_op_num_threads": args.threads}}
        sections = {"decoder": options}
        if config.get("model.encoder") is not None:
            sections["encoder"] = options
        config.overlay(json.dumps({"model": sections}))
    return genai.Model(config)


def _transcribe(args: argparse.Namespace) -> int:
    if not 0.0 <= args.temperature <= 2.0:  # (NaN too)
        raise UsageError(f"--temperature must be in [0, 2], got {args.temperature}")
    check_threads(args)
    if args.file == "-":
        data = sys.stdin.buffer.read()
        if not data:
            raise InvalidArgumentError("no audio came on stdin (FILE '-')")
        audios = genai.Audios([decode_audio(data, source="stdin")])  # named in messages
    else:
        if not Path(args.file).is_file():
            raise InvalidArgumentError(f"no such audio file: {args.file}")
        audios = genai.Audios.open(args.file)
    model = _load(args)
    timestamps = args.timestamps or args.format in ("srt", "vtt", "json")
    result = transcribe(
        model,
        audios,
        language=None if args.language == "auto" else args.language,
        task="translate" if args.translate else "transcribe",
        temperature=args.temperature,
        timestamps=timestamps,
    )
    if args.format == "srt":
        print(to_srt(result.segments), end="")
    elif args.format == "vtt":
        print(to_vtt(result.segments), end="")
    elif args.format == "json":
        segments = [
            {"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text}
            for s in result.segments
        ]
        document = {"text": result.text, "duration": result.duration, "segments": segments}
        print(json.dumps(document, ensure_ascii=False, indent=2))
    elif args.timestamps:
        for s in result.segments:
            print(f"[{format_timestamp(s.start)} --> {format_timestamp(s.end)}] {s.text}")
    else:
        print(result.text)
    return 0
