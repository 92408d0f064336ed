"""Where a GEMM point sits against the GPU's limits: bytes and FLOPs, floors, ceilings, regime.

A point `a [M, K] @ w[N, K]^T -> [M, N]` must do 2*M*N*K FLOPs and move at least its operands and
its output once. Its time can be no less than each of three floors:
  memory floor  = bytes / bandwidth,
  compute floor = FLOPs / peak of the dtype the math runs in,
  launch floor  = one kernel launched from a CUDA graph (an empty kernel's replay time).
The floors overlap rather than add, so the best attainable time is the largest of them, and that
largest floor names the regime ("launch", "memory" or "compute"): it is what a perfect kernel for
this shape would be limited by. The regime is a property of the shape on this GPU; how far the
measured time sits above the floor is reported separately (`pct_of_floor`, `pct_peak`).

Ceilings come from the spec sheet (`spec_ceilings`) and from this GPU (`measure_ceilings`: a large
device-to-device copy, the best large GEMM per dtype, the launch floor), measured in the same run
as the points. Percent of peak uses the peak of the dtype the math runs in (`MATH_DTYPE`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from fp4lab import bench
from fp4lab.dtypes import BYTES_PER_VALUE, INT4_GROUP, INT4_GROUP_BYTES, MATH_DTYPE, math_dtype  # noqa: F401
from fp4lab.formats import BLOCK_SIZE

SCALE_BYTES = 1                       # e4m3 (nvfp4) and e8m0 (mxfp4) block scales: 1 byte each
GLOBAL_SCALE_BYTES = {"nvfp4": 4, "mxfp4": 0}   # nvfp4's float32 per-tensor scale
FP8_ROW_SCALE_BYTES = 4               # float32 per row: torch-fp8's row-wise scales
OUTPUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

BOUNDS = ("launch", "memory", "compute")


def _check_positive(**dims: int) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def gemm_flops(m: int, n: int, k: int) -> int:
    _check_positive(m=m, n=n, k=k)
    return 2 * m * n * k


def operand_bytes(rows: int, k: int, dtype: str, fmt: str | None) -> int:
    """Bytes of one [rows, K] operand stored as `dtype` (fp4 packs in `fmt`, with its scales)."""
    if dtype not in BYTES_PER_VALUE:
        raise ValueError(f"weight dtype must be one of {sorted(BYTES_PER_VALUE)}, got {dtype!r}")
    if dtype == "fp4":
        if fmt not in BLOCK_SIZE:
            raise ValueError(f"fmt must be one of {sorted(BLOCK_SIZE)} for fp4 operands, "
                             f"got {fmt!r}")
        values = rows * math.ceil(k / 2)
        scales = rows * math.ceil(k / BLOCK_SIZE[fmt]) * SCALE_BYTES
        return values + scales + GLOBAL_SCALE_BYTES[fmt]
    if dtype == "int4":
        return rows * math.ceil(k / 2) + rows * math.ceil(k / INT4_GROUP) * INT4_GROUP_BYTES
    if dtype == "fp8":
        return rows * k + rows * FP8_ROW_SCALE_BYTES
    return rows * k * BYTES_PER_VALUE[dtype]


def gemm_bytes(m: int, n: int, k: int, weight_dtype: str, fmt: str | None,
               act_dtype: str | None = None, out_dtype: str = "bf16") -> int:
    """Bytes a GEMM point must move: weights [N, K] as `weight_dtype` (fp4 in `fmt` with its
    scales), activations [M, K] as `act_dtype` (default: `weight_dtype`, i.e. what a backend of
    that dtype feeds its math units; weight-only kernels pass "bf16"), output [M, N]."""
    _check_positive(m=m, n=n, k=k)
    act_dtype = act_dtype or weight_dtype
    if out_dtype not in OUTPUT_BYTES:
        raise ValueError(f"out_dtype must be one of {sorted(OUTPUT_BYTES)}, got {out_dtype!r}")
    return (operand_bytes(n, k, weight_dtype, fmt) + operand_bytes(m, k, act_dtype, fmt)
            + m * n * OUTPUT_BYTES[out_dtype])


@dataclass
class Ceilings:
    """The limits a point is placed against; `Ceilings(**dataclasses.asdict(c))` round-trips."""

    bandwidth_tbps: float | None
    peak_tflops: dict[str, float | None]   # keys "fp4", "fp8", "bf16" (and "fp32" on CPU)
    launch_us: float | None                # None for the spec sheet (it has no launch floor)
    source: str                            # "spec" | "measured"
    device: str = ""
    details: dict = field(default_factory=dict)  # how each figure was obtained


def spec_ceilings(spec) -> Ceilings:
    """The spec sheet's ceilings (a `hardware.GpuSpec`)."""
    return Ceilings(bandwidth_tbps=spec.memory_bw_tbps, peak_tflops=dict(spec.peak_tflops),
                    launch_us=None, source="spec", device=spec.name,
                    details={"sources": dict(getattr(spec, "sources", {}))})


def floors(m: int, n: int, k: int, weight_dtype: str, fmt: str | None, ceilings: Ceilings,
           act_dtype: str | None = None) -> dict[str, float | None]:
    """The point's memory, compute and launch floors in microseconds (None where unknown)."""
    moved = gemm_bytes(m, n, k, weight_dtype, fmt, act_dtype)
    peak = ceilings.peak_tflops.get(math_dtype(weight_dtype, act_dtype))
    # bytes / (TB/s * 1e12) s = bytes / (TB/s * 1e6) us; FLOPs likewise with TFLOP/s
    return {
        "memory_floor_us": moved / (ceilings.bandwidth_tbps * 1e6) if ceilings.bandwidth_tbps else None,
        "compute_floor_us": gemm_flops(m, n, k) / (peak * 1e6) if peak else None,
        "launch_floor_us": ceilings.launch_us,
    }


def regime(point_floors: dict[str, float | None]) -> str | None:
    """The largest floor's name: what a perfect kernel for this point would be limited by."""
    known = {bound: point_floors[f"{bound}_floor_us"] for bound in BOUNDS
             if point_floors.get(f"{bound}_floor_us") is not None}
    return max(known, key=known.get) if known else None


def classify(row: dict, ceilings: Ceilings) -> dict:
    """Roofline verdict for a measured row (m, n, k, fmt, weight_dtype, median_us; optional
    act_dtype): floors, bound, achieved tflops / tbps, % of the math dtype's peak and of bandwidth,
    and pct_of_floor (100 = the point runs at its largest floor)."""
    m, n, k, median_us = row["m"], row["n"], row["k"], row["median_us"]
    if not (isinstance(median_us, (int, float)) and median_us > 0):
        raise ValueError(f"median_us must be a positive number, got {median_us!r}")
    weight_dtype, act_dtype, fmt = row["weight_dtype"], row.get("act_dtype"), row.get("fmt")
    point_floors = floors(m, n, k, weight_dtype, fmt, ceilings, act_dtype)
    tflops = gemm_flops(m, n, k) / median_us / 1e6
    tbps = gemm_bytes(m, n, k, weight_dtype, fmt, act_dtype) / median_us / 1e6
    peak_dtype = math_dtype(weight_dtype, act_dtype)
    peak = ceilings.peak_tflops.get(peak_dtype)
    bound = regime(point_floors)
    largest = point_floors[f"{bound}_floor_us"] if bound else None
    return {
        **point_floors,
        "bound": bound,
        "tflops": tflops,
        "tbps": tbps,
        "peak_dtype": peak_dtype,
        "pct_peak": 100 * tflops / peak if peak else None,
        "pct_bandwidth": 100 * tbps / ceilings.bandwidth_tbps if ceilings.bandwidth_tbps else None,
        "pct_of_floor": 100 * largest / median_us if largest else None,
        "ceilings_source": ceilings.source,
    }


# -- measured ceilings --------------------------------------------------------------------------

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


def measured_bandwidth_tbps(run_json: dict) -> float | None:
    """A run folder's measured copy bandwidth (the GEMM sweep's ceiling probe, in run.json), or None."""
    return (run_json.get("sweep", {}).get("ceilings", {}).get("measured") or {}).get("bandwidth_tbps")
