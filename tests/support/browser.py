"""A real browser for the console's tests: Playwright driving Debian's Chromium (never a
browser Playwright downloads), a fresh profile each time, and the console itself started
as `python -m submit console` on a free port."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import urllib.error
import urllib.request

from tests.support.common import ROOT, free_ports

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
DOC_IMAGES = os.path.join(ROOT, "docs", "images")


def skip_reason() -> str | None:
    if not os.path.exists(CHROMIUM):
        return "Debian's chromium is not installed (.ci/setup installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the test extra)"
    return None


def start_console(reaper, log_path, *argv: str, port: int | None = None) -> str:
    """`python -m submit console` on a free port (or `port`, and `argv`); its URL on
    127.0.0.1 once it answers (with a page, or a refusal when it asks for a token)."""
    port = port or free_ports(1)[0]
    with open(log_path, "wb") as log:
        proc = reaper.python("-m", "submit", "console", "--port", str(port), *argv,
                             cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=2).read()
            return url
        except urllib.error.HTTPError:  # it answers, and asks for its token
            return url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the console did not start: " + open(
                    log_path, errors="replace").read()[-2000:]) from None
            time.sleep(0.2)


@contextlib.contextmanager
def chromium(profile_dir, *extra_args: str):
    """A page in headless Chromium with a fresh profile (and `extra_args`, e.g.
    `--host-resolver-rules`); closed (every process) after."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True,
            args=[*CHROMIUM_ARGS, *extra_args],
            viewport={"width": 1280, "height": 900})
        try:
            yield context.new_page()
        finally:
            context.close()


def screenshot(page, tmp_path, name: str, element=None) -> str:
    """A full-page screenshot (or of one element, a locator) kept with the test's files,
    and its copy for the docs."""
    path = os.path.join(tmp_path, "screenshots", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if element is not None:
        element.screenshot(path=path)
    else:
        page.screenshot(path=path, full_page=True)
    if os.path.isdir(DOC_IMAGES) and os.environ.get("MLJOB_DOC_SCREENSHOTS"):
        shutil.copy(path, os.path.join(DOC_IMAGES, name))
    print(f"screenshot: {path}", file=sys.stderr)
    return path
