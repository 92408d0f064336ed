"""Cross-check fp4lab's timer against `triton.testing.do_bench_cudagraph` on cuBLAS bf16 GEMMs.

For each weight shape N x K and each M: x[M, K] @ W[N, K]^T timed by
  - fp4lab warm L2 (one input set, graph replays): the like-for-like figure, since
    do_bench_cudagraph keeps the L2 warm;
  - do_bench_cudagraph, median;
  - fp4lab cold L2 (inputs rotated over >= 4x L2): the figure that matters for decode.
PASS when the two warm figures agree within 5%. One fixed-width line per point; JSON to --out.

Usage (on the GPU machine): python benchmarks/crosscheck_timer.py --out crosscheck.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

from fp4lab import bench, sweep
from fp4lab.results import provenance

AGREEMENT = 0.05  # |fp4lab / do_bench - 1| allowed
ROUNDS = 3        # interleaved measurements of each timer per point; medians compared
DEFAULT_SHAPES = "6144x2048,8192x8192"  # GLM-5 expert down-projection (fits in L2), and a large one
DEFAULT_M = "1,64,1024,8192"


def parse_grid(m_text: str, shapes_text: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """--m and --shapes through the sweep's parsers; a bad value exits with one line."""
    try:
        return sweep.parse_int_list(m_text, "--m", minimum=1), sweep.parse_shapes(shapes_text)
    except ValueError as exc:
        raise SystemExit(f"crosscheck: {exc}")


def bf16_matmul(args, out):
    x, w = args  # x [M, K], w [N, K]
    return lambda: torch.mm(x, w.t(), out=out)


def do_bench_median_us(fn) -> float:
    import triton.testing

    try:
        ms = triton.testing.do_bench_cudagraph(fn, return_mode="median")
    except TypeError:  # older triton: no return_mode
        ms = triton.testing.do_bench_cudagraph(fn, quantiles=[0.5])
    return float(ms[0] if isinstance(ms, (list, tuple)) else ms) * 1e3


def measure_point(m: int, n: int, k: int, config: bench.TimerConfig) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    # Interleaved rounds, alternating which timer goes first: at compute-bound sizes the card sits
    # at its power limit and its clock drifts by 10-20% within seconds, so one back-to-back pair
    # compares clock states rather than timers.
    warm_config = dataclasses.replace(config, cold_l2=False)
    warm_runs, reference_runs = [], []
    for round_index in range(ROUNDS):
        pair = [lambda: warm_runs.append(bench.time_call(bf16_matmul, (x, w), out, warm_config, "cuda")),
                lambda: reference_runs.append(do_bench_median_us(bf16_matmul((x, w), out)))]
        for measure in (pair if round_index % 2 == 0 else pair[::-1]):
            measure()
    warm = sorted(warm_runs, key=lambda timing: timing.median_us)[ROUNDS // 2]
    reference_us = statistics.median(reference_runs)
    cold = bench.time_call(bf16_matmul, (x, w), out, dataclasses.replace(config, cold_l2=True),
                           "cuda")
    ratio = warm.median_us / reference_us
    moved = (m * k + n * k + m * n) * 2
    return {
        "m": m, "n": n, "k": k,
        "fp4lab_warm_us": warm.median_us, "fp4lab_warm_p20_us": warm.p20_us,
        "fp4lab_warm_p80_us": warm.p80_us, "fp4lab_warm_graph": warm.graph,
        "do_bench_cudagraph_us": reference_us,
        "ratio": ratio, "pass": abs(ratio - 1) <= AGREEMENT,
        "fp4lab_warm_rounds_us": [t.median_us for t in warm_runs],
        "do_bench_rounds_us": reference_runs,
        "fp4lab_cold_us": cold.median_us, "fp4lab_cold_p20_us": cold.p20_us,
        "fp4lab_cold_p80_us": cold.p80_us, "cold_copies": cold.copies, "cold_note": cold.note,
        "cold_tbps": moved / cold.median_us / 1e6,
        "cold_tflops": 2 * m * n * k / cold.median_us / 1e6,
        "sm_clock_mhz": warm.sm_clock_mhz, "weight_mb": n * k * 2 / 1e6,
    }


def point_line(point: dict) -> str:
    return (f"{point['n']:>6}x{point['k']:<6} M={point['m']:>5}  "
            f"fp4lab warm {point['fp4lab_warm_us']:>9.2f} us  "
            f"do_bench {point['do_bench_cudagraph_us']:>9.2f} us  "
            f"ratio {point['ratio']:5.3f} {'PASS' if point['pass'] else 'FAIL'}  "
            f"cold {point['fp4lab_cold_us']:>9.2f} us {point['cold_tbps']:5.2f} TB/s "
            f"{point['cold_tflops']:7.1f} TFLOP/s  x{point['cold_copies']:<3} "
            f"{point['sm_clock_mhz'] or '-':>6} MHz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--m", default=DEFAULT_M, help=f"M values (default {DEFAULT_M})")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="weight shapes NxK")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("crosscheck: needs a CUDA GPU (torch sees none); nothing measured", file=sys.stderr)
        return 2
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(bench.TimerConfig.full(), repeats=args.repeats)
    print(f"warm-up: SM clock {bench.warm_up_clocks('cuda', config)} MHz", flush=True)
    points = []
    m_values, shapes = parse_grid(args.m, args.shapes)
    for n, k in shapes:
        for m in m_values:
            points.append(measure_point(m, n, k, config))
            print(point_line(points[-1]), flush=True)
    failures = [p for p in points if not p["pass"]]
    summary = (f"{len(points) - len(failures)}/{len(points)} points within "
               f"{AGREEMENT:.0%} of do_bench_cudagraph")
    out_path.write_text(json.dumps({"provenance": provenance(), "timer": dataclasses.asdict(config),
                                    "agreement": AGREEMENT, "summary": summary,
                                    "points": points}, indent=2, default=str))
    print(summary)
    print(f"wrote {out_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
