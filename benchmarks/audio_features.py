"""Whisper's audio front end: seconds to turn one 30 s audio file into log-mel features, genai's
processor against the reference's (onnxruntime-genai's ``MultiModalProcessor``) on the same
tiny Whisper folder (`genai.testing.whisper`) and the same files, at several sample rates.

    python benchmarks/audio_features.py [--rounds 15] [--baseline OLD_audio_features.py]

Each round calls every contender once per file, in turn (interleaved, so a busy machine slows
all alike); the table shows medians and the ratio to the reference. Files: a chirp and noise,
30 s, 16-bit WAV at 16, 22.05, 44.1 (stereo) and 48 kHz. ``genai`` and ``reference`` are the
processors' calls from the file's path (decoding, resampling, STFT, log-mel, the prompt's
tokens); ``genai features`` is `AudioPipeline.features` of the decoded clip alone.
``--baseline``: another version of ``genai/multimodal/audio_features.py`` (e.g. ``git show
REV:genai/multimodal/audio_features.py > old.py``) timed the same way as ``genai features``,
for a before/after. The largest difference of each contender's features from the
reference's is printed too.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _bench_args import header, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnxruntime_genai as og  # noqa: E402
import soundfile as sf  # noqa: E402

import genai  # noqa: E402
from genai.multimodal.audio_features import AudioPipeline  # noqa: E402
from genai.testing.whisper import write_whisper_fixture  # noqa: E402

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
FILES = [(16000, 1), (22050, 1), (44100, 2), (48000, 1)]


def signal(rate: int, channels: int, seconds: float = 30.0) -> np.ndarray:
    """Two tones (one chirping) and noise, ``[frames]`` or ``[frames, 2]``."""
    rng = np.random.default_rng(rate)
    t = np.arange(int(rate * seconds)) / rate
    x = (
        0.3 * np.sin(2 * np.pi * 400 * t * (1 + 0.02 * t))
        + 0.2 * np.sin(2 * np.pi * 1250 * t)
        + 0.05 * rng.standard_normal(t.size)
    ).astype(np.float32)
    return np.stack([x, 0.5 * x[::-1]], axis=1) if channels == 2 else x


def load_baseline(path: Path) -> type:
    """``AudioPipeline`` of another version of the module, loaded under its own name."""
    spec = importlib.util.spec_from_file_location("baseline_audio_features", path)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.AudioPipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=15)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()
    if args.baseline is not None and not args.baseline.is_file():
        parser.error(f"argument --baseline: {args.baseline} is not a file")
    header()
    with tempfile.TemporaryDirectory(prefix="audio-features-bench-") as work:
        measure(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> None:
    """Write the fixture and the files into ``work`` (removed by the caller), time, print."""
    folder = write_whisper_fixture(work)
    config = folder / "audio_processor_config.json"
    ref_processor = og.Model(str(folder)).create_multimodal_processor()
    our_processor = genai.Model(folder).create_multimodal_processor()
    pipeline = AudioPipeline.from_file(config)
    baseline = load_baseline(args.baseline).from_file(config) if args.baseline else None

    paths = {}
    for rate, channels in FILES:
        path = work / f"{rate}-{channels}ch.wav"
        sf.write(path, signal(rate, channels), rate, subtype="PCM_16")
        paths[f"{rate / 1000:g} kHz" + (" stereo" if channels == 2 else "")] = path

    def contenders(path: Path) -> dict[str, Callable[[], np.ndarray]]:
        clips = genai.Audios.open(path).clips
        runs = {
            "reference": lambda: ref_processor([PROMPT], audios=og.Audios.open(str(path)))[
                "audio_features"
            ].as_numpy(),
            "genai": lambda: np.asarray(
                our_processor(PROMPT, audios=genai.Audios.open(path))["audio_features"]
            ),
            "genai features": lambda: pipeline.features(clips),
        }
        if baseline is not None:
            runs["baseline features"] = lambda: baseline.features(clips)
        return runs

    times: dict[tuple[str, str], list[float]] = {}
    diffs: dict[tuple[str, str], float] = {}
    for label, path in paths.items():
        runs = contenders(path)
        expected = runs["reference"]()
        for name, run in runs.items():
            diffs[label, name] = float(np.abs(run() - expected).max())
    for _ in range(args.rounds):
        for label, path in paths.items():
            for name, run in contenders(path).items():
                started = time.perf_counter()
                run()
                times.setdefault((label, name), []).append(time.perf_counter() - started)

    names = list(contenders(next(iter(paths.values()))))
    print(f"medians of {args.rounds} interleaved rounds, seconds per 30 s file")
    print(f"{'file':<16}" + "".join(f"{n:>20}" for n in names))
    for label in paths:
        ref = statistics.median(times[label, "reference"])
        cells = []
        for name in names:
            median = statistics.median(times[label, name])
            cells.append(f"{median:8.4f} ({median / ref:4.2f}x)")
        print(f"{label:<16}" + "".join(f"{c:>20}" for c in cells))
    print("largest |features - reference's|")
    for label in paths:
        print(f"{label:<16}" + "".join(f"{diffs[label, n]:>20.2e}" for n in names))


if __name__ == "__main__":
    main()
