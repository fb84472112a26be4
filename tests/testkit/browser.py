"""A real headless Chromium (Debian's `chromium`) for tests that look at pages as a reader does."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.ports import free_port

INSTALL_HINT = "apt-get install -y chromium chromium-driver (.ci/run installs it)"


def chromium() -> str:
    """The browser's path; the test skips, saying how to install it, where there is none."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(f"no Chromium on this machine: {INSTALL_HINT}")
    return path


def _headless(url: str, *args: str, budget_ms: int, timeout_s: float) -> subprocess.CompletedProcess:
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        # Virtual time runs the page's scripts and requests until they settle or the budget ends.
        f"--virtual-time-budget={budget_ms}", "--run-all-compositor-stages-before-draw",
        "--window-size=1600,1000", *args, url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=True)


def dump_dom(url: str, budget_ms: int = 60_000, timeout_s: float = 240) -> str:
    return _headless(url, "--dump-dom", budget_ms=budget_ms, timeout_s=timeout_s).stdout


def screenshot(url: str, path: Path, budget_ms: int = 60_000, timeout_s: float = 240) -> Path:
    _headless(url, f"--screenshot={path}", budget_ms=budget_ms, timeout_s=timeout_s)
    assert path.read_bytes().startswith(b"\x89PNG")
    return path


class Browser:
    """A headless Chromium a test drives as a reader does (open, click, read), through
    chromedriver's WebDriver HTTP API (no client library); ``clicks`` counts the clicks."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver element reference key

    def __init__(self, log_path: Path):
        driver = shutil.which("chromedriver")
        if driver is None:
            pytest.skip(f"no chromedriver on this machine: {INSTALL_HINT}")
        self.port = free_port()
        self._log = log_path.open("w")
        self._driver = subprocess.Popen([driver, f"--port={self.port}"], stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.clicks = 0
        options = {"binary": chromium(), "args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000"]}
        deadline = time.monotonic() + 30
        while True:
            try:
                session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
                    "browserName": "chrome", "goog:chromeOptions": options}}})
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        self._session = f"/session/{session['sessionId']}"

    def _call(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise WebDriverError(json.loads(exc.read())["value"].get("message", "")) from None

    def open(self, url: str) -> None:
        self._call("POST", f"{self._session}/url", {"url": url})

    def find(self, xpath: str, timeout_s: float = 90) -> str:
        """The first element matching ``xpath`` that the page shows (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._call("POST", f"{self._session}/elements", {"using": "xpath", "value": xpath})
            for element in (f[self.ELEMENT] for f in found):
                with contextlib.suppress(WebDriverError):  # re-rendered meanwhile
                    if self._call("GET", f"{self._session}/element/{element}/displayed"):
                        return element
            if time.monotonic() > deadline:
                raise WebDriverError(f"no element shown for {xpath} in {timeout_s} s")
            time.sleep(0.5)

    def click(self, xpath: str, timeout_s: float = 90) -> None:
        """One click, as a reader makes it, on the element ``xpath`` names (waits until it can)."""
        deadline = time.monotonic() + timeout_s
        while True:
            element = self.find(xpath, timeout_s)
            try:
                self._call("POST", f"{self._session}/element/{element}/click", {})
                self.clicks += 1
                return
            except WebDriverError:  # covered by another element, or re-rendered: try again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def run(self, script: str, *args):
        return self._call("POST", f"{self._session}/execute/sync", {"script": script, "args": list(args)})

    def text(self) -> str:
        return self.run("return document.body.innerText")

    def url(self) -> str:
        return self._call("GET", f"{self._session}/url")

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self._call("GET", f"{self._session}/screenshot")))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call("DELETE", self._session)
        os.killpg(self._driver.pid, signal.SIGKILL)
        self._driver.wait(timeout=30)
        self._log.close()


class WebDriverError(RuntimeError):
    """chromedriver refused a command (no such element, element not interactable, ...)."""
