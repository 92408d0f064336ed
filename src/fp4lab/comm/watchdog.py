"""Never a hung run: heartbeats, a per-point deadline, a signal watch, and one way to stop.

Every rank writes a small heartbeat file (`<run>/logs/comm-rank<R>.json`: pid, host, the point
and phase it is in) whenever it enters a phase. A watchdog thread on every rank gives each point
`timeout_s` to finish (measure and exchange results); past that, or when the process receives
SIGTERM/SIGINT (torchrun stops every rank once one fails), it stops the rank through its
`Stopper`, which records the failure (rank 0: a row for the point in flight and run.json) and
exits. The thread acts even while the main thread is blocked inside a collective or a CUDA
synchronize: signals reach it through `signal.set_wakeup_fd`, not through a Python handler.

Heartbeats name the culprit in the message: a rank whose process is gone exited; a rank still
inside an earlier phase than the others is stuck there. They are read from the local disk, so
ranks on another node show as "no heartbeat here".
"""

from __future__ import annotations

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
    """Which ranks exited, which are stuck behind the others, in one sentence."""
    now = time.time() if now is None else now
    parts, missing = [], [r for r in range(world) if r not in beats]
    alive = {rank: process_alive(beat) for rank, beat in beats.items()}
    for rank, beat in sorted(beats.items()):
        if alive[rank] is False:
            parts.append(f"rank {rank} (pid {beat.pid}) exited during point {beat.point} "
                         f"({beat.label}, {beat.phase})")
    running = {rank: beat for rank, beat in beats.items() if alive[rank] is not False}
    if running:
        furthest = max(beat.step for beat in running.values())
        behind = {r: b for r, b in running.items() if b.step < furthest}
        for rank, beat in sorted(behind.items()):
            parts.append(f"rank {rank} is stuck in point {beat.point} ({beat.label}, "
                         f"{beat.phase}) for {now - beat.since:.1f} s")
        if not behind and not parts and len(running) == world:
            beat = next(iter(running.values()))
            parts.append(f"every rank is inside point {beat.point} ({beat.label}, {beat.phase})")
    if missing:
        parts.append(f"no heartbeat here from rank(s) {', '.join(map(str, missing))}")
    return "; ".join(parts) or "every rank reported progress"


class Stopper:
    """The one way a rank stops early: record why (once, whichever thread gets here first),
    say it on stderr, exit without running teardown that could wait on a dead peer."""

    def __init__(self, rank: int, record: Callable[[str, str], None] | None = None):
        self.rank = rank
        self.record = record            # (status, message) -> None; rank 0 writes the run folder
        self._once = threading.Lock()

    def stop(self, status: str, message: str, code: int) -> None:
        self._once.acquire()            # a second caller waits here until the first exits
        try:
            if self.record is not None:
                self.record(status, message)
        except Exception as exc:  # noqa: BLE001 - the exit must happen whatever the disk says
            print(f"fp4lab comm: rank {self.rank}: could not record the failure: {exc}",
                  file=sys.stderr)
        print(f"fp4lab comm: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)


class Watchdog:
    """Per-rank deadline and signal watch; `enter(point, label, phase)` from the main thread."""

    def __init__(self, folder: Path, rank: int, world: int, timeout_s: float, stopper: Stopper,
                 describe: Callable[[int, str], str]):
        self.folder, self.rank, self.world = Path(folder), rank, world
        self.timeout_s = timeout_s + (0.0 if rank == 0 else REPORTER_GRACE_S)
        self.stopper, self.describe = stopper, describe
        self.deadline: float | None = None
        self.step = 0
        self.current = (-1, "", "start")
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
        self.step += 1
        self.current = (point, label, phase)
        write_heartbeat(self.folder, Heartbeat(self.rank, os.getpid(), socket.gethostname(),
                                               self.step, point, label, phase, time.time()))
        if arm:
            self.deadline = time.monotonic() + self.timeout_s

    def _watch(self) -> None:
        while True:
            ready, _, _ = select.select([self._signal_read], [], [], 0.1)
            signum = os.read(self._signal_read, 1)[0] if ready else None
            if signum in WATCHED_SIGNALS:
                name = signal.Signals(signum).name
                self.stopper.stop("error", self.describe(
                    self.current[0], f"stopped by {name} (torchrun stops every rank once one "
                                     f"fails)"), 128 + signum)
            if self.deadline is not None and time.monotonic() > self.deadline:
                point, label, phase = self.current
                self.stopper.stop("timeout", self.describe(
                    point, f"point {point} ({label}) did not finish within "
                           f"{self.timeout_s:g} s"), EXIT_TIMEOUT)
