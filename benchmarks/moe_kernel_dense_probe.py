"""Is the fused MoE's CUDA kernel (`cuda_moe_kernel.cu`) the dense GEMM's missing M = 64-256 path?

At M >= 64 fp4lab's dense kernels lose to the peers: `cuda-w4a16` stages all M activation rows
in every split-K CTA and reduces by atomics (call 78: 8192x8192 M=64 loads 22 us, MMAs +20,
reduction +12 of 55.6), and `triton-w4a16` waits for every wgmma before issuing the next (the
SASS read of calls 135-136). The fused MoE's kernel has what both lack: a GEMM main loop (each CTA
over all of K, its work item's activations streamed through shared memory in chunks) and an
sm_90a build whose wgmma takes the decoded weights from registers with MMA_DEPTH steps in flight
(offline SASS: `WARPGROUP.DEPBAR.LE gsb0, 0x2`, no wait per wgmma). This probe runs its "down"
launch over ONE expert as a dense GEMM, out[M, N] = a[M, K] . W^T: the expert is W, the work
items are the M tokens 64 at a time (`ntiles` 8), the routing weights 1.

Split-K, which the kernel lacks, is emulated to see what it would buy: W's K is cut into `splits`
experts of K / splits (the same quantized bytes and global scale, sliced), the activations are
laid out [splits * M, K / splits] once before timing (a kernel with split-K would read them in
place), and the splits' bf16 partial outputs are summed by torch inside the timed call. Each
build is gated on the summed output against the float64 reference, then timed twice: the whole
call ("+sum") and its kernel launch alone ("kernel"). Beside them, at each point, the peers and
fp4lab's dense kernels (`cuda_probe.PEERS`, and `cuda-w4a16` where M <= 64), same timer.

    PYTHONPATH=src python3 benchmarks/moe_kernel_dense_probe.py --out $OUT/moe-dense

Writes measurements.jsonl (one row per variant and point) and prints one fixed-width line per row.
`--sass-only` instead compiles each build here with nvcc (no GPU; the NVRTC options the backend
passes, sm_90a for the wgmma builds) and writes builds_sass.jsonl: its wgmma (HGMMA) count and how
many of them are waited for in full before the next issues (`triton_sass.waited_wgmma`).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_w4a16 as tune  # noqa: E402  (beside this script)
from cuda_probe import PEERS, peer_row  # noqa: E402

from fp4lab import correctness  # noqa: E402
from fp4lab.backends.base import prepared_from  # noqa: E402
from fp4lab.backends.moe.cuda_fused import CudaMoeConfig, build, expert_launch, lay_out_experts  # noqa: E402
from fp4lab.formats import QuantizedTensor, dequantize  # noqa: E402

SHAPES = "8192x8192,4096x6144,6144x2048"
M_VALUES = "64,128,256"
ITEM_ROWS = 64                     # tokens a work item: `ntiles` 8
# the MoE's 64-pair preset (mma.sync, 2 row tiles a warp), a 4-warp sync build (4x the CTAs),
# and the async (wgmma) builds: one warpgroup with 4 k-groups in its ring, two warpgroups, two
# row tiles a warp; 2 wgmma steps in flight where the registers allow it
BUILDS = (CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, chunk=4, depth=2, weights="shared"),
          CudaMoeConfig(warps=4, ntiles=8, chunk=4, depth=4, weights="shared", min_ctas=None),
          CudaMoeConfig(warps=4, ntiles=8, chunk=4, depth=4, weights="shared", min_ctas=None,
                        mma="async", mma_depth=2),
          CudaMoeConfig(warps=8, ntiles=8, chunk=4, depth=2, weights="shared", min_ctas=None,
                        mma="async", mma_depth=2),
          CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, chunk=4, depth=2, weights="shared",
                        min_ctas=None, mma="async"))
SPLITS = (1, 2, 4)


def split_weights(w: QuantizedTensor, splits: int) -> QuantizedTensor:
    """W [N, K] as `splits` experts [splits, N, K / splits]: the same bytes, sliced along K."""
    n, k = w.shape

    def sliced(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(n, splits, t.shape[1] // splits).transpose(0, 1).contiguous()

    return QuantizedTensor(packed=sliced(w.packed), scales=sliced(w.scales),
                           global_scale=w.global_scale, fmt=w.fmt, shape=(splits, n, k // splits))


def work_tables(m: int, splits: int, device) -> types.SimpleNamespace:
    """Work items of up to ITEM_ROWS tokens of each split (expert), the pairs in order."""
    experts, starts, rows = [], [], []
    for split in range(splits):
        for first in range(0, m, ITEM_ROWS):
            experts.append(split)
            starts.append(split * m + first)
            rows.append(min(ITEM_ROWS, m - first))

    def table(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    return types.SimpleNamespace(sorted_pairs=table(list(range(splits * m))), work_expert=table(experts),
                                 work_start=table(starts), work_rows=table(rows))


def moe_prepared(config: CudaMoeConfig, splits: int, point: tune.Point, a, w, device,
                 kernel_only: bool = False):
    """The build as a dense GEMM over `splits` K-slices: the call (launch + torch's sum of the
    partials) or, with `kernel_only`, its launch alone (its output the partials, not gated)."""
    k_split = point.k // splits
    reason = config.reason(point.n, k_split, "dense")
    if reason:
        raise ValueError(reason)
    ops = lay_out_experts(split_weights(w, splits), device, interleave=False)
    launch, built = expert_launch(config, point.fmt, False, point.n, k_split, 1, device)
    tables = work_tables(point.m, splits, device)
    route_w = torch.ones(splits * point.m, dtype=torch.float32, device=device)
    a_split = a.reshape(point.m, splits, k_split).transpose(0, 1).reshape(splits * point.m, k_split).contiguous()
    partials = torch.empty(splits * point.m, point.n, dtype=torch.bfloat16, device=device)
    out = torch.empty(point.m, point.n, dtype=torch.bfloat16, device=device)

    def gemm(a_arg, out_arg):
        if kernel_only or splits == 1:
            launch(a_arg, ops, out_arg, tables, route_w)
            return out_arg
        launch(a_arg, ops, partials, tables, route_w)
        return torch.sum(partials.view(splits, point.m, point.n), dim=0, out=out_arg)

    return prepared_from(gemm, (a_split,), partials if kernel_only else out, a.float(),
                         dequantize(w).float(), {"build": built, "splits": splits})


def moe_rows(config: CudaMoeConfig, splits: int, point: tune.Point, a, w, device, timer):
    """(label, row) of the gated call and, where it passed, of its launch alone."""
    label = f"{config.label()} s{splits}"
    tolerance = correctness.TOLERANCE[point.fmt]
    full = tune.gate_and_time(lambda: moe_prepared(config, splits, point, a, w, device),
                              lambda p: correctness.check_backend(p, tolerance), timer, device)
    rows = [(label + (" +sum" if splits > 1 else ""), full)]
    if splits > 1 and full["status"] == "ok":
        # the same build (gated just above) without the sum: its check is the full call's
        kernel = tune.gate_and_time(lambda: moe_prepared(config, splits, point, a, w, device, True),
                                    lambda p: correctness.GateResult("ok", full["rel_err"], "gated as +sum"),
                                    timer, device)
        rows.append((label + " kernel", kernel))
    return rows


@functools.cache
def nvcc_version() -> str:
    return subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.split("\n")[-2].strip()


def build_sass(config: CudaMoeConfig, fmt: str) -> dict:
    """The down launch's build compiled by nvcc for sm_90(a), its wgmma read from the SASS
    (`triton_sass`'s reader, with its cuobjdump)."""
    from triton_sass import sass_of, waited_wgmma

    source, options = build(config, fmt, gate_up=False)
    arch = "sm_90a" if config.mma == "async" else "sm_90"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "k.cu").write_text(source)
        flags = [o for o in options if o != "-default-device"]   # NVRTC's alone
        subprocess.run(["nvcc", f"-arch={arch}", "-cubin", *flags, "-o", f"{folder}/k.cubin",
                        f"{folder}/k.cu"], check=True, capture_output=True, text=True)
        cubin = (Path(folder) / "k.cubin").read_bytes()
    hgmma, waited = waited_wgmma(sass_of(cubin))
    return {"fmt": fmt, "build": config.label(), "arch": arch, "hgmma": hgmma, "waited": waited,
            "mma_depth": config.mma_depth if config.mma == "async" else None, "nvcc": nvcc_version()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for measurements.jsonl")
    parser.add_argument("--formats", default="nvfp4")
    parser.add_argument("--shapes", default=SHAPES, help="N x K points, comma-separated")
    parser.add_argument("--m", default=M_VALUES, help="M values, comma-separated")
    parser.add_argument("--splits", default=",".join(map(str, SPLITS)),
                        help="K-slice experts (emulated split-K), comma-separated")
    parser.add_argument("--builds", help="indices into BUILDS, comma-separated (default: all)")
    parser.add_argument("--no-peers", action="store_true", help="leave the peers out")
    parser.add_argument("--sass-only", action="store_true",
                        help="compile the builds with nvcc here and read their wgmma (no GPU)")
    args = parser.parse_args(argv)
    fmts, shapes, m_values = (tune.parse_formats(args.formats), tune.parse_shapes(args.shapes),
                              tune.parse_m(args.m))
    splits = tuple(int(s) for s in args.splits.split(","))
    builds = [BUILDS[int(i)] for i in args.builds.split(",")] if args.builds else BUILDS
    if args.sass_only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        rows = [build_sass(c, fmt) for fmt in fmts for c in builds]
        (out / "builds_sass.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        for row in rows:
            print(f"{row['fmt']:<5} {row['build']:<40} {row['arch']:<7} HGMMA {row['hgmma']:>4} waited {row['waited']:>4}")
        return 0
    device = tune.script_device("moe_kernel_dense_probe", smoke=False)
    if device is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = tune.device_timer()
    weights: dict = {}
    peers = () if args.no_peers else (*PEERS, "cuda-w4a16")
    print(f"{'fmt':<5} {'N x K':>10} {'M':>3} {'variant':<52} {'status':<12} {'us':>8} {'TB/s':>5}  note")
    with open(out / "measurements.jsonl", "w") as log:
        for fmt in fmts:
            for n, k in shapes:
                for m in m_values:
                    point = tune.Point(fmt, n, k, m)
                    a, w = tune.operands(point, device, weights)
                    variants = [(name, name, lambda name=name: [(name, peer_row(name, point, a, w, device, timer))])
                                for name in peers if not (name == "cuda-w4a16" and m > 64)]
                    variants += [(f"{c.label()} s{s}", "cuda-moe-as-dense",
                                  lambda c=c, s=s: moe_rows(c, s, point, a, w, device, timer))
                                 for c in builds for s in splits]
                    for _, backend, run in variants:
                        for label, row in run():
                            row = {"fmt": fmt, "n": n, "k": k, "m": m, "variant": label,
                                   "backend": backend, **row, "bytes": tune.fp4_bytes(point)}
                            if "median_us" in row:
                                row["tbps"] = row["bytes"] / row["median_us"] / 1e6
                            log.write(json.dumps(row, default=str) + "\n")
                            log.flush()
                            print(f"{fmt:<5} {f'{n}x{k}':>10} {m:>3} {label:<52} {row['status']:<12} "
                                  f"{row.get('median_us', float('nan')):8.2f} {row.get('tbps', float('nan')):5.2f}  "
                                  f"{(row.get('message') or '')[:60]} {(row.get('info') or {}).get('build', '')}",
                                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
