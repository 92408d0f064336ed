"""Time a few `triton-w4a16` launch configurations at one point, gated first: a probe between
tuning runs (what a kernel change does, before it enters the tuner's grid).

    PYTHONPATH=src python3 benchmarks/gemv_probe.py --out $OUT/probe --point nvfp4:8192x8192:1 \
        --configs '[{"block_m": 1, "block_n": 64, "block_k": 256, "split_k": 4, "math": "gemv"}]'

Each config is a JSON object of `TileConfig` fields; the default is `PROBE_GRID` (the gemv
kernel's tiles in flight, K splits, rows a tile). Writes measurements.jsonl under
--out (the tuner's rows) and prints one fixed-width line per config.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_w4a16 as tune  # noqa: E402  (beside this script)

from fp4lab.backends.triton_w4a16 import TileConfig, choose_config, sm_count  # noqa: E402

GEMV = dict(block_m=1, block_n=64, block_k=256, num_stages=3, math="gemv")
PROBE_GRID = [   # num_stages: the gemv kernel's tiles in flight
    {**GEMV, "num_stages": 1, "split_k": 4}, {**GEMV, "num_stages": 2, "split_k": 4},
    {**GEMV, "split_k": 2}, {**GEMV, "split_k": 4}, {**GEMV, "split_k": 8},
    {**GEMV, "block_n": 128, "num_warps": 8, "split_k": 4},
    {**GEMV, "block_n": 128, "num_warps": 8, "split_k": 8},
    {**GEMV, "block_n": 32, "block_k": 512, "split_k": 4},
    {**GEMV, "block_n": 32, "block_k": 512, "split_k": 8},
    {**GEMV, "block_n": 32, "num_warps": 2, "split_k": 4},
    {**GEMV, "block_n": 32, "num_warps": 2, "split_k": 8},
    {**GEMV, "block_k": 512, "split_k": 4},
]


def parse_point(text: str) -> tune.Point:
    """"nvfp4:8192x8192:1" -> Point(fmt, N, K, M)."""
    try:
        fmt, shape, m = text.split(":")
        n, k = (int(v) for v in shape.lower().split("x"))
        return tune.Point(fmt, n, k, int(m))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--point wants fmt:NxK:M, e.g. nvfp4:8192x8192:1; "
                                         f"got {text!r}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for measurements.jsonl")
    parser.add_argument("--point", type=parse_point, action="append",
                        help="fmt:NxK:M, repeatable (default nvfp4:8192x8192:1)")
    parser.add_argument("--configs", type=json.loads, default=PROBE_GRID,
                        help="JSON list of TileConfig field objects (default PROBE_GRID)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemv_probe: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer, cache = tune.device_timer(), {}
    with open(out / "measurements.jsonl", "w") as log:
        for point in args.point or [parse_point("nvfp4:8192x8192:1")]:
            a, w = tune.operands(point, "cuda", cache)
            pick = choose_config(point.m, point.n, point.k, sm_count("cuda"))
            for config in [pick] + [TileConfig(**c) for c in args.configs]:
                row = tune.measure_config(point, config, a, w, "cuda", timer)
                log.write(json.dumps(row, default=str) + "\n")
                log.flush()
                us = row.get("median_us")
                print(f"{point.n}x{point.k} M={point.m:<4} {point.fmt} {config.label():<36} "
                      + (f"{us:8.2f} us {row['tbps']:5.2f} TB/s  {row['message']}" if us
                         else f"{row['status']}: {row.get('message', '')}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
