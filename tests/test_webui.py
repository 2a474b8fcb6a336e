"""The chat page of `genai serve`, in a real browser: Debian's headless Chromium driven by
Selenium through Debian's chromedriver (nothing downloads a browser), against `genai serve` on
the real default model. CI installs both packages (.ci/run); elsewhere these tests skip
without them."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import time

import httpx
import pytest

from tests.conftest import ROOT, missing_in_ci
from tests.parity import greedy
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


def reference_reply(folder):
    """The reference engine's greedy reply to QUESTION on the same folder (chat template)."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": QUESTION}])
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    run = greedy(og, model, prompt, len(prompt) + NEW_TOKENS)
    return tokenizer.decode(run.sequences[0][len(prompt) :])


def greedy_settings(browser, max_tokens=NEW_TOKENS):
    set_field(browser, "temperature", 0)
    set_field(browser, "max_tokens", max_tokens)


def test_a_question_gets_a_streamed_answer(browser, default_model_path):
    expected = reference_reply(default_model_path)
    with serve_command(default_model_path) as (url, _):
        open_page(browser, url)
        wait_for(lambda: browser.find_element("id", "model").text, what="the model's id")
        assert browser.find_element("id", "model").text == default_model_path.name
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
        greedy_settings(browser, max_tokens=4000)
        set_field(browser, "repetition_penalty", 1.3)  # a long reply that does not loop back
        ask(browser, "Write a very long story about a dragon who learns to bake bread.")
        wait_for(lambda: len((last_reply(browser) or {}).get("text", "")) > 40, what="text")
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


def test_api_key_is_asked_for_and_required(browser, default_model_path):
    with serve_command(default_model_path, "--api-key", "sesame") as (url, _):
        assert httpx.get(url + "/v1/models").status_code == 401
        open_page(browser, url)
        dialog = browser.find_element("id", "key-dialog")
        wait_for(lambda: dialog.get_attribute("open") is not None, what="the key dialog")
        assert browser.find_element("id", "model").text == ""
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
]  # fmt: skip


def test_markdown_renderer_in_the_browser(browser, tmp_path):
    page = tmp_path / "md.html"
    page.write_text(f'<script src="{(WEBUI / "markdown.js").as_uri()}"></script>')
    browser.get(page.as_uri())
    for source, html in MARKDOWN_CASES:
        assert js(browser, "return window.GenaiMarkdown.render(arguments[0]);", source) == html


def test_the_page_files_are_package_data():
    """Every file the page serves is matched by the wheel's package-data patterns."""
    import tomllib  # Python 3.11+: a lazy import keeps 3.10 collecting the suite

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["genai"]
    files = [p.relative_to(ROOT / "genai").as_posix() for p in WEBUI.iterdir() if p.suffix != ".py"]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
