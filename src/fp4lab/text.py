"""Words and numbers as the book prints them: escaping of data strings, and number formats.

Every string that comes from data (a backend name in a row, an error message, a run id, a model
name, a parameter value) is escaped with `md()` before it enters Markdown, with `html()` before
it enters HTML, and with `printable()` before it reaches a terminal: a run folder somebody sent
you is data, never markup (a backend named `<img src=x onerror=...>` prints as those characters).

Numbers: `sig()` gives significant digits without exponents for everyday magnitudes, `us()` a
time with its unit (us below 1 ms, ms above), `pct()` a percentage, `count()` a count with its noun.
"""

from __future__ import annotations

import html as _html
import math
import re

MISSING = "—"
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$&])")


def md(value) -> str:
    """`value` as plain text inside Markdown: no emphasis, code, links, tables, HTML or math."""
    text = " ".join(str(value).split())              # no line breaks: a value is one line
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def markdown_to_html(markdown: str) -> str:
    """Inline Markdown (as `md()` escapes data in it) to HTML; raw HTML in it is not passed
    through, so escaped or not, a data string can never become live markup."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).renderInline(markdown)


def html(value) -> str:
    """`value` as plain text inside HTML (quotes escaped too: safe in attributes)."""
    return _html.escape(str(value), quote=True)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value) -> str:
    """`value` as a terminal may print it: control characters (an escape sequence in a run
    folder's device name could retitle, clear or write the clipboard of your terminal) shown as
    `\\x1b`, line breaks and tabs kept."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value))


_INSTALL_PREFIX = re.compile(r"(?:/[^\s'\"():]+)*/(?:site|dist)-packages/")


def package_relative(value) -> str:
    """A message with each installed file's path cut to the package's own (`.../site-packages/
    gemlite/x.py` -> `gemlite/x.py`): a compiler's or library's error names the file that failed
    without the machine's install paths."""
    return _INSTALL_PREFIX.sub("", str(value))


def code(value) -> str:
    """`value` as inline code in Markdown, whatever it holds (backticks, HTML: code is literal)."""
    text = " ".join(str(value).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def is_missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)                   # NaN and pandas NA
    except (TypeError, ValueError):
        return False


def sig(value, digits: int = 3) -> str:
    """`digits` significant digits, no exponent from 1e-4 to 1e9, integers kept whole:
    sig(0.00123) '0.00123', sig(1013.4) '1013', sig(2.0) '2.0' (digits 2), sig(None) '—'."""
    if is_missing(value):
        return MISSING
    value = float(value)
    if not math.isfinite(value):
        return MISSING
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= digits - 1:
        return f"{round(value):,}".replace(",", "")
    if magnitude < -4:
        return f"{value:.{digits - 1}e}"
    decimals = digits - 1 - magnitude
    return f"{value:.{decimals}f}"


def _without_shared_unit(first: str, second: str) -> str:
    """`first` without its unit where `second` ends in the same one ('1.76 ms', '2.06 ms' ->
    '1.76'; '65%' -> '65'; '1.05x' -> '1.05'); as it is where the units differ or there is none."""
    unit = re.search(r"[^\d.]*$", second).group()
    if unit and first.endswith(unit) and first[:-len(unit)][-1:].isdigit():
        return first[:-len(unit)]
    return first


def span(values, format_one) -> str:
    """The range of `values` as each end reads in `format_one`, the unit written once where both
    share it: '65-66%', '1.05-1.12x', '1.76-2.06 ms', '980 us-1.02 ms'; one value where both ends
    read the same."""
    low, high = format_one(min(values)), format_one(max(values))
    return low if low == high else f"{_without_shared_unit(low, high)}-{high}"


def percentile_spread(p20_us, p80_us) -> str:
    """A timed burst's samples between two percentiles, one wording for every page:
    '20th-80th percentiles 1.70-1.95 ms', or '20th and 80th percentiles both 1.61 ms' where both
    ends read the same (a bare '1.61 ms' after 'percentiles' reads as one percentile's value)."""
    low, high = us(p20_us), us(p80_us)
    if low == high:
        return f"20th and 80th percentiles both {high}"
    return f"20th-80th percentiles {span((p20_us, p80_us), us)}"


def us_change(before, after) -> str:
    """Two times as a change, the unit written once where both share it: '3.40 → 1.72 us',
    '1.74 ms → 980 us'."""
    return f"{_without_shared_unit(us(before), us(after))} → {us(after)}"


def us(value, digits: int = 3) -> str:
    """A time given in microseconds: '9.46 us', '1.28 ms', '—'."""
    if is_missing(value):
        return MISSING
    if abs(float(value)) >= 1000:
        return f"{sig(float(value) / 1000, digits)} ms"
    return f"{sig(value, digits)} us"


def signed_us(value) -> str:
    """"+0.15 ms" or "-12 us": what one step adds to the one before it."""
    return ("+" if value >= 0 else "-") + us(abs(value))


def pct(value, digits: int = 2) -> str:
    """A percentage given in percent: '43%', '0.12%', '—'."""
    if is_missing(value):
        return MISSING
    return f"{sig(value, digits)}%"


def ratio(value, digits: int = 2) -> str:
    """'2.1x', '0.84x'."""
    return MISSING if is_missing(value) else f"{sig(value, digits)}x"


def ratio_to_one(value) -> str:
    """A ratio read against 1 (a kernel's math against its loads): three digits near 1, where
    two would make 1.05 '1.1x' (a 5% margin read as 10%); two elsewhere ('0.64x', '1.5x')."""
    near = not is_missing(value) and 0.9 <= value <= 1.2
    return ratio(value, 3 if near else 2)


def count(number: int, noun: str, plural: str | None = None) -> str:
    """'1 run', '2 runs', '3 backends'."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def minute_utc(value) -> str:
    """An ISO time stamp as a reader scans it: '2026-12-01T12:06:00+00:00' -> '2026-12-01 12:06 UTC'
    (other offsets are converted); anything unreadable is shown as it is."""
    from datetime import datetime, timezone

    if is_missing(value):
        return MISSING
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M") + (" UTC" if when.tzinfo is not None else "")


def short_sha(value):
    """A commit hash as git prints it short: '56d9385c5bdb...-dirty' -> '56d9385-dirty'; anything
    that does not start with a hash is kept as it is."""
    if not isinstance(value, str):
        return value
    found = re.fullmatch(r"([0-9a-f]{7})[0-9a-f]{1,33}(\W.*)?", value, flags=re.S)
    return found.group(1) + (found.group(2) or "") if found else value


def upper_first(value: str) -> str:
    """'faster than x' -> 'Faster than x': a phrase made a sentence's start (the rest untouched)."""
    return value[:1].upper() + value[1:]


def join(items, last: str = "and") -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(item) for item in items]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {last} " + items[-1]


def as_fast(fast_us: float, slow_us: float, within: float = 0.05) -> str:
    """How `fast_us` compares with `slow_us`: '2.1x as fast as', 'about as fast as',
    '0.80x as fast as' (slower)."""
    speedup = slow_us / fast_us
    if abs(speedup - 1) <= within:
        return "about as fast as"
    return f"{sig(speedup, 2)}x as fast as"
