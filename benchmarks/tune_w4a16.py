"""Tune `triton-w4a16`: a pruned grid of TileConfigs per (format, N x K, M), gated, then timed.

For each point the grid is choose_config's pick (the measured winner once SHAPE_PRESETS holds
the shape), its pipeline depth varied, then a few tile shapes for M's regime, each at the split-K
counts that put about 2 and 4 CTAs on every SM. Every config passes the
correctness gate (`fp4lab.correctness.check_backend`, float64 reference) before it is timed with
`fp4lab.bench.time_call` (cold L2, CUDA graph); a config that fails to compile, fails the gate
or raises is a row with its reason, never a time. The winners become `presets.json` rows
(`triton_w4a16.presets_from_json` loads them back as SHAPE_PRESETS). A compile is per tile shape
(M and the split count are runtime arguments of the kernel), so the grid costs few compiles.

Used by benchmarks/h200_kernels.py; alone on the GPU machine:
    PYTHONPATH=src python3 benchmarks/tune_w4a16.py --out $OUT
On a CPU, for a logic check only: TRITON_INTERPRET=1 ... --device cpu --shapes 40x64 --m 1,3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4lab import bench, correctness, formats, roofline
from fp4lab.backends import get
from fp4lab.backends.triton_w4a16 import (
    LAYOUTS, LOADS, MAX_SPLIT_K, MIN_K_BLOCKS_PER_SPLIT, TileConfig, choose_config, sm_count,
)

DEFAULT_SHAPES = "8192x8192,4096x6144,6144x2048"   # square, GLM-5 gate_up, GLM-5 down
DEFAULT_M = "1,4,16,64,256"
DEFAULT_FORMATS = "nvfp4,mxfp4"
SEED = 0
CTAS_PER_SM_CHOICES = (1, 2, 4)     # whole waves of CTAs: 1, 2 or 4 per SM
AB_ROUNDS = 4                       # rounds of `alternate`: A B A B A B A B


@contextlib.contextmanager
def kernel_source_from(module, path: Path):
    """A CUDA backend `module` (cuda_w4a16, moe.cuda_fused) built from another kernel file while
    inside: its KERNEL_SOURCE swapped, so that its builds come from that file (each compiled
    once: the builds are cached by kernel file), the package's own file's after (a probe's
    --baseline-kernel: the code a change replaces, timed in the same call)."""
    saved = module.KERNEL_SOURCE
    module.KERNEL_SOURCE = path
    try:
        yield
    finally:
        module.KERNEL_SOURCE = saved


def baseline_kernels(paths: list[Path]) -> tuple[Path, ...]:
    """--baseline-kernel's files, each checked before any GPU work."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"--baseline-kernel: no file {path}")
    return tuple(paths)


def script_device(script: str, smoke: bool) -> str | None:
    """"cuda" where torch sees a GPU, "cpu" for a --smoke run, else None after saying on stderr
    that `script` needs a GPU (the caller exits 2)."""
    if torch.cuda.is_available():
        return "cuda"
    if smoke:
        return "cpu"
    print(f"{script}: needs a CUDA GPU (torch sees none); use --smoke on a CPU", file=sys.stderr)
    return None


def device_timer() -> bench.TimerConfig:
    """What the sweep uses on GPUs."""
    return bench.TimerConfig(repeats=30, warmup_s=1.0)


@dataclass(frozen=True)
class Point:
    fmt: str
    n: int
    k: int
    m: int

    def label(self) -> str:
        return f"{self.n}x{self.k} M={self.m} {self.fmt}"


# --- the grid ------------------------------------------------------------------------------------

def tile_shapes(m: int) -> list[TileConfig]:
    """Tile shapes worth compiling for M's regime besides the pick (split-K is added per point).

    M <= 16 (the weight tile is the MMA's M side): the offline sm_90 SASS of the main loop in the
    halves layout (m16n64k256, 4 warps) has ~4.9 instructions per weight: the decode 2.25, the
    code and scale reads from shared memory and their decode ~0.8, the pipeline's address and
    loop work the rest; the H200 issues ~2 of 4 per cycle per SM there, so at decode the issue
    rate and the stalls between instructions, not the bytes, bound it (benchmarks/NOTES.md, calls
    8 and 20). What can still move it: a longer K step or a wider tile (the loop's fixed work over
    more weights), more warps per SM to issue from (8-warp tiles), smaller tiles with little or no
    split-K (2 warps, mma.sync), and at M <= 4 the gemv kernel first (`gemv_shapes`)."""
    if m <= 16:
        # m16n64k256 split 4: 6% faster than the preset at 6144x2048 M=1 (NOTES.md, call 38)
        shapes = [TileConfig(block_m=16, block_n=64, block_k=256, num_stages=3, swap_ab=True),
                  TileConfig(block_m=16, block_n=64, block_k=512, num_stages=2, swap_ab=True),
                  TileConfig(block_m=16, block_n=128, block_k=256, num_warps=8, num_stages=3,
                             swap_ab=True),
                  TileConfig(block_m=16, block_n=128, block_k=256, num_stages=3, swap_ab=True),
                  TileConfig(block_m=16, block_n=32, block_k=256, num_warps=2, num_stages=4,
                             swap_ab=True)]
        return gemv_shapes(m) + shapes
    # above decode M the weight tile as the MMA's M side too (swap_ab): the decoded weights feed
    # the MMA from registers, where the other way round they go through shared memory first
    # (TMA loads there: calls 31 and 35). Up to M = 64 the 4-warp m64n128k128 swap tile wins on
    # all three shapes, where humming is within 1% at 8192x8192 and 1.4x faster at 4096x6144:
    # beside it two warpgroups on the same tile or a 256-row one (more warps to hide the decode
    # behind the MMAs), a 256 K step on 64 rows (half the loop's fixed work a weight), and the one
    # unswapped tile that won a point once (4096x6144 MXFP4, call 8)
    if m <= 64:
        return [TileConfig(block_m=64, block_n=64, block_k=256, num_stages=3),
                TileConfig(block_m=64, block_n=128, block_k=128, num_stages=3, swap_ab=True),
                TileConfig(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3,
                           swap_ab=True),
                TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=3,
                           swap_ab=True),
                TileConfig(block_m=64, block_n=64, block_k=256, num_stages=3, swap_ab=True)]
    # prefill-sized M: each decoded weight should feed as many rows as possible (the decode is
    # redone for every row tile), so the tiles are tall
    return [TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4),
            TileConfig(block_m=256, block_n=128, block_k=64, num_warps=8),
            TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3,
                       swap_ab=True)]


def gemv_shapes(m: int) -> list[TileConfig]:
    """The CUDA-core gemv kernel's tiles (one activation row a program, 16-byte loads straight
    into registers, ~3.3 instructions per weight in the offline sm_90 SASS against the tensor-
    core kernel's 4.9). Calls 24-25 found it bound by the memory latency of each K step, not by
    instructions, so at M = 1 the tiles keep 3 in flight (num_stages) on 64 or 128 rows or with
    a 512 K step, and one shape keeps 2; above M = 1 every row decodes the weights again, so one
    shape only, to see that cost (benchmarks/NOTES.md)."""
    if m > 4:
        return []
    gemv = TileConfig(block_m=1, block_n=64, block_k=256, num_stages=3, math="gemv")
    if m > 1:
        return [gemv]
    return [gemv, dataclasses.replace(gemv, block_n=128, num_warps=8),
            dataclasses.replace(gemv, block_n=32, block_k=512),
            dataclasses.replace(gemv, num_stages=2)]


def split_choices(config: TileConfig, point: Point, sms: int) -> list[int]:
    """Split counts that fill whole waves of 1, 2 or 4 CTAs per SM without spilling into a
    mostly idle extra wave (so rounded down): the two fullest (1 or 2 a SM for 8-warp tiles); 1
    when the tiles alone fill the GPU."""
    tiles = -(-point.m // config.block_m) * -(-point.n // config.block_n)
    k_blocks = -(-point.k // config.block_k)
    top = max(1, min(MAX_SPLIT_K, k_blocks // MIN_K_BLOCKS_PER_SPLIT))
    splits = {min(top, max(1, per_sm * sms // tiles)) for per_sm in CTAS_PER_SM_CHOICES}
    if len(splits) > 2 and config.num_warps > 4:
        # 8-warp CTAs of ~160 registers a thread: two are resident an SM, so 4 would be 2 waves
        splits = set(sorted(splits)[:2])
    elif len(splits) > 2:       # keep the two fullest waves' worth
        splits = set(sorted(splits)[1:])
    return sorted(splits)


def candidates(point: Point, sms: int, loads=LOADS, layouts=LAYOUTS) -> list[TileConfig]:
    """choose_config's pick first (the measured winner where SHAPE_PRESETS has the shape: the
    yardstick), then on each of `layouts` ("rows", "tiles": each tile's bytes contiguous) and
    `loads` in turn ("pointer": cp.async, "tma": tensor descriptors): the pick, (M <= 64) the
    pick one pipeline stage shallower and two deeper (bytes in flight per SM), every tile shape
    at its split choices (gemv shapes once, with pointer loads and rows: TMA and tiles are the
    tensor-core kernel's), then (M <= 16) the pick with the plain-Triton decode: what the
    inline-PTX decode buys, measured, and a winner even if the PTX decode failed the gate on
    this GPU. No duplicates."""
    pick = choose_config(point.m, point.n, point.k, sms)
    grid = [pick]
    for config in tensor_core_variants(pick, point, sms):
        if config.math == "gemv":
            grid += [config] if "pointer" in loads and "rows" in layouts else []
        else:
            grid += [dataclasses.replace(config, loads=kind, layout=layout)
                     for layout in layouts for kind in loads]
    if point.m <= 16:
        grid.append(dataclasses.replace(pick, decode="bits"))
    return list(dict.fromkeys(grid))


def tensor_core_variants(pick: TileConfig, point: Point, sms: int) -> list[TileConfig]:
    """The pick (when it is a tensor-core config), its pipeline depths, the tile shapes."""
    grid = [pick] if pick.math == "dot" else []
    if point.m <= 64 and pick.math == "dot":
        grid += [dataclasses.replace(pick, num_stages=stages)
                 for stages in (pick.num_stages - 1, pick.num_stages + 2) if 2 <= stages <= 8]
    for shape in tile_shapes(point.m):
        grid += [dataclasses.replace(shape, split_k=s) for s in split_choices(shape, point, sms)]
    return grid


# --- measuring -----------------------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def timing_fields(timing: bench.Timing) -> dict:
    return {"median_us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us,
            "samples": timing.n, "graph": timing.graph, "cold_l2": timing.cold_l2,
            "copies": timing.copies, "sm_clock_mhz": timing.sm_clock_mhz, "timer_note": timing.note}


def gate_and_time(prepare, check, timer: bench.TimerConfig, device: str) -> dict:
    """Prepare, check, then time one variant; a row whatever happens."""
    try:
        prepared = prepare()
        gate = check(prepared)
    except Exception as exc:  # noqa: BLE001 - a config that cannot compile or run is a result
        return {"status": "error", "message": first_line(exc)}
    row = {"status": gate.status, "rel_err": gate.rel_err, "message": gate.message,
           "info": dict(prepared.info)}
    if not gate.ok:
        return row
    try:
        timing = bench.time_call(prepared.make_call, prepared.args, prepared.out, timer, device)
    except Exception as exc:  # noqa: BLE001
        return {**row, "status": "error", "message": "timing: " + first_line(exc)}
    return {**row, **timing_fields(timing)}


def alternate(calls: dict[str, tuple], timer: bench.TimerConfig, device: str,
              rounds: int = AB_ROUNDS) -> dict:
    """Prepared calls (label -> (make_call, args, out)) timed in turn, `rounds` times over
    (A B A B ...), so that a drift of the clock (power, heat) falls on each alike: per label the
    rounds' medians (`round_us`), and for each label after the first the median over rounds of
    its time over the first's in the same round (`ratio`; call 128's single medians of a 2 ms
    MoE call A then B differed by as much as the change being measured)."""
    if rounds < 1 or len(calls) < 2:
        raise ValueError(f"alternate needs 2+ calls and 1+ rounds, got {len(calls)} and {rounds}")
    round_us: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, (make_call, args, out) in calls.items():
            round_us[label].append(bench.time_call(make_call, args, out, timer, device).median_us)
    first = next(iter(calls))
    ratio = {label: statistics.median(t / f for t, f in zip(times, round_us[first]))
             for label, times in round_us.items() if label != first}
    return {"rounds": rounds, "round_us": round_us, "ratio": ratio}


def alternated_row(module, baseline: Path, prepare, check, timer: bench.TimerConfig,
                   device: str) -> dict:
    """`prepare()` built from `baseline` (inside kernel_source_from(module, ...)) and from the
    package's kernel file, both passing `check(prepared)` before either is timed, then timed in
    turn (`alternate`): `ratio`, the package's time over the baseline's, drift cancelled; a row
    whatever happens (a build that cannot compile or run is an error row naming why)."""
    try:
        with kernel_source_from(module, baseline):
            old = prepare()
        new = prepare()
        for prepared in (old, new):
            gate = check(prepared)
            if not gate.ok:
                return {"status": gate.status, "rel_err": gate.rel_err, "message": gate.message}
        result = alternate({"baseline": (old.make_call, old.args, old.out),
                            "current": (new.make_call, new.args, new.out)}, timer, device)
    except Exception as exc:  # noqa: BLE001 - a build that cannot compile or run is a result
        return {"status": "error", "message": first_line(exc)}
    return {"status": "ok", **result,
            "message": f"current / baseline {result['ratio']['current']:.3f} "
                       f"(median of {result['rounds']} alternated rounds)"}


def operands(point: Point, device: str, weights_cache: dict):
    """Activations [M, K] bf16 and FP4 weights [N, K] (quantized once per shape and format)."""
    gen = torch.Generator(device=device).manual_seed(SEED + point.m)
    a = torch.randn(point.m, point.k, generator=gen, device=device).to(torch.bfloat16)
    key = (point.fmt, point.n, point.k)
    if key not in weights_cache:
        w_gen = torch.Generator(device=device).manual_seed(SEED)
        dense = torch.randn(point.n, point.k, generator=w_gen, device=device) * point.k ** -0.5
        weights_cache[key] = formats.quantize(dense, point.fmt)
    return a, weights_cache[key]


def fp4_bytes(point: Point) -> int:
    return roofline.gemm_bytes(point.m, point.n, point.k, "fp4", point.fmt, act_dtype="bf16")


def measure_config(point: Point, config: TileConfig, a, w, device: str,
                   timer: bench.TimerConfig) -> dict:
    backend = get("triton-w4a16")
    row = gate_and_time(lambda: backend.prepare(a, w, device, config=config),
                        lambda p: correctness.check_backend(p, correctness.TOLERANCE[point.fmt]),
                        timer, device)
    row.update(kind="dense", backend="triton-w4a16", **dataclasses.asdict(point),
               config=dataclasses.asdict(config), label=config.label(),
               ctas=config.ctas(point.m, point.n, point.k, sm_count(device)), bytes=fp4_bytes(point))
    if "median_us" in row:
        row["tbps"] = row["bytes"] / row["median_us"] / 1e6
    return row


def measure_cublas(point: Point, a, w, device: str, timer: bench.TimerConfig) -> dict:
    """torch-bf16 (cuBLAS) on the dequantized weights: the yardstick."""
    backend = get("torch-bf16")
    row = gate_and_time(lambda: backend.prepare(a, w, device),
                        lambda p: correctness.check_backend(p, correctness.TOLERANCE["bf16"]),
                        timer, device)
    row.update(kind="cublas", backend="torch-bf16", **dataclasses.asdict(point),
               bytes=roofline.gemm_bytes(point.m, point.n, point.k, "bf16", None))
    if "median_us" in row:
        row["tbps"] = row["bytes"] / row["median_us"] / 1e6
    return row


def tune_point(point: Point, device: str, timer: bench.TimerConfig, weights_cache: dict,
               emit, deadline: float, sms: int, extra: dict | None = None) -> dict | None:
    """Every candidate of `point` (or, where `extra` maps its (N, K) to configs, the pick and
    those), each row passed to `emit`; the fastest timed row (or None). Stops at `deadline`
    (time.monotonic()), emitting what it skipped."""
    a, w = operands(point, device, weights_cache)
    best = None
    chosen = (extra or {}).get((point.n, point.k))
    grid = (list(dict.fromkeys([choose_config(point.m, point.n, point.k, sms), *chosen]))
            if chosen else candidates(point, sms))
    for index, config in enumerate(grid):
        if time.monotonic() > deadline:
            emit({"kind": "dense", "status": "skipped", **dataclasses.asdict(point),
                  "message": f"budget spent: {len(grid) - index} configs not run",
                  "skipped": [c.label() for c in grid[index:]]})
            break
        row = measure_config(point, config, a, w, device, timer)
        row["pick"] = index == 0
        emit(row)
        if "median_us" in row and (best is None or row["median_us"] < best["median_us"]):
            best = row
    return best


# --- presets -------------------------------------------------------------------------------------

def presets_rows(winners: list[dict], fmt: str = "nvfp4") -> list[dict]:
    """presets.json rows from the winners of one format: each measured M covers the M values up
    to it (above the previous measured one), as `triton_w4a16.presets_from_json` reads them."""
    return [{"n": row["n"], "k": row["k"], "m_max": row["m"], "config": row["config"],
             "median_us": row["median_us"]}
            for row in sorted(winners, key=lambda r: (r["n"], r["k"], r["m"]))
            if row["fmt"] == fmt]


# --- command line --------------------------------------------------------------------------------

def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            n, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"tune_w4a16: --shapes takes NxK,..., got {part!r}")
        if n < 1 or k < 64 or k % 32:
            raise SystemExit(f"tune_w4a16: --shapes {part}: need N >= 1, K >= 64 and a multiple "
                             f"of 32")
        shapes.append((n, k))
    return shapes


def parse_m(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"tune_w4a16: --m takes M,..., got {text!r}")
    if not values or min(values) < 1:
        raise SystemExit(f"tune_w4a16: --m values must be >= 1, got {text!r}")
    return values


def parse_configs(path: str) -> dict[tuple[int, int], list[TileConfig]]:
    """--configs: a JSON object {"NxK": [{TileConfig fields}, ...]}, configs to time (after the
    pick) instead of the grid at that shape; a bad file or field is named."""
    try:
        entries = json.loads(Path(path).read_text())
        return {parse_shapes(shape)[0]: [TileConfig(**fields) for fields in configs]
                for shape, configs in entries.items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise SystemExit(f"tune_w4a16: --configs {path}: {first_line(exc)}") from None


def parse_formats(text: str) -> list[str]:
    fmts = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in formats.BLOCK_SIZE]
    if bad or not fmts:
        raise SystemExit(f"tune_w4a16: --formats takes nvfp4,mxfp4, got {text!r}")
    return fmts


def plan(shapes, ms, fmts) -> list[Point]:
    return [Point(fmt, n, k, m) for fmt in fmts for n, k in shapes for m in ms]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for tune.jsonl and presets.json")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"NxK list ({DEFAULT_SHAPES})")
    parser.add_argument("--m", default=DEFAULT_M, help=f"M values ({DEFAULT_M})")
    parser.add_argument("--formats", default=DEFAULT_FORMATS, help=f"({DEFAULT_FORMATS})")
    parser.add_argument("--budget-s", type=float, default=200.0, help="seconds for the run")
    parser.add_argument("--repeats", type=int, default=30, help="timer repeats (default 30)")
    parser.add_argument("--configs", help='JSON {"NxK": [{TileConfig fields}, ...]}: time '
                        "the pick and these at that shape instead of the grid")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu only under TRITON_INTERPRET=1, to check the script's logic")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune_w4a16: needs a CUDA GPU (torch sees none); nothing measured", file=sys.stderr)
        return 2
    points = plan(parse_shapes(args.shapes), parse_m(args.m), parse_formats(args.formats))
    extra = parse_configs(args.configs) if args.configs else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = dataclasses.replace(device_timer(), repeats=args.repeats)
    deadline = time.monotonic() + args.budget_s
    sms = sm_count(args.device)
    winners = []
    with open(out / "tune.jsonl", "w") as lines:
        def emit(row):
            lines.write(json.dumps(row, default=str) + "\n")
            lines.flush()
            print(f"{row.get('label', row['kind']):<44.44} {row['n']:>5}x{row['k']:<5} "
                  f"M={row['m']:<4} {row['fmt']:<5} {row['status']:<12} "
                  f"{row.get('median_us', float('nan')):9.2f} us  {row.get('message', '')[:60]}",
                  flush=True)
        cache: dict = {}
        for point in points:
            best = tune_point(point, args.device, timer, cache, emit, deadline, sms, extra)
            if best:
                winners.append(best)
    rows = {fmt: presets_rows(winners, fmt) for fmt in parse_formats(args.formats)}
    (out / "presets.json").write_text(json.dumps({"dense": rows}, indent=1))
    print(f"tune_w4a16: {len(winners)} of {len(points)} points have a winner; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
