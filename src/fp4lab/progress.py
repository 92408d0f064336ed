"""Progress of long work, shown where a person watches it and never in a book page.

- From the CLI: a tqdm bar on stderr, with one fixed-width line per measured point above it.
- Inside a chapter run by `make report`: the report names a file in `FP4LAB_PROGRESS_FILE`; the
  kernel appends JSON lines there and the report draws them in its own terminal, so the executed
  notebook (the page) holds no progress output at all.
- Inside JupyterLab, run by hand: silent (the cell's result is what the reader wants).
"""

from __future__ import annotations

import json
import os
import sys

PROGRESS_ENV = "FP4LAB_PROGRESS_FILE"


def _in_kernel() -> bool:
    return "ipykernel" in sys.modules


class Progress:
    """`update(line)` after each unit of work; `close()` at the end (or use as a context)."""

    def __init__(self, total: int, desc: str, unit: str = "pt", header: str | None = None):
        self.total, self.desc, self.done = total, desc, 0
        self.bar = self.file = None
        target = os.environ.get(PROGRESS_ENV)
        if target:
            self.file = open(target, "a", buffering=1)
            self._emit(header)
        elif not _in_kernel():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                            leave=False)
            if header:
                self.bar.write(header, file=sys.stderr)

    def _emit(self, line: str | None) -> None:
        self.file.write(json.dumps({"desc": self.desc, "total": self.total, "done": self.done,
                                    "line": line}) + "\n")

    def update(self, line: str | None = None) -> None:
        self.done += 1
        if self.bar is not None:
            if line:
                self.bar.write(line, file=sys.stderr)
            self.bar.update(1)
        elif self.file is not None:
            self._emit(line)

    def note(self, line: str) -> None:
        """A line that is not a unit of work (a measured ceiling, a resumed run)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        elif self.file is not None:
            self._emit(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        self.bar = self.file = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
