"""What a page of the built book must not show, checked in a live browser (used by test_browser.py).

`page_findings(driver)` runs one script in the loaded page and returns, per check, what it found
(empty lists when the page is clean). `problems(name, findings)` turns those into one line
per failed check. The checks (the book reads like a diagnosis, offline, from disk):

  stderr        stderr streams and tracebacks of the executed notebook
  raw_output    print() output and plain-text reprs (`Name: x, dtype: float64`): not prose
  code_cell     a visible code cell (they are all removed; none is allowed)
  wide_table    a table whose box (its scroll container, else the table) is wider than the article
  missing_value NaN / None / NaT / <NA> in a table cell (the tables print "—")
  abs_path      /work/, /root/, /home/ or /tmp/ in the page's text
  image         an image that did not load
  link          a local link to a file that does not exist, or to an anchor that is not there
  console       a SEVERE entry in the browser console
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

CHECKS = ("stderr", "raw_output", "code_cell", "wide_table", "missing_value", "abs_path", "image",
          "link", "console")
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/-])/(?:work|root|home|tmp)/[^\s'\"<>)]*")
MISSING_VALUE = re.compile(r"\b(?:NaN|nan|None|NaT)\b|<NA>")
MAX_SHOWN = 3            # examples per check and page in the failure message

# One pass over the page. Closed <details> are opened first so that what they hold is checked too
# (the caller takes its screenshot before). Visible = rendered (has client rects, not hidden).
PAGE_SCRIPT = r"""
const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
const snippet = el => (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 160);
document.querySelectorAll('details').forEach(d => { d.open = true; });
const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
const articleBox = article.getBoundingClientRect();
const scrollBox = el => {
  for (let node = el; node && node !== article; node = node.parentElement) {
    const overflow = getComputedStyle(node).overflowX;
    if (overflow === 'auto' || overflow === 'scroll') return node;
  }
  return el;
};
const wide = [];
document.querySelectorAll('article table').forEach(table => {
  if (!visible(table)) return;
  const box = scrollBox(table).getBoundingClientRect();
  if (box.right > articleBox.right + 1 || box.width > articleBox.width + 1) {
    wide.push({table: snippet(table.querySelector('caption') || table.querySelector('tr') || table),
               width: Math.round(box.width), article: Math.round(articleBox.width)});
  }
});
return {
  stderr: Array.from(document.querySelectorAll('.output.stderr, .output.traceback, .output.error'))
    .map(snippet),
  raw_output: Array.from(document.querySelectorAll('.cell_output .output.stream:not(.stderr), .cell_output .output.text_plain'))
    .filter(visible).map(snippet),
  code_cell: Array.from(document.querySelectorAll('.cell_input, .cell > .highlight')).filter(visible).map(snippet),
  wide_table: wide,
  cells: Array.from(document.querySelectorAll('article td, article th')).map(c => c.textContent.trim()),
  text: article.innerText + '\n' + Array.from(document.querySelectorAll('.bd-sidebar-primary, header, footer'))
    .map(el => el.innerText).join('\n'),
  images: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)
    .map(i => i.getAttribute('src')),
  hrefs: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
};
"""


def page_findings(driver) -> dict[str, list]:
    """Every check's findings on the page the driver has loaded (console: entries since the last read)."""
    raw = driver.execute_script(PAGE_SCRIPT)
    return {
        "stderr": raw["stderr"],
        "raw_output": raw["raw_output"],
        "code_cell": raw["code_cell"],
        "wide_table": [f"{t['width']} px box in a {t['article']} px article: {t['table']!r}" for t in raw["wide_table"]],
        "missing_value": sorted({cell for cell in raw["cells"] if MISSING_VALUE.search(cell)}),
        "abs_path": sorted(set(ABSOLUTE_PATH.findall(raw["text"]))),
        "image": [src or "(no src)" for src in raw["images"]],
        "link": broken_local_links(raw["hrefs"]),
        "console": [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"],
    }


def broken_local_links(hrefs: list[str]) -> list[str]:
    """file:// hrefs whose file is missing, or whose #anchor is no id/name in that file."""
    broken, texts = [], {}
    for href in dict.fromkeys(hrefs):
        target, anchor = urldefrag(href)
        url = urlparse(target)
        if url.scheme != "file" or not url.path:
            continue
        path = Path(unquote(url.path))
        if not path.exists():
            broken.append(href)
        elif anchor and path.suffix == ".html":
            if path not in texts:
                texts[path] = path.read_text(errors="replace")
            if not re.search(rf'''(?:id|name)=["']{re.escape(unquote(anchor))}["']''', texts[path]):
                broken.append(href)
    return broken


def problems(name: str, findings: dict[str, list]) -> dict[str, str]:
    """{check: one line} for each failed check of one page: `page: check: n found, e.g. ...`."""
    lines = {}
    for check in CHECKS:
        found = findings.get(check) or []
        if found:
            examples = " | ".join(str(item) for item in found[:MAX_SHOWN])
            lines[check] = f"{name}: {check}: {len(found)} found, e.g. {examples}"
    return lines
