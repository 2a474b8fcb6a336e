"""Vision-language models: time to first token with one image, and decode speed, genai against
onnxruntime-genai (the reference) on the same folder and the same processor output.

    PYTHONPATH=. python benchmarks/vision.py [--kinds phi3v qwen2_5_vl] [--repeat 5]
        [--hidden 256] [--layers 4] [--vocab 64] [--new-tokens 64] [--folder DIR] [--ttft-rounds 41]

For each kind, tiny random folders are written with `genai.testing.vision` (``--hidden`` and
``--layers`` size the decoder, ``--vocab`` its base vocabulary; ``--folder`` runs a real folder
instead), and a 336x336 and a 1344x1344 synthetic image are turned into model inputs once by
the reference's processor (so both engines run the same arrays; the processors are compared
elsewhere). TTFT is ``set_inputs`` (vision, embedding and decoder prompt runs) plus the
first ``generate_next_token``; decode is ``--new-tokens`` greedy steps after it. Each engine's own
processor is timed apart (``proc``: opening the image file and making the inputs;
``--no-processor`` skips it). The engines run interleaved (their order alternating), ``--repeat``
times each, after one warm-up run; medians are reported with the ratio genai / reference (TTFT:
lower is better; decode tok/s: higher is better), in wall-clock time and in the process's CPU
time (``CPU ... ratio``: the median of each turn's own ratio; the work each engine does, what a
shared machine measures best).
Then decode again in lockstep (``step``): both engines' generators advance token by token,
their steps alternating, each step timed (wall and the calling thread's CPU time); medians
per run, medians over ``--repeat`` runs; ratio genai / reference (lower is better; ``CPU
ratio``: the median of each run's own ratio). The lockstep generators are created with decode
ahead off (``GENAI_DECODE_AHEAD=0``): each call is one model step in the caller's thread.
``--ttft-rounds N`` then times TTFT alone in N interleaved rounds (fresh generators, the
calling thread's CPU time; ``ratio``: the median of each round's own genai / reference ratio).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
from _bench_args import (
    DECODE_AHEAD_NOTE,
    decode_ahead_off,
    header,
    non_negative_int,
    positive_int,
    require_model,
)
from PIL import Image

import genai
from genai.testing.vision import write_gemma3, write_phi3v, write_qwen2_5_vl

PROMPTS = {
    "phi3v": "<|user|>\n<|image_1|>\nwhat is in the picture?<|end|>\n<|assistant|>\n",
    "qwen2_5_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    "what is in the picture?<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n<start_of_image>what is in the picture?<end_of_turn>\n"
    "<start_of_turn>model\n",
}
WRITERS = {"phi3v": write_phi3v, "qwen2_5_vl": write_qwen2_5_vl, "gemma3": write_gemma3}


def picture(path: Path, side: int) -> str:
    """A synthetic picture: colour gradients, stripes and a disc."""
    yy, xx = np.mgrid[0:side, 0:side]
    image = np.stack([xx * 255 // side, yy * 255 // side, (xx // 16 % 2) * 200], -1)
    image[(xx - side // 2) ** 2 + (yy - side // 3) ** 2 < (side // 5) ** 2] = (240, 30, 30)
    Image.fromarray(image.astype(np.uint8)).save(path)
    return str(path)


def run_once(
    module, model, inputs, prompt: int, new_tokens: int
) -> tuple[tuple[float, float, float, float], np.ndarray]:
    """((TTFT seconds, decode tokens per second, TTFT CPU seconds, decode tokens per CPU
    second), the sequence) for a ``prompt``-token input. CPU time is the process's (both
    engines run in this process, one at a time, so it is the running engine's)."""
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=prompt + new_tokens + 1)
    generator = module.Generator(model, params)
    cpu_start, start = time.process_time(), time.perf_counter()
    generator.set_inputs(inputs)
    generator.generate_next_token()
    cpu_first, first = time.process_time(), time.perf_counter()
    for _ in range(new_tokens):
        generator.generate_next_token()
    cpu_end, end = time.process_time(), time.perf_counter()
    times = (
        first - start,
        new_tokens / (end - first),
        cpu_first - cpu_start,
        new_tokens / max(cpu_end - cpu_first, 1e-9),
    )
    return times, generator.get_sequence(0)


def lockstep(engines: dict, prompt: int, new_tokens: int) -> dict[str, tuple[float, float]]:
    """Per-token step time of each engine, the engines' steps alternating token by token (so
    both see the same machine load): ``name -> (median seconds per step, median CPU seconds
    of the calling thread per step)`` (both engines run their graphs on the caller's thread
    with one intra-op thread)."""
    generators = {}
    for name, (module, model, inputs) in engines.items():
        params = module.GeneratorParams(model)
        params.set_search_options(max_length=prompt + new_tokens + 1)
        with decode_ahead_off():  # per-step times: every step in the caller's thread
            generators[name] = module.Generator(model, params)
        generators[name].set_inputs(inputs)
        generators[name].generate_next_token()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    order = list(generators.items())
    for step in range(new_tokens):
        for name, generator in order if step % 2 else order[::-1]:
            cpu, wall = time.thread_time(), time.perf_counter()
            generator.generate_next_token()
            times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    return {
        name: (statistics.median(t[0] for t in rows), statistics.median(t[1] for t in rows))
        for name, rows in times.items()
    }


def ttft_rounds(engines: dict, prompt: int, rounds: int, new_tokens: int) -> dict[str, float]:
    """Time to first token alone, ``rounds`` interleaved rounds (the engines' order
    alternating; a fresh generator each, made outside the time, with the main turns'
    max_length; one warm-up round): the
    calling thread's CPU time of ``set_inputs`` + the first ``generate_next_token``.
    Returns each engine's median seconds and ``"ratio"``, the median of the rounds' own
    genai / reference ratios (the measure a shared machine moves least)."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    order = list(engines.items())
    for turn in range(rounds + 1):
        for name, (module, model, inputs) in order if turn % 2 else order[::-1]:
            params = module.GeneratorParams(model)
            params.set_search_options(max_length=prompt + new_tokens + 1)
            generator = module.Generator(model, params)
            cpu = time.thread_time()
            generator.set_inputs(inputs)
            generator.generate_next_token()
            cpu = time.thread_time() - cpu
            del generator
            if turn:
                times[name].append(cpu)
    out = {name: statistics.median(rows) for name, rows in times.items()}
    pairs = zip(times["genai"], times["reference"], strict=True)
    out["ratio"] = statistics.median(ours / ref for ours, ref in pairs)
    return out


def processing_time(module, model, prompt: str, image: str) -> float:
    """Seconds for the engine's own processor to open ``image`` and make the inputs."""
    processor = model.create_multimodal_processor()
    start = time.perf_counter()
    processor(prompt, images=module.Images.open(image))
    return time.perf_counter() - start


def bench(
    folder: Path,
    prompt: str,
    image: str,
    repeat: int,
    new_tokens: int,
    with_processor: bool,
    rounds: int = 0,
) -> dict:
    ref_model = og.Model(str(folder))
    named = ref_model.create_multimodal_processor()(prompt, images=og.Images.open(image))
    text = prompt
    ours_inputs = genai.NamedTensors()
    for name in named.keys():  # noqa: SIM118 (the reference's NamedTensors does not iterate)
        ours_inputs[name] = named[name].as_numpy()
    our_model = genai.Model(folder)
    # genai collapses the sessions' weights into huge pages on a background thread after
    # loading; measure after it, as after the reference's (synchronous) load
    our_model.huge_pages.wait()
    engines = {"reference": (og, ref_model, named), "genai": (genai, our_model, ours_inputs)}
    prompt = named["input_ids"].as_numpy().shape[1]
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name in engines}
    sequences = {}
    for turn in range(repeat + 1):
        order = list(engines.items())
        for name, (module, model, inputs) in order if turn % 2 else order[::-1]:
            times, sequence = run_once(module, model, inputs, prompt, new_tokens)
            sequences[name] = sequence
            processing = processing_time(module, model, text, image) if with_processor else 0.0
            if turn:  # the first turn warms up
                results[name].append((*times, processing))
    same = np.array_equal(sequences["genai"], sequences["reference"])
    out = {"tokens": prompt, "same_tokens": same}
    for name, rows in results.items():
        out[name] = tuple(statistics.median(r[i] for r in rows) for i in range(5))
    steps: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for _ in range(repeat):
        for name, medians in lockstep(engines, prompt, new_tokens).items():
            steps[name].append(medians)
    for name, rows in steps.items():
        out[f"{name} step"] = tuple(statistics.median(r[i] for r in rows) for i in range(2))
    # CPU ratios: the median of each turn's (each lockstep run's) own ratio, so that a load
    # change between turns moves both engines' times alike
    pairs = zip(results["genai"], results["reference"], strict=True)
    out["cpu ttft ratio"] = statistics.median(ours[2] / ref[2] for ours, ref in pairs)
    pairs = zip(results["genai"], results["reference"], strict=True)
    out["cpu rate ratio"] = statistics.median(ours[3] / ref[3] for ours, ref in pairs)
    pairs = zip(steps["genai"], steps["reference"], strict=True)
    out["cpu step ratio"] = statistics.median(ours[1] / ref[1] for ours, ref in pairs)
    if rounds:
        out["ttft rounds"] = ttft_rounds(engines, prompt, rounds, new_tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The lockstep ('step') columns: " + DECODE_AHEAD_NOTE + ".",
    )
    parser.add_argument("--kinds", nargs="+", default=["phi3v", "qwen2_5_vl"], choices=WRITERS)
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--hidden", type=positive_int, default=256)
    parser.add_argument("--layers", type=positive_int, default=4)
    parser.add_argument(
        "--vocab",
        type=positive_int,
        default=64,
        help="the fixtures' base vocabulary (their markers come on top; e.g. 32000 as Phi-3's)",
    )
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--sides", type=positive_int, nargs="+", default=[336, 1344])
    parser.add_argument("--folder", type=Path, help="a real model folder (its prompt: --kinds)")
    parser.add_argument("--no-processor", action="store_true", help="skip timing the processors")
    parser.add_argument(
        "--ttft-rounds",
        type=non_negative_int,
        default=0,
        help="then time TTFT alone in this many interleaved rounds (thread CPU time)",
    )
    args = parser.parse_args()
    if args.folder is not None:
        require_model(args.folder, "--folder")
    header(None if args.folder else 1)  # the fixtures: 1 intra-op thread
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images = {side: picture(root / f"picture{side}.png", side) for side in args.sides}
        print(
            f"{'kind':<11} {'image':>9} {'tokens':>6}  {'TTFT ref':>9} {'TTFT genai':>10} "
            f"{'ratio':>6}  {'tok/s ref':>9} {'tok/s genai':>11} {'ratio':>6}  same  "
            f"{'proc ref':>9} {'proc genai':>10}  {'CPU TTFT ratio':>14} {'CPU tok/s ratio':>15}  "
            f"{'step ref':>9} {'step genai':>10} {'ratio':>6} {'CPU ratio':>9}"
        )
        for kind in args.kinds:
            if args.folder is not None:
                folder = args.folder
            else:
                folder = WRITERS[kind](
                    root,
                    hidden_size=args.hidden,
                    num_layers=args.layers,
                    num_heads=max(4, args.hidden // 64),
                    num_kv_heads=max(2, args.hidden // 128),
                    base_vocab=args.vocab,
                )
            for side, image in images.items():
                row = bench(
                    folder,
                    PROMPTS[kind],
                    image,
                    args.repeat,
                    args.new_tokens,
                    not args.no_processor,
                    args.ttft_rounds,
                )
                (ref_ttft, ref_rate, _, _, ref_proc) = row["reference"]
                (our_ttft, our_rate, _, _, our_proc) = row["genai"]
                ref_step = row["reference step"][0]
                our_step = row["genai step"][0]
                procs = (
                    f"{1000 * ref_proc:>7.1f}ms {1000 * our_proc:>8.1f}ms"
                    if not args.no_processor
                    else f"{'-':>9} {'-':>10}"
                )
                print(
                    f"{kind:<11} {side:>4}x{side:<4} {row['tokens']:>6}  "
                    f"{1000 * ref_ttft:>7.1f}ms {1000 * our_ttft:>8.1f}ms "
                    f"{our_ttft / ref_ttft:>6.2f}  {ref_rate:>9.0f} {our_rate:>11.0f} "
                    f"{our_rate / ref_rate:>6.2f}  {row['same_tokens']!s:<5} "
                    f"{procs}  "
                    f"{row['cpu ttft ratio']:>14.2f} {row['cpu rate ratio']:>15.2f}  "
                    f"{1e6 * ref_step:>7.0f}us {1e6 * our_step:>8.0f}us "
                    f"{our_step / ref_step:>6.2f} {row['cpu step ratio']:>9.2f}",
                    flush=True,
                )
                if "ttft rounds" in row:
                    alone = row["ttft rounds"]
                    print(
                        f"{'':<11} {'':>9} TTFT alone, {args.ttft_rounds} rounds, thread CPU: "
                        f"ref {1000 * alone['reference']:.2f}ms genai {1000 * alone['genai']:.2f}ms"
                        f" ratio {alone['ratio']:.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
