"""The rank loop of `python -m fp4lab comm` under torchrun: every rank walks the plan's points in
lock-step, rank 0 writes one row per point into the run folder as soon as it is measured.

Per point, every rank of the run (those outside the point's group only keep step):
  prepare the buffers -> agree -> check the data once -> agree -> time -> exchange results.
The agreements run on a separate gloo group (the control group), so that a point failing on one
rank (an allocation, a wrong result) is skipped by all instead of leaving the others waiting
inside a collective, and so that control traffic never shares the measured communicator.
Timing is `fp4lab.bench.time_call`'s, with no cold-L2 copies (decode's activations were just
written, and nccl-tests also reuses one buffer) and one call per replay (`min_replay_ms=0`, so the
number of collectives each rank issues never depends on its own estimate); a call runs the op
`calls_per_sample` times (the plan). Rows take the slowest rank per iteration (`comm.rows`).

Faults end the run, never hang it: collectives time out (`init_process_group(timeout=...)`,
twice the point deadline), a watchdog per rank stops it at the point deadline or on torchrun's
SIGTERM (`comm.watchdog`), and a failed exchange of results stops it at once; rank 0 then records
the reason in run.json["comm"]["failure"] with the rows measured so far kept.
"""

from __future__ import annotations

import contextlib

import datetime as _dt
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab import bench, hardware
from fp4lab.comm import collectives, nccl_env, rows, topology
from fp4lab.comm.faults import Fault
from fp4lab.comm.plan import CommPlan, CommPoint
from fp4lab.comm.watchdog import EXIT_FAILED, Watchdog, describe_ranks, read_heartbeats
from fp4lab.errors import UsageError
from fp4lab.results import RunDir, new_run_id, provenance, utc_now


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world: int
    local_rank: int
    backend: str                 # "nccl" | "gloo"
    device: torch.device


def rank_info(device: str = "auto", environ=os.environ) -> RankInfo:
    """This process's rank, from torchrun's environment, and its device and backend."""
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in environ]
    if missing:
        raise UsageError(f"comm ranks run under torchrun ({', '.join(missing)} not set); "
                         "use `python -m fp4lab comm --nproc-per-node N` to launch them")
    rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    local_rank = int(environ.get("LOCAL_RANK", rank))
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {device!r}")
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if not use_cuda:
        return RankInfo(rank, world, local_rank, "gloo", torch.device("cpu"))
    if local_rank >= torch.cuda.device_count():
        raise UsageError(f"--device cuda: local rank {local_rank} has no GPU "
                         f"({torch.cuda.device_count()} visible)")
    return RankInfo(rank, world, local_rank, "nccl", torch.device("cuda", local_rank))


def process_group_timeout(plan: CommPlan) -> _dt.timedelta:
    """Collectives give up after twice the point deadline: the watchdog speaks first."""
    return _dt.timedelta(seconds=2 * plan.point_timeout_s + 30)


def timer_config(plan: CommPlan) -> bench.TimerConfig:
    return bench.TimerConfig(repeats=plan.repeats, warmup_s=plan.warmup_s,
                             max_warmup_s=max(5.0, plan.warmup_s), cold_l2=False,
                             use_graph=plan.use_graph, min_replay_ms=0.0)


def one_line(exc: BaseException) -> str:
    """`Type: first line` of an exception, without gloo's `[.../pair.cc:553]` source prefix."""
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else ""
    text = re.sub(r"\. This is typically caused by.*$", "", text)   # gloo's advice after a crash
    return f"{type(exc).__name__}: {text[:200]}".rstrip(": ")


class PeerFailure(Exception):
    """The ranks could not exchange results: a peer is gone or its connection broke."""


class Control:
    """Agreement between all ranks over the control group (gloo, whatever the measured backend)."""

    def __init__(self, group, world: int):
        self.group, self.world = group, world

    def exchange(self, value) -> list:
        gathered = [None] * self.world
        try:
            dist.all_gather_object(gathered, value, group=self.group)
        except RuntimeError as exc:
            raise PeerFailure(one_line(exc)) from exc
        return gathered

    def broadcast(self, value):
        box = [value]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except RuntimeError as exc:
            raise PeerFailure(one_line(exc)) from exc
        return box[0]


class Recorder:
    """Rank 0's writes into the run folder; a lock keeps the watchdog's and the loop's apart."""

    def __init__(self, run: RunDir):
        self.run = run
        self.rows = 0
        self.finished = False
        self._lock = threading.Lock()

    def append(self, row: dict) -> None:
        with self._lock:
            self.run.append_rows("comm", [row])
            self.rows += 1

    def fail(self, row: dict | None, message: str) -> None:
        """Record why the run stopped; keeps the lock, since the process exits next."""
        if not self._lock.acquire(timeout=10) or self.finished:
            return
        if row is not None:
            self.run.append_rows("comm", [row])
        self.run.update_run_json("comm", {"status": "failed", "failure": message,
                                          "rows_kept": self.rows, "ended": utc_now()})

    def finish(self) -> None:
        with self._lock:
            self.run.update_run_json("comm", {"status": "complete", "rows": self.rows,
                                              "ended": utc_now()})
            self.finished = True


def measured_groups(plan: CommPlan, info: RankInfo) -> dict[int, object]:
    """The group of ranks 0..size-1 for every measured size (created by all ranks, in order)."""
    groups = {}
    for size in plan.group_sizes(info.world):
        groups[size] = dist.group.WORLD if size == info.world else dist.new_group(
            list(range(size)), timeout=process_group_timeout(plan))
    return groups


def device_name(info: RankInfo) -> str:
    if info.device.type == "cuda":
        return torch.cuda.get_device_name(info.device)
    return hardware.cpu_model()


class RankLoop:
    def __init__(self, plan: CommPlan, info: RankInfo, control: Control, groups: dict,
                 run_path: Path, recorder: Recorder | None, fault: Fault | None, progress: bool):
        self.plan, self.info, self.control, self.groups = plan, info, control, groups
        self.run_path, self.recorder, self.fault, self.progress = run_path, recorder, fault, progress
        self.points = plan.points(info.world)
        self.timer = timer_config(plan)
        self.current: CommPoint | None = None
        self.watchdog = Watchdog(run_path / "logs", info.rank, info.world, plan.point_timeout_s,
                                 self._describe, self._record_failure if recorder else None)

    # -- failure reports ------------------------------------------------------------------------
    def _describe(self, headline: str) -> str:
        ranks = describe_ranks(read_heartbeats(self.run_path / "logs", self.info.world),
                               self.info.world)
        kept = (f"{self.recorder.rows} rows kept in {self.run_path / 'comm.parquet'}"
                if self.recorder else "rank 0 keeps the rows measured")
        return f"{headline}: {ranks}; {kept}"

    def _record_failure(self, status: str, message: str) -> None:
        row = None
        if self.current is not None:
            row = rows.blank_row(self.run_path.name, self.current, self.plan, self.info.backend,
                                 self.info.device.type)
            row.update(status=status, error=message)
        self.recorder.fail(row, message)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> int:
        self.watchdog.start()
        # not armed: rank 0 may still be writing provenance; the control group's timeout and a
        # dead peer's broken connection cover the start
        self.watchdog.enter(-1, "start", "start")
        try:
            self.control.exchange(None)
            for point in self.points:
                self._point(point)
            self.watchdog.enter(len(self.points), "finish", "finish", arm=True)
            if self.recorder:
                self.recorder.finish()       # every row is written: the run is complete
            self.control.exchange(None)      # no rank tears down while another still works
        except PeerFailure as exc:
            beat = self.watchdog.beat
            self.watchdog.stop("error", f"point {beat.point} ({beat.label}): the ranks could not "
                                        f"exchange results ({exc})", EXIT_FAILED)
        if self.recorder:
            done = self.recorder.run.read_rows("comm")
            print(rows.summary_table(done), flush=True)
            print(f"comm: {len(done)} rows in {self.run_path / 'comm.parquet'}", flush=True)
        return 0

    def _point(self, point: CommPoint) -> None:
        self.current = point

        def enter(phase: str, arm: bool = False) -> None:
            self.watchdog.enter(point.index, point.label, phase, arm)

        def agreed(status: str) -> bool:  # every rank calls it, members or not
            enter("exchange")
            statuses = self.control.exchange(status if member else None)
            enter("measure")
            return member and all(s in (None, "ok") for s in statuses)

        enter("measure", arm=True)
        if self.fault and self.fault.strikes(self.info.rank, point.index):
            self.fault.strike()
        member = self.info.rank < point.world_size
        state, prepared = {"status": "ok", "error": ""}, None
        if member:
            state, prepared = self._guard(state, lambda: collectives.prepare(
                point, self.plan, self.groups[point.world_size], list(range(point.world_size)),
                self.info.rank, self.info.device))
            if prepared is not None:
                state.update(nbytes=prepared.nbytes, calls=prepared.calls,
                             imbalance=prepared.imbalance)
        if agreed(state["status"]):
            state, problem = self._guard(state, prepared.check)
            if problem:
                state.update(status="wrong_result", error=problem)
        if agreed(state["status"]):
            state, timing = self._guard(state, lambda: bench.time_call(
                prepared.make_call, prepared.args, None, self.timer, self.info.device))
            if timing is not None:
                state.update(samples=[s / prepared.calls for s in timing.samples_us],
                             graph=timing.graph, note=timing.note)
        enter("exchange")
        results = self.control.exchange(state if member else None)
        del prepared
        if self.recorder:
            row = rows.point_row(self.run_path.name, point, self.plan, results,
                                 self.info.backend, self.info.device.type)
            self.recorder.append(row)
            if self.progress:
                print(rows.progress_line(point.index + 1, len(self.points), point.label, row),
                      flush=True)
        self.current = None

    def _guard(self, state: dict, work):
        """(state, work()) or, when it raises, (state with the error, None)."""
        if state["status"] != "ok":
            return state, None
        try:
            return state, work()
        except collectives.Unavailable as exc:
            return {**state, "status": "unavailable", "error": str(exc)}, None
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {**state, "status": "oom", "error": one_line(exc)}, None
        except Exception as exc:  # noqa: BLE001 - a point that fails is a row that says why
            return {**state, "status": "error", "error": one_line(exc)}, None


def share_run_folder(control: Control, info: RankInfo, runs_dir, run_id: str | None) -> Path:
    """Rank 0 creates the run folder; every rank learns its path (or rank 0's reason it cannot)."""
    answer: tuple[str, str] = ("", "")
    if info.rank == 0:
        try:
            run = RunDir.create(runs_dir, run_id=run_id or new_run_id("comm"))
            answer = (str(run.path), "")
            if run.has_table("comm"):
                answer = ("", f"run folder {run.path} already holds comm rows; use a new --run-id")
        except ValueError as exc:
            answer = ("", str(exc))
    path, problem = control.broadcast(answer)
    if problem:
        raise UsageError(problem)
    (Path(path) / "logs").mkdir(parents=True, exist_ok=True)
    return Path(path)


def describe_run(run: RunDir, plan: CommPlan, info: RankInfo, ranks: list[dict],
                 env: dict, command) -> None:
    run.update_run_json(None, {"provenance": run.run_json().get("provenance") or provenance(command)})
    run.update_run_json("comm", {
        "plan": plan.as_dict(), "world_size": info.world, "backend": info.backend,
        "device": info.device.type, "group_sizes": list(plan.group_sizes(info.world)),
        "points": len(plan.points(info.world)), "ranks": ranks, "environment": env,
        "topology": topology.nvidia_smi_topology() if info.backend == "nccl" else
        {"matrix": None, "note": "CPU run (gloo): no GPU interconnect"},
        "started": utc_now(), "status": "running",
    })


def run_rank(plan: CommPlan, runs_dir, run_id: str | None = None, device: str = "auto",
             fault: Fault | None = None, progress: bool = True, command=None) -> int:
    """One rank of a comm run (call under torchrun); returns the exit status (0: complete)."""
    info = rank_info(device)
    try:
        plan.group_sizes(info.world)
    except ValueError as exc:
        raise UsageError(f"--world-sizes: {exc}") from None
    env = nccl_env.apply()
    timeout = process_group_timeout(plan)
    if info.backend == "nccl":
        torch.cuda.set_device(info.device)
        dist.init_process_group("nccl", timeout=timeout, device_id=info.device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    control = Control(dist.new_group(backend="gloo", timeout=timeout), info.world)
    groups = measured_groups(plan, info)
    run_path = share_run_folder(control, info, runs_dir, run_id)
    ranks = control.exchange({"rank": info.rank, "host": socket.gethostname(), "pid": os.getpid(),
                              "local_rank": info.local_rank, "device": device_name(info)})
    recorder = None
    if info.rank == 0:
        run = RunDir.open(run_path)
        describe_run(run, plan, info, ranks, env, command)
        recorder = Recorder(run)
    with (RunDir.open(run_path).lock("fp4lab comm rank 0") if info.rank == 0 else contextlib.nullcontext()):
        status = RankLoop(plan, info, control, groups, run_path, recorder, fault, progress).run()
    dist.destroy_process_group()
    return status
