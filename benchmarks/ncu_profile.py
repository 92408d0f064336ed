"""The kernels behind issue 13's two open targets, each gated once and then launched once inside
a CUDA profiler range, for Nsight Compute (`ncu --profile-from-start off`) to read their hardware
counters: where a kernel's cycles go when the time-variant anatomy cannot say.

    ncu --clock-control none --profile-from-start off --csv --page raw \\
        --metrics "$(python3 benchmarks/ncu_profile.py --metrics)" \\
        --log-file $OUT/ncu.csv env PYTHONPATH=src python3 benchmarks/ncu_profile.py

In order (one profiled launch each; the MoE call is four: routing, gate_up, down, top-k sum):
  - `triton-w4a16` at 8192x8192 M=1 NVFP4 with its preset, its "load" stage, the "stream" of the
    same bytes, and the preset at M=16;
  - `triton-w4a16-moe` at GLM-5 B=512 (uniform routing) NVFP4 with its preset.
Without ncu it runs the same launches and prints their labels (the check that the driver works);
`--smoke` runs tiny stand-ins on a CPU under TRITON_INTERPRET=1 (the test). `--peers` profiles
instead the fastest peers at the same two points, humming-w4a16 and humming-moe-indexed (NVFP4;
the humming wheel installed; their launches as fp4lab's wrappers make them, `PEER_MOE_KERNELS`).
`--cuda` profiles fp4lab's CUDA kernels with their presets: the decode GEMM (`cuda-w4a16`) at the
dense points, then the fused MoE (`cuda-w4a16-moe`, the path the book diagnoses) at the MoE point
in each of `CUDA_MOE_FORMATS` (four launches a call, as the Triton method's);
`--cuda-builds g16d4w8k8,...` profiles those builds of the decode GEMM instead, and no MoE
(k-groups, depth, warps, warps a team; k1 when left out).
`--m64` profiles humming-w4a16, triton-w4a16 and cuda-w4a16 (their presets) at 8192x8192 M=64
NVFP4 instead: the point where humming, which waits for half of its wgmma, beats fp4lab's Triton
kernel, which waits for all (benchmarks/NOTES.md, calls 141-143); then the Triton preset's
two-warpgroup twin (`M64_TWIN`: 8 warps on the same tile, which lost 7% there in call 83 and won
11-18% at the smaller shapes), to see what the second warpgroup changes in the counters.
`--launches FILE`
writes launches.json: one entry per kernel launch ncu will see, in order (its label and the
weights it reads), which `fp4lab.analysis.counters` joins with ncu's rows; `--describe` writes it
and runs nothing (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_w4a16 as tune  # noqa: E402  (beside this script)

from fp4lab import backends, correctness  # noqa: E402
from fp4lab.backends.moe import base as moe_base, get as get_moe  # noqa: E402
from fp4lab.backends.cuda_w4a16 import CudaTileConfig, choose_config as cuda_choose  # noqa: E402
from fp4lab.backends.triton_w4a16 import anatomy_variants, tensor_core_config  # noqa: E402
from fp4lab.moe import presets as model_presets, routing  # noqa: E402

# what each launch did: time, DRAM and L2 bytes and throughput, instructions and issue slots,
# occupancy and registers, and why warps waited (stall cycles per issued instruction, by reason)
METRICS = [
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
    "launch__grid_size", "launch__block_size", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "smsp__warps_launched.sum",
    "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio",
]


DENSE_POINTS = ((1, ("full", "load", "stream")), (16, ("full",)))     # (M, anatomy stages)
MOE_POINT = ("glm-5", 512)
CUDA_MOE_FORMATS = ("mxfp4", "nvfp4")     # the diagnosed path's format first (the 1155Z run's)
MOE_LAUNCHES = (("route", "route"), ("gate_up", "fused MoE"), ("down", "fused MoE"),
                ("top-k sum", "torch.sum"))   # (part, kernel) of a fused method's call, in order
SMS = 132   # the H200's (the configs a CPU describes are the GPU's)


def dense_shape(smoke: bool) -> tuple[int, int]:
    return (48, 256) if smoke else (8192, 8192)


def moe_point(smoke: bool):
    model, batch = model_presets.get(MOE_POINT[0]), MOE_POINT[1]
    if smoke:
        model, batch = model_presets.scaled_down(model), 6
    ids = routing.sample_expert_ids("uniform", model.experts, model.top_k, batch, 1)[0]
    return model, batch, ids


def launch_plan(smoke: bool) -> list[dict]:
    """Every kernel launch the profiled calls make, in order: {"launch", "kernel", "weights"}
    (the weights it reads; 0 for routing and the top-k sum)."""
    n, k = dense_shape(smoke)
    plan = []
    for m, stages in DENSE_POINTS:
        config = tensor_core_config(m, n, k, SMS)
        plan += [{"launch": f"dense {n}x{k} M={m} {stage}",
                  "kernel": "stream" if stage == "stream" else config.label(),
                  "weights": n * k} for stage in stages]
    return plan + moe_plan("moe", smoke)


def moe_plan(where: str, smoke: bool = False) -> list[dict]:
    """The four launches of a fused method's call at the MoE point, labelled "<where> <point>
    <part>"."""
    point, weights = moe_gemm_weights(smoke)
    return [{"launch": f"{where} {point} {part}", "kernel": kernel, "weights": weights.get(part, 0)}
            for part, kernel in MOE_LAUNCHES]


def moe_gemm_weights(smoke: bool) -> tuple[str, dict]:
    """("<model> B=<batch>", the weights gate_up and down read at the MoE point): every active
    expert's [2I, H] and [H, I]."""
    model, batch, ids = moe_point(smoke)
    active = len(set(ids.reshape(-1).tolist()))
    h, i = model.hidden, model.moe_intermediate
    return f"{model.key} B={batch}", {"gate_up": active * 2 * i * h, "down": active * h * i}


# humming-moe-indexed's call (fp4lab.backends.moe.humming): gate_up, two torch kernels (SiLU * up),
# down, three torch kernels (the scatter copy, the routing weights, the top-k sum)
PEER_MOE_KERNELS = ("gate_up", "torch", "torch", "down", "torch", "torch", "torch")


def peer_plan() -> list[dict]:
    """`launch_plan` for --peers: humming's dense GEMM, then its MoE call's kernels."""
    n, k = dense_shape(False)
    point, weights = moe_gemm_weights(False)
    weights = {**weights, "torch": 0}
    where = f"humming-moe-indexed {point}"
    return ([{"launch": f"humming-w4a16 {n}x{k} M=1", "kernel": "humming", "weights": n * k}]
            + [{"launch": f"{where} {'torch glue' if part == 'torch' else part}",
                "kernel": "torch" if part == "torch" else "humming MoE", "weights": weights[part]}
               for part in PEER_MOE_KERNELS])


def parse_builds(text: str) -> list[CudaTileConfig]:
    """'g16d4w8k8,g8d8w4' -> those builds of cuda-w4a16 (k-groups, depth, warps, warps a
    team: 1 when left out)."""
    builds = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"g(\d+)d(\d+)w(\d+)(?:k(\d+))?", item.strip())
        if not match:
            raise SystemExit(f"--cuda-builds: {item!r} is not g<groups>d<depth>w<warps>[k<team>], "
                             "e.g. g16d4w8k8")
        try:
            builds.append(CudaTileConfig(groups=int(match[1]), depth=int(match[2]),
                                         warps=int(match[3]), kwarps=int(match[4] or 1)))
        except ValueError as exc:
            raise SystemExit(f"--cuda-builds {item}: {exc}") from None
    return builds


def cuda_points(builds: list[CudaTileConfig]):
    """(M, build) of each --cuda launch: every build (the preset: None) at each dense M."""
    n, k = dense_shape(False)
    for build in builds or [None]:
        for m, _ in DENSE_POINTS:
            if build is None or build.reason(m, n, k) is None:
                yield m, build


def cuda_plan(builds: list[CudaTileConfig]) -> list[dict]:
    """`launch_plan` for --cuda: cuda-w4a16 at the dense points' M, per build; with the presets
    (no builds named) then cuda-w4a16-moe's call in each of CUDA_MOE_FORMATS."""
    n, k = dense_shape(False)
    dense = [{"launch": f"cuda-w4a16 {n}x{k} M={m}",
              "kernel": (build or cuda_choose(m, n, k)).label(), "weights": n * k}
             for m, build in cuda_points(builds)]
    if builds:
        return dense
    return dense + [row for fmt in CUDA_MOE_FORMATS for row in moe_plan(f"cuda-w4a16-moe {fmt}")]


def gated_dense(backend: str, m: int, device: str, cache: dict, **prepare_options):
    """`backend` prepared at the dense shape, M=`m`, NVFP4, after its gate passed."""
    n, k = dense_shape(False)
    a, w = tune.operands(tune.Point("nvfp4", n, k, m), device, cache)
    prepared = backends.get(backend).prepare(a, w, device, **prepare_options)
    gate = correctness.check_backend(prepared, correctness.TOLERANCE["nvfp4"])
    if not gate.ok:
        raise SystemExit(f"{backend} at M={m} failed its gate: {gate.message}")
    return prepared


def cuda_launches(device: str, builds: list[CudaTileConfig]):
    n, k = dense_shape(False)
    cache: dict = {}
    for m, build in cuda_points(builds):
        prepared = gated_dense("cuda-w4a16", m, device, cache, config=build)
        yield f"cuda-w4a16 {n}x{k} M={m} nvfp4 {prepared.info['config']}", prepared.call
    if not builds:
        for fmt in CUDA_MOE_FORMATS:
            yield gated_moe_call("cuda-w4a16-moe", device, False, fmt)


def dense_launches(device: str, smoke: bool):
    n, k = dense_shape(smoke)
    cache: dict = {}
    for m, stages in DENSE_POINTS:
        a, w = tune.operands(tune.Point("nvfp4", n, k, m), device, cache)
        for variant in anatomy_variants(a, w, device, stages=stages):
            gate = variant.check()
            if not gate.ok:
                raise SystemExit(f"{variant.stage} at M={m} failed its check: {gate.message}")
            yield (f"dense {n}x{k} M={m} {variant.stage} {variant.prepared.info['config']}",
                   variant.prepared.call)


M64_BACKENDS = ("humming-w4a16", "triton-w4a16", "cuda-w4a16")   # one launch a call each


def m64_twin():
    """The Triton M=64 preset at the dense shape with two warpgroups on its tile."""
    n, k = dense_shape(False)
    return dataclasses.replace(tensor_core_config(64, n, k, SMS), num_warps=8)


def m64_plan() -> list[dict]:
    """`launch_plan` for --m64: each of M64_BACKENDS' presets at the dense shape, M=64, then the
    Triton preset's two-warpgroup twin."""
    n, k = dense_shape(False)
    kernels = {"humming-w4a16": "humming", "triton-w4a16": tensor_core_config(64, n, k, SMS).label(),
               "cuda-w4a16": cuda_choose(64, n, k).label()}
    return ([{"launch": f"{backend} {n}x{k} M=64", "kernel": kernels[backend], "weights": n * k}
             for backend in M64_BACKENDS]
            + [{"launch": f"triton-w4a16 {n}x{k} M=64 two warpgroups", "kernel": m64_twin().label(),
                "weights": n * k}])


def m64_launches(device: str):
    n, k = dense_shape(False)
    cache: dict = {}
    for backend in M64_BACKENDS:
        yield f"{backend} {n}x{k} M=64 nvfp4", gated_dense(backend, 64, device, cache).call
    twin = gated_dense("triton-w4a16", 64, device, cache, config=m64_twin())
    yield f"triton-w4a16 {n}x{k} M=64 nvfp4 {twin.info['config']}", twin.call


def gated_moe_call(method: str, device: str, smoke: bool, fmt: str = "nvfp4"):
    """(label, call) of MoE `method` at the MoE point with `fmt` weights, after its gate passed."""
    model, batch, ids = moe_point(smoke)
    problem = moe_base.make_layer_problem(ids, model.experts, model.hidden,
                                          model.moe_intermediate, fmt, device)
    call = get_moe(method).prepare(problem)
    gate = moe_base.check_call(call, problem)
    if not gate.ok:
        raise SystemExit(f"{method} {fmt} failed its gate: {gate.message}")
    return f"{method} {model.key} B={batch} {fmt} ({call.note})", call.call


def moe_launch(device: str, smoke: bool):
    yield gated_moe_call("triton-w4a16-moe", device, smoke)


def peer_launches(device: str):
    """humming-w4a16 at 8192x8192 M=1 and humming-moe-indexed at GLM-5 B=512, NVFP4, gated."""
    n, k = dense_shape(False)
    yield f"humming-w4a16 {n}x{k} M=1 nvfp4", gated_dense("humming-w4a16", 1, device, {}).call
    yield gated_moe_call("humming-moe-indexed", device, False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", action="store_true",
                        help="print the metric list for ncu --metrics and exit")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny stand-ins (the CPU test, under TRITON_INTERPRET=1)")
    parser.add_argument("--peers", action="store_true",
                        help="profile humming's dense and MoE kernels at the same points instead")
    parser.add_argument("--cuda", action="store_true",
                        help="profile fp4lab's CUDA decode GEMM (cuda-w4a16) at the dense points")
    parser.add_argument("--cuda-builds", default="", metavar="g16d4w8k8,...",
                        help="with --cuda: profile these builds instead of the preset")
    parser.add_argument("--m64", action="store_true",
                        help="profile humming's, the Triton and the CUDA dense kernels at M=64 instead")
    parser.add_argument("--launches", type=Path,
                        help="write launches.json (what each kernel launch is) to this file")
    parser.add_argument("--describe", action="store_true",
                        help="only write --launches (no GPU, nothing run)")
    args = parser.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if (args.peers or args.cuda or args.m64) and args.smoke:
        parser.error("--peers, --cuda and --m64 profile GPU-only kernels: no --smoke")
    if args.peers + args.cuda + args.m64 > 1:
        parser.error("one of --peers, --cuda and --m64 a run")
    if args.cuda_builds and not args.cuda:
        parser.error("--cuda-builds goes with --cuda")
    builds = parse_builds(args.cuda_builds)
    if args.launches:
        plan = (peer_plan() if args.peers else cuda_plan(builds) if args.cuda else m64_plan() if args.m64
                else launch_plan(args.smoke))
        args.launches.write_text(json.dumps(plan, indent=1) + "\n")
    if args.describe:
        if not args.launches:
            parser.error("--describe writes --launches FILE: name it")
        return 0
    device = tune.script_device("ncu_profile", args.smoke)
    if device is None:
        return 2
    launches = (list(peer_launches(device)) if args.peers else list(cuda_launches(device, builds))
                if args.cuda else list(m64_launches(device)) if args.m64
                else [*dense_launches(device, args.smoke), *moe_launch(device, args.smoke)])
    for label, call in launches:
        call()                                     # compiled and warm before its range
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        print(f"profiled: {label}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
