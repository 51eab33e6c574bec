"""The built documentation site, opened in a real headless browser (Debian's ``chromium``).

Builds nothing: it opens what ``python -m sphinx -W --keep-going -b html docs
docs/_build/html`` built (``.ci/run`` builds it first) and, for the home page, the API
reference and one executed lesson, checks that

* the screenshot is a real picture (a PNG of the asked size, not blank: many distinct
  colours, a fair share of non-background pixels);
* the page the browser rendered (its DOM after scripts ran) has the page's title and body and
  no error text: no Python traceback, no notebook error output, no docutils system message;
* the browser's console logged no error, and nothing was fetched from the network (every
  host name resolves to nowhere, so a CDN script or font would log a failed load).

Without ``chromium`` or the built site the test skips with the reason; with ``REFBRAID_CI=1``
(set by ``.ci/run``) it fails instead. Screenshots: ``docs/_build/screenshots/``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "docs" / "_build" / "html"
SHOTS = ROOT / "docs" / "_build" / "screenshots"
WINDOW = (1280, 1400)  # width, height of every screenshot in CSS pixels
BROWSER_TIMEOUT = 120  # seconds per page; a page that loads here takes a few
IN_CI = os.environ.get("REFBRAID_CI") == "1"

#: page → (file under the site, text its rendered DOM must contain)
PAGES = {
    "home": ("index.html", "Layer-parallel training of deep networks with MGRIT"),
    "api": ("api.html", "API reference"),
    "lesson": ("course/05_layer_parallel_training.html", "Lesson 05"),
}

#: Text that means a page shows an error instead of its content.
ERROR_TEXT = [
    "Traceback (most recent call last)",
    "CellExecutionError",
    "ModuleNotFoundError",
    'class="system-message"',  # docutils: a directive or role that failed
    'class="output traceback',  # MyST-NB: a cell's error output
    "404 Not Found",
]

pytestmark = pytest.mark.docs


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (REFBRAID_CI=1: the documentation test must run in CI)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _unavailable("Debian's `chromium` is not installed (apt-get install -y chromium)")
    if not (SITE / "index.html").is_file():
        _unavailable(f"no built site at {SITE}: run "
                     "`python -m sphinx -W --keep-going -b html docs docs/_build/html`")
    SHOTS.mkdir(parents=True, exist_ok=True)
    return path


def _chromium(browser: str, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with no network, a throw-away profile and console logging."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--hide-scrollbars",
           "--host-resolver-rules=MAP * ~NOTFOUND",  # any network fetch fails, and says so
           f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT,
                          check=False)


def _console_errors(stderr: str) -> list[str]:
    """Console messages at error level, and failed loads, from Chromium's log on stderr."""
    errors = []
    for line in stderr.splitlines():
        console = "CONSOLE" in line and ("ERROR" in line.split("CONSOLE")[0]
                                         or "Uncaught" in line)
        failed_load = "Failed to load resource" in line or "net::ERR_" in line
        if console or failed_load:
            errors.append(line.strip())
    return errors


def _check_png(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", f"{path.name} is a {image.format}, not a PNG"
        assert image.size[0] >= WINDOW[0] // 2 and image.size[1] >= WINDOW[1] // 2, (
            f"{path.name}: {image.size} is smaller than the window {WINDOW}")
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    flat = pixels.reshape(-1, 3)
    background = np.median(flat, axis=0)
    share = float(np.mean(np.abs(flat - background).sum(axis=1) > 30))
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    assert share > 0.01, f"{path.name} is blank: {share:.2%} of pixels differ from background"
    assert colours > 50, f"{path.name} has only {colours} colours: not a rendered page"


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_in_headless_chromium(name, browser, tmp_path):
    relative, must_contain = PAGES[name]
    page = SITE / relative
    if not page.is_file():
        pytest.fail(f"the built site has no {relative}")
    url = page.as_uri()
    shot = SHOTS / f"{name}.png"
    shot.unlink(missing_ok=True)

    taken = _chromium(browser, f"--screenshot={shot}", url, tmp=tmp_path)
    assert shot.is_file(), f"chromium wrote no screenshot of {relative}:\n{taken.stderr[-3000:]}"
    _check_png(shot)

    dom = _chromium(browser, "--dump-dom", url, tmp=tmp_path)
    assert dom.returncode == 0, f"chromium --dump-dom failed:\n{dom.stderr[-3000:]}"
    html = dom.stdout
    assert must_contain in html, f"{relative}: the rendered page lacks {must_contain!r}"
    shown = [text for text in ERROR_TEXT if text in html]
    assert not shown, f"{relative} shows error text: {shown}"
    errors = _console_errors(taken.stderr + dom.stderr)
    assert not errors, f"{relative}: the browser logged errors:\n" + "\n".join(errors)


def test_the_site_needs_nothing_from_the_network(browser):
    """Built offline, read offline: no script, style sheet, font or image from a URL."""
    remote = re.compile(r"""<(script|link|img)\b[^>]*\b(src|href)=["'](https?:)?//""", re.I)
    offenders = {}
    for page in SITE.rglob("*.html"):
        found = remote.findall(page.read_text(encoding="utf-8", errors="replace"))
        if found:
            offenders[str(page.relative_to(SITE))] = len(found)
    assert not offenders, f"pages that load remote resources: {offenders}"
