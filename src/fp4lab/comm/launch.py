"""Launching a comm run: torchrun over N local processes, a whole-run time limit, one verdict.

`launch` runs `-m fp4lab comm ...` through fp4lab.torchrun (its own process group, no restarts, a
failed rank stops the others), with NVLink multicast off in its environment (`comm.nccl_env`).
When torchrun ends it reads the run folder: the run completed, or rank 0 recorded why it stopped,
or (rank 0 itself gone) the launcher records what the heartbeats say. `smoke_into` is the
two-process CPU (gloo) run of the smoke profile into a given run folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fp4lab import torchrun
from fp4lab.comm import nccl_env
from fp4lab.comm.watchdog import describe_ranks, read_heartbeats
from fp4lab.results import RunDir, utc_now


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


def launch_environment(environ=os.environ) -> dict[str, str]:
    env = torchrun.environment(environ)
    nccl_env.apply(env)
    return env


def launch(nproc: int, worker_args: list[str], run_path: Path, timeout_s: float | None = None,
           capture: bool = False) -> LaunchResult:
    """Run the ranks; `worker_args` must name the run folder (`--out`, `--run-id`) as `run_path`."""
    finished = torchrun.run(nproc, "fp4lab", ["comm", *worker_args], env=launch_environment(),
                            timeout_s=timeout_s, capture=capture)
    result = verdict(finished.returncode, Path(run_path), nproc, finished.timed_out, timeout_s)
    result.output = finished.output
    return result


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
