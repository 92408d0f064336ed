"""A chapter's page: named sections of prose, tables, figures and notes, built by the chapter
module and shown by the notebook one section per cell.

Pages read like a report: prose is Markdown whose data strings are escaped (fp4lab.text.md),
tables are escaped HTML (fp4lab.plots.tables), figures carry a provenance caption under them,
and a CPU smoke run carries a banner on every page saying what it is. Warnings raised while the
chapter ran are collected into a note at the end instead of landing on the page as stderr.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from fp4lab import text

SMOKE_BANNER = ("CPU smoke run: this page checks the pipeline on a CPU with tiny shapes. Its numbers "
                "describe that CPU, not a GPU; what a GPU measured is in the reference part of the book.")
EMPTY_SMOKE = ("Nothing here for a CPU smoke run: this section needs GPU measurements; the reference "
               "part of the book shows it for the GPU that measured it.")
EMPTY_RUN = "This run holds nothing for this section (the chapter's notes say why, where known)."
NOTE_STYLES = {"note": ("#eef4fb", "#3572b0"), "warning": ("#fff7e6", "#d48806"),
               "danger": ("#fdeded", "#c00"), "smoke": ("#f3f0fa", "#6a4fb3")}


def note_html(message: str, kind: str = "note", title: str = "", markdown: bool = False) -> str:
    """An admonition box (styled inline, so the share file needs no theme) around plain text
    (escaped here), or around inline Markdown whose data strings were escaped with text.md."""
    background, border = NOTE_STYLES[kind]
    body = text.markdown_to_html(message) if markdown else text.html(message)
    heading = f"<p style='margin:0 0 0.3em 0'><b>{text.html(title)}</b></p>" if title else ""
    return (f'<div class="fp4lab-{kind}" style="background:{background};border-left:5px solid {border};'
            f'padding:0.5em 1em;margin:0.6em 0">{heading}<p style="margin:0">{body}</p></div>')


@dataclass
class Block:
    kind: str            # "markdown" | "html" | "figure"
    payload: Any
    caption: str = ""


@dataclass
class Page:
    title: str
    smoke: bool = False
    sections: dict[str, list[Block]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def prose(self, section: str, markdown: str) -> None:
        self.sections.setdefault(section, []).append(Block("markdown", markdown))

    def bullets(self, section: str, lines: list[str]) -> None:
        if lines:
            self.prose(section, "\n".join(f"- {line}" for line in lines))

    def html(self, section: str, html: str) -> None:
        self.sections.setdefault(section, []).append(Block("html", html))

    def note(self, section: str, message: str, kind: str = "note", title: str = "") -> None:
        """A plain-text message (escaped here) in a box."""
        self.html(section, note_html(message, kind, title))

    def figure(self, section: str, fig, caption: str) -> None:
        self.sections.setdefault(section, []).append(Block("figure", fig, caption))

    def show(self, *sections: str) -> None:
        """Display sections in the notebook (one cell's output). When every content section asked
        for is empty, a line says so, so no heading stands over nothing."""
        from IPython.display import HTML, display

        for section in sections:
            self._show_one(section)
        content = [section for section in sections if section not in ("banner", "notes", "parameters")]
        if content and not any(self.sections.get(section) for section in content):
            display(HTML(f'<p class="fp4lab-empty" style="color:#666;font-style:italic">'
                         f"{text.html(EMPTY_SMOKE if self.smoke else EMPTY_RUN)}</p>"))

    def _show_one(self, section: str) -> None:
        from IPython.display import HTML, Image, Markdown, display

        if section == "banner":
            if self.smoke:
                display(HTML(note_html(SMOKE_BANNER, "smoke", "CPU smoke run")))
            return
        if section == "notes":
            self._show_notes(display, HTML)
            return
        for block in self.sections.get(section, []):
            if block.kind == "markdown":
                display(Markdown(block.payload))
            elif block.kind == "html":
                display(HTML(block.payload))
            else:
                display(Image(data=png(block.payload), format="png"))
                if block.caption:
                    display(HTML(f'<p class="fp4lab-caption" style="font-size:0.8em;color:#555;'
                                 f'margin-top:0">{text.html(block.caption)}</p>'))

    def _show_notes(self, display, HTML) -> None:
        if self.notes:
            items = "".join(f"<li>{text.html(note)}</li>" for note in dict.fromkeys(self.notes))
            display(HTML(f'<details class="fp4lab-notes"><summary>{len(set(self.notes))} notes from this '
                         f"run (warnings raised while the chapter ran)</summary><ul>{items}</ul></details>"))


FIGURE_TEXT_LIMIT = 160      # characters per line of any text in a figure (a label is a name)


def png(fig) -> bytes:
    """A figure rendered as PNG bytes (figures are not pyplot's: they show only where shown).
    Every text is drawn as the characters it holds: a backend named `$\\frac{` in a legend is
    data, never mathtext (which would fail to parse and take the page down); control characters
    become spaces and an absurdly long line is cut, so a 10 kB name cannot crowd the axes out."""
    import io

    import matplotlib
    from matplotlib.text import Text

    for artist in fig.findobj(Text):
        artist.set_parse_math(False)
        artist.set_text(figure_text(artist.get_text()))
    buffer = io.BytesIO()
    with matplotlib.rc_context({"text.parse_math": False}):     # tick labels are made while drawing
        fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def figure_text(value: str) -> str:
    lines = (" ".join(line.split()) for line in str(value).split("\n"))
    return "\n".join(line if len(line) <= FIGURE_TEXT_LIMIT else line[:FIGURE_TEXT_LIMIT - 1] + "…"
                     for line in lines)


class NoteCollector(logging.Handler):
    """fp4lab's log warnings and Python warnings go to the page's notes, not to stderr."""

    def __init__(self, page: Page):
        super().__init__(logging.WARNING)
        self.page = page

    def emit(self, record: logging.LogRecord) -> None:
        self.page.notes.append(record.getMessage())


def collect_warnings(page: Page) -> None:
    """Route warnings raised from here on in this process (a notebook kernel) to `page.notes`."""
    logger = logging.getLogger("fp4lab")
    logger.handlers = [h for h in logger.handlers if not isinstance(h, NoteCollector)]
    logger.addHandler(NoteCollector(page))
    logger.propagate = False

    def showwarning(message, category, filename, lineno, file=None, line=None):
        page.notes.append(f"{category.__name__}: {message}")

    warnings.showwarning = showwarning
