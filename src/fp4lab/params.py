"""One way to check a parameter, for the CLI, the chapters and the sweep configs alike.

Each `check_*` returns the value in its canonical type or raises `ParameterError` with one line
naming the parameter and the (truncated) value. Checks run before any work starts, so a typo costs
one line, never a half-written run folder.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from fp4lab.errors import ParameterError

SHOWN_LIMIT = 60
# run ids, labels and other names that become folder names: no separators, no line breaks
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut to SHOWN_LIMIT characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_LIMIT else text[:SHOWN_LIMIT - 3] + "..."


def fail(name: str, value: Any, expected: str) -> ParameterError:
    return ParameterError(f"{name}={shown(value)}: {expected}")


def check_int(name: str, value: Any, minimum: int | None = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise fail(name, value, "expected an integer")
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise fail(name, value, f"expected an integer {bounds}")
    return int(value)


def check_float(name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                strict_minimum: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(name, value, "expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise fail(name, value, "expected a finite number")
    if minimum is not None and (value <= minimum if strict_minimum else value < minimum):
        raise fail(name, value, f"expected a number {'>' if strict_minimum else '>='} {minimum:g}")
    if maximum is not None and value > maximum:
        raise fail(name, value, f"expected a number <= {maximum:g}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(name, value, "expected True or False")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise fail(name, value, f"expected one of {', '.join(choices)}")
    return value


def check_text(name: str, value: Any, allow_empty: bool = True, limit: int = 4096) -> str:
    """A free string (a path, a preset name): one line, not absurdly long."""
    if not isinstance(value, str):
        raise fail(name, value, "expected a string")
    if not allow_empty and not value.strip():
        raise fail(name, value, "expected a non-empty string")
    if "\n" in value or "\r" in value or "\x00" in value or len(value) > limit:
        raise fail(name, value, f"expected one line of at most {limit} characters")
    return value


def check_name(name: str, value: Any) -> str:
    """A name that becomes a folder (run ids): letters, digits, '.', '_', '-'; at most 128."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise fail(name, value, "use letters, digits, '.', '_' and '-' (at most 128, no newline)")
    return value


def _sequence(name: str, value: Any) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise fail(name, value, "expected a list")
    return list(value)


def check_int_list(name: str, value: Any, minimum: int = 1, allow_empty: bool = False) -> tuple[int, ...]:
    items = _sequence(name, value)
    if not items and not allow_empty:
        raise fail(name, value, "expected a non-empty list of integers")
    return tuple(check_int(f"{name}[{i}]", item, minimum) for i, item in enumerate(items))


def check_text_list(name: str, value: Any, choices: Iterable[str] | None = None,
                    allow_empty: bool = True) -> tuple[str, ...]:
    items = _sequence(name, value)
    if not items and not allow_empty:
        raise fail(name, value, "expected a non-empty list")
    if choices is not None:
        choices = tuple(choices)
        return tuple(check_choice(f"{name}[{i}]", item, choices) for i, item in enumerate(items))
    return tuple(check_text(f"{name}[{i}]", item, allow_empty=False) for i, item in enumerate(items))


def check_shapes(name: str, value: Any) -> tuple[tuple[int, int], ...]:
    """[[N, K], ...] of positive integers."""
    shapes = []
    for i, shape in enumerate(_sequence(name, value)):
        pair = _sequence(f"{name}[{i}]", shape)
        if len(pair) != 2:
            raise fail(f"{name}[{i}]", shape, "expected a pair [N, K]")
        shapes.append((check_int(f"{name}[{i}][0]", pair[0]), check_int(f"{name}[{i}][1]", pair[1])))
    return tuple(shapes)


def parse_int_list(name: str, text: str, minimum: int = 1) -> tuple[int, ...]:
    """'1,16,256' (the CLI's form) -> (1, 16, 256)."""
    parts = [part.strip() for part in check_text(name, text).split(",") if part.strip()]
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise fail(name, text, "expected a comma list of integers, e.g. 1,16,256") from None
    return check_int_list(name, values, minimum)


def parse_shapes(name: str, text: str) -> tuple[tuple[int, int], ...]:
    """'4096x6144,6144x2048' -> ((4096, 6144), (6144, 2048))."""
    shapes = []
    for part in filter(None, (p.strip() for p in check_text(name, text).split(","))):
        try:
            n, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise fail(name, part, "expected NxK, e.g. 4096x6144") from None
        shapes.append((n, k))
    return check_shapes(name, shapes)


def parse_text_list(text: str | None) -> tuple[str, ...]:
    """'a, b,c' -> ('a', 'b', 'c'); None or '' -> ()."""
    return tuple(part.strip() for part in text.split(",") if part.strip()) if text else ()
