"""Runs CLI cases in one process, as `python -m fp4lab ARGS` would, and reports each as JSON.

`python -m fakes.cli_driver < cases.json` (cwd: anywhere; the runs folder from FP4LAB_RUNS_DIR):
each case's argv goes to `fp4lab.cli.main`, exactly what `python -m fp4lab` calls; its exit
status, stderr and stdout are recorded, an exception escaping main() is recorded as the traceback
`python -m fp4lab` would have printed, and `changed` lists the files under the watched folders
that the case created, changed or removed (lock files hold no data and are not counted). One
process for every case: importing torch once instead of sixty times. A case still running after
CASE_LIMIT_S was not refused up front (it started work): it is stopped and recorded with that
reason, so one such case fails its own test instead of the whole table's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

LOCK_FILES = (".lock", ".run.json.lock")
CASE_LIMIT_S = 30


class CaseOutlivedItsLimit(BaseException):
    """Raised in a case that runs past CASE_LIMIT_S (a BaseException: no `except Exception` in
    the code under test swallows it)."""


def _stop_the_case(signum, frame):
    raise CaseOutlivedItsLimit(f"the case ran past {CASE_LIMIT_S} s: it was not refused before work")


def snapshot(roots: list[str]) -> dict[str, str]:
    files = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file() and path.name not in LOCK_FILES:
                files[str(path)] = hashlib.sha1(path.read_bytes()).hexdigest()
            elif path.is_dir():
                files[str(path) + "/"] = "folder"
    return files


def run_case(argv: list[str], watched: list[str]) -> dict:
    from fp4lab import cli

    before = snapshot(watched)
    logging.getLogger().handlers.clear()        # main() binds its log handler to this case's stderr
    out, err = io.StringIO(), io.StringIO()
    result = {"argv": argv, "traceback": None}
    previous = signal.signal(signal.SIGALRM, _stop_the_case)
    signal.alarm(CASE_LIMIT_S)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result["code"] = cli.main(argv)
        except SystemExit as exc:
            result["code"] = exc.code if isinstance(exc.code, int) else 1
        except BaseException:                   # what `python -m fp4lab` would print
            result["code"] = 1
            result["traceback"] = traceback.format_exc()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    after = snapshot(watched)
    result.update(stdout=out.getvalue(), stderr=err.getvalue(),
                  changed=sorted(set(before.items()) ^ set(after.items())))
    return result


def main() -> int:
    request = json.load(sys.stdin)
    results = [run_case(case, request["watched"]) for case in request["cases"]]
    json.dump(results, sys.__stdout__)
    return 0


if __name__ == "__main__":
    os.environ.pop("FP4LAB_RUN_LOCK", None)
    sys.exit(main())
