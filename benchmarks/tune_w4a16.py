"""Tune `triton-w4a16`'s tiles: a small grid of TileConfigs per (shape, M), checked, then timed.

For each weight shape N x K and each M (nvfp4 everywhere, mxfp4 at a few points) the script tries
`choose_config`'s pick and a few neighbours for that M regime. Every config passes the
correctness gate (`fp4lab.correctness`, relative Frobenius error against float64) before it is
timed with `fp4lab.bench.time_call` (short settings, cold L2, CUDA graph); configs that fail to
compile, fail the gate, or take far longer than the best one on a single probe call are reported
and skipped. cuBLAS bf16 (`torch-bf16`) is timed beside each point. One fixed-width line per
(shape, M, config); then the best config per point, and a `SHAPE_PRESETS` block to paste into
`src/fp4lab/backends/triton_w4a16.py`. JSON to --out. The whole run stays within --budget-s.

Usage on the GPU machine (after `source benchmarks/device_setup.sh`):
    python3 benchmarks/tune_w4a16.py --out $OUT/tune_w4a16.json
On a CPU, for a logic check only: TRITON_INTERPRET=1 ... --device cpu --shapes 32x64 --m 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp4lab import bench, correctness, formats, roofline, sweep
from fp4lab.backends import get
from fp4lab.backends.triton_w4a16 import TileConfig, auto_split_k, choose_config, sm_count
from fp4lab.results import provenance

DEFAULT_SHAPES = "6144x2048,4096x6144,8192x8192"   # GLM-5 down, gate_up, and a square one
DEFAULT_M = "1,16,64,256,1024,4096,16384"
DEFAULT_MXFP4_POINTS = "6144x2048:1,6144x2048:256,6144x2048:4096,4096x6144:16"
DEFAULT_BUDGET_S = 160.0
PRUNE_FACTOR = 4.0          # a probe call this many times slower than the best is not timed
PRUNE_MIN_US = 50.0         # ... unless it is this fast anyway (launch noise dominates)
SEED = 0


@dataclass(frozen=True)
class Point:
    fmt: str
    n: int
    k: int
    m: int

    def label(self) -> str:
        return f"{self.n:>5}x{self.k:<5} M={self.m:>5} {self.fmt:<5}"


@dataclass
class Budget:
    """Seconds left for the whole run, shared out evenly over the points still to measure."""

    total_s: float
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.total_s - (time.monotonic() - self.started)

    def per_point_s(self, points_left: int) -> float:
        return self.left_s() / max(points_left, 1)


# --- the grid ------------------------------------------------------------------------------------

def regime_candidates(m: int) -> list[TileConfig]:
    """Neighbours of the generic preset for M's regime (split-K is added per shape later)."""
    if m <= 16:
        return [
            TileConfig(block_m=16, block_n=64, block_k=128, num_stages=4, swap_ab=True),
            TileConfig(block_m=16, block_n=128, block_k=128, num_stages=4, swap_ab=True),
            TileConfig(block_m=16, block_n=64, block_k=256, num_stages=3, swap_ab=True),
            TileConfig(block_m=16, block_n=64, block_k=128, num_stages=4),
            TileConfig(block_m=16, block_n=32, block_k=256, num_stages=4),
        ]
    if m <= 64:
        block_m = max(16, 1 << (m - 1).bit_length())
        return [
            TileConfig(block_m=block_m, block_n=64, block_k=128, num_stages=4, swap_ab=True),
            TileConfig(block_m=block_m, block_n=128, block_k=128, num_stages=3, swap_ab=True),
            TileConfig(block_m=block_m, block_n=64, block_k=128, num_stages=4),
            TileConfig(block_m=block_m, block_n=128, block_k=64, num_stages=3),
        ]
    if m <= 256:
        return [
            TileConfig(block_m=64, block_n=128, block_k=64, num_stages=3),
            TileConfig(block_m=64, block_n=128, block_k=128, num_stages=3),
            TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
            TileConfig(block_m=64, block_n=128, block_k=128, num_stages=3, swap_ab=True),
        ]
    return [
        TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
        TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
        TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
        TileConfig(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
        TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
    ]


def candidates(point: Point, sms: int) -> list[TileConfig]:
    """choose_config's pick first, then its regime's neighbours (split-K by SM count), plus the
    pick without split-K at small M to show what the split buys; no duplicates."""
    pick = choose_config(point.m, point.n, point.k, sms)
    grid = [pick] + [auto_split_k(c, point.m, point.n, point.k, sms)
                     for c in regime_candidates(point.m)]
    if pick.split_k > 1:
        grid.append(dataclasses.replace(pick, split_k=1))
    return list(dict.fromkeys(grid))


# --- measuring one config ------------------------------------------------------------------------

def probe_us(call, device: str) -> float:
    """One eager call's time: enough to drop configs that are hopeless before timing them."""
    if device == "cpu":
        start = time.perf_counter()
        call()
        return (time.perf_counter() - start) * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def context_alive(device: str) -> bool:
    """False when an error left the CUDA context unusable (illegal address and the like)."""
    if device == "cpu":
        return True
    try:
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def measure(backend_name: str, a, w, point: Point, device: str, timer: bench.TimerConfig,
            tolerance: float, config: TileConfig | None = None, prune_above_us=None) -> dict:
    """Gate, probe, then time one (backend, config) at one point; a row whatever happens."""
    row = {**dataclasses.asdict(point), "backend": backend_name,
           "config": None if config is None else dataclasses.asdict(config),
           "config_label": backend_name if config is None else config.label()}
    backend = get(backend_name)
    try:
        prepared = (backend.prepare(a, w, device) if config is None
                    else backend.prepare(a, w, device, config=config))
        gate = correctness.check_backend(prepared, tolerance)
    except Exception as exc:  # noqa: BLE001 - a config that cannot compile or run is a result
        return {**row, "status": "error", "message": first_line(exc)}
    row.update(rel_err=gate.rel_err, message=gate.message)
    if not gate.ok:
        return {**row, "status": gate.status}
    row["probe_us"] = probe_us(prepared.call, device)
    if prune_above_us is not None and row["probe_us"] > prune_above_us:
        return {**row, "status": "pruned",
                "message": f"probe {row['probe_us']:.1f} us > {prune_above_us:.1f} us "
                           f"({PRUNE_FACTOR:g}x the best probe): not timed"}
    timing = bench.time_call(prepared.make_call, prepared.args, prepared.out, timer, device)
    moved = roofline.gemm_bytes(point.m, point.n, point.k, "fp4" if config else "bf16",
                                point.fmt if config else None, act_dtype="bf16")
    return {**row, "status": "ok", "timing": dataclasses.asdict(timing),
            "median_us": timing.median_us, "tbps": moved / timing.median_us / 1e6,
            "tflops": roofline.gemm_flops(point.m, point.n, point.k) / timing.median_us / 1e6,
            "line": bench.format_timing_line(row["config_label"], timing)}


def row_line(point: Point, row: dict, cublas_us: float | None) -> str:
    """One fixed-width line: the point, then the timer's line (or why there is no time)."""
    if row["status"] != "ok":
        reason = row.get("message", "")
        return f"{point.label()} {row['config_label']:<36.36} {row['status']:>12}  {reason[:110]}"
    versus = f"{cublas_us / row['median_us']:6.2f}x cuBLAS" if cublas_us else ""
    return (f"{point.label()} {row['line']}  {row['tbps']:5.2f} TB/s {row['tflops']:7.1f} "
            f"TFLOP/s {versus}")


# --- one point -----------------------------------------------------------------------------------

def operands(point: Point, device: str, weights_cache: dict):
    """Activations [M, K] bf16 and FP4 weights [N, K] (quantized once per shape and format)."""
    gen = torch.Generator(device=device).manual_seed(SEED + point.m)
    a = torch.randn(point.m, point.k, generator=gen, device=device).to(torch.bfloat16)
    key = (point.fmt, point.n, point.k)
    if key not in weights_cache:
        w_gen = torch.Generator(device=device).manual_seed(SEED)
        dense = torch.randn(point.n, point.k, generator=w_gen, device=device)
        weights_cache[key] = formats.quantize(dense, point.fmt)
    return a, weights_cache[key]


def tune_point(point: Point, grid: list[TileConfig], device: str, timer: bench.TimerConfig,
               seconds: float, weights_cache: dict) -> tuple[dict, list[dict]]:
    """(the cuBLAS bf16 row, the triton rows) for one point, stopping after `seconds`."""
    deadline = time.monotonic() + seconds
    a, w = operands(point, device, weights_cache)
    cublas = measure("torch-bf16", a, w, point, device, timer, correctness.TOLERANCE["bf16"])
    cublas_us = cublas.get("median_us")
    print(row_line(point, cublas, None), flush=True)
    rows, best_probe = [], None
    for index, config in enumerate(grid):
        if index > 0 and time.monotonic() > deadline:
            skipped = [c.label() for c in grid[index:]]
            rows.append({**dataclasses.asdict(point), "backend": "triton-w4a16",
                         "status": "skipped", "skipped": skipped,
                         "message": f"point budget {seconds:.0f} s spent"})
            print(f"{point.label()} budget spent: skipped {', '.join(skipped)}", flush=True)
            break
        prune = None if best_probe is None else max(PRUNE_FACTOR * best_probe, PRUNE_MIN_US)
        row = measure("triton-w4a16", a, w, point, device, timer,
                      correctness.TOLERANCE[point.fmt], config, prune)
        if cublas_us and row["status"] == "ok":
            row["vs_cublas"] = cublas_us / row["median_us"]
        rows.append(row)
        print(row_line(point, row, cublas_us), flush=True)
        if "probe_us" in row:
            best_probe = min(best_probe or row["probe_us"], row["probe_us"])
        if row["status"] == "error" and not context_alive(device):
            raise RuntimeError(f"the CUDA context died at {point.label()} {config.label()}: "
                               f"{row['message']}")
    return cublas, rows


# --- summary -------------------------------------------------------------------------------------

def best_rows(results: list[dict]) -> list[dict]:
    """The fastest gated config per point, with cuBLAS bf16 beside it."""
    best = []
    for result in results:
        timed = [r for r in result["rows"] if r["status"] == "ok"]
        if not timed:
            best.append({**result["point"], "best": None, "cublas_us": result["cublas_us"]})
            continue
        winner = min(timed, key=lambda r: r["median_us"])
        best.append({**result["point"], "best": winner["config"], "label": winner["config_label"],
                     "median_us": winner["median_us"], "tbps": winner["tbps"],
                     "cublas_us": result["cublas_us"],
                     "vs_cublas": winner.get("vs_cublas"),
                     "pick_us": next((r["median_us"] for r in timed
                                      if r["config"] == result["pick"]), None)})
    return best


def best_table(best: list[dict]) -> str:
    header = (f"{'shape':>11} {'M':>6} {'fmt':<5} {'best config':<32} {'us':>9} {'TB/s':>6} "
              f"{'cuBLAS us':>10} {'speedup':>9} {'pick us':>9}")
    lines = [header, "-" * len(header)]
    for b in best:
        shape = f"{b['n']}x{b['k']}"
        cublas = f"{b['cublas_us']:10.2f}" if b["cublas_us"] else f"{'-':>10}"
        if b["best"] is None:
            lines.append(f"{shape:>11} {b['m']:>6} {b['fmt']:<5} {'(nothing passed/timed)':<32} "
                         f"{'-':>9} {'-':>6} {cublas}")
            continue
        ratio = f"{b['vs_cublas']:9.2f}" if b.get("vs_cublas") else f"{'-':>9}"
        pick = f"{b['pick_us']:9.2f}" if b.get("pick_us") else f"{'-':>9}"
        lines.append(f"{shape:>11} {b['m']:>6} {b['fmt']:<5} {b['label']:<32} "
                     f"{b['median_us']:9.2f} {b['tbps']:6.2f} {cublas} {ratio} {pick}")
    return "\n".join(lines)


def config_source(config: TileConfig) -> str:
    """`TileConfig(...)` naming only the fields that differ from the defaults, so a pasted
    preset line stays short and shows what was tuned."""
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if f.default is dataclasses.MISSING or getattr(config, f.name) != f.default]
    return f"TileConfig({', '.join(changed)})"


def shape_presets_snippet(best: list[dict]) -> str:
    """SHAPE_PRESETS from the nvfp4 winners: each measured M covers the M values above the
    previous measured one; the largest covers everything beyond (None)."""
    by_shape: dict[tuple[int, int], list[dict]] = {}
    for b in best:
        if b["fmt"] == "nvfp4" and b["best"] is not None:
            by_shape.setdefault((b["n"], b["k"]), []).append(b)
    lines = ["SHAPE_PRESETS: dict[tuple[int, int], tuple[tuple[int | None, TileConfig], ...]] = {"]
    for (n, k), winners in by_shape.items():
        winners = sorted(winners, key=lambda b: b["m"])
        lines.append(f"    ({n}, {k}): (")
        for index, b in enumerate(winners):
            m_max = "None" if index == len(winners) - 1 else str(b["m"])
            lines.append(f"        ({m_max}, {config_source(TileConfig(**b['best']))}),")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------------

def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """NxK,... through the sweep's parser, with the kernel's own limit on K."""
    try:
        shapes = sweep.parse_shapes(text)
    except ValueError as exc:
        raise SystemExit(f"tune_w4a16: --{exc}")
    for n, k in shapes:
        if n < 1 or k < 32 or k % 32:
            raise SystemExit(f"tune_w4a16: --shapes {n}x{k}: need N >= 1 and K a multiple of 32")
    return shapes


def parse_m(text: str) -> tuple[int, ...]:
    try:
        return sweep.parse_int_list(text, "--m", minimum=1)
    except ValueError as exc:
        raise SystemExit(f"tune_w4a16: {exc}")


def parse_mxfp4_points(text: str) -> list[Point]:
    points = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            shape, m = part.split(":")
            (n, k), = parse_shapes(shape)
            points.append(Point("mxfp4", n, k, int(m)))
        except ValueError:
            raise SystemExit(f"tune_w4a16: --mxfp4-points takes NxK:M,..., got {part!r}")
    return points


def plan(args) -> list[Point]:
    """nvfp4 at every shape x M, then the mxfp4 points; GLM-5 shapes first so a cut run has them."""
    points = [Point("nvfp4", n, k, m)
              for n, k in parse_shapes(args.shapes) for m in parse_m(args.m)]
    return points + parse_mxfp4_points(args.mxfp4_points)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"NxK list ({DEFAULT_SHAPES})")
    parser.add_argument("--m", default=DEFAULT_M, help=f"M values ({DEFAULT_M})")
    parser.add_argument("--mxfp4-points", default=DEFAULT_MXFP4_POINTS,
                        help=f"NxK:M list timed in mxfp4 too ({DEFAULT_MXFP4_POINTS}); '' for none")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu only under TRITON_INTERPRET=1, to check the script's logic")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune_w4a16: needs a CUDA GPU (torch sees none); nothing measured", file=sys.stderr)
        return 2
    if args.budget_s <= 0:
        raise SystemExit(f"tune_w4a16: --budget-s must be > 0, got {args.budget_s}")
    points = plan(args)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    timer = bench.TimerConfig.smoke()
    sms = sm_count(args.device)
    print(f"tune_w4a16: {len(points)} points, {args.budget_s:g} s budget, {sms} SMs", flush=True)

    results, weights_cache, stopped = [], {}, ""
    for index, point in enumerate(points):
        if budget.left_s() <= 0:
            stopped = f"budget spent before {len(points) - index} points: " + ", ".join(
                p.label().replace("  ", " ") for p in points[index:])
            print(f"tune_w4a16: {stopped}", flush=True)
            break
        grid = candidates(point, sms)
        try:
            cublas, rows = tune_point(point, grid, args.device, timer,
                                      budget.per_point_s(len(points) - index), weights_cache)
        except RuntimeError as exc:  # a dead CUDA context: keep what was measured
            stopped = str(exc)
            print(f"tune_w4a16: stopping, {stopped}", flush=True)
            break
        results.append({"point": dataclasses.asdict(point), "cublas_us": cublas.get("median_us"),
                        "cublas": cublas, "pick": dataclasses.asdict(grid[0]), "rows": rows})

    best = best_rows(results)
    table, snippet = best_table(best), shape_presets_snippet(best)
    print("\nbest config per point (cold L2, CUDA graph; speedup = cuBLAS bf16 us / best us; "
          "pick = choose_config's choice)")
    print(table)
    print("\n# paste into src/fp4lab/backends/triton_w4a16.py "
          "(measured by benchmarks/tune_w4a16.py)")
    print(snippet)
    out_path.write_text(json.dumps({
        "provenance": provenance(), "timer": dataclasses.asdict(timer), "sm_count": sms,
        "budget_s": args.budget_s, "elapsed_s": args.budget_s - budget.left_s(),
        "stopped": stopped, "results": results, "best": best, "shape_presets": snippet,
    }, indent=2, default=str))
    print(f"wrote {out_path} ({args.budget_s - budget.left_s():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
