"""A steady GEMM load to watch: chapter 02 samples one when a run has no telemetry of its own.

The timeline is idle -> load -> idle, so the figure shows the climb, the plateau (or the clock
falling at the power limit) and the decay, and the lag of the ~1 s averaged power reading.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from fp4lab.telemetry.sampler import TELEMETRY_COLUMNS, Sampler

SYNC_EVERY_CALLS = 8  # keep the queue short so the load stops when the clock says so


@dataclass(frozen=True)
class SteadyLoad:
    m: int = 8192
    n: int = 8192
    k: int = 8192
    idle_s: float = 1.0  # idle before and after the load


def empty_telemetry():
    import pandas as pd

    return pd.DataFrame({column: pd.Series(dtype="float64") for column in TELEMETRY_COLUMNS})


def sample_steady_load(duration_s: float, rate_hz: float = 20.0, load: SteadyLoad = SteadyLoad(),
                       device_index: int = 0) -> tuple[Any, dict[str, Any]]:
    """(telemetry table, metadata) of bf16 torch.mm under the sampler; empty with a reason on CPU."""
    if not isinstance(duration_s, (int, float)) or not duration_s > 0:
        raise ValueError(f"duration_s {duration_s!r}: the load must last a positive number of seconds")
    import torch

    if not torch.cuda.is_available():
        return empty_telemetry(), {"available": False,
                                   "reason": "no CUDA GPU on this machine: no load to sample"}
    sampler = Sampler(rate_hz, device_index)
    if not sampler.available:
        return empty_telemetry(), sampler.metadata()
    device = torch.device("cuda", device_index)
    a = torch.randn(load.m, load.k, device=device, dtype=torch.bfloat16)
    w = torch.randn(load.n, load.k, device=device, dtype=torch.bfloat16)
    out = torch.empty(load.m, load.n, device=device, dtype=torch.bfloat16)
    calls = 0
    with sampler:
        time.sleep(load.idle_s)
        start = time.time()
        while time.time() - start < duration_s:
            for _ in range(SYNC_EVERY_CALLS):
                torch.mm(a, w.t(), out=out)
            torch.cuda.synchronize(device)
            calls += SYNC_EVERY_CALLS
        end = time.time()
        time.sleep(load.idle_s)
    tflops = 2 * load.m * load.n * load.k * calls / (end - start) / 1e12
    return sampler.frame, {**sampler.metadata(), "source": "steady bf16 torch.mm load (chapter 02)",
                           "load": dataclasses.asdict(load), "load_start_s": start, "load_end_s": end,
                           "load_tflops": tflops, "calls": calls}
