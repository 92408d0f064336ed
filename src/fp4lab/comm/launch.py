"""Launching a comm run: torchrun over N local processes, a whole-run time limit, one verdict.

`launch` starts `python -m torch.distributed.run --standalone --nproc-per-node N -m fp4lab comm
...` in its own process group, with NVLink multicast off in its environment (`comm.nccl_env`) and
torchrun's own failure handling (no restarts; a failed rank stops the others within 0.1 s). When
torchrun ends it reads the run folder: the run completed, or rank 0 recorded why it stopped, or
(rank 0 itself gone) the launcher records what the heartbeats say. `smoke_into` is the two-process
CPU (gloo) run of the smoke profile into a given run folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import fp4lab
from fp4lab.comm import nccl_env
from fp4lab.comm.watchdog import describe_ranks, read_heartbeats
from fp4lab.results import RunDir, utc_now

TERMINATE_GRACE_S = 15        # after the time limit: SIGTERM, then SIGKILL this much later
MONITOR_INTERVAL_S = 0.1      # how often torchrun checks its ranks


@dataclass
class LaunchResult:
    returncode: int              # torchrun's exit status (-9/-15 when the time limit killed it)
    run_path: Path
    status: str                  # "complete" | "failed"
    message: str                 # one line: what happened, where the rows are
    rows: int
    output: str = ""             # torchrun's stdout and stderr, when captured

    @property
    def ok(self) -> bool:
        return self.status == "complete"


def torchrun_command(nproc: int, worker_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--monitor-interval", str(MONITOR_INTERVAL_S), "-m", "fp4lab", "comm", *worker_args]


def launch_environment(environ=os.environ) -> dict[str, str]:
    env = dict(environ)
    nccl_env.apply(env)
    env.setdefault("OMP_NUM_THREADS", "1")   # what torchrun would set, without its banner
    package_root = str(Path(fp4lab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def launch(nproc: int, worker_args: list[str], run_path: Path, timeout_s: float | None = None,
           capture: bool = False) -> LaunchResult:
    """Run the ranks; `worker_args` must name the run folder (`--out`, `--run-id`) as `run_path`."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    output = subprocess.PIPE if capture else None
    process = subprocess.Popen(torchrun_command(nproc, worker_args), env=launch_environment(),
                               start_new_session=True, stdout=output, stderr=output, text=True)
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = _stop(process)
    except BaseException:
        # Ctrl-C or SIGTERM of the launcher: torchrun runs in its own session, so the terminal's
        # signal never reaches it; the ranks must not outlive their launcher
        _stop(process)
        raise
    result = verdict(process.returncode, Path(run_path), nproc, timed_out, timeout_s)
    result.output = (out or "") + (err or "")
    return result


def _stop(process: subprocess.Popen) -> tuple[str | None, str | None]:
    """SIGTERM to the torchrun process group we started (it forwards it), SIGKILL if it lingers."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()


def verdict(returncode: int, run_path: Path, nproc: int, timed_out: bool = False,
            timeout_s: float | None = None) -> LaunchResult:
    """What the run folder says after torchrun ended; records the failure if no rank did."""
    if not (run_path / "run.json").is_file():
        cause = (f"the run outlived its {timeout_s:g} s time limit" if timed_out else
                 f"torchrun exited {returncode}")
        return LaunchResult(returncode or 1, run_path, "failed",
                            f"{cause} before rank 0 created {run_path}", 0)
    run = RunDir.open(run_path)
    comm = run.run_json().get("comm", {})
    kept = len(run.read_rows("comm"))
    if comm.get("status") == "complete":
        # rank 0 marks the run complete once every row is written; a rank failing after that
        # (at teardown) is said, but the measurement stands
        after = "" if returncode == 0 else (f" (torchrun exited {returncode} after the run "
                                            f"completed: a rank failed at teardown)")
        return LaunchResult(returncode, run_path, "complete",
                            f"{kept} rows in {run_path / 'comm.parquet'}{after}", kept)
    message = comm.get("failure") if comm.get("status") == "failed" else None
    if message is None:
        cause = (f"the run outlived its {timeout_s:g} s time limit" if timed_out else
                 f"torchrun exited {returncode} with no failure recorded by rank 0")
        ranks = describe_ranks(read_heartbeats(run_path / "logs", nproc), nproc)
        message = f"{cause}: {ranks}; {kept} rows kept in {run_path / 'comm.parquet'}"
        run.update_run_json("comm", {"status": "failed", "failure": message, "rows_kept": kept,
                                     "ended": utc_now()})
    return LaunchResult(returncode or 1, run_path, "failed", message, kept)


def smoke_into(run_dir: str | os.PathLike, nproc: int = 2, timeout_s: float = 120) -> LaunchResult:
    """The smoke profile's two-process gloo run into `run_dir` (created if missing): its comm
    table and run.json["comm"], for chapter 05 in CI. Returns the verdict; never raises for a
    failed run (the verdict says why)."""
    run_dir = Path(run_dir)
    worker_args = ["--device", "cpu", "--profile", "smoke", "--quiet",
                   "--out", str(run_dir.parent), "--run-id", run_dir.name]
    return launch(nproc, worker_args, run_dir, timeout_s=timeout_s, capture=True)
