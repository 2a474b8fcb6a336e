"""Whisper benchmark: real-time factor (seconds of compute per second of audio) of tiny.en on a
60 s clip, for genai on the folders `genai build` writes (fp32, int8), the reference engine
(onnxruntime-genai) on the same folders, and faster-whisper (CTranslate2 int8) on the weights
they were built from, all at the same number of threads.

    python benchmarks/whisper.py [--model DIR] [--threads 1] [--rounds 3]
                                 [--faster-whisper-python PATH]

``--model``: the CTranslate2 tiny.en folder (default: where scripts/fetch_whisper_tiny_en.sh
puts it). The clip is espeak-ng speech of thirteen sentences at 16 kHz in two 30 s windows
(genai.testing.whisper.speech_clip). Every engine decodes the same work: each 30 s window
greedily with ``<|startoftranscript|><|notimestamps|>`` (faster-whisper: beam_size 1, no
timestamps, no conditioning on previous text, no VAD), features included. faster-whisper runs
in a child interpreter (``--faster-whisper-python``, a venv with ``pip install faster-whisper``;
it is not a dependency of genai) that transcribes when told, so its rounds alternate with the
others'; it is skipped when none is given. The table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_args import header, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime_genai as og  # noqa: E402

import genai  # noqa: E402
from genai.builder import build  # noqa: E402
from genai.testing.whisper import SPEECH_RATE, speech_clip, write_wav  # noqa: E402

TINY_EN = Path(
    os.environ.get("GENAI_WHISPER_DIR", Path.home() / ".cache" / "genai" / "whisper-tiny.en-ct2")
)
PROMPT = "<|startoftranscript|><|notimestamps|>"

_FASTER_WHISPER = """
import json, sys, time, wave
import numpy as np
from faster_whisper import WhisperModel
model_dir, wav, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=threads,
                     num_workers=1)
with wave.open(wav) as w:
    audio = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
for _ in sys.stdin:  # one transcription per line read: the parent interleaves the rounds
    t = time.perf_counter()
    segments, _ = model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                   without_timestamps=True, condition_on_previous_text=False,
                                   vad_filter=False)
    text = " ".join(s.text.strip() for s in segments)
    print(json.dumps({"seconds": time.perf_counter() - t, "text": text}), flush=True)
"""


def load(engine, folder: Path, threads: int):
    """``engine.Model`` on ``folder`` with ``threads`` intra-op threads in both sessions."""
    config = engine.Config(str(folder))
    options = {"session_options": {"intra_op_num_threads": threads}}
    config.overlay(json.dumps({"model": {"encoder": options, "decoder": options}}))
    return engine.Model(config)


def transcribe_windows(engine, model, windows: list[Path]) -> tuple[float, str]:
    """Seconds to decode every window greedily (features included), and the text."""
    processor = model.create_multimodal_processor()
    texts = []
    started = time.perf_counter()
    for wav in windows:
        inputs = processor(PROMPT, audios=engine.Audios.open(str(wav)))
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=448)
        generator = engine.Generator(model, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        texts.append(processor.decode(generator.get_sequence(0)))
    return time.perf_counter() - started, " ".join(t.strip() for t in texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=TINY_EN)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--faster-whisper-python", type=Path, default=None)
    args = parser.parse_args()
    if not (args.model / "model.bin").is_file():
        sys.exit(f"no CTranslate2 tiny.en at {args.model}: run scripts/fetch_whisper_tiny_en.sh")
    fw_python = args.faster_whisper_python
    if fw_python is not None and not fw_python.is_file():
        parser.error(f"argument --faster-whisper-python: {fw_python} is not a file")
    header(args.threads)
    with tempfile.TemporaryDirectory(prefix="whisper-bench-") as work:
        measure(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> None:
    """Build the folders in ``work`` (removed by the caller), run the rounds, print the table."""
    clip, _ = speech_clip()
    seconds = len(clip) / SPEECH_RATE
    window = 30 * SPEECH_RATE
    wav = write_wav(work / "clip.wav", clip)
    windows = [
        write_wav(work / f"w{i}.wav", clip[i * window : (i + 1) * window])
        for i in range(len(clip) // window)
    ]
    folders = {p: build(args.model, work / p, precision=p) for p in ("fp32", "int8")}

    runs: dict[str, tuple] = {}
    for precision, folder in folders.items():
        runs[f"genai {precision}"] = (genai, load(genai, folder, args.threads))
        runs[f"reference {precision}"] = (og, load(og, folder, args.threads))
    times: dict[str, list[float]] = {name: [] for name in runs}
    texts: dict[str, str] = {}
    child = None
    if args.faster_whisper_python:
        child = subprocess.Popen(
            [
                str(args.faster_whisper_python),
                "-c",
                _FASTER_WHISPER,
                str(args.model),
                str(wav),
                str(args.threads),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        times["faster-whisper int8"] = []

    def faster_whisper() -> tuple[float, str]:
        assert child is not None and child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            sys.exit("the faster-whisper child failed (see its error above)")
        result = json.loads(line)
        return result["seconds"], result["text"]

    for engine, model in runs.values():  # warm-up (first-run allocations, page-in)
        transcribe_windows(engine, model, windows[:1])
    if child:
        faster_whisper()
    for _ in range(args.rounds):  # rounds alternate between the engines
        for name, (engine, model) in runs.items():
            elapsed, texts[name] = transcribe_windows(engine, model, windows)
            times[name].append(elapsed)
        if child:
            elapsed, texts["faster-whisper int8"] = faster_whisper()
            times["faster-whisper int8"].append(elapsed)
    if child:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()

    fw = statistics.median(times["faster-whisper int8"]) if "faster-whisper int8" in times else None
    print(f"\ntiny.en, {seconds:.0f} s clip, {args.threads} thread(s), median of {args.rounds}")
    print("| engine | seconds | RTF | vs reference (same folder) | vs faster-whisper int8 |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        precision = name.split()[-1]
        ref = times.get(f"reference {precision}")
        vs_ref = (
            f"{median / statistics.median(ref):.2f}" if ref and name.startswith("genai") else ""
        )
        vs_fw = f"{median / fw:.2f}" if fw else ""
        print(f"| {name} | {median:.2f} | {median / seconds:.3f} | {vs_ref} | {vs_fw} |")
    print()
    for name, text in texts.items():
        print(f"{name}: {text[:160]}...")


if __name__ == "__main__":
    main()
