"""`cuda-w4a16-moe`, fp4lab's CUDA fused MoE, against its peers at issue 13's MoE points: its
preset and every build of the first point's grid (`GRID`; `LARGE_GRID` over 32 pairs an expert)
gated, then timed with the package's timer (cold L2, CUDA graph), beside humming-moe-indexed
(when its wheel is installed) and triton-w4a16-moe's preset at the same points; the first
point's three fastest builds (and the preset) are the only ones timed at the others; at the first
point the anatomy stages (loads only; loads and decode; and the MMAs, no epilogue; all but the
epilogue without the weights' reads: both launches writing nothing, timed, not gated) of the
fastest build of each kind
(sync or async, weights in registers or in shared memory); at every point the fastest build's
call stopped after each launch (routing, gate_up, down), so the summary gives each launch's time.

    PYTHONPATH=src python3 benchmarks/cuda_moe_probe.py --out $OUT/moe [--budget-s 380]
        [--baseline-kernel old.cu ...]

`--baseline-kernel` (repeatable) also times the first point's preset built from another kernel
file (an earlier commit's `git show <sha>:src/fp4lab/backends/cuda_moe_kernel.cu`, or a variant
to try), gated and dissected like the preset and before it, so that a change to the kernel's code
is measured against the code it replaces in the same call (labelled "<build> @<file stem>"); after
the preset, the two builds timed in turn, four rounds (`tune.alternate`), give the ratio of their
times with the clock's drift cancelled ("<build> vs @<file stem>").

Writes measurements.jsonl (one row per method, build and point, as it happens; the ceilings first)
and prints one fixed-width line per row. `--smoke` runs the same steps on the scaled CPU stand-in
of GLM-5 (every step an "unavailable" row there: the kernel needs a GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h200_kernels as kernels  # noqa: E402  (Run, the ceilings, the models' weights)
import tune_w4a16 as tune  # noqa: E402  (kernel_source_from, alternated_row)

from fp4lab import bench  # noqa: E402
from fp4lab.backends.moe import base as moe_base, cuda_fused, get as get_moe  # noqa: E402
from fp4lab.backends.moe.cuda_fused import CHUNK_CHOICES, CudaMoeConfig, choose_moe_config  # noqa: E402
from fp4lab.backends.moe.triton_fused import CALL_PARTS  # noqa: E402
from fp4lab.moe import routing  # noqa: E402

POINTS = (("glm-5", 512), ("deepseek-v3", 512), ("glm-5", 64))
PEERS = ("humming-moe-indexed", "triton-w4a16-moe")
# The k loop compiled once an item's width (session 28: no compare, branch and NOP around each
# pair of MMAs; 91-97 instructions a k-group and row tile at 32 pairs, from 130). In order:
# - the preset: 8 warps of two row tiles (each B fragment read by ldmatrix serves both), 4
#   k-groups staged and 2 in each warp's ring in shared memory, three CTAs an SM (80 registers;
#   NVFP4 gate_up spills 4 B, NVRTC 13.0). Nsight Compute on the H100 (call 111) read the two-CTA
#   build's warps 25% active, each issuing every 7.25 cycles (a scheduler 55% busy, no pipe over
#   45%): latency bounds its math, which on the H200 (call 108) adds 0.57 ms to its 1.31 ms of
#   loads. H100, GLM-5 B = 512 NVFP4: 1.95 / 2.03 ms (calls 112 / 113);
# - the two-CTA preset before it (8 k-groups staged, 4 in the ring): 2.03 / 2.03; on the H200
#   1.88 / 1.75 ms NVFP4 / MXFP4 (call 108);
# - 16 warps of one row tile with 2 k-groups in registers (the few-pairs preset's shape);
# - three CTAs with 4 k-groups in the ring (24 B of spill): 1.97 / 1.99;
# - the async build (wgmma: B read by the tensor cores, no ldmatrix) with its weights in registers,
#   and two with the ring (no spill, no serialized wgmma: NVRTC 13.0), which drop a row tile's 16
#   HMMA and 4 ldmatrix a k-group for 4 wgmma, though their SASS spends about as much on
#   descriptors (benchmarks/NOTES.md, session 30).
# The sync build reads 4 KB of shared memory a k-group and row tile at 32 pairs (32 clocks an SM
# at 128 B a clock, the H200's whole copy time for the tile's 576 B): why two row tiles a warp.
GRID = (CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=2, weights="shared", min_ctas=3),
        CudaMoeConfig(warps=8, row_tiles=2, depth=4, weights="shared"), CudaMoeConfig(depth=2),
        CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=4, weights="shared", min_ctas=3),
        CudaMoeConfig(depth=2, mma="async"),
        CudaMoeConfig(warps=8, row_tiles=2, depth=4, weights="shared", mma="async"),
        CudaMoeConfig(warps=8, chunk=4, depth=2, weights="shared", mma="async", min_ctas=3))
# Over 32 pairs an expert (GLM-5 at B >= 2048; the reference run on the H200: 6.6 ms NVFP4 at B =
# 2048 against humming's 4.2) a 32-pair item reads and decodes each expert's weights once for every
# 32 of its pairs: 64-pair items halve both. Two row tiles of 8 warps, the weights in each warp's
# ring; 4 k-groups staged (two CTAs an SM fit 2 x 102 KB of shared memory: 128 registers, NVFP4
# spills 72 B at 4 k-groups in flight, 4 B at 2), or 8 with one CTA an SM (156 registers, no
# spill; NVRTC 13.0 ptxas -v). Call 109 (H100, GLM-5 B = 2048 NVFP4): 4.67, 4.66, 5.17 ms against
# the 32-pair preset's 5.52 and humming's 4.21.
LARGE_GRID = (CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, chunk=4, depth=4, weights="shared"),
              CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, chunk=4, depth=2, weights="shared"),
              CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, depth=4, weights="shared", min_ctas=1))
# More warps an SM with the ring's loads (`--grid more-warps`): the 16-warp register build's math
# alone is the fastest (1.18 ms at GLM-5 B = 512, 32 warps an SM) and the preset's the slower
# (1.49, 24 warps), whose ring streams the weights faster. Four CTAs of 8 warps fit 4 x 52 KB of
# shared memory at 64 registers: two row tiles spill 188 B of loads (NVRTC 13.0 ptxas -v), one
# row tile none. Each build is dissected, not only the fastest of its kind: the question is
# each one's math alone (the compute stage, the SMs' own work: an H100 answers it for the H200).
MORE_WARPS_GRID = (CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=2, weights="shared", min_ctas=4),
                   CudaMoeConfig(warps=8, chunk=4, depth=2, weights="shared", min_ctas=4),
                   CudaMoeConfig(depth=2))
# One CTA barrier a chunk instead of two (`--grid buffers`): Nsight Compute on the H100 (call 123)
# read the preset's warps issuing on ~60% of cycles, barrier and long-scoreboard the top stalls.
# Three staged buffers drop the barrier that frees a buffer; twice the chunk halves both barriers
# (and fits fewer CTAs an SM). Each beside the preset it varies, every build dissected.
def buffer_variants(preset: CudaMoeConfig) -> list[CudaMoeConfig]:
    wider = min(2 * preset.chunk, CHUNK_CHOICES[-1])
    return [dataclasses.replace(preset, buffers=3), dataclasses.replace(preset, chunk=wider),
            dataclasses.replace(preset, chunk=wider, buffers=3)]


LARGE_PAIRS = 32         # mean pairs an expert over which the first point's grid is LARGE_GRID
ANATOMY = ("load", "decode", "mma", "compute")   # MOE_STAGES timed beside the fastest builds
SMOKE_POINTS = (("glm-5", 16),)


def layer_row(run: kernels.Run, problem, method: str, config=None, until: str = "sum",
              stage: str = "full") -> dict:
    """One method's call gated (the whole call) and timed; a prefix (`until`) or an anatomy
    stage of cuda-w4a16-moe (`stage`, writing no output) only timed."""
    options = {"until": until} if stage == "full" else {"until": until, "stage": stage}
    call = get_moe(method).prepare(problem, config=config, **options) if config is not None \
        else get_moe(method).prepare(problem)
    row = {"method": method, "config": dataclasses.asdict(config) if config else None,
           "weight_bytes": call.weight_bytes, "note": call.note,
           "loads_max": int(problem.loads.max()), "stage": stage}
    if stage != "full":
        row.update(status="ok", message=f"anatomy stage {stage}: no output, not gated")
    elif until == "sum":
        gate = moe_base.check_call(call, problem)
        row.update(status=gate.status, rel_err=gate.rel_err, message=gate.message)
        if not gate.ok:
            return row
    else:
        row.update(status="ok", message=f"the call up to {until}, not gated")
    timing = bench.time_call(call.make_call, call.args, call.out, run.timer, run.device)
    return {**row, **kernels.tune.timing_fields(timing)}


def line(row: dict | None) -> str:
    if row is None:                                     # a step the deadline left out
        return "(skipped: the budget is spent)"
    what = f"{row.get('model', '')} B={row.get('batch', '')} {row.get('fmt', '')}"
    label = row.get("label", "")
    if "median_us" in row:
        floor = row.get("floor_us")
        pct = f"{100 * floor / row['median_us']:5.1f}% of floor" if floor else ""
        return f"{what:24s} {label:42s} {row['median_us']:9.1f} us  {pct}"
    return f"{what:24s} {label:42s} {row['status']}: {row.get('message', '')[:80]}"


def alternated_row(run: kernels.Run, problem, config: CudaMoeConfig, baseline: Path) -> dict:
    """The build from `baseline` and from the package's kernel file, both gated, then timed in
    turn (tune.alternated_row)."""
    method = get_moe("cuda-w4a16-moe")
    row = tune.alternated_row(cuda_fused, baseline, lambda: method.prepare(problem, config=config),
                              lambda call: moe_base.check_call(call, problem), run.timer, run.device)
    return {**row, "config": dataclasses.asdict(config)}


def dissect(run: kernels.Run, problem, what: dict, build: CudaMoeConfig, label: str) -> None:
    """The anatomy stages of one build, one row each."""
    for stage in (s for s in ANATOMY if not build.stage_reason(s)):
        row = run.step("moe_part", {**what, "label": f"{label} stage {stage}"},
                       lambda s=stage: layer_row(run, problem, "cuda-w4a16-moe", build, stage=s))
        print(line(row), flush=True)


def fastest_of_each_kind(timed: list[tuple[float, CudaMoeConfig]]) -> list[CudaMoeConfig]:
    """The fastest timed build of each way to multiply (sync, async) and to hold the weights in
    flight (registers, shared), fastest first: the anatomy of each says what its MMAs add to its
    own loads."""
    fastest: dict[tuple[str, str], CudaMoeConfig] = {}
    for _, config in sorted(timed, key=lambda pair: pair[0]):
        fastest.setdefault((config.mma, config.weights), config)
    return list(fastest.values())


def probe_point(run: kernels.Run, model, batch: int, fmt: str, weights, configs,
                anatomy: bool, dissect_every: bool = False, baselines: tuple[Path, ...] = ()) -> list[dict]:
    what = {"model": model.key, "batch": batch, "fmt": fmt}
    ids = routing.sample_expert_ids("uniform", model.experts, model.top_k, batch, 1)[0]
    problem = moe_base.make_layer_problem(ids, model.experts, model.hidden, model.moe_intermediate,
                                          fmt, run.device, weights=weights)
    timed = []
    for method in PEERS:
        row = run.step("moe", {**what, "label": method}, lambda m=method: layer_row(run, problem, m))
        print(line(row), flush=True)
    for baseline in baselines if configs else ():
        label = f"{configs[0].label()} @{baseline.stem}"
        with tune.kernel_source_from(cuda_fused, baseline):
            row = run.step("moe", {**what, "label": label},
                           lambda: layer_row(run, problem, "cuda-w4a16-moe", configs[0]))
            print(line(row), flush=True)
            if anatomy:
                dissect(run, problem, what, configs[0], label)
    for config in configs:
        row = run.step("moe", {**what, "label": config.label()},
                       lambda c=config: layer_row(run, problem, "cuda-w4a16-moe", c))
        print(line(row), flush=True)
        if row is not None and "median_us" in row:
            timed.append((row["median_us"], config))
    for baseline in baselines if configs else ():
        row = run.step("moe_alternated", {**what, "label": f"{configs[0].label()} vs @{baseline.stem}"},
                       lambda b=baseline: alternated_row(run, problem, configs[0], b))
        print(line(row), flush=True)
    if timed:
        best = min(timed, key=lambda pair: pair[0])[1]
        dissected = [config for _, config in timed] if dissect_every else fastest_of_each_kind(timed)
        for build in dissected if anatomy else ():
            dissect(run, problem, what, build, build.label())
        for until in CALL_PARTS[:-1]:
            row = run.step("moe_part", {**what, "label": f"{best.label()} until {until}"},
                           lambda u=until: layer_row(run, problem, "cuda-w4a16-moe", best, u))
            print(line(row), flush=True)
    return [config for _, config in sorted(timed, key=lambda pair: pair[0])]


def first_point_builds(preset: CudaMoeConfig, mean_pairs: float, grid_name: str = "default") -> list[CudaMoeConfig]:
    """The builds timed at the first point: the preset, then the grid for its pairs an expert
    (or the named one)."""
    if grid_name == "preset":
        grid = []
    elif grid_name == "more-warps":
        grid = MORE_WARPS_GRID
    elif grid_name == "buffers":
        grid = buffer_variants(preset)
    else:
        grid = LARGE_GRID + GRID[:1] if mean_pairs > LARGE_PAIRS else GRID
    return [preset] + [config for config in grid if config != preset]


def parse_points(text: str) -> tuple[tuple[str, int], ...]:
    """'glm-5:512,deepseek-v3:512' -> (("glm-5", 512), ("deepseek-v3", 512))."""
    points = []
    for item in filter(None, text.split(",")):
        name, _, batch = item.strip().partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise SystemExit(f"--points: {item!r} is not model:batch, e.g. glm-5:512")
        points.append((name, int(batch)))
    if not points:
        raise SystemExit("--points: name at least one model:batch")
    return tuple(points)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=380.0)
    parser.add_argument("--formats", default="nvfp4,mxfp4")
    parser.add_argument("--points", default=",".join(f"{m}:{b}" for m, b in POINTS),
                        help="model:batch,... (the first is where every build and the anatomy run)")
    parser.add_argument("--grid", default="default",
                        choices=("default", "preset", "more-warps", "buffers"),
                        help="preset: the preset alone at the first point; more-warps: "
                             "MORE_WARPS_GRID there; buffers: the preset's buffer_variants; each "
                             "with every build dissected")
    parser.add_argument("--baseline-kernel", type=Path, action="append", default=[],
                        help="a kernel file whose build of the first point's preset is timed and "
                             "dissected before it (an earlier commit's cuda_moe_kernel.cu); "
                             "repeatable")
    parser.add_argument("--smoke", action="store_true", help="the scaled CPU stand-in")
    args = parser.parse_args(argv)
    points = SMOKE_POINTS if args.smoke else parse_points(args.points)     # before any GPU work
    baselines = tune.baseline_kernels(args.baseline_kernel)
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    plan = dataclasses.replace(kernels.MOE, moe_scaled=args.smoke, step_limit_s=90.0)
    run = kernels.Run(args.out, args.budget_s, plan, device)
    kernels.phase_ceilings(run)
    for fmt in args.formats.split(","):
        ranked: list[CudaMoeConfig] = []
        weights_for: dict = {}
        for index, (name, batch) in enumerate(points):
            model = kernels.moe_model(name, args.smoke)
            if model.key not in weights_for:
                weights_for.clear()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                run.step("moe_weights", {"model": model.key, "fmt": fmt},
                         lambda m=model: kernels.build_weights(run, m, fmt, weights_for))
            if model.key not in weights_for:
                continue
            pairs = batch * model.top_k
            preset = choose_moe_config(pairs, model.experts, fmt)
            configs = first_point_builds(preset, pairs / model.experts, args.grid) if index == 0 \
                else [preset] + [c for c in ranked[:3] if c != preset]
            found = probe_point(run, model, batch, fmt, weights_for[model.key], configs,
                                anatomy=index == 0, dissect_every=args.grid != "default",
                                baselines=baselines if index == 0 else ())
            ranked = ranked or found
    return 0


if __name__ == "__main__":
    sys.exit(main())
