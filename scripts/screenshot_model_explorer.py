"""A screenshot of ``circle-jax view`` (run by hand, never by CI): the bundled example in
Model Explorer with golden's gradient-norm overlay, taken by headless Chromium.

    pip install -e ".[explorer]"; apt-get install chromium
    python scripts/screenshot_model_explorer.py [-o docs/model_explorer_overlay.png]

It writes the example as a .circle file, computes golden's gradients on 16 digits (SGD,
categorical cross-entropy) and their per-operator overlay, starts ``circle-jax view`` on a
free port of 127.0.0.1 in a child process, opens the address it prints in headless Chromium
and, through the DevTools protocol on another loopback port (tornado's websocket client, a
Jupyter dependency), waits until the page has drawn the graph, then captures it; it stops
both. Outbound requests of the server (Model Explorer's version check) go to a closed
loopback port through the proxy variables. (``chromium --screenshot`` alone captures the
page before Model Explorer has laid the graph out.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import circle_jax as cj
from circle_jax.examples import branching_cnn, digits
from circle_jax.oracle import golden, golden_overlay, write_overlay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def devtools(port: int, path: str, method: str = "GET") -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


async def capture(port: int, url: str, wait_s: float) -> bytes:
    """Open ``url`` in the browser behind DevTools ``port``; once no "Processing graph"
    text is left (or after ``wait_s``) plus 3 s to draw, the page as PNG bytes."""
    from tornado.websocket import websocket_connect

    target = devtools(port, "/json/new?" + urllib.parse.quote(url, safe=""), "PUT")
    ws = await websocket_connect(target["webSocketDebuggerUrl"], max_message_size=1 << 28)
    calls = 0

    async def call(method: str, **params: object) -> dict:
        nonlocal calls
        calls += 1
        ws.write_message(json.dumps({"id": calls, "method": method, "params": params}))
        while True:
            msg = json.loads(await ws.read_message())
            if msg.get("id") == calls:
                return msg.get("result", {})

    deadline = time.monotonic() + wait_s
    busy = ("document.body.innerText.includes('Processing graph') "
            "|| !document.querySelector('canvas')")
    while time.monotonic() < deadline:
        await asyncio.sleep(2)
        if not (await call("Runtime.evaluate", expression=busy))["result"]["value"]:
            break
    await asyncio.sleep(3)
    shot = await call("Page.captureScreenshot", format="png")
    ws.close()
    return base64.b64decode(shot["data"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default=os.path.join(ROOT, "docs",
                                                          "model_explorer_overlay.png"))
    p.add_argument("--size", default="1400,900", help="window size W,H (default 1400,900)")
    p.add_argument("--wait_s", type=float, default=120,
                   help="the longest wait for the page to draw the graph (default 120)")
    args = p.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("E: Chromium not found (apt-get install chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "branching_cnn.circle")
        branching_cnn().save(model_path)
        model = cj.load(model_path, lowering="reference")
        x, y = digits()
        data = golden(model, [x[:16]], y[:16],
                      cj.TrainConfig(loss="cce", optimizer="sgd", learning_rate=0.1))
        overlay = os.path.join(tmp, "gradients.json")
        write_overlay(golden_overlay(data, model), overlay)
        port, closed = free_port(), f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "HTTP_PROXY": closed, "HTTPS_PROXY": closed,
               "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
        server = subprocess.Popen(
            [sys.executable, "-m", "circle_jax.cli", "view", model_path, "--overlay", overlay,
             "--port", str(port), "--no_browser"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            url = None
            deadline = time.monotonic() + 120
            while url is None and time.monotonic() < deadline and server.poll() is None:
                found = re.match(rf"http://127\.0\.0\.1:{port}/\S*", server.stdout.readline())
                url = found.group(0) if found else None
            if url is None:
                print("E: circle-jax view printed no address", file=sys.stderr)
                return 1
            png = shoot(browser, url, args.size, args.wait_s, env, tmp)
        finally:
            stop(server)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "wb") as f:
        f.write(png)
    print(f"wrote {args.output} ({os.path.getsize(args.output)} bytes)")
    return 0


def shoot(browser: str, url: str, size: str, wait_s: float, env: dict, tmp: str) -> bytes:
    """Headless Chromium with DevTools on a free loopback port: the page at ``url``."""
    port = free_port()
    chrome = subprocess.Popen(
        [browser, "--headless=new", "--no-sandbox", "--hide-scrollbars",
         "--enable-unsafe-swiftshader", "--use-angle=swiftshader", f"--window-size={size}",
         "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={port}",
         f"--user-data-dir={os.path.join(tmp, 'chromium')}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                devtools(port, "/json/version")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        return asyncio.run(capture(port, url, wait_s))
    finally:
        stop(chrome)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


if __name__ == "__main__":
    raise SystemExit(main())
