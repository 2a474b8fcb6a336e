"""Image parts of chat completions (``{"type": "image_url", "image_url": {"url":
"data:..."}}``) on a served vision-language folder (`genai.testing.vision`): the reply is the
reference's greedy reply to the same templated prompt and image (its processor, set_inputs,
greedy decoding); remote URLs, bad data and a model without images are 400s with OpenAI's
error body; remote URLs are fetched with ``allow_remote`` (``--allow-remote-images``)."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
og = pytest.importorskip("onnxruntime_genai")
Image = pytest.importorskip("PIL.Image")

import genai  # noqa: E402
from genai.serve.app import ServeEngine  # noqa: E402
from genai.serve.images import MAX_IMAGES  # noqa: E402
from genai.serve.server import BackgroundServer  # noqa: E402
from genai.testing.vision import write_phi3v, write_qwen2_5_vl  # noqa: E402

NEW = 5
TAGS = {"phi3v": "<|image_{n}|>\n", "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>"}


def png_bytes(seed: int, size: tuple[int, int] = (70, 90)) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module", params=["phi3v", "qwen2_5_vl"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_vlm")
    writer = {"phi3v": write_phi3v, "qwen2_5_vl": write_qwen2_5_vl}[request.param]
    folder = writer(root)
    model = genai.Model(folder)
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=4, max_queue=16)
    with BackgroundServer(engine) as server:
        yield request.param, folder, server


def chat(server, content, **options) -> httpx.Response:
    body = {
        "model": server.engine.model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW,
        "temperature": 0,
        **options,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def reference_reply(folder, text: str, images: list[bytes]) -> str:
    """The reference's greedy reply to the templated ``text`` with ``images``."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": text}])
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    inputs = model.create_multimodal_processor()(prompt, images=og.Images.open_bytes(*images))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=inputs["input_ids"].shape()[1] + NEW)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokenizer.decode(np.asarray(tokens, np.int32))


def test_image_parts_give_the_reference_reply(served) -> None:
    """Two images between text parts: each part becomes the model's tag, in order."""
    kind, folder, server = served
    first, second = png_bytes(1), png_bytes(2, (120, 40))
    content = [
        {"type": "text", "text": "compare "},
        {"type": "image_url", "image_url": {"url": data_url(first)}},
        {"type": "text", "text": "with "},
        {"type": "image_url", "image_url": {"url": data_url(second), "detail": "low"}},
    ]
    reply = chat(server, content)
    assert reply.status_code == 200, reply.text
    tag = TAGS[kind]
    text = f"compare {tag.format(n=1)}with {tag.format(n=2)}"
    expected = reference_reply(folder, text, [first, second])
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_streamed_image_reply_equals_the_whole_one(served) -> None:
    _, _, server = served
    content = [{"type": "image_url", "image_url": {"url": data_url(png_bytes(3))}}]
    whole = chat(server, content).json()["choices"][0]["message"]["content"]
    streamed = chat(server, content, stream=True)
    assert streamed.status_code == 200
    pieces = []
    for line in streamed.text.splitlines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"]
            if delta:
                pieces.append(delta[0]["delta"].get("content") or "")
    assert "".join(pieces) == whole


BAD = {
    "remote": ({"url": "https://example.com/cat.png"}, "--allow-remote-images"),
    "scheme": ({"url": "file:///etc/passwd"}, "data: URLs"),
    "not base64": ({"url": "data:image/png;base64,@@@"}, "base64 is invalid"),
    "not base64 marked": ({"url": "data:image/png,abc"}, "must be base64"),
    "bmp": ({"url": "data:image/bmp;base64," + base64.b64encode(b"BM" + bytes(64)).decode()},
            "only PNG and JPEG"),
    "corrupt png": ({"url": data_url(png_bytes(4)[:60])}, "invalid image input"),
    "no url": ({}, "image_url"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_images_are_400s(served, case) -> None:
    _, _, server = served
    image_url, message = BAD[case]
    reply = chat(server, [{"type": "image_url", "image_url": image_url}])
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]


def test_too_many_images_and_images_outside_user_messages_are_400s(served) -> None:
    _, _, server = served
    part = {"type": "image_url", "image_url": {"url": data_url(png_bytes(5, (8, 8)))}}
    reply = chat(server, [part] * (MAX_IMAGES + 1))
    assert reply.status_code == 400 and f"at most {MAX_IMAGES}" in reply.text
    body = {
        "model": server.engine.model_name,
        "messages": [{"role": "system", "content": [part]}, {"role": "user", "content": "hi"}],
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and "only user messages" in reply.text


def test_remote_images_are_fetched_when_allowed(served) -> None:
    kind, folder, server = served
    image = png_bytes(6)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_port}/cat.png"
    content = [{"type": "image_url", "image_url": {"url": url}}]
    try:
        assert chat(server, content).status_code == 400
        server.engine.images.allow_remote = True
        reply = chat(server, content)
    finally:
        server.engine.images.allow_remote = False
        httpd.shutdown()
    assert reply.status_code == 200, reply.text
    expected = reference_reply(folder, TAGS[kind].format(n=1), [image])
    assert reply.json()["choices"][0]["message"]["content"] == expected


def test_a_text_model_refuses_image_parts(fixture_folders) -> None:
    model = genai.Model(fixture_folders["gqa"])
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=2)
    with BackgroundServer(engine) as server:
        part = {"type": "image_url", "image_url": {"url": data_url(png_bytes(7))}}
        reply = chat(server, [part])
    assert reply.status_code == 400
    assert "takes no images" in reply.json()["error"]["message"]


def test_several_choices_of_an_image_prompt(served) -> None:
    """n = 2 greedy choices: both generators take the request's image inputs."""
    _, _, server = served
    content = [{"type": "image_url", "image_url": {"url": data_url(png_bytes(8))}}]
    whole = chat(server, content).json()["choices"][0]["message"]["content"]
    reply = chat(server, content, n=2)
    assert reply.status_code == 200, reply.text
    assert [c["message"]["content"] for c in reply.json()["choices"]] == [whole, whole]
