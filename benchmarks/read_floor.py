"""The fastest one-launch read of a weight tensor's bytes over a few launch shapes: how far
`fp4lab.backends.stream_kernel.LAUNCH` (the anatomy's "stream" stage) is from the best this
kernel finds at each size. Used by `h200_kernels.py`; each shape checked exactly, then timed
with the package's timer (cold L2, CUDA-graph replay).
"""

from __future__ import annotations

import torch

from fp4lab import bench
from fp4lab.backends import stream_kernel

SHAPES = ((1024, 4, 4), (2048, 4, 8), (1024, 8, 4), (4096, 2, 8), (512, 8, 2))   # BLOCK, ITERS, warps


def measure(words: torch.Tensor, timer: bench.TimerConfig, device: str) -> list[dict]:
    """One row per launch shape: its median time, checked against torch's XOR of the words."""
    rows = []
    for launch in SHAPES:
        count = stream_kernel.programs(words, launch)
        out = torch.empty(count, dtype=torch.int32, device=words.device)

        def make_call(args, out, launch=launch):
            return lambda: stream_kernel.launch_read(args[0], out, launch)

        label = f"block {launch[0]} x {launch[1]}, {launch[2]} warps, {count} programs"
        make_call((words,), out)()
        if not torch.equal(out, stream_kernel.expected_xor(words, count, launch)):
            rows.append({"status": "wrong_result", "label": label,
                         "message": "XOR of the words differs from torch's"})
            continue
        timing = bench.time_call(make_call, (words,), out, timer, device)
        rows.append({"status": "ok", "label": label, "median_us": timing.median_us,
                     "p20_us": timing.p20_us, "p80_us": timing.p80_us,
                     "cold_l2": timing.cold_l2, "graph": timing.graph,
                     "bytes": 4 * words.numel(), "tbps": 4 * words.numel() / timing.median_us / 1e6})
    return rows
