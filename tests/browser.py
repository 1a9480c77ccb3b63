"""A headless Chromium driven over the W3C WebDriver protocol, for the tests of web pages.

Debian's `chromium` and `chromium-driver` (.ci/run installs them); the protocol is
plain JSON over HTTP to chromedriver, so no client library is needed. `Browser()`
skips the calling test, saying why, when either program is absent.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

WINDOW = (1280, 860)


def programs() -> tuple[str, str] | None:
    """(chromium, chromedriver) on PATH, or None."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


class Browser:
    """One headless Chromium window: `open(url)`, `run(script)`, `until(script)`, `png()`."""

    def __init__(self, window: tuple[int, int] = WINDOW):
        found = programs()
        if found is None:
            pytest.skip("needs Debian's chromium and chromium-driver (apt-get install them)")
        chromium, driver = found
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.profile = tempfile.TemporaryDirectory(prefix="lineage-chromium-")
        self.driver = subprocess.Popen(
            [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.session = None
        try:
            self._wait_ready()
            args = [
                "--headless=new",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--window-size={window[0]},{window[1]}",
                f"--user-data-dir={self.profile.name}",
            ]
            options = {"binary": chromium, "args": args}
            caps = {"browserName": "chrome", "goog:chromeOptions": options}
            reply = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
            self.session = reply["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, patience: float = 30.0) -> None:
        deadline = time.monotonic() + patience
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except OSError:
                pass
            if self.driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"webdriver {method} {path}: {error.read()[:500]!r}") from None

    def _session(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def run(self, script: str, *args):
        """The value of `script` (a function body: `return ...`) run in the page."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def until(self, script: str, *args, patience: float = 60.0):
        """The first truthy value of `script`, run every 0.2 s; AssertionError past
        `patience` seconds (a page that never shows it), with the last value."""
        deadline = time.monotonic() + patience
        while True:
            value = self.run(script, *args)
            if value:
                return value
            assert time.monotonic() < deadline, f"the page never showed it: {script} -> {value!r}"
            time.sleep(0.2)

    def png(self) -> bytes:
        return base64.b64decode(self._session("GET", "/screenshot"))

    def close(self) -> None:
        try:
            if self.session is not None:
                self._session("DELETE", "")
        except (OSError, RuntimeError):
            pass
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            self.profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
