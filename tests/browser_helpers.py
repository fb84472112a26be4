"""A real headless Chromium (Debian's `chromium`) for tests that look at pages as a reader does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

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
