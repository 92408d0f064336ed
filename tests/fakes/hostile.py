"""A hostile run folder and the checks that nothing in it became live markup.

`HOSTILE` holds strings a run folder somebody sent you could carry in any text field: HTML that
runs script, a `javascript:` link, MyST roles and directives, backticks, line breaks, mathtext,
attribute break-outs and a 10 kB string. `hostile_run()` copies a real (GPU) run folder and puts
them into every text field of its rows, its telemetry and its run.json, and into its folder name.

`live_markup(html)` lists what in an HTML fragment could run or load something: any tag fp4lab
never emits, any `on...` attribute, a `javascript:` URL, an image not embedded as PNG data.
`payload_markup(html)` is the check for a whole built page (whose theme has scripts of its own):
only markup carrying the payloads' `alert(1)` counts. `shown(page)` is what a notebook displays
for each section of a chapter page, as the kernel would send it to myst-nb.
"""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

HOSTILE = [
    "<svg onload=alert(1)>",
    "<img src=x onerror=alert(1)>",
    "</table><script>alert(1)</script>",
    "[x](javascript:alert(1))",
    "<a href='javascript:alert(1)'>x</a>",
    "{raw}`<b onmouseover=alert(1)>x</b>`",
    "```{raw} html\n<script>alert(1)</script>\n```",
    ":::{raw} html\n<svg onload=alert(1)>\n:::",
    "`` `<script>alert(1)</script>` ``",
    "line one\nline two\r\n<script>alert(1)</script>",
    "$\\frac{<svg onload=alert(1)>}$",
    "\" onmouseover=\"alert(1)",
    "' onfocus='alert(1)' autofocus='",
    "**bold** | a | b |\n|---|---|\n| <script>alert(1)</script> |",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "x" * 10_000 + "<svg onload=alert(1)>",
]
# the columns whose words the analysis computes with (a hostile value there skips the row)
VOCABULARY = {"status", "fmt", "weight_dtype", "act_dtype", "math_dtype", "device", "preset", "gemm",
              "kind", "routing"}
# names the analysis looks for (its baselines): kept so the pages compute every comparison
BASELINES = {"torch-bf16", "loop-bf16", "dense-bf16", "grouped-bf16"}
FOLDER_NAME = "20261130T092010Z-<svg onload=alert(1)>"


def hostile_run(source: Path, dest_root: Path, everything: bool = False, name: str = FOLDER_NAME) -> Path:
    """A copy of the run folder `source` under `dest_root/name` with HOSTILE strings in every
    text field of its gemm, anatomy, moe and comm rows (every one with `everything`; else all but the
    vocabulary columns and the baseline names), its telemetry and its run.json."""
    import pandas as pd

    from fp4lab import schema
    from fp4lab.results import dumps

    dest = dest_root / name
    dest.mkdir(parents=True)
    shutil.copy2(source / "run.json", dest / "run.json")
    strings = _cycle()
    names: dict[str, str] = {}
    for table in ("gemm", "anatomy", "moe", "comm"):
        if not (source / f"{table}.jsonl").exists():
            continue
        text_columns = [c.name for c in schema.TABLES[table].columns if c.dtype == "str"]
        rows = [json.loads(line) for line in (source / f"{table}.jsonl").read_text().splitlines()]
        for row in rows:
            for column in text_columns:
                if not everything and (column in VOCABULARY or row.get(column) in BASELINES):
                    continue
                if column in ("backend", "method", "library", "gemm_backend") and row.get(column):
                    row[column] = names.setdefault(row[column], f"{HOSTILE[len(names) % len(HOSTILE)]} #{len(names)}")
                else:
                    row[column] = next(strings)
        (dest / f"{table}.jsonl").write_text("".join(dumps(row) + "\n" for row in rows))
    if (source / "telemetry.parquet").exists():
        telemetry = pd.read_parquet(source / "telemetry.parquet").iloc[::5].reset_index(drop=True)
        telemetry["throttle_reasons"] = [next(strings) for _ in range(len(telemetry))]
        telemetry.to_parquet(dest / "telemetry.parquet", index=False)
    info = json.loads((dest / "run.json").read_text())
    device = info.setdefault("provenance", {}).setdefault("device", {})
    for key in ("name", "driver", "cuda_version", "label", "cpu_model"):
        device[key] = next(strings)
    provenance = info["provenance"]
    provenance["versions"] = {package: next(strings) for package in provenance.get("versions") or {"torch": ""}}
    provenance.update(fp4lab_git_sha=next(strings), command=next(strings), host=next(strings))
    info.setdefault("report", {})["profile"] = next(strings)
    ceilings = (info.get("sweep") or {}).get("ceilings") or {}
    for source_name in ("measured", "spec"):
        if isinstance(ceilings.get(source_name), dict):
            ceilings[source_name]["device"] = next(strings)
            ceilings[source_name]["details"] = {"bandwidth": next(strings), "launch": next(strings)}
    (dest / "run.json").write_text(json.dumps(info))
    return dest


def _cycle():
    while True:
        yield from HOSTILE


# -- what counts as live --------------------------------------------------------------------------

TAGS = {"div", "p", "b", "i", "em", "strong", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th",
        "td", "caption", "details", "summary", "h1", "h2", "h3", "h4", "code", "pre", "span", "br", "hr",
        "a", "img", "html", "head", "body", "meta", "title", "blockquote"}
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href"}


class _Findings(HTMLParser):
    def __init__(self, strict: bool):
        super().__init__(convert_charrefs=True)
        self.strict, self.found, self._open_script = strict, [], False

    def handle_starttag(self, tag, attrs):
        carries = any("alert(1)" in (value or "") for _, value in attrs)
        if self.strict and tag not in TAGS:
            self.found.append(f"<{tag}> element")
        elif not self.strict and tag in ("svg", "img", "iframe", "object", "embed") and carries:
            self.found.append(f"<{tag}> element carrying the payload")
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on") and (self.strict or "alert(1)" in value):
                self.found.append(f"<{tag} {name}=...> handler")
            if name in URL_ATTRIBUTES and re.sub(r"\s", "", value).startswith(("javascript:", "vbscript:")):
                self.found.append(f"<{tag} {name}='{value[:30]}'> script URL")
            if self.strict and tag == "img" and name == "src" and not value.startswith("data:image/png;base64,"):
                self.found.append(f"<img src='{value[:30]}'> loads from outside")
        self._open_script = tag == "script"

    def handle_data(self, data):
        if self._open_script and "alert(1)" in data:
            self.found.append("<script> holding the payload")

    def handle_endtag(self, tag):
        self._open_script = False


def live_markup(html: str) -> list[str]:
    """Everything in an HTML fragment fp4lab wrote that could run or load something."""
    parser = _Findings(strict=True)
    parser.feed(html)
    parser.close()
    return parser.found


def payload_markup(html: str) -> list[str]:
    """The payloads of HOSTILE that became markup in a whole page (a theme's own scripts pass)."""
    parser = _Findings(strict=False)
    parser.feed(html)
    parser.close()
    return parser.found


def unescaped_myst(markdown: str) -> list[str]:
    """MyST roles and directives in Markdown (`{name}` not escaped as `\\{name\\}`), outside
    code spans (whose content is literal)."""
    outside_code = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown, flags=re.S)
    return re.findall(r"(?<!\\)\{[A-Za-z][\w:-]*(?<!\\)\}", outside_code)


def markdown_html(markdown: str) -> str:
    """Markdown as myst-nb renders a text/markdown output: CommonMark, raw HTML passed through
    (its commonmark mode), so an unescaped tag would be live."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).render(markdown)


def raw_html_blocks(markdown: str) -> tuple[str, list[str]]:
    """(the Markdown without its ```{raw} html fences, the fences' HTML): a book page's raw
    HTML is passed through by Sphinx as it is."""
    blocks = re.findall(r"^```\{raw\} html\n(.*?)\n```$", markdown, flags=re.M | re.S)
    rest = re.sub(r"^```\{raw\} html\n.*?\n```$", "", markdown, flags=re.M | re.S)
    return rest, blocks


def shown(page, monkeypatch) -> list[tuple[str, str, str]]:
    """(section, mime type, content) of every output a notebook shows for `page`: each section
    through `page.show`, as the kernel hands it to myst-nb (Markdown, HTML, PNG)."""
    import IPython.display
    from IPython.core.formatters import format_display_data

    outputs: list[tuple[str, str, str]] = []
    current = {"section": ""}

    def display(*objects, **_):
        for obj in objects:
            data, _ = format_display_data(obj)
            for mime in ("text/markdown", "text/html", "image/png"):
                if mime in data:
                    outputs.append((current["section"], mime, data[mime]))
                    break

    monkeypatch.setattr(IPython.display, "display", display)
    for section in ["banner", *page.sections, "notes"]:
        current["section"] = section
        page.show(section)
    return outputs


def output_problems(outputs: list[tuple[str, str, str]]) -> list[str]:
    """Live markup in a page's outputs, each named by its section."""
    problems = []
    for section, mime, content in outputs:
        if mime == "text/markdown":
            found = live_markup(markdown_html(content)) + unescaped_myst(content)
        elif mime == "text/html":
            found = live_markup(content)
        else:
            found = []
        problems += [f"{section} ({mime}): {item}" for item in found]
    return problems


def notebook_of(outputs: list[tuple[str, str, str]], title: str):
    """An executed-notebook stand-in: a heading cell, then one hidden code cell per output (what
    myst-nb renders from a notebook papermill executed)."""
    import nbformat

    book = nbformat.v4.new_notebook()
    book.cells.append(nbformat.v4.new_markdown_cell(f"# {title}"))
    for _, mime, content in outputs:
        cell = nbformat.v4.new_code_cell("page.show(...)", metadata={"tags": ["remove-input"]})
        data = {mime: content, "text/plain": "<output>"}
        cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
        book.cells.append(cell)
    return book
