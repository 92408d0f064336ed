"""The one runner every sweep uses: one worker process per group of points, crash isolation,
per-point timeouts, resume, and signals that stop cleanly.

The parent sends a group's points to `python -m fp4lab.sweep.worker` as one JSON job on stdin and
reads JSON lines back: `ready`, then per point `start` and `row`; `unavailable` when the group
cannot run here at all (one reason for all its points); `interrupted` on Ctrl-C. What a worker
costs when it fails is one point, never the sweep:
- it dies (segfault, illegal address poisoning the CUDA context, os._exit): the point it was
  measuring becomes an `error` row with the worker's last stderr lines, and a fresh worker takes
  the rest;
- it hangs: after `point_timeout_s` the worker is killed, the point becomes a `timeout` row, and
  a fresh worker takes the rest.
SIGTERM and SIGHUP are handled like Ctrl-C: workers are stopped, rows already written are kept and
the sweep records `interrupted`. Workers die with their parent (PR_SET_PDEATHSIG), so a killed
sweep leaves no process holding the GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

STDERR_TAIL_LINES = 8
WORKER_MODULE = "fp4lab.sweep.worker"
READY_TIMEOUT_S = 600.0          # imports, CUDA init, clock warm-up before the first point


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP (or a worker that saw one): stop, keep every row written."""


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted in the main thread for the duration (as Ctrl-C
    raises KeyboardInterrupt), so `finally` blocks stop workers and record the status; a
    repeated signal while they do is ignored (SIGKILL still ends everything)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    stopping = []

    def handler(signum, frame):
        if stopping:          # a second signal while stopping: let the cleanup record `interrupted`
            return
        stopping.append(signum)
        raise Interrupted(f"received {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _stderr_tail(log_path: Path, start: int) -> str:
    with open(log_path, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-STDERR_TAIL_LINES:]) or "(no stderr)"


def log_path(run, group: str) -> Path:
    """`logs/<group>.log` of the run folder, inside it whatever the group's name holds."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", group).lstrip(".") or "group"
    return run.path / "logs" / f"{safe}.log"


def worker_messages(job: dict[str, Any], log_path: Path, point_timeout_s: float,
                    ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[dict[str, Any]]:
    """Start a worker on `job`; yield its messages, a `timeout` message when it stays silent too
    long (it is killed), then an `exit` message with its return code and last stderr lines."""
    from fp4lab.results import RunFolderError, open_own

    if log_path.parent.is_symlink():
        raise RunFolderError(f"{log_path.parent}: is a symbolic link; fp4lab writes only the run folder's "
                             "own files")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open_own(log_path, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log)
    selector = selectors.DefaultSelector()
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
        selector.register(proc.stdout, selectors.EVENT_READ)
        buffer, phase, deadline = b"", "start-up", time.monotonic() + ready_timeout_s
        while True:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                proc.kill()
                proc.wait()
                yield {"event": "timeout", "phase": phase}
                return
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue                     # a line cut short when the worker died
                if message.get("event") == "start":
                    phase, deadline = "point", time.monotonic() + point_timeout_s
                elif message.get("event") in ("ready", "row"):
                    phase, deadline = "between points", time.monotonic() + ready_timeout_s
                yield message
        yield {"event": "exit", "returncode": proc.wait(), "stderr": _stderr_tail(log_path, start)}
    finally:
        selector.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def measure_group(group: str, points: list, job: dict[str, Any], log_path: Path,
                  record: Callable[[dict[str, Any]], None], blank: Callable[[Any, str, str], dict],
                  point_timeout_s: float) -> None:
    """Measure `points` of one group (a backend, an MoE method) in worker processes.

    `record(row)` is called once per point; `blank(point, status, error)` makes the row of a
    point the worker could not measure. A fresh worker takes over after a death or a timeout.
    """
    remaining = {_key(point.identity()): point for point in points}
    while remaining:
        message_job = {**job, "group": group, "points": [p.identity() for p in remaining.values()]}
        in_progress, ready = None, False
        for message in worker_messages(message_job, log_path, point_timeout_s):
            event = message["event"]
            if event == "ready":
                ready = True
            elif event == "start":
                in_progress = remaining.get(_key(message["point"]))
            elif event == "row":
                point = remaining.pop(_key(message["point"]), None)
                if point is not None:
                    record(message["row"])
                in_progress = None
            elif event == "unavailable":
                for point in list(remaining.values()):
                    record(blank(point, "unavailable", message["reason"]))
                remaining.clear()
            elif event == "interrupted":
                raise Interrupted("the worker was interrupted")
            elif event == "timeout":
                lost = [in_progress] if in_progress is not None else list(remaining.values())
                reason = (f"no answer within {point_timeout_s:g} s (point_timeout_s): the worker was "
                          f"killed" if in_progress is not None else
                          f"the worker sent nothing during {message['phase']}: killed")
                for point in lost:
                    remaining.pop(_key(point.identity()), None)
                    record(blank(point, "timeout", reason))
            elif event == "exit" and remaining:
                reason = f"worker {exit_text(message['returncode'])}: {message['stderr']}"
                lost = [in_progress] if ready and in_progress is not None else list(remaining.values())
                for point in lost:
                    remaining.pop(_key(point.identity()), None)
                    record(blank(point, "error", reason))


def _key(identity: dict[str, Any]) -> tuple:
    """A point's identity as the worker echoes it back (JSON round trip), hashable."""
    return tuple(sorted(identity.items()))


def ensure_ceilings(run, device: str) -> dict[str, Any]:
    """The run's ceilings: measured once (in a worker) and kept in run.json["sweep"]["ceilings"];
    {"measured": {...} or None, "spec": {...} or None, "error": why not measured}."""
    import dataclasses

    from fp4lab import hardware, roofline

    stored = (run.run_json().get("sweep") or {}).get("ceilings")
    if stored and stored.get("measured"):
        return stored
    ceilings: dict[str, Any] = {"measured": None}
    for message in worker_messages({"kind": "ceilings", "device": device},
                                   log_path(run, "ceilings"), point_timeout_s=READY_TIMEOUT_S):
        if message["event"] == "ceilings":
            ceilings["measured"] = message["ceilings"]
        elif message["event"] == "error":
            ceilings["error"] = message["error"]
        elif message["event"] == "interrupted":
            raise Interrupted("the ceilings worker was interrupted")
        elif message["event"] in ("exit", "timeout") and not ceilings["measured"] and "error" not in ceilings:
            ceilings["error"] = (f"ceilings worker {exit_text(message['returncode'])}: {message['stderr']}"
                                 if message["event"] == "exit" else "ceilings worker timed out")
    spec = hardware.detect(device).spec
    ceilings["spec"] = dataclasses.asdict(roofline.spec_ceilings(spec)) if spec is not None else None
    run.update_run_json("sweep", {"ceilings": ceilings})
    return ceilings
