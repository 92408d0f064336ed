"""The built book in headless Chromium: every page reads like a diagnosis, offline, from disk.

Run by `make browser-check` after `make report` (marker `browser`). For the front page and every
chapter of both parts (this run, the reference run) it takes a full-page screenshot into
screenshots/ and fails on what tests/book_checks.py lists (stderr, raw print output, visible code,
tables wider than the article, NaN/None cells, absolute paths, missing images, broken local links,
console errors); the front page's verdict box must be above the fold at 1400x900.

Outside `make browser-check` a missing Chromium or an unbuilt book skips; under it
(FP4LAB_BROWSER_REQUIRED=1) they fail, so the check cannot pass by not running.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

import book_checks

pytestmark = pytest.mark.browser

CHECKOUT = Path(__file__).resolve().parents[1]     # the book of this checkout, whichever fp4lab is imported
HTML_DIR = CHECKOUT / "book" / "_build" / "html"
SCREENSHOTS = CHECKOUT / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars")
FOLD = (1400, 900)                 # the screen the front page's verdict must fit on
MAX_SCREENSHOT_HEIGHT = 16000      # px: longer pages are cut there
REQUIRED = os.environ.get("FP4LAB_BROWSER_REQUIRED") == "1"

# Findings that are known, owned elsewhere and reported: {page: {check: why, and who fixes it}}.
# A listed finding that no longer occurs fails too, so an entry cannot outlive its fix.
KNOWN_ISSUES: dict[str, dict[str, str]] = {}


class KnownIssue(UserWarning):
    """A finding listed in KNOWN_ISSUES: shown in pytest's warnings summary on every run."""


def book_pages(html_dir: Path = HTML_DIR) -> list[str]:
    """The front page, then every chapter in toc order (read from the built navigation)."""
    front = html_dir / "intro.html"
    if not front.exists():
        return []
    links = re.findall(r'href="(chapters/[^"#]+\.html)"', front.read_text())
    return ["intro.html"] + list(dict.fromkeys(links))


def unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        unavailable(f"{CHROMIUM} or {CHROMEDRIVER} missing (make browser-check installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fp4lab-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS + (f"--window-size={FOLD[0]},{FOLD[1]}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def screenshots():
    """screenshots/, emptied of the last check's pictures."""
    SCREENSHOTS.mkdir(exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    return SCREENSHOTS


def set_viewport(driver, width: int, height: int) -> None:
    """The page's viewport exactly (a window size would include the browser's frame)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def open_page(driver, url: str, width: int, height: int) -> None:
    """Load url in a width x height viewport; the console log is drained first so that what is
    read after belongs to this page, and the images are given a moment to finish."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")
    set_viewport(driver, width, height)
    driver.get(url)
    WebDriverWait(driver, 10).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"))


def full_page_screenshot(driver, target: Path) -> None:
    """The whole page (the viewport grown to the document, up to the cap) as one PNG."""
    height = min(driver.execute_script("return document.documentElement.scrollHeight"), MAX_SCREENSHOT_HEIGHT)
    set_viewport(driver, FOLD[0], height)
    driver.execute_script("return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
    driver.save_screenshot(str(target))


@pytest.fixture(scope="module")
def book() -> list[str]:
    """The built book's pages (skipped, or failed under make browser-check, when there is none)."""
    pages = book_pages()
    if not pages:
        unavailable(f"no built book at {HTML_DIR}: run make report first")
    return pages


def test_the_book_is_built(book):
    assert len(book) > 1, "the front page links to no chapter"
    assert (HTML_DIR / "index.html").exists(), "index.html (the redirect to the front page) is missing"


def test_front_page_verdict_above_the_fold(book, browser, screenshots):
    """The diagnosis in 30 seconds: the verdict box, its numbers and levers (.fp4lab-glance) and
    the seed's table (.fp4lab-seed, on a GPU diagnosis) end above the fold of a 1400x900 screen."""
    open_page(browser, (HTML_DIR / "intro.html").as_uri(), *FOLD)
    browser.save_screenshot(str(screenshots / "intro_fold.png"))
    boxes = browser.execute_script(
        "const rect = b => { const r = b.getBoundingClientRect();"
        "                    return {top: r.top, bottom: r.bottom, smoke: b.classList.contains('fp4lab-smoke')}; };"
        "return {verdict: Array.from(document.querySelectorAll('.fp4lab-note, .fp4lab-smoke'))"
        "          .filter(b => /verdict/i.test(b.innerText)).map(rect),"
        "        glance: Array.from(document.querySelectorAll('.fp4lab-glance')).map(rect),"
        "        seed: Array.from(document.querySelectorAll('.fp4lab-seed')).map(rect)};")
    assert boxes["verdict"], "the front page has no verdict box (.fp4lab-note or .fp4lab-smoke saying 'Verdict')"
    if not boxes["verdict"][0]["smoke"]:
        assert boxes["glance"] and boxes["seed"], "a GPU verdict without its numbers and levers or the seed's table"
    for name, found in boxes.items():
        for box in found[:1]:
            assert 0 <= box["top"] and box["bottom"] <= FOLD[1], (
                f"the front page's {name} spans {box['top']:.0f}-{box['bottom']:.0f} px: not above the fold "
                f"of a {FOLD[0]}x{FOLD[1]} screen (see {screenshots / 'intro_fold.png'})")


@pytest.mark.parametrize("page", book_pages())
def test_page_is_clean(browser, screenshots, page):
    open_page(browser, (HTML_DIR / page).as_uri(), *FOLD)
    shot = screenshots / (page.removesuffix(".html").replace("/", "_") + ".png")
    full_page_screenshot(browser, shot)
    failed = book_checks.problems(page, book_checks.page_findings(browser))   # {check: line}
    known = KNOWN_ISSUES.get(page, {})
    for check in sorted(set(failed) & set(known)):
        warnings.warn(KnownIssue(f"{failed[check]} [{known[check]}]"), stacklevel=1)
    new = [line for check, line in failed.items() if check not in known]
    assert not new, f"screenshot {shot}\n" + "\n".join(new)
    fixed = sorted(set(known) - set(failed))
    assert not fixed, f"{page}: {', '.join(fixed)} no longer found: remove them from KNOWN_ISSUES"


# -- the checks bite: a page with every fault, and the same faults done right ---------------------

BAD_PAGE = """<!DOCTYPE html><html><body><main><article class="bd-article" style="width:600px">
<div class="cell"><div class="cell_input"><pre>import fp4lab</pre></div>
<div class="cell_output"><div class="output stderr"><pre>Warning: something</pre></div>
<div class="output stream"><pre>provenance written</pre></div></div></div>
<table style="width:1500px"><tr><td>NaN</td><td>None</td><td>1.5</td></tr></table>
<p>written to /tmp/fp4lab/run.json</p>
<img src="missing.png"><a href="nothere.html">gone</a><a href="#nowhere">nowhere</a>
<script>console.error("boom")</script></article></main></body></html>"""

GOOD_PAGE = """<!DOCTYPE html><html><body><main><article class="bd-article" style="width:600px">
<div id="here" style="overflow-x:auto;max-width:100%"><table style="width:1500px">
<tr><td>&mdash;</td><td>Nonetheless</td><td>https://example.org/tmp/x</td></tr></table></div>
<p>results/reference/run.json</p><a href="#here">here</a>
<div class="cell tag_remove-input"><div class="cell_output"><div class="output text_html"><p>prose</p></div></div></div>
</article></main></body></html>"""


def test_checks_find_every_fault(browser, tmp_path):
    (tmp_path / "bad.html").write_text(BAD_PAGE)
    open_page(browser, (tmp_path / "bad.html").as_uri(), 1000, 800)
    findings = book_checks.page_findings(browser)
    assert [check for check in book_checks.CHECKS if not findings[check]] == []
    assert findings["missing_value"] == ["NaN", "None"]
    assert findings["abs_path"] == ["/tmp/fp4lab/run.json"]
    assert sorted(Path(link).name for link in findings["link"]) == ["bad.html#nowhere", "nothere.html"]


def test_checks_pass_the_same_things_done_right(browser, tmp_path):
    (tmp_path / "good.html").write_text(GOOD_PAGE)
    open_page(browser, (tmp_path / "good.html").as_uri(), 1000, 800)
    assert book_checks.problems("good.html", book_checks.page_findings(browser)) == {}
