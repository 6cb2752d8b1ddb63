"""Open a page in headless Chromium over the DevTools protocol (``--remote-debugging-pipe``, stdlib only).

Collects what the browser reports as errors -- uncaught exceptions, ``console.error``/``assert``, and
log entries of level ``error`` (failed loads, blocked requests) -- and takes a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def find_chromium() -> str | None:
    """``$RLGRAD_CHROMIUM`` if set, else the first Chromium-family browser on PATH."""
    if os.environ.get("RLGRAD_CHROMIUM"):
        return os.environ["RLGRAD_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


def chromium_or_skip() -> str:
    """The browser for a test that opens a page, or skip that test saying what it needs. Nothing installs a
    browser for the tests (scripts/setup.sh installs no system package): install one to run them."""
    import pytest

    path = find_chromium()
    if path is None:
        pytest.skip("needs headless Chromium, not found (chromium, chromium-browser, google-chrome on PATH): "
                    "install it, e.g. `sudo apt-get install chromium`, or point RLGRAD_CHROMIUM at a Chrome binary")
    return path


class _Pipe:
    def __init__(self, proc: subprocess.Popen, w: int, r: int):
        self.proc, self.w, self.r, self.buf, self.next_id = proc, w, r, b"", 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m


def open_page(chromium: str, url: str, screenshot: Path, width: int = 1280, height: int = 1600,
              settle_s: float = 0.5) -> list[str]:
    """Load ``url``, save a PNG screenshot, return the error messages the page produced."""
    cmd_r, cmd_w = os.pipe()  # we write commands -> chromium reads fd 3
    res_r, res_w = os.pipe()  # chromium writes fd 4 -> we read

    def child_fds():  # runs in the child before exec; go through high numbers so no end clobbers another
        os.dup2(cmd_r, 110)
        os.dup2(res_w, 111)
        os.dup2(110, 3)
        os.dup2(111, 4)

    profile = tempfile.mkdtemp(prefix="rlgrad-chromium-")
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
         f"--user-data-dir={profile}", f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"],
        pass_fds=(3, 4), preexec_fn=child_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(cmd_r)
    os.close(res_w)
    pipe = _Pipe(proc, cmd_w, res_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            pipe.call(domain, session=sid)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        pipe.call("Page.navigate", {"url": url}, session=sid)
        pipe.wait_event("Page.loadEventFired")
        time.sleep(settle_s)  # late errors (timers) surface as events before the screenshot call returns
        shot = pipe.call("Page.captureScreenshot", {"format": "png"}, session=sid)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for e in pipe.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
        try:
            pipe.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
        return errors
    finally:
        os.close(cmd_w)
        os.close(res_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
