"""The built book in headless Chromium: every chapter opens from disk, images load, links resolve.

Run by `make browser-check` after `make report` (marker `browser`). Screenshots go to
screenshots/. Skipped when Chromium, chromedriver or the built book is absent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from fp4lab.results import REPO_ROOT

pytestmark = pytest.mark.browser

HTML_DIR = REPO_ROOT / "book" / "_build" / "html"
SCREENSHOTS = REPO_ROOT / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1600")


def book_pages() -> list[Path]:
    """The front page and every chapter, in toc order (read from the built navigation)."""
    import re

    index = HTML_DIR / "intro.html"
    links = re.findall(r'href="(chapters/[^"#]+\.html)"', index.read_text())
    return [index] + [HTML_DIR / link for link in dict.fromkeys(links)]


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium/chromedriver not installed (make browser-check installs them)")
    if not (HTML_DIR / "index.html").exists():
        pytest.skip("no built book: run make report first")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fp4lab-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS + (f"--user-data-dir={profile}",):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def broken_local_links(page: Path, hrefs: list[str]) -> list[str]:
    """hrefs to local files (file:// or relative) that do not exist on disk."""
    broken = []
    for href in hrefs:
        url = urlparse(urldefrag(href)[0])
        if url.scheme == "file" and url.path and not Path(unquote(url.path)).exists():
            broken.append(href)
    return broken


def test_every_chapter_renders_offline(browser):
    SCREENSHOTS.mkdir(exist_ok=True)
    pages = book_pages()
    assert len(pages) > 1, "the front page links to no chapter"
    problems = []
    for page in pages:
        browser.get(page.as_uri())
        name = page.relative_to(HTML_DIR).as_posix()
        browser.save_screenshot(str(SCREENSHOTS / (name.replace("/", "_") + ".png")))
        missing_images = browser.execute_script(
            "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
            ".map(i => i.getAttribute('src'))")
        hrefs = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
        severe = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        problems += [f"{name}: image not loaded: {src}" for src in missing_images]
        problems += [f"{name}: broken link: {href}" for href in broken_local_links(page, hrefs)]
        problems += [f"{name}: console error: {message}" for message in severe]
    assert not problems, "\n".join(problems)
