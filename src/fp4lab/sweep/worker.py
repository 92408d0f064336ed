"""The sweep's worker process: `python -m fp4lab.sweep.worker` reads one JSON job on stdin.

Jobs: {"kind": "ceilings", "device"} measures the roofline ceilings; {"kind": "gemm" | "moe" |
"anatomy" | "moe_anatomy", "group", "points", ...} measures each point of one group
(fp4lab.sweep.gemm, .moe, .anatomy, .moe_anatomy). Answers are JSON lines on the worker's original
stdout (see fp4lab.sweep.runner); anything a library prints
goes to stderr, which the parent keeps in the run folder's logs, so a crash's last words reach the
`error` row. Isolation is the point: a backend that segfaults, hangs or poisons the CUDA context
takes only this process down. The worker dies with its parent (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import sys
from typing import Any, Callable, TextIO

PR_SET_PDEATHSIG = 1


def protocol_channel() -> TextIO:
    """Keep the real stdout for messages; send every other write to fd 1 to stderr."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent dies (a killed sweep leaves no orphan)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally still kills workers on every clean exit
    if os.getppid() == 1:          # the parent died before prctl took effect
        os._exit(1)


def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def sender(channel: TextIO) -> Callable[..., None]:
    def send(event: str, **payload: Any) -> None:
        channel.write(json.dumps({"event": event, **payload}, default=_json_default) + "\n")
        channel.flush()
    return send


def first_line(exc: BaseException) -> str:
    from fp4lab.text import package_relative

    text = str(exc).strip().splitlines()
    return package_relative(f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "))[:500]


def run_ceilings(job: dict[str, Any], send) -> None:
    from fp4lab.ceilings import measure_ceilings

    try:
        ceilings = measure_ceilings(job["device"])
    except Exception as exc:  # noqa: BLE001 - reported; the analysis falls back to spec ceilings
        send("error", error=first_line(exc))
        return
    send("ceilings", ceilings=dataclasses.asdict(ceilings))


def main() -> int:
    die_with_parent()
    send = sender(protocol_channel())
    job = json.loads(sys.stdin.read())
    try:
        from fp4lab.sweep import anatomy, gemm, moe, moe_anatomy
        from fp4lab.sweep.registry import load_extra_backends

        load_extra_backends()
        jobs = {"ceilings": run_ceilings, "gemm": gemm.measure_job, "moe": moe.measure_job,
                "anatomy": anatomy.measure_job, "moe_anatomy": moe_anatomy.measure_job}
        jobs[job["kind"]](job, send)
    except KeyboardInterrupt:
        send("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
