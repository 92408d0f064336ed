"""The GEMM sweep on every GPU of the box: one torchrun rank per GPU, one run folder.

`gpus: all` (the full profile) sweeps each visible GPU in its own process, launched by torchrun
(fp4lab.torchrun); `gpus: one` (the default) measures the one device in the calling process. The
parent holds the run folder's lock and measures the ceilings once (GPU 0); each rank (`python -m
fp4lab.sweep.ranks RUN_DIR`, started by torchrun with LOCAL_RANK) measures the grid on
`cuda:<LOCAL_RANK>` into the run's shared tables (rows keyed and tagged by gpu_index and PCI bus
id), and records its end in run.json["sweep_gpus"][<gpu_index>]: `points` it measured in this
call and `rows` the table holds for its GPU (a resume that measures nothing still says what is
there). A rank that dies stops the others (torchrun); every row written is kept and a resume
measures the rest on each GPU.
"""

from __future__ import annotations

import sys
from typing import Any

from fp4lab.results import RunDir, utc_now

SECTION = "sweep_gpus"


class RanksFailed(RuntimeError):
    """torchrun ended with a rank that did not finish its GPU's grid (rows written are kept)."""


def ranks_for(gpus: str, device: str) -> int | None:
    """How many ranks sweep `device`: the visible GPU count for `gpus: all` on "cuda", None
    (the calling process measures) for `gpus: one`, a CPU, or one named GPU ("cuda:N")."""
    import torch

    if gpus != "all" or device != "cuda":
        return None
    return torch.cuda.device_count()


def sweep_every_gpu(run: RunDir, nproc: int, retry_failed: bool, progress: bool) -> int:
    """Launch the ranks on the run (whose stored config they measure); returns the points they
    measured, or raises RanksFailed naming the GPUs that did not finish."""
    from fp4lab import torchrun

    args = [str(run.path)] + (["--retry-failed"] if retry_failed else []) + ([] if progress else ["--quiet"])
    started = utc_now()
    finished = torchrun.run(nproc, "fp4lab.sweep.ranks", args)
    ended = {gpu: state for gpu, state in (run.run_json().get(SECTION) or {}).items()
             if isinstance(state, dict) and str(state.get("ended", "")) >= started}
    unfinished = [str(gpu) for gpu in range(nproc)
                  if (ended.get(str(gpu)) or {}).get("status") != "complete"]
    if finished.returncode != 0 or unfinished:
        states = ", ".join(f"GPU {gpu}: {(ended.get(gpu) or {}).get('status', 'no record')}"
                           f"{_why(ended.get(gpu))}" for gpu in unfinished) or "every GPU finished"
        raise RanksFailed(f"the per-GPU sweep's torchrun exited {finished.returncode} ({states}); "
                          f"measured rows are kept in {run.path}: resume measures the rest")
    return sum(int(state.get("points", 0)) for state in ended.values())


def _why(state: dict | None) -> str:
    return f" ({state['error']})" if state and state.get("error") else ""


def rank_main(argv: list[str]) -> int:
    """One rank: the stored grid on cuda:<LOCAL_RANK> (cpu when the stored device is the CPU,
    which the tests use), under the lock its launcher holds."""
    import argparse
    import os

    from fp4lab.sweep.config import GemmSweep
    from fp4lab.sweep.gemm import device_facts, sweep_device
    from fp4lab.sweep.runner import Interrupted, signals_as_interrupt

    parser = argparse.ArgumentParser(prog="python -m fp4lab.sweep.ranks")
    parser.add_argument("run_dir")
    parser.add_argument("--retry-failed", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    run = RunDir.open(args.run_dir)
    config = GemmSweep.from_dict((run.run_json().get("sweep") or {})["config"])
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = "cpu" if config.device == "cpu" else f"cuda:{rank}"
    facts = device_facts(device)
    gpu = str(facts["gpu_index"] if facts["gpu_index"] is not None else rank)
    state: dict[str, Any] = {"device": device, "pci_bus_id": facts["pci_bus_id"], "status": "running",
                             "started": utc_now()}
    with run.lock(), signals_as_interrupt():
        run.update_run_json(SECTION, {gpu: dict(state)})
        state["status"] = "interrupted"
        try:
            state["points"] = sweep_device(config, run, device, retry_failed=args.retry_failed,
                                           progress=not args.quiet and rank == 0,
                                           label=f"gemm {run.run_id} GPU {gpu}")
            state["status"] = "complete"
        except (KeyboardInterrupt, Interrupted):
            return 130
        except Exception as exc:  # noqa: BLE001 - recorded for the launcher, then raised
            state.update(status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"[:300])
            raise
        finally:
            state["rows"] = sum(row.get("gpu_index") == facts["gpu_index"] for row in run.read_rows("gemm"))
            run.update_run_json(SECTION, {gpu: {**state, "ended": utc_now()}})
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
