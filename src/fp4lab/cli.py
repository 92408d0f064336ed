"""`python -m fp4lab <command>`: the headless entry point.

Each command's arguments live in the module that owns the work (`add_cli(subparsers)`); this file
only assembles them and turns a bad argument into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command modules, imported lazily so `python -m fp4lab backends` does not pay for pandas etc.
COMMAND_MODULES = (
    "fp4lab.backends",
    "fp4lab.sweep",
    "fp4lab.moe.cli",
    "fp4lab.report",
    "fp4lab.results",
    "fp4lab.comm.cli",
)


from fp4lab.errors import UsageError  # noqa: F401 - re-exported for the command modules


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, no traceback
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fp4lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"fp4lab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fp4lab: interrupted", file=sys.stderr)
        return 130
