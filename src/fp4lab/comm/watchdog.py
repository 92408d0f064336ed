"""Never a hung run: heartbeats, a per-point deadline, a signal watch, and one way to stop.

Every rank writes a small heartbeat file (`<run>/logs/comm-rank<R>.json`: pid, host, the point
and phase it is in) whenever it enters a phase. A watchdog thread on every rank gives each point
`timeout_s` to finish (measure and exchange results); past that, or when the process receives
SIGTERM/SIGINT (torchrun stops every rank once one fails), it stops the rank (`Watchdog.stop`,
also called by the main thread when results cannot be exchanged): heartbeat marked with why,
failure recorded (rank 0: a row for the point in flight and run.json), exit. The thread acts even while the main thread is blocked inside a collective or a CUDA
synchronize: signals reach it through `signal.set_wakeup_fd`, not through a Python handler.

Heartbeats name the culprit in the message: a rank whose process is gone without having
stopped itself died; a rank still inside an earlier phase than the others is stuck there. They are read from the local disk, so
ranks on another node show as "no heartbeat here".
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

PHASES = ("start", "measure", "exchange", "finish")
EXIT_FAILED = 3        # a peer failed (results could not be exchanged)
EXIT_TIMEOUT = 4       # a point outlived its deadline
# non-zero ranks wait this much longer than rank 0 before giving up, so that rank 0, which owns
# the run folder, is the one that records why the run stopped
REPORTER_GRACE_S = 2.0
WATCHED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Heartbeat:
    rank: int
    pid: int
    host: str
    step: int             # phases entered so far: every rank walks the same steps in lock-step
    point: int            # index of the point, -1 before the first
    label: str
    phase: str            # one of PHASES
    since: float          # epoch seconds the phase began
    stopped: str = ""     # why the rank stopped itself ("" while it runs, or when it died)


def heartbeat_path(folder: Path, rank: int) -> Path:
    return Path(folder) / f"comm-rank{rank}.json"


def write_heartbeat(folder: Path, beat: Heartbeat) -> None:
    path = heartbeat_path(folder, beat.rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(beat)))
    tmp.replace(path)


def read_heartbeats(folder: Path, world: int) -> dict[int, Heartbeat]:
    beats = {}
    for rank in range(world):
        try:
            beats[rank] = Heartbeat(**json.loads(heartbeat_path(folder, rank).read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return beats


def process_alive(beat: Heartbeat) -> bool | None:
    """Whether the rank's process still runs (None: it ran on another host, so unknown here)."""
    if beat.host != socket.gethostname():
        return None
    try:
        state = Path(f"/proc/{beat.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")     # a zombie has exited, only not yet been reaped


def describe_ranks(beats: dict[int, Heartbeat], world: int, now: float | None = None) -> str:
    """Which ranks died, which are stuck behind the others, in one sentence. A rank that died
    without stopping itself is a culprit, and so is a rank behind the others (running, or
    stopped by the same signal that stopped them); ranks that stopped themselves are named,
    with why, only when there is no culprit."""
    now = time.time() if now is None else now
    alive = {rank: process_alive(beat) for rank, beat in beats.items()}
    silent = {r: b for r, b in beats.items() if alive[r] is False and not b.stopped}
    parts = [f"rank {rank} (pid {beat.pid}) exited during point {beat.point} ({beat.label}, "
             f"{beat.phase}) without saying why" for rank, beat in sorted(silent.items())]
    walking = {r: b for r, b in beats.items() if r not in silent}
    if walking:
        furthest = max(beat.step for beat in walking.values())
        parts += [f"rank {rank} {'was' if beat.stopped else 'is'} stuck in point {beat.point} "
                  f"({beat.label}, {beat.phase}) for {now - beat.since:.1f} s"
                  for rank, beat in sorted(walking.items()) if beat.step < furthest]
    if not parts:
        parts = [f"rank {rank} stopped: {beat.stopped}" for rank, beat in sorted(beats.items())
                 if beat.stopped]
    if not parts and len(walking) == world:
        beat = next(iter(walking.values()))
        parts.append(f"every rank is inside point {beat.point} ({beat.label}, {beat.phase})")
    missing = [rank for rank in range(world) if rank not in beats]
    if missing:
        parts.append(f"no heartbeat here from rank(s) {', '.join(map(str, missing))}")
    return "; ".join(parts) or "no rank reported a problem"


class Watchdog:
    """A rank's deadline, signal watch and way out; `enter(point, label, phase)` from the main
    thread, `stop(status, headline, code)` from any thread."""

    def __init__(self, folder: Path, rank: int, world: int, timeout_s: float,
                 describe: Callable[[str], str],
                 record: Callable[[str, str], None] | None = None):
        self.folder, self.rank, self.world = Path(folder), rank, world
        self.timeout_s = timeout_s + (0.0 if rank == 0 else REPORTER_GRACE_S)
        self.describe = describe        # headline -> the full message (which ranks, rows kept)
        self.record = record            # (status, message) -> None; rank 0 writes the run folder
        self.deadline: float | None = None
        self.beat = Heartbeat(rank, os.getpid(), socket.gethostname(), 0, -1, "", "start",
                              time.time())
        self._once = threading.Lock()
        self._signal_read: int | None = None
        self._thread = threading.Thread(target=self._watch, name="fp4lab-comm-watchdog",
                                        daemon=True)

    def start(self) -> "Watchdog":
        """Call from the main thread: signals then wake the watchdog, wherever the main thread is."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        for signum in WATCHED_SIGNALS:
            signal.signal(signum, lambda *_: None)   # the watchdog acts; no default termination
        self._signal_read = read
        self._thread.start()
        return self

    def enter(self, point: int, label: str, phase: str, arm: bool = False) -> None:
        """A new phase: heartbeat written; `arm` restarts the deadline (once per point: its
        measuring and its exchanges share one)."""
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}: not one of {', '.join(PHASES)}")
        self.beat = dataclasses.replace(self.beat, step=self.beat.step + 1, point=point,
                                        label=label, phase=phase, since=time.time())
        write_heartbeat(self.folder, self.beat)
        if arm:
            self.deadline = time.monotonic() + self.timeout_s

    def stop(self, status: str, headline: str, code: int) -> None:
        """Stop this rank: heartbeat marked, failure recorded (once, whichever thread comes
        first), said on stderr, then exit without teardown that could wait on a dead peer."""
        self._once.acquire()            # a second caller waits here until the first exits
        try:
            write_heartbeat(self.folder, dataclasses.replace(self.beat, stopped=headline))
            message = self.describe(headline)
            if self.record is not None:
                self.record(status, message)
        except Exception as exc:  # noqa: BLE001 - the exit must happen whatever the disk says
            message = f"{headline} (and recording it failed: {exc})"
        print(f"fp4lab comm: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)

    def _watch(self) -> None:
        while True:
            ready, _, _ = select.select([self._signal_read], [], [], 0.1)
            signum = os.read(self._signal_read, 1)[0] if ready else None
            if signum in WATCHED_SIGNALS:
                self.stop("error", f"stopped by {signal.Signals(signum).name} (torchrun stops "
                                   f"every rank once one fails)", 128 + signum)
            if self.deadline is not None and time.monotonic() > self.deadline:
                beat = self.beat
                self.stop("timeout", f"point {beat.point} ({beat.label}) did not finish within "
                                     f"{self.timeout_s:g} s", EXIT_TIMEOUT)
