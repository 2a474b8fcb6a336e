"""Take docs/webui.png: `genai serve` on the default model, the chat page in Debian's headless
Chromium (Selenium + chromedriver), two greedy questions (the second answered with a list).
With ``--image FILE`` (and a vision-language ``--model``) the first question goes with that
image, picked through the page's image button.

    python scripts/webui_screenshot.py [--out docs/webui.png] [--model DIR] [--image FILE]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from genai.serve.server import free_port

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "List three facts about Paris.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "webui.png"))
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--image", help="a PNG or JPEG sent with the first question")
    args = parser.parse_args()
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "genai",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if args.model:
        command += ["-m", args.model]
    server = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1100,820")
    driver = None
    try:
        for _ in range(600):
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        driver.get(url + "/")
        time.sleep(1)
        run = driver.execute_script
        run("document.getElementById('toggle-settings').click();")
        run("document.getElementById('system').value = 'Answer briefly.';")
        run("document.getElementById('temperature').value = '0';")
        run("document.getElementById('max_tokens').value = '80';")
        run("document.getElementById('repetition_penalty').value = '1.1';")
        for number, question in enumerate(QUESTIONS, 1):
            if args.image and number == 1:
                picker = driver.find_element("id", "image-input")
                picker.send_keys(str(Path(args.image).resolve()))
                time.sleep(0.5)
            run("document.getElementById('prompt').value = arguments[0];", question)
            run("document.getElementById('composer').requestSubmit();")
            for _ in range(1200):
                done = run(
                    "const b = document.querySelectorAll('.message.assistant');"
                    "return b.length === arguments[0] && b[b.length - 1].dataset.outcome;",
                    number,
                )
                if done:
                    break
                time.sleep(0.1)
        run("document.getElementById('chat').scrollTop = 0;")
        driver.save_screenshot(args.out)
        print(args.out)
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
