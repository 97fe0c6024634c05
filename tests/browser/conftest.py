"""A headless Chromium for the page's tests, driven over ``--remote-debugging-pipe`` (CDP).

Why this driver: the page needs a real browser (layout, events, canvas), and Debian's ``chromium`` is
enough: Chromium speaks the DevTools protocol as NUL-separated JSON on file descriptors 3 (in) and 4 (out),
so sixty lines of standard library drive it. No Python package, no browser download (playwright's CDN is
not reachable here), no chromedriver whose version must match the browser's, no TCP port.

The browser is found as ``$GATEPOOL_CHROMIUM`` or the first of chromium, chromium-browser, google-chrome
on PATH; without one every test here skips with a one-line reason (``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

LAPTOP = (1366, 900)


def find_browser() -> tuple[str | None, str]:
    """(the browser's path, or None and why not)."""
    env = os.environ.get("GATEPOOL_CHROMIUM")
    if env:
        return (env, "") if Path(env).is_file() else (None, f"GATEPOOL_CHROMIUM={env} is not a file")
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name), ""
    return None, "no Chromium on PATH (apt-get install chromium, or set GATEPOOL_CHROMIUM)"


class CDPError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium and one page in it; ``send`` a CDP command, ``evaluate`` JavaScript."""

    def __init__(self, exe: str, profile: Path, log: Path) -> None:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # the child's fds 3 and 4 are dup2'd (inheritable) from close-on-exec copies ≥ 10, so no dup2
        # clobbers another; close_fds=False keeps them (Python's own fds are close-on-exec anyway)
        dup = fcntl.F_DUPFD_CLOEXEC
        hi_r, hi_w = fcntl.fcntl(to_chrome_r, dup, 10), fcntl.fcntl(from_chrome_w, dup, 10)

        def child_fds() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", f"--user-data-dir={profile}", "about:blank"]
        self._log = open(log, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     preexec_fn=child_fds, close_fds=False)
        for fd in (to_chrome_r, from_chrome_w, hi_r, hi_w):
            os.close(fd)
        self._out = os.fdopen(to_chrome_w, "wb", buffering=0)
        self._in = os.fdopen(from_chrome_r, "rb", buffering=0)
        self._id = 0
        self._replies: dict[int, queue.Queue] = {}
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = self._in.read(1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.append(msg)

    def send(self, method: str, params: dict | None = None, *, session: bool = True,
             timeout: float = 60) -> dict:
        with self._lock:
            self._id += 1
            mid, q = self._id, queue.Queue()
            self._replies[mid] = q
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self._out.write(json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            raise CDPError(f"{method}: no reply in {timeout} s") from None
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply["result"]

    def evaluate(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise CDPError(f"{expression[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, path: Path, size: tuple[int, int] = LAPTOP) -> None:
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.evaluate("document.body && document.body.dataset.ready === '1'"):
                    return
            except CDPError:
                pass  # the new document is not there yet
            time.sleep(0.05)
        raise CDPError(f"{path}: the page never set body[data-ready]")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the browser started."""
        out = []
        for e in list(self.events):
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(str(p.get("args")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(str(p["entry"].get("text")))
        return out

    def mouse(self, x: float, y: float, kind: str = "mouseMoved") -> None:
        params = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=1)
        self.send("Input.dispatchMouseEvent", params)

    def center(self, selector: str) -> tuple[float, float]:
        """Scroll ``selector`` into view; the viewport coordinates of its centre."""
        r = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                          "e.scrollIntoView({block: 'center'}); const b = e.getBoundingClientRect();"
                          "return [b.left + b.width / 2, b.top + b.height / 2]; })()")
        return r[0], r[1]

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe, why = find_browser()
    if exe is None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("chromium")
    b = Chromium(exe, tmp / "profile", tmp / "chromium.log")
    yield b
    b.close()
