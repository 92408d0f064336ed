"""Nsight Compute over `cuda-w4a16-moe` at GLM-5 B = 512 NVFP4 (uniform routing): each build's
full call and its anatomy stages (loads only; and decode; and the MMAs, no epilogue; all but the
epilogue without the weights' reads), one call
each inside a CUDA profiler range, so that ncu reads where the time above the loads goes (0.16
ms in the preset, 0.15 for 16 warps in registers on the H100, call 105): issue slots, pipe use,
shared-memory traffic, the warps' stall reasons, gate_up and down apart.

Run under ncu by benchmarks/ncu_cuda_moe.sh (the ncu command line, then `--summary`).

Every full build is gated against the float64 layer before its profiled call; the stage builds
write nothing and are not gated (as in the probe). `--summary` needs no GPU: one block a launch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4lab.analysis.counters import raw_table
from fp4lab.backends.moe.cuda_fused import CudaMoeConfig

# (build, stages): the 32-pair preset (8 warps of two row tiles, 4 k-groups staged, 2 in each
# warp's ring in shared memory, three CTAs an SM: 80 registers), then the same warps with 8 staged
# and 4 in the ring, two CTAs an SM (the preset until call 112). H100, GLM-5 B = 512 NVFP4,
# gate_up: the two-CTA build's 4 warps a scheduler issue 55-57% of cycles, 7 cycles between a
# warp's issues, no pipe over 46% busy (calls 111-112); the three-CTA build's 6 issue 58%, 10
# cycles apart, with 3.5% more instructions (call 112). The "compute" stage (no weight read) says
# how fast each issues when no load waits on HBM.
BUILDS = ((CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=2, weights="shared", min_ctas=3),
           ("full", "mma", "load", "compute")),
          (CudaMoeConfig(warps=8, row_tiles=2, depth=4, weights="shared"),
           ("full", "load", "compute")))
LAUNCHES = ("gate_up", "down")        # the call's fp4_moe_gemm launches, in order
HEADLINE = {                          # ncu raw metric -> what the summary calls it
    "gpu__time_duration.sum": "time",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active %",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles between issues a warp",
    "launch__registers_per_thread": "registers",
    "smsp__inst_executed.avg": "instructions a scheduler",
    "gpc__cycles_elapsed.avg.per_second": "SM clock (Hz)",
}
STALL = "smsp__average_warps_issue_stalled_"
PIPE, PIPE_SUFFIX = "sm__inst_executed_pipe_", ".avg.pct_of_peak_sustained_active"


def labels() -> list[str]:
    return [f"{config.label()} stage {stage} {launch}"
            for config, stages in BUILDS for stage in stages for launch in LAUNCHES]


def profile() -> int:
    import torch

    from fp4lab.backends.moe import base as moe_base, get as get_moe
    from fp4lab.moe import presets as model_presets, routing

    model = model_presets.get("glm-5")
    ids = routing.sample_expert_ids("uniform", model.experts, model.top_k, 512, 1)[0]
    problem = moe_base.make_layer_problem(ids, model.experts, model.hidden, model.moe_intermediate,
                                          "nvfp4", "cuda")
    method = get_moe("cuda-w4a16-moe")
    for config, stages in BUILDS:
        for stage in stages:
            call = method.prepare(problem, config=config, stage=stage)
            if stage == "full":
                gate = moe_base.check_call(call, problem)
                print(f"{config.label():40s} gate {gate.message}", flush=True)
                if not gate.ok:
                    return 1
            call.call()                                      # compiled and warm before the range
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            call.call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{config.label():40s} stage {stage}: profiled", flush=True)
    return 0


def ncu_rows(path: Path) -> list[dict]:
    """ncu's --page raw CSV -> one {metric: cell} a kernel row."""
    names, _, data = raw_table(path)
    return [dict(zip(names, row)) for row in data if len(row) == len(names)]


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def summary(rows: list[dict], names: list[str], top: int = 6) -> str:
    """One block a launch: the headline metrics, the `top` stall reasons (cycles a warp waits
    per issued instruction) and the busiest instruction pipes."""
    if len(rows) != len(names):
        return f"{len(rows)} ncu rows against {len(names)} launches: not joined"
    blocks = []
    for name, row in zip(names, rows):
        lines = [name]
        for metric, what in HEADLINE.items():
            if metric in row:
                lines.append(f"  {what:30s} {row[metric]}")
        stalls = sorted(((number(v) or 0.0, k[len(STALL):]) for k, v in row.items()
                         if k.startswith(STALL) and k.endswith("_per_issue_active.ratio")
                         and "not_issued" not in k), reverse=True)
        lines += [f"  stall {reason:40s} {value:6.2f}" for value, reason in stalls[:top]]
        pipes = sorted(((number(v) or 0.0, k[len(PIPE):-len(PIPE_SUFFIX)]) for k, v in row.items()
                        if k.startswith(PIPE) and k.endswith(PIPE_SUFFIX)), reverse=True)
        lines += [f"  pipe {pipe:41s} {value:6.2f} % busy" for value, pipe in pipes[:top]]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=Path, help="write (profile) or read (--summary) "
                        "the profiled launches' labels, one a line")
    parser.add_argument("--summary", type=Path, metavar="CSV", help="summarize ncu's raw CSV")
    args = parser.parse_args(argv)
    if args.summary:
        names = args.launches.read_text().splitlines() if args.launches else labels()
        print(summary(ncu_rows(args.summary), names))
        return 0
    if args.launches:
        args.launches.write_text("\n".join(labels()) + "\n")
    return profile()


if __name__ == "__main__":
    sys.exit(main())
