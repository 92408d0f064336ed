"""Does the NVML sampler disturb what it watches? (issue 4, item 3)

Times the same bf16 GEMM points with and without `fp4lab.telemetry.Sampler` running, interleaved
over several rounds (the order flips each round so clock drift does not favour either side), and
reports the median paired change of the timer's median. If it is >= 1% at the first rate, the
next (lower) rate is tried; the highest rate under 1% is the answer. One fixed-width line per
point, JSON to --out.

    python benchmarks/telemetry_overhead.py --out overhead.json            # on the H200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from fp4lab import bench
from fp4lab.telemetry import Sampler

THRESHOLD_PCT = 1.0
SAMPLER_SETTLE_S = 0.2  # let the sampler reach its steady rhythm before timing


@dataclass
class OverheadConfig:
    ms: tuple[int, ...] = (1, 64, 1024)
    shapes: tuple[tuple[int, int], ...] = ((6144, 2048), (8192, 8192))   # (N, K)
    rates_hz: tuple[float, ...] = (20.0, 10.0, 5.0)
    rounds: int = 5
    repeats: int = 30
    device: str = "cuda"


def make_point(m: int, n: int, k: int, device: str):
    """bf16 a[M, K] @ w[N, K]^T -> out[M, N], in the timer's (make_call, args, out) form."""
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)

    def make_call(args, out_):
        return lambda: torch.mm(args[0], args[1].t(), out=out_)

    return make_call, (a, w), out


def time_point(point, timer: bench.TimerConfig, device: str, rate_hz: float | None) -> float:
    make_call, args, out = point
    if rate_hz is None:
        return bench.time_call(make_call, args, out, timer, device).median_us
    with Sampler(rate_hz):
        time.sleep(SAMPLER_SETTLE_S)
        return bench.time_call(make_call, args, out, timer, device).median_us


def measure_rate(config: OverheadConfig, rate_hz: float, echo=print) -> dict:
    """Per point: median over rounds of (with - without) / without, in %."""
    timer = bench.TimerConfig(repeats=config.repeats)
    points = []
    for n, k in config.shapes:
        for m in config.ms:
            point = make_point(m, n, k, config.device)
            changes, plain_us, sampled_us = [], [], []
            for round_index in range(config.rounds):
                order = (None, rate_hz) if round_index % 2 == 0 else (rate_hz, None)
                timed = {rate: time_point(point, timer, config.device, rate) for rate in order}
                plain_us.append(timed[None])
                sampled_us.append(timed[rate_hz])
                changes.append(100.0 * (timed[rate_hz] - timed[None]) / timed[None])
            row = {"m": m, "n": n, "k": k, "rate_hz": rate_hz,
                   "median_us_without": statistics.median(plain_us),
                   "median_us_with": statistics.median(sampled_us),
                   "change_pct": statistics.median(changes), "changes_pct": changes}
            echo(f"{rate_hz:>5.0f} Hz  M {m:>5}  N {n:>5}  K {k:>5}  without {row['median_us_without']:>10.2f} us"
                 f"  with {row['median_us_with']:>10.2f} us  change {row['change_pct']:>+7.2f}%")
            points.append(row)
            del point
    all_changes = [c for row in points for c in row["changes_pct"]]
    return {"rate_hz": rate_hz, "points": points, "median_change_pct": statistics.median(all_changes),
            "worst_point_change_pct": max((row["change_pct"] for row in points), key=abs)}


def measure_overhead(config: OverheadConfig, echo=print) -> dict:
    """Try each rate from the highest down; stop at the first whose median change is < 1%."""
    sampler = Sampler(config.rates_hz[0])
    result = {"config": dataclasses.asdict(config), "threshold_pct": THRESHOLD_PCT,
              "sampler_available": sampler.available, "reason": sampler.reason, "rates": [],
              "highest_rate_under_threshold_hz": None}
    if not sampler.available:
        echo(f"the sampler cannot run here ({sampler.reason}): its overhead is not measurable")
        return result
    for rate_hz in config.rates_hz:
        measured = measure_rate(config, rate_hz, echo)
        result["rates"].append(measured)
        echo(f"{rate_hz:>5.0f} Hz  median change {measured['median_change_pct']:+.2f}%, worst point "
             f"{measured['worst_point_change_pct']:+.2f}%")
        if abs(measured["median_change_pct"]) < THRESHOLD_PCT:
            result["highest_rate_under_threshold_hz"] = rate_hz
            break
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=OverheadConfig.rounds)
    parser.add_argument("--repeats", type=int, default=OverheadConfig.repeats)
    parser.add_argument("--rates", type=float, nargs="+", default=list(OverheadConfig.rates_hz))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    if args.rounds < 2 or args.repeats < 1:
        print("error: --rounds must be >= 2 and --repeats >= 1", file=sys.stderr)
        return 2
    config = OverheadConfig(rounds=args.rounds, repeats=args.repeats, rates_hz=tuple(args.rates),
                            device=args.device)
    result = measure_overhead(config)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)
    verdict = result["highest_rate_under_threshold_hz"]
    print(f"highest rate under {THRESHOLD_PCT:g}%: {f'{verdict:g} Hz' if verdict else 'none'}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
