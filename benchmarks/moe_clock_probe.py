"""The fused MoE's time beside the SM clock and the board power under a sustained load:
humming-moe-indexed, then `cuda-w4a16-moe`'s preset, at GLM-5 B = 512 (uniform routing), each
gated against the float64 layer, then replayed back to back for `--seconds` while fp4lab's
telemetry sampler reads NVML (SM clock, power, clock-event reasons, power-violation time).

Why: call 108 (H200) timed the preset's samples in two groups (p20 1.79 ms, median 2.05 ms NVFP4)
while the SM clock read before and after them was 1980 and ~1700 MHz; the peers' points held
1980. This says whether the slow group is the clock, and what lowered it.

    PYTHONPATH=src python3 benchmarks/moe_clock_probe.py --out $OUT/clock [--seconds 8] [--fmt nvfp4]
        [--rest-s 3] [--methods humming-moe-indexed,cuda-w4a16-moe]

Writes replays.jsonl (one row a replay: method, host time at its end, us a call) and
telemetry.jsonl (the sampler's rows); prints, per method, the replays grouped by the SM clock of
the telemetry sample nearest each, and the power and clock-event reasons seen.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h200_kernels as kernels  # noqa: E402  (the models' weights)

from fp4lab import bench, telemetry  # noqa: E402
from fp4lab.analysis.moe import SLOW_CLOCK_SHARE  # noqa: E402  (the book's "slow clock")
from fp4lab.analysis.power import reason_counts  # noqa: E402
from fp4lab.backends.moe import base as moe_base, get as get_moe  # noqa: E402
from fp4lab.moe import routing  # noqa: E402

METHODS = ("humming-moe-indexed", "cuda-w4a16-moe")
CLOCK_BINS_MHZ = (0, 1800, 1950, 10_000)       # throttled, part-way, at the boost clock
MIN_REPLAY_MS = 20.0                           # calls a replay: the sync between replays ~0.1%


def sustained_replays(call, seconds: float) -> list[dict]:
    """`call` captured `n` times in a CUDA graph, replayed back to back for `seconds`: per
    replay the host time at its end and the GPU time a call (us)."""
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    n = max(1, round(MIN_REPLAY_MS / start.elapsed_time(end)))
    graph, failure = bench.capture_graph(lambda: [call() for _ in range(n)], torch.device("cuda"))
    if graph is None:
        raise RuntimeError(failure)
    rows, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        rows.append({"t": time.time(), "us": start.elapsed_time(end) * 1e3 / n, "calls": n})
    return rows


def onset_words(frame, window) -> str:
    """When the SM clock first fell under SLOW_CLOCK_SHARE of the window's highest reading,
    counted from the end of the first replay (load began one replay earlier), and the calls'
    time before and after: what a timer's burst of that length would see."""
    t0 = frame["t"].min() - frame["us"].iloc[0] * frame["calls"].iloc[0] / 1e6
    top = window["sm_clock_mhz"].max()
    fallen = window[window["sm_clock_mhz"] < SLOW_CLOCK_SHARE * top]
    if fallen.empty:
        return f"SM clock held {top:.0f} MHz throughout"
    onset = fallen["t"].iloc[0] - t0
    before, after = frame[frame["t"] < t0 + onset], frame[frame["t"] >= t0 + onset + 0.5]
    settled = window[window["t"] >= fallen["t"].iloc[0] + 0.5]["sm_clock_mhz"].median()
    return (f"SM clock fell under {SLOW_CLOCK_SHARE:.0%} of {top:.0f} MHz {onset:.3f} s into the load; "
            f"calls before {before['us'].median():.1f} us ({len(before)} replays), from 0.5 s after "
            f"{after['us'].median():.1f} us at {settled:.0f} MHz")


def summary(method: str, replays, samples) -> list[str]:
    """Lines: the replays by the SM clock nearest them (count, median and p20-p80 us), then the
    power and the clock-event reasons over the method's window."""
    import pandas as pd

    frame = pd.merge_asof(pd.DataFrame(replays).sort_values("t"),
                          samples[["t", "sm_clock_mhz"]].sort_values("t"), on="t",
                          direction="nearest")
    frame["clock"] = pd.cut(frame["sm_clock_mhz"], CLOCK_BINS_MHZ, right=False)
    lines = []
    for clock, group in frame.groupby("clock", observed=True):
        us = group["us"]
        lines.append(f"{method:22s} SM clock {str(clock):14s} {len(us):5d} replays  median "
                     f"{us.median():8.1f} us  p20-p80 {us.quantile(0.2):8.1f}-{us.quantile(0.8):8.1f}")
    window = samples[(samples["t"] >= frame["t"].min()) & (samples["t"] <= frame["t"].max())]
    lines.append(f"{method:22s} {onset_words(frame, window)}")
    reasons = sorted(reason_counts(window["throttle_reasons"]))
    lines.append(f"{method:22s} power {window['power_instant_w'].median():6.0f} W median, "
                 f"{window['power_instant_w'].max():6.0f} W max (limit {window['power_limit_w'].max():.0f}); "
                 f"SM clock {window['sm_clock_mhz'].min():.0f}-{window['sm_clock_mhz'].max():.0f} MHz; "
                 f"clock-event reasons: {', '.join(reasons) or 'none read'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate-hz", type=float, default=100.0)
    parser.add_argument("--fmt", default="nvfp4", choices=("nvfp4", "mxfp4"))
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rest-s", type=float, default=3.0,
                        help="idle before each method's load, so the board's power average starts low")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_clock_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    model = kernels.moe_model("glm-5", False)
    weights = (moe_base.quantized_expert_weights(model.experts, 2 * model.moe_intermediate,
                                                 model.hidden, args.fmt, "cuda"),
               moe_base.quantized_expert_weights(model.experts, model.hidden,
                                                 model.moe_intermediate, args.fmt, "cuda", seed=1))
    ids = routing.sample_expert_ids("uniform", model.experts, model.top_k, args.batch, 1)[0]
    problem = moe_base.make_layer_problem(ids, model.experts, model.hidden, model.moe_intermediate,
                                          args.fmt, "cuda", weights=weights)
    calls = {}
    for method in args.methods.split(","):
        try:
            call = get_moe(method).prepare(problem)
        except Exception as exc:  # noqa: BLE001 - a method that cannot run here is left out
            print(f"{method:22s} unavailable: {exc}")
            continue
        gate = moe_base.check_call(call, problem)
        print(f"{method:22s} gate {gate.status}: {gate.message}")
        if gate.ok:
            calls[method] = call
    replays: dict[str, list[dict]] = {}
    with telemetry.Sampler(rate_hz=args.rate_hz) as sampler:
        for method, call in calls.items():
            time.sleep(args.rest_s)              # from rest: the onset of the power cap is timed
            replays[method] = sustained_replays(call.call, args.seconds)
    samples = sampler.frame
    with open(args.out / "replays.jsonl", "w") as out:
        for method, rows in replays.items():
            for row in rows:
                out.write(json.dumps({"method": method, "fmt": args.fmt, "batch": args.batch, **row}) + "\n")
    samples.to_json(args.out / "telemetry.jsonl", orient="records", lines=True)
    if not sampler.available or samples.empty:
        print(f"no telemetry: {sampler.reason}")
        return 1
    for method, rows in replays.items():
        print("\n".join(summary(method, rows, samples)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
