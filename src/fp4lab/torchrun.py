"""One process per device through torchrun (PyTorch's launcher), for every fp4lab command that
spreads over the GPUs of a box: the per-GPU GEMM sweep (fp4lab.sweep.ranks) and the comm runs
(fp4lab.comm.launch).

`run` starts `python -m torch.distributed.run --standalone --nproc-per-node N -m <module> ...` in
its own process group, with torchrun's own failure handling (no restarts; a failed rank stops the
others within 0.1 s) and an optional whole-run time limit. Ctrl-C or SIGTERM of the caller stops
the ranks too: they never outlive their launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import fp4lab

TERMINATE_GRACE_S = 15        # after the time limit: SIGTERM, then SIGKILL this much later
MONITOR_INTERVAL_S = 0.1      # how often torchrun checks its ranks


@dataclass
class Finished:
    returncode: int               # torchrun's exit status (-9/-15 when the time limit killed it)
    timed_out: bool
    output: str = ""              # stdout and stderr, when captured


def command(nproc: int, module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--monitor-interval", str(MONITOR_INTERVAL_S), "-m", module, *args]


def environment(environ=os.environ) -> dict[str, str]:
    """The ranks' environment: the caller's, one OpenMP thread per rank (what torchrun would set,
    without its banner), and this fp4lab importable whatever the working directory."""
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    package_root = str(Path(fp4lab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def run(nproc: int, module: str, args: list[str], *, env: dict[str, str] | None = None,
        timeout_s: float | None = None, capture: bool = False) -> Finished:
    """Run `module` on `nproc` local ranks and wait for torchrun to end."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1, got {nproc!r}")
    output = subprocess.PIPE if capture else None
    process = subprocess.Popen(command(nproc, module, args), env=env or environment(),
                               start_new_session=True, stdout=output, stderr=output, text=True)
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = _stop(process)
    except BaseException:
        # torchrun runs in its own session, so the terminal's Ctrl-C never reaches it
        _stop(process)
        raise
    return Finished(process.returncode, timed_out, (out or "") + (err or ""))


def _stop(process: subprocess.Popen) -> tuple[str | None, str | None]:
    """SIGTERM to the torchrun process group we started (it forwards it), SIGKILL if it lingers."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()
