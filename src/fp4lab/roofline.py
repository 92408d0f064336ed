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

Ceilings come from the spec sheet (`spec_ceilings`) and from this GPU (`fp4lab.ceilings`: a large
device-to-device copy, the best large GEMM per dtype, the launch floor), measured in the same run
as the points. Percent of peak uses the peak of the dtype the math runs in (`MATH_DTYPE`).
Pure arithmetic: nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
