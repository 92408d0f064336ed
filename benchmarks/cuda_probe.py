"""`cuda-w4a16`, fp4lab's CUDA decode GEMM, against its peers at issue 13's decode points: every
build of the kernel (`GRID`, `WIDE_GRID` over M = 16: k-groups a warp, depth, warps a CTA, warps
a team, register cap, launch; at each point also the cluster twin of every build whose grid is
under one CTA an SM, `builds_at`, or of every build with `--every-twin`) gated, then timed with
the package's timer (cold L2, CUDA graph), beside the Triton kernel's preset, cuBLAS bf16 and
humming-w4a16 (when its wheel is installed) at the same points (`--no-peers` leaves them out);
then the preset build's anatomy stages (`cuda_w4a16.ANATOMY_STAGES`, each passing its own check) and the
streaming read of the same bytes.

    PYTHONPATH=src python3 benchmarks/cuda_probe.py --out $OUT/cuda

Over M = 8, wherever the splits add into the workspace, each build is timed with both split-K
reductions (`CudaTileConfig.reduce`: one atomic a sum, or one 16-byte vector reduction a lane's
four sums of an n8 tile).

`--preset-only` times the preset build alone at each point, and its reduction twin (with the
peers and the anatomy);
`--baseline-kernel FILE` (repeatable) times the preset built from another kernel file too, gated,
with its split-K-free "mma" stage, before the package's (labelled "<build> @<file stem>"), then
both timed in turn, four rounds, for the ratio of their times with the clock's drift cancelled
("<build> vs @<file stem>"): a change to the kernel's code measured against the code it replaces
in the same call.

Writes measurements.jsonl (one row per variant and point) and presets.json (the fastest gated
build per point), and prints one fixed-width line per row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_w4a16 as tune  # noqa: E402  (beside this script)

from fp4lab import correctness  # noqa: E402
from fp4lab.backends import get  # noqa: E402
from fp4lab.backends import cuda_w4a16, triton_w4a16  # noqa: E402
from fp4lab.backends.cuda_w4a16 import REDUCE_CHOICES, CudaTileConfig, Preset, choose_config  # noqa: E402

SHAPES = ((8192, 8192), (4096, 6144), (6144, 2048))
M_VALUES = (1, 4, 16)
# (k-groups a warp, depth, warps a CTA, warps a team on one row tile, CTAs an SM must fit), for
# M <= 16: the three preset builds (call 57: `min_ctas` buys registers, 1-9% faster than ptxas'
# own ~52), and 16-warp CTAs of teams of 2 or 4 warps a tile, which stage 2-4x the k (over 48 KB
# at M = 16: the opt-in) for half to a quarter of the splits, the teams adding up in shared
# memory; each launched both ways. `CudaTileConfig.reason` leaves out what a point cannot take
DECODE_BUILDS = ((8, 4, 8, 4, 1), (8, 4, 16, 1, 2), (16, 4, 16, 1, 2),
                 (8, 4, 16, 2, 2), (16, 4, 16, 2, 2), (8, 4, 16, 4, 1))
# for 16 < M <= 64 (eight n8 activation tiles at M = 64, ~100 registers a thread): 8-warp CTAs
# two an SM, 16-warp CTAs in teams of 2 (at K = 2048 with a cluster the fastest, call 75), 16
# k-groups a warp (half the splits, so half the split-K atomics)
WIDE_BUILDS = ((8, 4, 8, 1, 2), (8, 4, 16, 2, 1), (16, 4, 8, 1, 1), (8, 4, 16, 1, 1))
OVERLAPS = ("tail", "all")


def grid_of(builds) -> tuple[CudaTileConfig, ...]:
    return tuple(CudaTileConfig(groups=g, depth=d, warps=w, kwarps=kw, min_ctas=b, overlap=overlap)
                 for g, d, w, kw, b in builds for overlap in OVERLAPS)


GRID = grid_of(DECODE_BUILDS)
WIDE_GRID = grid_of(WIDE_BUILDS)
SMS = 132                                    # the H200's: where a grid is under one CTA an SM


def parse_builds(text: str) -> tuple[tuple, ...]:
    """--builds "g,d,w,kw,b;...": (k-groups a warp, depth, warps a CTA, warps a team, CTAs an SM
    must fit or "none") per build, as DECODE_BUILDS; a bad entry is named."""
    builds = []
    for entry in (e.strip() for e in text.split(";") if e.strip()):
        fields = [f.strip() for f in entry.split(",")]
        try:
            if len(fields) != 5:
                raise ValueError(f"needs 5 fields, got {len(fields)}")
            g, d, w, kw = (int(f) for f in fields[:4])
            build = (g, d, w, kw, None if fields[4].lower() == "none" else int(fields[4]))
            grid_of((build,))                          # CudaTileConfig checks every field
        except ValueError as exc:
            raise SystemExit(f"cuda_probe: --builds {entry!r}: {exc}") from None
        builds.append(build)
    if not builds:
        raise SystemExit(f"cuda_probe: --builds takes g,d,w,kw,b;..., got {text!r}")
    return tuple(builds)


def reduce_twin(config: CudaTileConfig, m: int, k: int) -> CudaTileConfig | None:
    """The build with the other split-K reduction (REDUCE_CHOICES), where the two differ
    (`CudaTileConfig.reduce_matters`)."""
    if not config.reduce_matters(m, k):
        return None
    other = next(r for r in REDUCE_CHOICES if r != config.reduce)
    return dataclasses.replace(config, reduce=other)


def builds_at(m: int, n: int, k: int, every_twin: bool = False,
              grid: tuple[CudaTileConfig, ...] | None = None) -> list[CudaTileConfig]:
    """The builds timed at a point: GRID (WIDE_GRID over M = 16; with `grid`, the point's preset
    build then those; an empty `grid`, the preset alone), after each build whose grid has fewer
    CTAs than SMs (`every_twin`: any grid) its twin with all of a column's splits in one cluster
    (the `clustered` presets' rule; 2 to 16 splits), and after each of those its twin with the
    other split-K reduction where the two differ (`reduce_twin`)."""
    chosen = ([choose_config(m, n, k)] if grid == ()
              else dict.fromkeys([choose_config(m, n, k), *grid]) if grid
              else GRID if m <= 16 else WIDE_GRID)
    builds = []
    for config in chosen:
        builds.append(config)
        clustered = Preset(m, None, config, clustered=True)
        if grid != () and clustered.holds(m, n, k, 10**6 if every_twin else SMS):
            builds.append(clustered.build(n, k))
    twins = [reduce_twin(config, m, k) for config in builds]
    return list(dict.fromkeys(build for pair in zip(builds, twins) for build in pair if build is not None))

PEERS = ("triton-w4a16", "torch-bf16", "humming-w4a16")


def peer_row(name: str, point: tune.Point, a, w, device: str, timer) -> dict:
    backend = get(name)
    available, reason = backend.availability(device)
    if not available or point.fmt not in backend.formats:
        return {"status": "unavailable", "message": reason}
    tolerance = correctness.TOLERANCE["bf16" if name == "torch-bf16" else point.fmt]
    return tune.gate_and_time(lambda: backend.prepare(a, w, device),
                              lambda p: correctness.check_backend(p, tolerance), timer, device)


def cuda_row(config: CudaTileConfig, point: tune.Point, a, w, device: str, timer) -> dict:
    reason = config.reason(point.m, point.n, point.k)
    if reason:
        return {"status": "unavailable", "message": reason}
    backend = get("cuda-w4a16")
    return tune.gate_and_time(lambda: backend.prepare(a, w, device, config=config),
                              lambda p: correctness.check_backend(p, correctness.TOLERANCE[point.fmt]),
                              timer, device)


def anatomy_row(stage: str, config: CudaTileConfig, a, w, device: str, timer) -> dict:
    """One anatomy stage of the preset build ("stream": the streaming read of the same bytes)."""
    made = {}

    def prepare():
        module = triton_w4a16 if stage == "stream" else cuda_w4a16
        extra = {} if stage == "stream" else {"config": config}
        made["variant"] = module.anatomy_variants(a, w, device, stages=(stage,), **extra)[0]
        return made["variant"].prepared

    return tune.gate_and_time(prepare, lambda p: made["variant"].check(), timer, device)


def baseline_rows(baseline: Path, config: CudaTileConfig, point: tune.Point, a, w, device: str,
                  timer) -> list[tuple[str, dict]]:
    """The preset build from another kernel file: the GEMM, then its "mma" stage (the GEMM
    without the split-K reduction), each gated, labelled "<build> @<file stem>"; then that GEMM
    and the package's timed in turn ("<build> vs @<file stem>": their ratio, drift cancelled)."""
    label = f"{config.label()} @{baseline.stem}"
    with tune.kernel_source_from(cuda_w4a16, baseline):
        rows = [(label, cuda_row(config, point, a, w, device, timer)),
                (f"anatomy mma @{baseline.stem}", anatomy_row("mma", config, a, w, device, timer))]
    return rows + [(f"{config.label()} vs @{baseline.stem}",
                    alternated_row(baseline, config, point, a, w, device, timer))]


def alternated_row(baseline: Path, config: CudaTileConfig, point: tune.Point, a, w, device: str,
                   timer) -> dict:
    """The build from `baseline` and from the package's kernel file, both gated, then timed in
    turn (tune.alternated_row)."""
    backend, tolerance = get("cuda-w4a16"), correctness.TOLERANCE[point.fmt]
    return tune.alternated_row(cuda_w4a16, baseline,
                               lambda: backend.prepare(a, w, device, config=config),
                               lambda prepared: correctness.check_backend(prepared, tolerance),
                               timer, device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for measurements.jsonl")
    parser.add_argument("--formats", default="nvfp4,mxfp4")
    parser.add_argument("--no-anatomy", action="store_true", help="leave the preset's stages out")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES),
                        help="N x K points, comma-separated (default: the issue's three)")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)), help="M values, comma-separated")
    parser.add_argument("--no-peers", action="store_true", help=f"leave {', '.join(PEERS)} out")
    parser.add_argument("--builds", help='"g,d,w,kw,b;...": time the preset build and these (each '
                        "launched both ways) instead of the grid")
    parser.add_argument("--every-twin", action="store_true",
                        help="time every build's cluster twin, not only where its grid is under "
                             "one CTA an SM (at M = 64 the split-K reduction costs 12 us of 55: call 78)")
    parser.add_argument("--preset-only", action="store_true",
                        help="time each point's preset build alone, not the grid")
    parser.add_argument("--baseline-kernel", type=Path, action="append", default=[],
                        help="a kernel file whose build of each point's preset is timed before "
                             "it (an earlier commit's cuda_w4a16_kernel.cu); repeatable")
    args = parser.parse_args(argv)
    if args.preset_only and args.builds:
        raise SystemExit("cuda_probe: --preset-only and --builds exclude each other")
    baselines = tune.baseline_kernels(args.baseline_kernel)
    fmts, shapes, m_values = (tune.parse_formats(args.formats), tune.parse_shapes(args.shapes),
                              tune.parse_m(args.m))
    grid = grid_of(parse_builds(args.builds)) if args.builds else (() if args.preset_only else None)
    device = tune.script_device("cuda_probe", smoke=False)
    if device is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = tune.device_timer()
    weights: dict = {}
    best: dict = {}
    print(f"{'fmt':<5} {'N x K':>10} {'M':>3} {'variant':<34} {'status':<12} {'us':>8} {'TB/s':>5} "
          f"{'regs':>4} {'local':>5} {'ctas':>4} {'clus':>4}  note")
    with open(out / "measurements.jsonl", "w") as log:
        for fmt in fmts:
            for n, k in shapes:
                for m in m_values:
                    point = tune.Point(fmt, n, k, m)
                    a, w = tune.operands(point, device, weights)
                    pick = choose_config(m, n, k)
                    variants = [(label, "cuda-w4a16-baseline", lambda done=done: done, None)
                                for baseline in baselines
                                for label, done in baseline_rows(baseline, pick, point, a, w, device, timer)]
                    variants += [(c.label(), "cuda-w4a16", lambda c=c: cuda_row(c, point, a, w, device, timer),
                                  c) for c in builds_at(m, n, k, args.every_twin, grid)]
                    variants += [(name, name, lambda name=name: peer_row(name, point, a, w, device, timer),
                                  None) for name in PEERS if not args.no_peers]
                    variants += [(f"anatomy {stage}", "cuda-w4a16-anatomy",
                                  lambda stage=stage: anatomy_row(stage, pick, a, w, device, timer), None)
                                 for stage in ("stream", *cuda_w4a16.ANATOMY_STAGES)
                                 if not args.no_anatomy]
                    for label, backend, run, config in variants:
                        row = {"fmt": fmt, "n": n, "k": k, "m": m, "variant": label,
                               "backend": backend, **run(), "bytes": tune.fp4_bytes(point)}
                        if config is not None:
                            row.update(config=dataclasses.asdict(config), pick=config == pick)
                        if "median_us" in row:
                            row["tbps"] = row["bytes"] / row["median_us"] / 1e6
                            key = f"{fmt} {n}x{k} M={m}"
                            if backend == "cuda-w4a16" and (key not in best
                                                            or row["median_us"] < best[key]["median_us"]):
                                best[key] = {"config": row["config"], "median_us": row["median_us"]}
                        log.write(json.dumps(row) + "\n")
                        log.flush()
                        info = row.get("info") or {}
                        print(f"{fmt:<5} {f'{n}x{k}':>10} {m:>3} {label:<34} {row['status']:<12} "
                              f"{row.get('median_us', float('nan')):8.2f} "
                              f"{row.get('tbps', float('nan')):5.2f} "
                              f"{info.get('registers', ''):>4} {info.get('local_bytes', ''):>5} "
                              f"{info.get('ctas_per_sm', ''):>4} {info.get('active_clusters', ''):>4}  "
                              f"{'pick ' if row.get('pick') else ''}{(row.get('message') or '')[:90]}",
                              flush=True)
    (out / "presets.json").write_text(json.dumps(best, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
