"""Image processors: the time from image files to model inputs (decode, resize, normalise,
crops or patches, the prompt's tags expanded to input ids), genai against onnxruntime-genai
(the reference) on the same folder and the same files.

    PYTHONPATH=. python benchmarks/image_processors.py [--kinds phi3v qwen2_5_vl gemma3]
        [--repeat 7] [--format png|jpg]

For each kind a tiny folder is written with `genai.testing.vision` (only its
``processor_config.json`` and tokenizer matter here) and a 336x336 and a 1344x1344 synthetic
picture are saved. One timed call is ``Images.open(path)`` plus ``processor(prompt,
images=...)``; the engines run interleaved, ``--repeat`` times each after a warm-up, and the
medians are reported with the ratio genai / reference (lower is better). The outputs are
checked equal before timing (tests/test_image_processors.py checks them in depth).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
from _bench_args import header, positive_int
from PIL import Image

import genai
from genai.testing.vision import write_gemma3, write_phi3v, write_qwen2_5_vl

PROMPTS = {
    "phi3v": "<|user|>\n<|image_1|>\nwhat is this?<|end|>\n<|assistant|>\n",
    "qwen2_5_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    "what is this?<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n<start_of_image>what is this?<end_of_turn>\n"
    "<start_of_turn>model\n",
}
WRITERS = {"phi3v": write_phi3v, "qwen2_5_vl": write_qwen2_5_vl, "gemma3": write_gemma3}


def picture(path: Path, side: int) -> str:
    """A synthetic photo-like picture: gradients, stripes, a disc and mild noise."""
    rng = np.random.default_rng(side)
    yy, xx = np.mgrid[0:side, 0:side]
    image = np.stack([xx * 255 // side, yy * 255 // side, (xx // 16 % 2) * 200], -1)
    image[(xx - side // 2) ** 2 + (yy - side // 3) ** 2 < (side // 5) ** 2] = (240, 30, 30)
    image = np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)
    options = {"quality": 90} if path.suffix == ".jpg" else {}
    Image.fromarray(image).save(path, **options)
    return str(path)


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=list(WRITERS), choices=list(WRITERS))
    parser.add_argument("--repeat", type=positive_int, default=7)
    parser.add_argument("--format", choices=("png", "jpg"), default="png")
    args = parser.parse_args()
    header()
    with tempfile.TemporaryDirectory(prefix="genai-bench-images-") as root:
        measure(args, Path(root))


def measure(args: argparse.Namespace, root: Path) -> None:
    """Write the pictures and folders into ``root`` (removed by the caller), time, print."""
    files = {side: picture(root / f"picture{side}.{args.format}", side) for side in (336, 1344)}
    print(f"{'kind':<11} {'image':>9} {'reference ms':>13} {'genai ms':>9} {'ratio':>6}")
    for kind in args.kinds:
        folder = WRITERS[kind](root)
        theirs = og.Model(str(folder)).create_multimodal_processor()
        ours = genai.Model(folder).create_multimodal_processor()
        prompt = PROMPTS[kind]
        for side, path in files.items():

            def run_reference(path=path, processor=theirs, prompt=prompt):
                return processor(prompt, images=og.Images.open(path))

            def run_genai(path=path, processor=ours, prompt=prompt):
                return processor(prompt, images=genai.Images.open(path))

            expected, actual = run_reference(), run_genai()  # warm-up and a check
            for name in expected.keys():  # noqa: SIM118 (the reference's has no __iter__)
                difference = np.abs(
                    expected[name].as_numpy().astype(np.float64)
                    - actual[name].as_numpy().astype(np.float64)
                ).max()
                assert difference <= 1e-5, (kind, side, name, difference)
            reference, mine = [], []
            for _ in range(args.repeat):
                reference.append(timed(run_reference))
                mine.append(timed(run_genai))
            ref_ms = 1000 * statistics.median(reference)
            our_ms = 1000 * statistics.median(mine)
            print(
                f"{kind:<11} {side:>4}x{side:<4} {ref_ms:>13.1f} {our_ms:>9.1f} "
                f"{our_ms / ref_ms:>6.2f}"
            )


if __name__ == "__main__":
    main()
