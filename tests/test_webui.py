"""The chat page of `genai serve`, in a real browser: Debian's headless Chromium driven by
Selenium through Debian's chromedriver (nothing downloads a browser), against `genai serve` on
the real default model, and on a tiny Phi-3 Vision folder (`genai.testing.vision`) for images:
an image picked or pasted on the page gets the reference engine's greedy reply to that image
and prompt (its MultiModalProcessor on the same folder). CI installs both packages (.ci/run);
elsewhere these tests skip without them."""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import re
import shutil
import time

import httpx
import numpy as np
import pytest

from tests.conftest import ROOT, missing_in_ci
from tests.parity import chat_reply
from tests.serve_helpers import serve_command

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")
pytest.importorskip("fastapi", reason="genai serve needs the serve extra")

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
NEW_TOKENS = 24
WEBUI = ROOT / "genai" / "serve" / "webui"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's chromium + chromium-driver packages) under Selenium."""
    try:
        from selenium import webdriver  # lazy: only these tests drive a browser
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing_in_ci("selenium is not installed (the test extra installs it)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        missing_in_ci("needs Debian's chromium and chromium-driver (apt-get install them)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1100,800")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def text_server(default_model_path):
    """`genai serve` on the default model with no options, shared by the tests that need
    nothing else: its URL."""
    with serve_command(default_model_path) as (url, _):
        yield url


def wait_for(condition, timeout=90.0, what="the page"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def js(browser, script, *args):
    return browser.execute_script(script, *args)


def open_page(browser, url):
    browser.get(url + "/")
    wait_for(lambda: js(browser, "return document.readyState") == "complete")
    # Count the renders of every assistant reply (a streamed reply renders many times).
    js(
        browser,
        """window.renders = 0;
        new MutationObserver(() => { window.renders += 1; }).observe(
            document.getElementById('messages'), {subtree: true, childList: true});""",
    )


def set_field(browser, name, value):
    js(browser, "document.getElementById(arguments[0]).value = arguments[1];", name, str(value))


def ask(browser, text):
    set_field(browser, "prompt", text)
    js(browser, "document.getElementById('composer').requestSubmit();")


def last_reply(browser):
    return js(
        browser,
        """const boxes = document.querySelectorAll('.message.assistant');
        if (!boxes.length) return null;
        const box = boxes[boxes.length - 1];
        const stats = box.querySelector('.stats');
        return {text: box.querySelector('.content').innerText, outcome: box.dataset.outcome || '',
                tokens: box.dataset.tokens || '', stats: stats ? stats.innerText : ''};""",
    )


def greedy_settings(browser, max_tokens=NEW_TOKENS):
    set_field(browser, "temperature", 0)
    set_field(browser, "max_tokens", max_tokens)


def focused(browser):
    """The id of the element with keyboard focus (BODY's tag when focus is lost)."""
    return js(browser, "const e = document.activeElement; return e ? e.id || e.tagName : null;")


def count_chat_posts(browser) -> None:
    """Count the page's requests to /v1/chat/completions from now on (``window.chatPosts``)
    and keep their bodies (``window.chatBodies``)."""
    js(
        browser,
        """window.chatPosts = 0;
        window.chatBodies = [];
        const original = window.fetch;
        window.fetch = (resource, ...rest) => {
            if (String(resource).includes('chat/completions')) {
                window.chatPosts += 1;
                window.chatBodies.push(JSON.parse(rest[0].body));
            }
            return original(resource, ...rest);
        };""",
    )


def start_a_long_reply(browser, keyboard=False):
    """Ask for a reply too long to end by itself in the test (with Enter on the Send button:
    ``keyboard``); wait until it streams."""
    greedy_settings(browser, max_tokens=4000)
    set_field(browser, "repetition_penalty", 1.3)  # a long reply that does not loop back
    story = "Write a very long story about a dragon who learns to bake bread."
    if keyboard:
        from selenium.webdriver.common.keys import Keys  # lazy: the browser fixture checked it

        set_field(browser, "prompt", story)
        browser.find_element("id", "send").send_keys(Keys.ENTER)
    else:
        ask(browser, story)
    wait_for(lambda: len((last_reply(browser) or {}).get("text", "")) > 40, what="text")


def reply_busy(browser):
    """The last reply's aria-busy and the aria-live of the region holding it."""
    return js(
        browser,
        """const boxes = document.querySelectorAll('.message.assistant');
        const box = boxes[boxes.length - 1];
        return [box.getAttribute('aria-busy'),
                box.closest('[aria-live]').getAttribute('aria-live')];""",
    )


def test_a_question_gets_a_streamed_answer(browser, default_model_path):
    expected = chat_reply(og, default_model_path, QUESTION, NEW_TOKENS)
    with serve_command(default_model_path) as (url, _):
        open_page(browser, url)
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        assert browser.find_element("id", "model").text == default_model_path.name
        # a text model: no image upload (the server says it takes no images)
        assert httpx.get(url + "/webui/config.json").json()["accepts_images"] is False
        assert not browser.find_element("id", "attach").is_displayed()
        greedy_settings(browser)
        ask(browser, QUESTION)
        reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
        renders = js(browser, "return window.renders")
    assert reply["outcome"] == "done"
    assert " ".join(reply["text"].split()) == " ".join(expected.split())
    assert "Paris" in reply["text"]
    assert renders > 3, "the reply was written at once, not streamed"
    assert int(reply["tokens"]) > 1 and "tok/s" in reply["stats"] and "~" not in reply["stats"]


def _disconnected(url):
    metrics = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(r'^genai_requests_total\{outcome="disconnected"\} (\S+)$', metrics, re.M)
    return float(match.group(1)) if match else 0.0


def test_stop_ends_the_reply_and_frees_the_server(browser, default_model_path):
    with serve_command(default_model_path) as (url, _):
        open_page(browser, url)
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        start_a_long_reply(browser)
        assert browser.find_element("id", "stop").is_displayed()
        browser.find_element("id", "stop").click()
        reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="stop")
        assert reply["outcome"] == "stopped" and "stopped" in reply["stats"]
        assert browser.find_element("id", "send").is_displayed()
        # The server saw the client go away and freed the request's slot.
        wait_for(lambda: _disconnected(url) >= 1, timeout=30, what="the server to cancel")
        health = wait_for(lambda: (h := httpx.get(url + "/health").json())["running"] == 0 and h)
        assert health["status"] == "ok"
        stopped_text = last_reply(browser)["text"]
        time.sleep(0.5)
        assert last_reply(browser)["text"] == stopped_text  # nothing arrives after the stop


def test_new_chat_during_a_reply_starts_an_empty_conversation(browser, text_server):
    """New chat while a reply streams stops it, and nothing of it reaches the new conversation
    (the stopped reply ends after the reset)."""
    open_page(browser, text_server)
    wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
    count_chat_posts(browser)
    start_a_long_reply(browser)
    assert browser.find_element("id", "stop").is_displayed()
    browser.find_element("id", "new-chat").click()
    assert not browser.find_elements("css selector", ".message")
    wait_for(lambda: browser.find_element("id", "send").is_displayed(), what="Send")
    greedy_settings(browser)
    set_field(browser, "repetition_penalty", 1)
    ask(browser, QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    bodies = js(browser, "return window.chatBodies")
    assert len(bodies) == 2
    assert bodies[1]["messages"] == [{"role": "user", "content": QUESTION}]
    assert reply["outcome"] == "done" and "Paris" in reply["text"]
    assert len(browser.find_elements("css selector", ".message")) == 2


def test_keyboard_focus_and_the_live_region_follow_a_reply(browser, text_server):
    """Enter on Send moves the focus to Stop (Send is hidden), Enter on Stop back to the message
    box; the reply streams under aria-busy in the polite live region, announced when it ends."""
    from selenium.webdriver.common.keys import Keys  # lazy: the browser fixture checked it

    open_page(browser, text_server)
    wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
    start_a_long_reply(browser, keyboard=True)
    assert focused(browser) == "stop"
    assert reply_busy(browser) == ["true", "polite"]
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="stop")
    assert reply["outcome"] == "stopped"
    assert focused(browser) == "prompt"
    assert reply_busy(browser) == ["false", "polite"]
    # typed in the message box: the focus stays there, to write the next one while it streams
    greedy_settings(browser)
    set_field(browser, "repetition_penalty", 1)
    prompt = browser.find_element("id", "prompt")
    prompt.send_keys(QUESTION, Keys.ENTER)
    wait_for(lambda: len(browser.find_elements("css selector", ".message.assistant")) == 2)
    assert focused(browser) == "prompt"
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done" and "Paris" in reply["text"]
    assert focused(browser) == "prompt"
    assert reply_busy(browser) == ["false", "polite"]


def test_the_settings_panel_fits_a_narrow_window(browser, text_server):
    """On a phone-sized window (the header wraps) the settings panel lies between the header
    and the message box, and its last button scrolls into reach."""
    metrics = {"width": 360, "height": 640, "deviceScaleFactor": 1, "mobile": True}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        open_page(browser, text_server)
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        browser.find_element("id", "toggle-settings").click()
        layout = js(
            browser,
            """const box = (q) => document.querySelector(q).getBoundingClientRect();
            return {header: box('header').bottom, top: box('#settings').top,
                    bottom: box('#settings').bottom, composer: box('#composer').top,
                    height: window.innerHeight};""",
        )
        assert layout["header"] <= layout["top"], layout
        assert layout["bottom"] <= layout["composer"] <= layout["height"], layout
        for name in ("reset-settings", "prompt"):  # reached, and not covered
            hit = js(
                browser,
                """const element = document.getElementById(arguments[0]);
                element.scrollIntoView({block: 'nearest'});
                const r = element.getBoundingClientRect();
                const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
                return hit && hit.id;""",
                name,
            )
            assert hit == name
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_message_too_large_for_the_server_is_kept(browser, text_server):
    """A text-only request over --max-body-bytes is refused on the page, in words for what it
    holds (no images here)."""
    open_page(browser, text_server)
    wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
    greedy_settings(browser)
    count_chat_posts(browser)
    error = browser.find_element("id", "image-error")
    big = "document.getElementById('prompt').value = 'x'.repeat(5 << 20);"
    js(browser, big + "document.getElementById('composer').requestSubmit();")
    wait_for(lambda: error.is_displayed() and error.text, what="the refusal")
    assert error.text.startswith("This message makes a 5.0 MiB request"), error.text
    assert "4.0 MiB (genai serve --max-body-bytes). Shorten the message." in error.text
    assert "image" not in error.text
    assert js(browser, "return document.getElementById('prompt').value.length") == 5 << 20
    assert js(browser, "return window.chatPosts") == 0
    ask(browser, QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done" and not error.is_displayed()
    js(browser, big + "document.getElementById('composer').requestSubmit();")
    wait_for(lambda: error.is_displayed() and error.text, what="the refusal")
    assert error.text.startswith("This message and the conversation make a 5.0 MiB"), error.text
    assert "Shorten the message or start a new chat." in error.text
    assert "image" not in error.text
    assert js(browser, "return window.chatPosts") == 1


def _small_context_copy(folder, to, context: int):
    """A copy of the model folder ``folder`` with ``context`` as its context length and
    max_length. Copied, not hard-linked: a second link to the user cache's model.onnx.data
    makes onnx refuse to load it ("a potential hardlink attack") while the copy lives."""
    shutil.copytree(folder, to)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["context_length"] = context
    config.setdefault("search", {})["max_length"] = context
    (to / "genai_config.json").write_text(json.dumps(config))
    return to


def test_a_full_context_is_said_on_the_page(browser, default_model_path, tmp_path):
    """A reply cut because the conversation filled the context looked finished (the page never
    read finish_reason); the next message's 400 did not say what to do."""
    folder = _small_context_copy(default_model_path, tmp_path / "small", 120)
    with serve_command(folder) as (url, _):
        open_page(browser, url)
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        set_field(browser, "temperature", 0)
        set_field(browser, "max_tokens", "")  # no max_tokens: the reply runs to the context
        set_field(browser, "repetition_penalty", 1.3)
        ask(browser, "Write a very long story about a dragon who learns to bake bread.")
        reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="reply")
        assert reply["outcome"] == "done", reply["stats"]
        assert "cut: the conversation filled the model's context" in reply["stats"]
        ask(browser, "Go on.")
        wait_for(lambda: len(browser.find_elements("css selector", ".message.assistant")) == 2)
        reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="400")
        assert reply["outcome"] == "error"
        assert reply["stats"].endswith("New chat starts a fresh conversation."), reply["stats"]


def test_api_key_is_asked_for_and_required(browser, default_model_path):
    from selenium.webdriver.common.keys import Keys  # lazy: the browser fixture checked it

    with serve_command(default_model_path, "--api-key", "sesame") as (url, _):
        assert httpx.get(url + "/v1/models").status_code == 401
        open_page(browser, url)
        dialog = browser.find_element("id", "key-dialog")
        wait_for(lambda: dialog.get_attribute("open") is not None, what="the key dialog")
        assert browser.find_element("id", "model").text == ""
        # Escape before any user activation (Chromium closes the dialog then, whatever the
        # cancel event's handler says): the page opens it again, the key still awaited
        js(
            browser,
            """window.keyDialogCloses = 0;  // after the page's own close handler
            document.getElementById('key-dialog').addEventListener(
                'close', () => { window.keyDialogCloses += 1; });""",
        )
        browser.switch_to.active_element.send_keys(Keys.ESCAPE)
        wait_for(lambda: js(browser, "return window.keyDialogCloses"), what="the close")
        assert dialog.get_attribute("open") is not None
        assert focused(browser) == "key-input"
        set_field(browser, "key-input", "wrong")
        browser.find_element("id", "key-save").click()
        error = browser.find_element("id", "key-error")
        wait_for(lambda: error.is_displayed() and error.text, what="the refusal")
        assert "API key" in error.text  # the server's 401 message, shown to the user
        assert dialog.get_attribute("open") is not None
        set_field(browser, "key-input", "sesame")
        browser.find_element("id", "key-save").click()
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        assert dialog.get_attribute("open") is None
        assert focused(browser) == "prompt"  # the keyboard goes on in the message box
        greedy_settings(browser)
        ask(browser, QUESTION)
        reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="reply")
    assert reply["outcome"] == "done" and "Paris" in reply["text"]


def test_no_webui_serves_the_api_only(default_model_path):
    with serve_command(default_model_path, "--no-webui") as (url, _):
        assert httpx.get(url + "/").status_code == 404
        assert httpx.get(url + "/webui/app.js").status_code == 404
        assert httpx.get(url + "/v1/models").status_code == 200


A = '<a href="https://x.org/a_b_c" target="_blank" rel="noopener noreferrer">docs</a>'
MARKDOWN_CASES = [
    ("**b** *it* `a*b*`", "<p><strong>b</strong> <em>it</em> <code>a*b*</code></p>"),
    ("<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
    ("```python\nif a < b:\n    pass\n```",
     '<pre><span class="lang">python</span><code class="language-python">'
     "if a &lt; b:\n    pass</code></pre>"),
    ("```\nstill streaming", "<pre><code>still streaming</code></pre>"),
    ("- one\n- two", "<ul><li>one</li><li>two</li></ul>"),
    ("3. three\n4. four", '<ol start="3"><li>three</li><li>four</li></ol>'),
    ("## Title", "<h2>Title</h2>"),
    ("[docs](https://x.org/a_b_c)", f"<p>{A}</p>"),
    ("[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
    ("| a | b |\n|---|---|\n| 1 | 2 |",
     "<table><thead><tr><th>a</th><th>b</th></tr></thead>"
     "<tbody><tr><td>1</td><td>2</td></tr></tbody></table>"),
    ("> quoted", "<blockquote><p>quoted</p></blockquote>"),
    ("[a](http://x.com/?q=1&x=<img>)",
     '<p><a href="http://x.com/?q=1&amp;x=&lt;img&gt;" target="_blank" '
     'rel="noopener noreferrer">a</a></p>'),
    ("""[q](https://x.org/"a'b)""",
     '<p><a href="https://x.org/&quot;a&#39;b" target="_blank" '
     'rel="noopener noreferrer">q</a></p>'),
    ("[x](&#106;avascript:alert(1))", "<p>[x](&amp;#106;avascript:alert(1))</p>"),
]  # fmt: skip
#: link URLs as written: the browser reads each back from the rendered href (escaped once)
LINK_URLS = ["http://x.com/?q=1&x=<img>", """https://x.org/"a'b""", "https://x.org/?a&amp;b=1"]


def test_markdown_renderer_in_the_browser(browser, tmp_path):
    page = tmp_path / "md.html"
    page.write_text(f'<script src="{(WEBUI / "markdown.js").as_uri()}"></script>')
    browser.get(page.as_uri())
    for source, html in MARKDOWN_CASES:
        assert js(browser, "return window.GenaiMarkdown.render(arguments[0]);", source) == html
    for url in LINK_URLS:
        href = js(
            browser,
            """const holder = document.createElement('div');
            holder.innerHTML = window.GenaiMarkdown.render('[link](' + arguments[0] + ')');
            return holder.querySelector('a').getAttribute('href');""",
            url,
        )
        assert href == url


def test_the_page_files_are_package_data():
    """Every file the page serves is matched by the wheel's package-data patterns."""
    import tomllib  # Python 3.11+: a lazy import keeps 3.10 collecting the suite

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["genai"]
    files = [p.relative_to(ROOT / "genai").as_posix() for p in WEBUI.iterdir() if p.suffix != ".py"]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


# --- images on a vision-language model ------------------------------------------------------------
IMAGE_QUESTION = "What is in this picture?"
IMAGE_TOKENS = 8
#: the phi3v server's body limit: the small test pictures fit, the noisy one does not
BODY_LIMIT = 200_000


def png(pixels: np.ndarray) -> bytes:
    Image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def gradient(height: int, width: int, channel: int) -> bytes:
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[..., channel] = np.linspace(0, 255, width, dtype=np.float32).astype(np.uint8)[None]
    return png(pixels)


def image_reply(folder, image: bytes | None) -> str:
    """The reference's greedy reply to IMAGE_QUESTION after ``image`` (phi3v's tag first, as
    the page sends the image part before the text), through its MultiModalProcessor."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    text = ("<|image_1|>\n" if image is not None else "") + IMAGE_QUESTION
    messages = json.dumps([{"role": "user", "content": text}])
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    images = og.Images.open_bytes(image) if image is not None else None
    inputs = model.create_multimodal_processor()(prompt, images=images)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=inputs["input_ids"].shape()[1] + IMAGE_TOKENS)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokenizer.decode(np.asarray(tokens, np.int32))


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    """`genai serve` on a tiny random Phi-3 Vision folder: (url, folder)."""
    from genai.testing.vision import write_phi3v

    folder = write_phi3v(tmp_path_factory.mktemp("webui_vlm"))
    with serve_command(folder, "--max-body-bytes", str(BODY_LIMIT)) as (url, _):
        yield url, folder


def open_vision_page(browser, url):
    open_page(browser, url)
    wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
    wait_for(lambda: browser.find_element("id", "attach").is_displayed(), what="the image button")
    greedy_settings(browser, max_tokens=IMAGE_TOKENS)


def attachments(browser):
    """The thumbnails waiting to be sent: their natural widths (0: the image did not load)."""
    return js(
        browser,
        "return Array.from(document.querySelectorAll('#attachments img'), i => i.naturalWidth);",
    )


def user_images(browser):
    """The natural sizes of the last user message's thumbnails and their URLs' schemes."""
    return js(
        browser,
        """const boxes = document.querySelectorAll('.message.user');
        const box = boxes[boxes.length - 1];
        return Array.from(box.querySelectorAll('img'),
                          i => [i.naturalWidth, i.naturalHeight, i.src.slice(0, 22)]);""",
    )


def paste(browser, data: bytes, name: str, mime: str = "image/png") -> None:
    js(
        browser,
        """const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], arguments[1], {type: arguments[2]}));
        document.getElementById('prompt').dispatchEvent(new ClipboardEvent('paste',
            {clipboardData: transfer, bubbles: true, cancelable: true}));""",
        base64.b64encode(data).decode(),
        name,
        mime,
    )


def test_a_picked_image_gets_the_reference_reply(browser, vision_server, tmp_path):
    url, folder = vision_server
    picture = gradient(300, 200, 2)
    expected = image_reply(folder, picture)
    # the image decides the reply: without it, or with another one, the reference differs
    assert words(expected) != words(image_reply(folder, None))
    assert words(expected) != words(image_reply(folder, gradient(60, 80, 0)))
    assert httpx.get(url + "/webui/config.json").json()["accepts_images"] is True
    path = tmp_path / "gradient.png"
    path.write_bytes(picture)
    open_vision_page(browser, url)
    browser.find_element("id", "image-input").send_keys(str(path))
    assert wait_for(lambda: attachments(browser), what="the thumbnail") == [200]
    ask(browser, IMAGE_QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done", reply["stats"]
    assert words(reply["text"]) == words(expected)
    # the user's message shows the image it sent (a data: URL the page's CSP lets load)
    assert user_images(browser) == [[200, 300, "data:image/png;base64,"]]
    assert attachments(browser) == []


def test_a_pasted_image_gets_the_reference_reply(browser, vision_server):
    url, folder = vision_server
    picture = gradient(90, 150, 1)
    expected = image_reply(folder, picture)
    open_vision_page(browser, url)
    paste(browser, picture, "pasted.png")
    assert wait_for(lambda: attachments(browser), what="the thumbnail") == [150]
    ask(browser, IMAGE_QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done", reply["stats"]
    assert words(reply["text"]) == words(expected)
    assert user_images(browser) == [[150, 90, "data:image/png;base64,"]]


def test_new_chat_drops_the_images_not_sent(browser, vision_server):
    url, _ = vision_server
    open_vision_page(browser, url)
    count_chat_posts(browser)
    paste(browser, gradient(90, 150, 1), "pasted.png")
    assert wait_for(lambda: attachments(browser), what="the thumbnail") == [150]
    browser.find_element("id", "new-chat").click()
    assert attachments(browser) == []
    assert not browser.find_element("id", "attachments").is_displayed()
    ask(browser, IMAGE_QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done", reply["stats"]
    assert js(browser, "return window.chatBodies")[0]["messages"] == [
        {"role": "user", "content": IMAGE_QUESTION}
    ]


def test_images_the_server_would_refuse_are_refused_on_the_page(browser, vision_server):
    url, _ = vision_server
    open_vision_page(browser, url)
    error = browser.find_element("id", "image-error")
    count_chat_posts(browser)
    # not PNG or JPEG (a GIF header), whatever its name and declared type say
    paste(browser, b"GIF89a" + bytes(64), "cat.png")
    wait_for(lambda: error.is_displayed() and error.text, what="the refusal")
    assert "not a PNG or JPEG" in error.text and "cat.png" in error.text
    assert attachments(browser) == []
    # a PNG the decoder takes, but too large for this server's request body limit: kept on the
    # page with the message, nothing sent
    noise = png(np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8))
    assert 0.75 * BODY_LIMIT < len(noise) < 20 << 20
    paste(browser, noise, "noise.png")
    wait_for(lambda: attachments(browser) == [300], what="the thumbnail")
    assert not error.is_displayed()
    ask(browser, IMAGE_QUESTION)
    wait_for(lambda: "--max-body-bytes" in error.text, what="the refusal")
    assert "195.3 KiB" in error.text  # the server's limit, as the page says it
    assert browser.find_element("id", "prompt").get_attribute("value") == IMAGE_QUESTION
    assert attachments(browser) == [300]
    assert not browser.find_elements("css selector", ".message")
    assert js(browser, "return window.chatPosts") == 0
    # removing the image lets the question go
    browser.find_element("css selector", "#attachments .remove").click()
    assert attachments(browser) == []
    ask(browser, IMAGE_QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done" and js(browser, "return window.chatPosts") == 1


def test_a_refused_message_leaves_the_conversation(browser, vision_server):
    """Four large images make a prompt longer than the folder's context: the server's 400 is
    shown, and the next question goes without them (the reference's reply to it alone)."""
    url, folder = vision_server
    expected = image_reply(folder, None)
    open_vision_page(browser, url)
    for k in range(4):
        paste(browser, gradient(1000, 1000, k % 3), f"big{k}.png")
        wait_for(lambda k=k: len(attachments(browser)) == k + 1, what="the thumbnail")
    ask(browser, IMAGE_QUESTION)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="the 400")
    assert reply["outcome"] == "error"
    assert "context" in reply["stats"] and "left out of the conversation" in reply["stats"]
    ask(browser, IMAGE_QUESTION)
    wait_for(lambda: len(browser.find_elements("css selector", ".message.assistant")) == 2)
    reply = wait_for(lambda: (r := last_reply(browser)) and r["outcome"] and r, what="a reply")
    assert reply["outcome"] == "done", reply["stats"]
    assert words(reply["text"]) == words(expected)


VISION_TAGS = {
    "phi3v": "<|image_1|>\n",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "gemma3": "<start_of_image>",
}


def reference_takes_images(folder, tag: str | None) -> bool:
    """Whether the reference's multimodal processor for ``folder`` makes pixel values from an
    image (``tag``: the prompt's image tag for its kind; None: no vision kind to try)."""
    model = og.Model(str(folder))
    try:
        processor = model.create_multimodal_processor()
    except Exception:  # a text model has no processor
        return False
    if tag is None:
        return False
    inputs = processor(tag + "hi", images=og.Images.open_bytes(gradient(40, 50, 0)))
    return "pixel_values" in set(inputs.keys())


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3", "text", "whisper"])
def test_the_page_is_told_whether_the_model_takes_images(kind, tmp_path, fixture_folders):
    """/webui/config.json's ``accepts_images`` is what the model's processor can do (the
    reference's on the same folder), and the limits are the server's."""
    from fastapi.testclient import TestClient  # lazy: the serve extra

    import genai
    from genai.serve.app import ServeEngine, create_app
    from genai.testing import vision
    from genai.testing.whisper import write_whisper_fixture

    if kind == "text":
        folder = fixture_folders["gqa"]
    elif kind == "whisper":
        folder = write_whisper_fixture(tmp_path)
    else:
        folder = getattr(vision, f"write_{kind}")(tmp_path)
    expected = reference_takes_images(folder, VISION_TAGS.get(kind))
    assert expected is (kind in VISION_TAGS)
    model = genai.Model(str(folder))
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=2)
    assert engine.accepts_images is expected
    app = create_app(engine, manage_engine=False, max_body_bytes=123456)
    config = TestClient(app).get("/webui/config.json").json()
    assert config["accepts_images"] is expected
    assert config["max_body_bytes"] == 123456
    assert config["max_images"] == 16 and config["max_image_bytes"] == 20 << 20
