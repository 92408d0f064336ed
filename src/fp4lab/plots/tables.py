"""Tables as the book prints them: HTML with units in the headers, numbers with sensible digits,
no index column, missing values as "—", every cell escaped, and a box that scrolls sideways
instead of widening the page.

A table is declared as columns: `Col(source, header, format)`; the formats are those of
`fp4lab.text` (sig, us, pct, ratio, an integer, or plain text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

from fp4lab import text

BOX_STYLE = "overflow-x:auto;max-width:100%;margin:0.5em 0 1em 0"
TABLE_STYLE = "border-collapse:collapse;font-size:0.85em"
CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #ddd;vertical-align:top"
NUMBER_STYLE = "white-space:nowrap"
TEXT_STYLE = "white-space:normal;min-width:6em;max-width:36em"
HEADER_STYLE = "white-space:normal;min-width:4em;max-width:12em"


def integer(value) -> str:
    return text.MISSING if text.is_missing(value) else f"{int(round(float(value)))}"


def plain(value) -> str:
    """Text as a cell shows it; a library's error names its files without the install paths."""
    if text.is_missing(value):
        return text.MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return text.package_relative(value)


FORMATS: dict[str, Callable[[Any], str]] = {
    "text": plain, "int": integer, "sig": text.sig, "sig2": lambda v: text.sig(v, 2),
    "sig4": lambda v: text.sig(v, 4), "us": text.us, "pct": text.pct, "ratio": text.ratio,
    "share": lambda v: text.pct(None if v is None or v != v else 100 * v),   # a 0-1 fraction as %
}


@dataclass(frozen=True)
class Col:
    source: str                      # the frame's column
    header: str                      # what the reader sees, with its unit: "time (us)"
    format: str = "text"             # a key of FORMATS
    align: str = ""                  # "" = right for numbers, left for text


def html_table(frame: pd.DataFrame, columns: list[Col], caption: str = "", empty: str = "") -> str:
    """The frame's `columns` as an escaped HTML table in a scrolling box; `empty` (a sentence)
    when the frame has no rows."""
    if not len(frame):
        return f"<p><em>{text.html(empty or 'No rows.')}</em></p>"
    head = "".join(f'<th style="{CELL_STYLE};{HEADER_STYLE};text-align:{_align(c)}">{text.html(c.header)}</th>'
                   for c in columns)
    body = []
    for _, row in frame.iterrows():
        cells = "".join(
            f'<td style="{CELL_STYLE};{_wrap(c)};text-align:{_align(c)}">'
            f'{text.html(FORMATS[c.format](row.get(c.source)))}</td>' for c in columns)
        body.append(f"<tr>{cells}</tr>")
    caption_html = (f'<caption style="caption-side:bottom;text-align:left;font-size:0.8em;color:#555">'
                    f"{text.html(caption)}</caption>") if caption else ""
    return (f'<div class="fp4lab-table" style="{BOX_STYLE}"><table style="{TABLE_STYLE}">{caption_html}'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _wrap(column: Col) -> str:
    return TEXT_STYLE if column.format == "text" else NUMBER_STYLE


def _align(column: Col) -> str:
    if column.align:
        return column.align
    return "left" if column.format == "text" else "right"


def key_values(pairs: list[tuple[str, Any]], caption: str = "") -> str:
    """A two-column table of names and values (parameters, a device's readings)."""
    frame = pd.DataFrame([{"name": name, "value": plain(value)} for name, value in pairs])
    return html_table(frame, [Col("name", "name"), Col("value", "value")], caption)


def frame_columns(frame: pd.DataFrame) -> list[Col]:
    """Every column of `frame` as plain text, headed by its name (for tables built as shown)."""
    return [Col(str(name), str(name)) for name in frame.columns]
