"""Headless Chromium for the tests that look at a page (roll-view): Debian's chromium (scripts/test.sh
installs it) driven by playwright's Python package through its executable_path, never playwright's own
browser download. Without chromium the test is skipped, except under CI=true, where it fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        reason = "no chromium on PATH (Debian: apt-get install chromium; scripts/test.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must run the browser test")
        pytest.skip(reason)
    return path


@contextlib.contextmanager
def served(run_dir: Path) -> Iterator[str]:
    """roll-view's server for run_dir on a free loopback port, in this process; yields its URL."""
    from roll_lite.viewer.server import serve

    server = serve(run_dir)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def page() -> Iterator:
    """A fresh page in headless chromium; a JavaScript error on it fails the test when it closes."""
    executable = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 720})
            tab.set_default_timeout(20_000)
            errors: list[str] = []
            tab.on("pageerror", lambda error: errors.append(str(error)))
            yield tab
            assert not errors, f"JavaScript errors on the page: {errors}"
        finally:
            browser.close()
