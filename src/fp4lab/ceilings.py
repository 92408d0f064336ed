"""This GPU's ceilings, measured with fp4lab's timer: a large device-to-device copy (bandwidth,
bytes read + written), the best large GEMM per dtype (peaks), and an empty kernel's graph replay
(the launch floor). The sweep measures them once per run, in a worker, before the points.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fp4lab import bench
from fp4lab.roofline import Ceilings, gemm_flops


@dataclass(frozen=True)
class CeilingProbes:
    """Sizes of the probes `measure_ceilings` runs."""

    copy_bytes: int          # device-to-device copy (source size)
    gemm_size: int           # square GEMM edge for the dtype peaks
    repeats: int

    @classmethod
    def cuda(cls) -> "CeilingProbes":
        return cls(copy_bytes=2**30, gemm_size=8192, repeats=30)

    @classmethod
    def cuda_quick(cls) -> "CeilingProbes":
        return cls(copy_bytes=2**28, gemm_size=4096, repeats=10)

    @classmethod
    def cpu(cls) -> "CeilingProbes":
        return cls(copy_bytes=2**24, gemm_size=256, repeats=9)  # a shared CPU is noisy


def _probe_config(probes: CeilingProbes) -> bench.TimerConfig:
    # the probes are far larger than L2 (or deliberately the best case): time them warm
    return dataclasses.replace(bench.TimerConfig(), repeats=probes.repeats, cold_l2=False)


def measure_copy_tbps(device: torch.device, probes: CeilingProbes) -> tuple[float, str]:
    source = torch.ones(probes.copy_bytes // 4, device=device)
    target = torch.empty_like(source)
    # eager, not graph-replayed: a memcpy node in a CUDA graph runs on the copy engines, which
    # moved 2.7 TB/s on the H200 where the SM copy kernel of an eager copy_ moves ~4.2 TB/s
    config = dataclasses.replace(_probe_config(probes), use_graph=False)
    timing = bench.time_call(lambda args, out: lambda: out.copy_(args[0]), (source,), target,
                             config, device)
    moved = 2 * source.nbytes  # read + write
    label = f"copy {source.nbytes / 2**20:.0f} MiB (read+write counted)"
    return moved / timing.median_us / 1e6, bench.format_timing_line(label, timing)


def measure_gemm_tflops(device: torch.device, probes: CeilingProbes, dtype: str) -> tuple[float, str]:
    """Best-case square GEMM throughput for "bf16" / "fp32" (torch.mm) or "fp8" (_scaled_mm)."""
    size = probes.gemm_size
    a = torch.randn(size, size, device=device)
    w = torch.randn(size, size, device=device)  # [N, K]
    if dtype == "fp8":
        scale = torch.ones((), device=device)
        args = (a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), scale)
        out = torch.empty(size, size, device=device, dtype=torch.bfloat16)

        def make_call(call_args, call_out):
            a8, w8, one = call_args
            # _scaled_mm wants the second operand column-major: w8 [N, K] -> w8.t() [K, N]
            return lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                            out_dtype=torch.bfloat16, out=call_out)
        what = "_scaled_mm e4m3 (no fast accum)"  # as the torch-fp8 backend runs it
    else:
        torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        args = (a.to(torch_dtype), w.to(torch_dtype))
        out = torch.empty(size, size, device=device, dtype=torch_dtype)

        def make_call(call_args, call_out):
            return lambda: torch.mm(call_args[0], call_args[1].t(), out=call_out)
        what = f"torch.mm {dtype}"
    timing = bench.time_call(make_call, args, out, _probe_config(probes), device)
    label = f"{what} {size}^3"
    return gemm_flops(size, size, size) / timing.median_us / 1e6, bench.format_timing_line(label, timing)


def measure_ceilings(device="auto", quick: bool = False) -> Ceilings:
    """This device's ceilings, measured now with fp4lab's timer (see module doc)."""
    device = bench.torch_device(device)
    details: dict[str, str] = {}
    if device.type == "cpu":
        probes = CeilingProbes.cpu()
        peak_dtypes = ("fp32", "bf16")
        name = "cpu"
    else:
        probes = CeilingProbes.cuda_quick() if quick else CeilingProbes.cuda()
        bench.warm_up_clocks(device, bench.TimerConfig())
        peak_dtypes = ("bf16", "fp8") if torch.cuda.get_device_capability(device) >= (8, 9) \
            else ("bf16",)
        name = torch.cuda.get_device_name(device)
    bandwidth, details["bandwidth"] = measure_copy_tbps(device, probes)
    peaks: dict[str, float | None] = {"fp4": None, "fp8": None, "bf16": None}
    for dtype in peak_dtypes:
        try:
            peaks[dtype], details[dtype] = measure_gemm_tflops(device, probes, dtype)
        except RuntimeError as exc:  # e.g. a torch build without this dtype's GEMM: say so
            peaks[dtype], details[dtype] = None, f"probe failed: {str(exc).splitlines()[0][:200]}"
    missing = [dtype for dtype, value in peaks.items() if value is None and dtype not in details]
    if missing:
        details["not_measured"] = (f"{', '.join(missing)}: no probe for this dtype on "
                                   f"{'the CPU' if device.type == 'cpu' else name}; "
                                   "use the spec sheet's figure")
    launch = bench.empty_kernel_launch_us(device, bench.TimerConfig.smoke())
    details["launch"] = ("one-element add replayed from a CUDA graph" if device.type == "cuda"
                         else "CPU: dispatch time of a one-element torch add")
    return Ceilings(bandwidth_tbps=bandwidth, peak_tflops=peaks, launch_us=launch,
                    source="measured", device=name, details=details)
