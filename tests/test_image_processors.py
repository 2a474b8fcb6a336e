"""Image inputs of vision-language models: `genai.Images` and the image processors of phi3v,
Qwen-VL (qwen2_5_vl, qwen3_vl) and gemma3 against the reference's processor
(``onnxruntime_genai``'s ``create_multimodal_processor()``) on the same tiny folders
(`genai.testing.vision`) and the same image files.

Pixel values must lie within 1e-5 of the reference's; input ids, image sizes, grids, token
counts and token type ids must be identical; a prompt whose tags and images disagree raises
the reference's message. JPEGs decode with the reference's libjpeg (IJG 9e, through
jpeglib): identical too; without jpeglib (Pillow's libjpeg-turbo) colour JPEGs stay within
the bound docs/differences.md states. Bad files (corrupt, unsupported, decompression bombs)
raise clear errors with bounded memory.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.errors import (
    ArgumentTypeError,
    ConfigError,
    InvalidArgumentError,
    UnsupportedFeatureError,
)
from genai.multimodal import images as images_module
from genai.multimodal.images import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE
from genai.multimodal.vision_phi3 import Phi3VisionProcessor
from genai.testing.vision import write_gemma3, write_phi3v, write_qwen2_5_vl

og = pytest.importorskip("onnxruntime_genai")
Image = pytest.importorskip("PIL.Image")

KINDS = ("phi3v", "qwen2_5_vl", "qwen3_vl", "gemma3")
PROMPTS = {
    "phi3v": "<|user|>\n{tags}what is this?<|end|>\n<|assistant|>\n",
    "qwen2_5_vl": "<|im_start|>user\n{tags}what is this?<|im_end|>\n<|im_start|>assistant\n",
    "qwen3_vl": "<|im_start|>user\n{tags}what is this?<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n{tags}what is this?<end_of_turn>\n<start_of_turn>model\n",
}
#: The largest step of one 8-bit level after normalisation (CLIP's smallest std).
ONE_LEVEL = 1 / 255 / 0.26130258 + 1e-5


def tags(kind: str, count: int) -> str:
    if kind == "phi3v":
        return "".join(f"<|image_{i + 1}|>\n" for i in range(count))
    if kind == "gemma3":
        return "<start_of_image>" * count
    return "<|vision_start|><|image_pad|><|vision_end|>" * count


def prompt(kind: str, count: int) -> str:
    return PROMPTS[kind].format(tags=tags(kind, count))


# -- files ---------------------------------------------------------------------------------


def write_png(path: Path, rows: np.ndarray, color_type: int, bit_depth: int = 8) -> None:
    """A PNG written by hand (any bit depth / colour type Pillow cannot write), unfiltered."""
    height, width = rows.shape[:2]
    samples = rows.astype(">u2" if bit_depth == 16 else np.uint8).reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in samples)
    _write_png_chunks(path, width, height, color_type, bit_depth, [zlib.compress(raw)])


def _write_png_chunks(
    path: Path, width: int, height: int, color_type: int, bit_depth: int, idat: list[bytes]
) -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    with open(path, "wb") as file:
        file.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header))
        for data in idat:
            file.write(chunk(b"IDAT", data))
        file.write(chunk(b"IEND", b""))


def picture(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Smooth colour waves plus noise: resampling has edges and gradients to get wrong."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    waves = [(np.sin(x / 7.0 + k) + np.cos(y / 11.0 - k)) * 60 + 128 for k in range(channels)]
    array = np.stack(waves, -1) + rng.normal(0, 20, (height, width, channels))
    return np.clip(array, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Image files of every kind the parity tests cover (PNG and grey JPEG: exact)."""
    root = tmp_path_factory.mktemp("images")
    paths: dict[str, Path] = {name: root / name for name in (
        "rgb_odd.png", "rgba.png", "gray.png", "gray16.png", "rgb16.png", "gray_alpha.png",
        "palette.png", "gray.jpg", "tiny.png", "big.png", "wide.png",
    )}  # fmt: skip
    Image.fromarray(picture(301, 517, 3, 0)).save(paths["rgb_odd.png"])
    Image.fromarray(picture(97, 133, 4, 1), "RGBA").save(paths["rgba.png"])
    Image.fromarray(picture(250, 250, 1, 2)[:, :, 0]).save(paths["gray.png"])
    deep = np.random.default_rng(3).integers(0, 65536, (64, 80, 3))
    write_png(paths["gray16.png"], deep[:, :, 0], color_type=0, bit_depth=16)
    write_png(paths["rgb16.png"], deep, color_type=2, bit_depth=16)
    write_png(paths["gray_alpha.png"], picture(70, 50, 2, 4), color_type=4)
    palette = Image.fromarray(picture(64, 64, 3, 5)).convert("P")
    palette.save(paths["palette.png"], transparency=3)
    Image.fromarray(picture(123, 77, 1, 6)[:, :, 0]).save(paths["gray.jpg"], quality=90)
    Image.fromarray(picture(5, 3, 3, 7)).save(paths["tiny.png"])
    Image.fromarray(picture(1344, 1344, 3, 8)).save(paths["big.png"])
    Image.fromarray(picture(60, 700, 3, 9)).save(paths["wide.png"])
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    return {
        "phi3v": write_phi3v(root),
        "qwen2_5_vl": write_qwen2_5_vl(root),
        "qwen3_vl": write_qwen2_5_vl(root, model_type="qwen3_vl", seed=3),
        "gemma3": write_gemma3(root),
    }


@pytest.fixture(scope="module")
def processors(folders: dict[str, Path]) -> dict[str, tuple]:
    """kind -> (the reference's processor, genai's processor) on the same folder."""
    return {
        kind: (
            og.Model(str(folder)).create_multimodal_processor(),
            genai.Model(folder).create_multimodal_processor(),
        )
        for kind, folder in folders.items()
    }


def assert_same_inputs(ours, reference) -> None:
    assert sorted(ours.keys()) == sorted(reference.keys())
    for name in reference.keys():  # noqa: SIM118 (the reference's NamedTensors has no __iter__)
        expected = reference[name].as_numpy()
        actual = ours[name].as_numpy()
        assert actual.dtype == expected.dtype, name
        assert actual.shape == expected.shape, name
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=name)


# -- parity with the reference's processor -------------------------------------------------

EXACT = ("rgb_odd.png", "rgba.png", "gray.png", "gray16.png", "rgb16.png", "gray_alpha.png",
         "palette.png", "gray.jpg", "tiny.png", "big.png", "wide.png")  # fmt: skip


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("kind", KINDS)
def test_one_image_matches_the_reference(kind, name, files, processors) -> None:
    reference, ours = processors[kind]
    text = prompt(kind, 1)
    expected = reference(text, images=og.Images.open(files[name]))
    assert_same_inputs(ours(text, images=genai.Images.open(files[name])), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_no_image_matches_the_reference(kind, processors) -> None:
    reference, ours = processors[kind]
    assert_same_inputs(ours(prompt(kind, 0)), reference(prompt(kind, 0)))


@pytest.mark.parametrize("kind", ("phi3v", "qwen2_5_vl", "qwen3_vl", "gemma3"))
def test_three_images_of_different_sizes_match_the_reference(kind, files, processors) -> None:
    """Three images: Qwen-VL stacks each image's patches zero-padded to the largest, as the
    reference does; phi3v's tags may come in any order."""
    reference, ours = processors[kind]
    names = [files["rgb_odd.png"], files["tiny.png"], files["wide.png"]]
    text = prompt(kind, 3)
    if kind == "phi3v":
        text = "<|image_2|> first, <|image_3|> then <|image_1|>, plus <|image_2|> again"
    expected = reference(text, images=og.Images.open(*names))
    assert_same_inputs(ours(text, images=genai.Images.open(*names)), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_prompt_matches_the_reference(kind, files, processors) -> None:
    """Qwen-VL and Gemma 3 write one image marker per image into an empty prompt."""
    reference, ours = processors[kind]
    names = [files["gray.png"], files["tiny.png"]]
    try:
        expected = reference("", images=og.Images.open(*names))
    except RuntimeError as error:  # phi3v: no tag for the images
        with pytest.raises(InvalidArgumentError) as raised:
            ours("", images=genai.Images.open(*names))
        assert str(raised.value) == str(error)
        return
    assert_same_inputs(ours("", images=genai.Images.open(*names)), expected)


def test_a_qwen_prompt_without_vision_end_matches_the_reference(files, processors) -> None:
    reference, ours = processors["qwen2_5_vl"]
    text = "<|vision_start|> a, <|vision_start|><|image_pad|>b<|vision_end|> c <|vision_end|>"
    names = [files["tiny.png"], files["gray.png"]]
    expected = reference(text, images=og.Images.open(*names))
    assert_same_inputs(ours(text, images=genai.Images.open(*names)), expected)


MISMATCHES = {
    "phi3v": ["<|image_1|> hi", "<|image_1|> <|image_2|> <|image_3|>", "<|image_2|> <|image_2|>"],
    "qwen2_5_vl": ["<|vision_start|><|image_pad|><|vision_end|>", "hi", "<|vision_start|>" * 2],
    "gemma3": ["<start_of_image>", "hi", "<start_of_image><start_of_image>"],
}


@pytest.mark.parametrize(("kind", "index"), [(kind, i) for kind in MISMATCHES for i in range(3)])
@pytest.mark.parametrize("count", [0, 1, 3])
def test_tags_and_images_that_disagree_raise_the_reference_error(
    kind, index, count, files, processors
) -> None:
    """A tag without an image, an image without a tag, or counts that differ: the reference's
    message (or, where the reference accepts the pair, the same inputs)."""
    reference, ours = processors[kind]
    text = MISMATCHES[kind][index]
    names = [files["tiny.png"], files["gray.png"], files["wide.png"]][:count]
    theirs = og.Images.open(*names) if names else None
    mine = genai.Images.open(*names) if names else None
    try:
        expected = reference(text, images=theirs)
    except RuntimeError as error:
        with pytest.raises(InvalidArgumentError) as raised:
            ours(text, images=mine)
        assert str(raised.value) == str(error)
        return
    assert_same_inputs(ours(text, images=mine), expected)


def test_the_disagreements_include_errors(files, processors) -> None:
    """The mismatch cases above are not all accepted by the reference (so they test errors)."""
    reference, _ = processors["phi3v"]
    with pytest.raises(RuntimeError, match="unique image tags"):
        reference("<|image_1|> hi")
    with pytest.raises(RuntimeError, match="unexpected value of image_id"):
        reference("<|image_2|> <|image_2|>", images=og.Images.open(files["tiny.png"]))


def test_float16_vision_graphs_get_float16_pixel_values(folders, files) -> None:
    model = genai.Model(folders["phi3v"])
    processor = Phi3VisionProcessor(model.config, np.float16)
    out = processor(
        genai.Tokenizer(model), "<|image_1|>", images=genai.Images.open(files["tiny.png"])
    )
    assert out["pixel_values"].as_numpy().dtype == np.float16


# -- colour JPEGs: the reference's libjpeg ----------------------------------------------------


def colour_jpeg(path: Path, subsampling: int, progressive: bool = False) -> str:
    y, x = np.mgrid[0:300, 0:400]
    waves = [np.sin(x / 40) * 100, np.cos(y / 30) * 100, np.sin((x + y) / 50) * 60]
    array = np.clip(np.stack(waves, -1) + 128 + picture(300, 400, 3, 11) / 8.0 - 16, 0, 255)
    Image.fromarray(array.astype(np.uint8)).save(
        path, quality=90, subsampling=subsampling, progressive=progressive
    )
    return str(path)


JPEGS = [(0, False), (1, False), (2, False), (2, True)]  # 4:4:4, 4:2:2, 4:2:0, progressive


@pytest.mark.parametrize(("subsampling", "progressive"), JPEGS)
@pytest.mark.parametrize("kind", KINDS)
def test_colour_jpegs_match_the_reference(kind, subsampling, progressive, tmp_path, processors):
    """JPEGs decode with IJG libjpeg 9e (jpeglib), the reference's libjpeg: identical."""
    pytest.importorskip("jpeglib")
    path = colour_jpeg(tmp_path / "colour.jpg", subsampling, progressive)
    reference, ours = processors[kind]
    expected = reference(prompt(kind, 1), images=og.Images.open(path))
    assert_same_inputs(ours(prompt(kind, 1), images=genai.Images.open(path)), expected)


@pytest.mark.parametrize(("subsampling", "most", "mean"), [(0, 1.5, 0.01), (2, 8, 0.5)])
def test_without_jpeglib_colour_jpegs_lie_within_the_documented_bound(
    subsampling, most, mean, tmp_path, processors, monkeypatch
) -> None:
    """Without jpeglib, Pillow's libjpeg-turbo decodes: 4:4:4 files differ by about one
    level, 4:2:0 files by a few levels at colour edges (docs/differences.md)."""
    monkeypatch.setattr(images_module, "_jpeglib", lambda: None)
    path = colour_jpeg(tmp_path / "colour.jpg", subsampling)
    reference, ours = processors["phi3v"]
    expected = reference("<|image_1|>", images=og.Images.open(path))
    actual = ours("<|image_1|>", images=genai.Images.open(path))
    diff = np.abs(actual["pixel_values"].as_numpy() - expected["pixel_values"].as_numpy())
    assert 0 < diff.max() <= most * ONE_LEVEL
    assert diff.mean() <= mean * ONE_LEVEL
    np.testing.assert_array_equal(actual["input_ids"].as_numpy(), expected["input_ids"].as_numpy())


# -- og.Images -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(6000, 1), (1, 6000)], ids=["wide", "tall"])
def test_a_sliver_of_an_image_keeps_one_row_for_phi3v(processors, tmp_path, size) -> None:
    """An aspect ratio above 16 x 336 : 1 resized to less than a pixel (Pillow's bare
    ValueError, the reference's allocation failure); the side keeps one pixel, so the image
    makes one tile row or column and the features' shapes follow."""
    path = tmp_path / "sliver.png"
    Image.fromarray(np.full((size[1], size[0], 3), 200, np.uint8)).save(path)
    ours = processors["phi3v"][1]
    inputs = ours("<|image_1|>\nhi", images=genai.Images.open(str(path)))
    sizes = inputs["image_sizes"].as_numpy()[0].tolist()
    assert sizes == ([336, 5376] if size[0] > size[1] else [5376, 336])
    assert np.isfinite(inputs["pixel_values"].as_numpy()).all()


def test_images_open_and_open_bytes_decode_the_same(files) -> None:
    names = [files["rgb_odd.png"], files["gray.jpg"], files["rgba.png"]]
    opened = genai.Images.open(*names)
    blobs = genai.Images.open_bytes(*(Path(n).read_bytes() for n in names))
    assert len(opened) == len(blobs) == 3
    for a, b in zip(opened, blobs, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.uint8 and a.shape[2] == 3
    # RGBA: the alpha channel is dropped, not composited (as the reference's decoder)
    rgba = np.asarray(Image.open(files["rgba.png"]))
    np.testing.assert_array_equal(opened[2], rgba[:, :, :3])


def test_images_argument_errors(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="No images provided"):
        genai.Images.open()
    with pytest.raises(FileNotFoundError, match="Image path does not exist"):
        genai.Images.open(str(tmp_path / "missing.png"))
    with pytest.raises(ArgumentTypeError, match="Image paths must be strings"):
        genai.Images.open(3)
    with pytest.raises(InvalidArgumentError, match="is a directory, not an image file"):
        genai.Images.open(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="is a directory, not an audio file"):
        genai.Audios.open(str(tmp_path))
    with pytest.raises(ArgumentTypeError, match="Image data must be bytes"):
        genai.Images.open_bytes("not bytes")


def _encoded(image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["BMP", "GIF", "TIFF", "WEBP", "NOISE", "EMPTY"])
def test_unsupported_formats_raise_a_clear_error(fmt) -> None:
    small = Image.fromarray(picture(16, 16, 3, 0))
    if fmt == "NOISE":
        data = np.random.default_rng(0).integers(0, 256, 4096).astype(np.uint8).tobytes()
    elif fmt == "EMPTY":
        data = b""
    else:
        try:
            data = _encoded(small, fmt)
        except (KeyError, OSError):
            pytest.skip(f"this Pillow cannot write {fmt}")
    with pytest.raises(InvalidArgumentError, match="only PNG and JPEG"):
        genai.Images.open_bytes(data)


def test_corrupt_files_raise_a_clear_error(files) -> None:
    png = Path(files["rgb_odd.png"]).read_bytes()
    jpeg = Path(files["gray.jpg"]).read_bytes()
    cases = {
        "truncated png": png[: len(png) // 3],
        "png with a broken header": png[:12] + b"XXXX" + png[16:],
        "truncated jpeg": jpeg[: len(jpeg) // 2],
        "jpeg without frames": jpeg[:4] + b"\x00" * 100,
        "png signature, no chunks": png[:8] + b"\x00" * 40,  # Pillow: "cannot identify"
    }
    for what, data in cases.items():
        with pytest.raises(InvalidArgumentError, match="image 0: ") as raised:
            genai.Images.open_bytes(data)
        assert "PNG" in str(raised.value) or "JPEG" in str(raised.value), what
        assert "object at 0x" not in str(raised.value), what  # no Pillow file object repr


def test_cmyk_jpeg_is_refused() -> None:
    cmyk = Image.fromarray(picture(16, 16, 3, 0)).convert("CMYK")
    with pytest.raises(InvalidArgumentError, match="CMYK"):
        genai.Images.open_bytes(_encoded(cmyk, "JPEG"))


# -- decompression bombs: refused from the header, in bounded memory ---------------------------


def _bomb_png(path: Path, side: int) -> None:
    """A valid grey PNG of side x side zeros, compressed as it is written (~400 kB for 20000)."""
    compressor = zlib.compressobj(9)
    row = b"\x00" * (side + 1)
    chunks, pending = [], []
    for start in range(0, side, 1000):
        pending.append(compressor.compress(row * min(1000, side - start)))
    pending.append(compressor.flush())
    chunks.append(b"".join(pending))
    _write_png_chunks(path, side, side, color_type=0, bit_depth=8, idat=chunks)


def _bomb_jpeg(side: int) -> bytes:
    """A small JPEG whose frame header claims side x side pixels."""
    data = bytearray(_encoded(Image.fromarray(picture(16, 16, 3, 0)), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def test_decompression_bombs_are_refused_in_bounded_memory(tmp_path) -> None:
    """20000 x 20000 (1.2 GB decoded) is refused from the header: the process that opens it
    stays far below one decoded copy."""
    bomb = tmp_path / "bomb.png"
    _bomb_png(bomb, 20000)
    (tmp_path / "bomb.jpg").write_bytes(_bomb_jpeg(20000))
    script = textwrap.dedent(
        """
        import resource, sys
        import genai
        from genai.errors import InvalidArgumentError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for path in sys.argv[1:]:
            try:
                genai.Images.open(path)
            except InvalidArgumentError as error:
                print("refused:", error)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print("grew_kib", after - before)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(bomb), str(tmp_path / "bomb.jpg")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    refusals = [line for line in lines if line.startswith("refused:")]
    assert len(refusals) == 2, run.stdout + run.stderr
    for line in refusals:
        assert "20000x20000" in line and f"{MAX_IMAGE_SIDE}" in line
    grew = int(lines[-1].split()[1])
    assert grew < 100 * 1024, f"opening the bombs grew the process by {grew} KiB"


def test_the_limits_are_the_reference_limits() -> None:
    """One pixel over a side or over the area is refused; the limit itself is fine to ask."""
    assert (MAX_IMAGE_SIDE, MAX_IMAGE_PIXELS) == (16384, 100_000_000)
    with pytest.raises(InvalidArgumentError, match="16385x16"):
        genai.Images.open_bytes(_bomb_jpeg_size(16385, 16))
    with pytest.raises(InvalidArgumentError, match="10001x10000"):
        genai.Images.open_bytes(_bomb_jpeg_size(10001, 10000))


def _bomb_jpeg_size(width: int, height: int) -> bytes:
    data = bytearray(_bomb_jpeg(16))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


# -- processor configs -----------------------------------------------------------------------


def _copy_with_transforms(folder: Path, target: Path, keep) -> Path:
    shutil.copytree(folder, target)
    config = json.loads((target / "processor_config.json").read_text())
    transforms = config["processor"]["transforms"]
    config["processor"]["transforms"] = [t for t in transforms if keep(t["operation"]["type"])]
    (target / "processor_config.json").write_text(json.dumps(config))
    return target


def test_a_qwen_config_without_patching_matches_the_reference(folders, files, tmp_path) -> None:
    """Without PatchImage the processor patches the one HWC image itself, as the reference."""
    folder = _copy_with_transforms(
        folders["qwen2_5_vl"], tmp_path / "nopatch", lambda kind: kind != "PatchImage"
    )
    text = prompt("qwen2_5_vl", 1)
    expected = og.Model(str(folder)).create_multimodal_processor()(
        text, images=og.Images.open(files["rgb_odd.png"])
    )
    ours = genai.Model(folder).create_multimodal_processor()
    assert_same_inputs(ours(text, images=genai.Images.open(files["rgb_odd.png"])), expected)


def test_config_errors_name_the_problem(folders, tmp_path) -> None:
    folder = _copy_with_transforms(folders["gemma3"], tmp_path / "odd", lambda kind: True)
    config = json.loads((folder / "processor_config.json").read_text())
    config["processor"]["transforms"].append({"operation": {"type": "Mystery"}})
    (folder / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedFeatureError, match="'Mystery' is not supported"):
        genai.Model(folder).create_multimodal_processor()
    (folder / "processor_config.json").unlink()
    with pytest.raises(ConfigError, match="processor config not found"):
        genai.Model(folder).create_multimodal_processor()
