"""The correctness gate: no GEMM result is timed until it matches a float64 reference.

The reference multiplies `prepared.ref_a` and `prepared.ref_w`, the dequantized operands the
backend really multiplies, so the gate measures the kernel (accumulation order, output rounding,
layout and scale handling) and not the quantization, which is the same on both sides.

The metric is the relative Frobenius error ||out - ref|| / ||ref||. A scale-invariant check such
as cosine similarity is not enough: a kernel that reads a bf16 global scale as fp32 (FlashInfer
#3398) returns `c * ref` with cosine 1.0 and passes, while its relative error is |1 - c|. The gate
also reports the norm ratio ||out|| / ||ref||, so a wrong global scale is named as such.

Before the call the output is poisoned with a NaN whose bit pattern (payload) a kernel never
produces, so after the call "poison survived" (unwritten elements) and "the kernel wrote NaN" are
told apart. Exceptions raised by the call propagate: the sweep records them as `error` rows.

Shape legend: `M` activation rows, `N` weight rows (output features), `K` reduction dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Relative Frobenius tolerance per operand format (the format of the weights the kernel reads).
# Both sides multiply the same dequantized operands, so the tolerance covers only what a correct
# kernel may do differently from float64:
#   - output rounding to bf16: relative error <= 2^-9 per element, ~1e-3 in Frobenius norm;
#   - decoding weights to bf16 in registers (weight-only kernels): nvfp4 value x e4m3 scale x fp32
#     global scale rounds at 2^-9 per weight; mxfp4 scales are powers of two, exact in bf16;
#   - fp32 accumulation in any order: ~K * 2^-24, negligible for K <= 64k.
# A bound of 2e-2 leaves a 10-20x margin over those, while every failure seen in the wild lands
# far above it: all zeros give 1.0, a factor-2 scale error 0.5, swapped scale layouts ~0.3-1.4.
TOLERANCE: dict[str, float] = {
    "nvfp4": 2e-2,
    "mxfp4": 2e-2,
    "fp8": 2e-2,
    "bf16": 2e-2,
}

# When out is close to s * ref for a single scalar s (residual below tolerance after removing s),
# the error is a wrong global scale and the message says so.
SCALE_DIAGNOSIS_MIN_DEVIATION = 0.05

# NaNs with a payload a floating-point unit does not produce (hardware NaNs are canonical).
_POISON_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF8_0000_F4A5_F4A5),
    torch.float32: (torch.int32, 0x7FC1_F4A5),
    torch.bfloat16: (torch.int16, 0x7FD5),
    torch.float16: (torch.int16, 0x7E5A),
}


@dataclass
class GateResult:
    """The gate's verdict on one (backend, shape) point; `message` is one self-describing line."""

    status: str  # "ok" | "wrong_result"
    rel_err: float
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def reference_gemm(ref_a: torch.Tensor, ref_w: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ w[N, K]^T in float64 -> [M, N], on the operands' device."""
    if ref_a.dim() != 2 or ref_w.dim() != 2:
        raise ValueError(f"reference_gemm needs 2-D ref_a [M, K] and ref_w [N, K], got shapes "
                         f"{tuple(ref_a.shape)} and {tuple(ref_w.shape)}")
    if ref_a.shape[1] != ref_w.shape[1]:
        raise ValueError(f"reference_gemm: ref_a has K={ref_a.shape[1]} but ref_w has "
                         f"K={ref_w.shape[1]}")
    if ref_a.device != ref_w.device:
        raise ValueError(f"reference_gemm: ref_a is on {ref_a.device} but ref_w on {ref_w.device}")
    return ref_a.to(torch.float64) @ ref_w.to(torch.float64).T


def poison(out: torch.Tensor) -> None:
    """Fill `out` with the poison NaN (or, for dtypes without NaN payloads, a sentinel)."""
    if out.dtype in _POISON_BITS:
        int_dtype, bits = _POISON_BITS[out.dtype]
        out.view(int_dtype).fill_(bits)
    elif out.dtype.is_floating_point:  # float8 and the like: NaN has no spare payload bits
        out.fill_(float("nan"))
    else:
        out.fill_(torch.iinfo(out.dtype).min)


def poison_survived(out: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements still holding the poison, i.e. never written by the call."""
    if out.dtype in _POISON_BITS:
        int_dtype, bits = _POISON_BITS[out.dtype]
        return out.view(int_dtype) == bits
    if out.dtype.is_floating_point:
        return torch.isnan(out)
    return out == torch.iinfo(out.dtype).min


def run_poisoned(prepared):
    """Poison `prepared.out` (when it has one), run `prepared.call()` once and synchronize every
    GPU its result lies on: the result a check reads (a tensor, or a list of them: a loop of
    expert GEMMs)."""
    if prepared.out is not None:
        poison(prepared.out)
    result = prepared.call()
    tensors = result if isinstance(result, (list, tuple)) else [result]
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}:
        torch.cuda.synchronize(device)
    return result


def exact(result: torch.Tensor, expected: torch.Tensor, check: str, units: str,
          what: str) -> GateResult:
    """An integer check that must match to the last bit: "ok", or how many `units` differ."""
    wrong = int((result != expected).sum())
    if wrong:
        return GateResult("wrong_result", math.nan, f"{check}: {wrong} of {expected.numel()} {units} differ")
    return GateResult("ok", 0.0, f"{check} exact ({what})")


def check_backend(prepared, tolerance: float) -> GateResult:
    """Poison `prepared.out`, run `prepared.call()` once, synchronize, compare with float64.

    Checks, in the order they are reported: output shape, unwritten elements (poison survived),
    NaN/Inf written, all zeros, then the relative Frobenius error against `tolerance`.
    """
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be a positive finite number, got {tolerance!r}")
    reference = reference_gemm(prepared.ref_a, prepared.ref_w)  # [M, N] float64
    reference_norm = torch.linalg.vector_norm(reference).item()
    if reference_norm == 0.0:
        raise ValueError("the reference output is all zeros (ref_a or ref_w is zero): the gate "
                         "needs non-zero operands to tell a working kernel from a broken one")
    return compare(run_poisoned(prepared), reference, reference_norm, tolerance)


def compare(result: torch.Tensor, reference: torch.Tensor, reference_norm: float,
            tolerance: float) -> GateResult:
    """The gate's verdict on `result` against the float64 `reference` [M, N]."""
    if tuple(result.shape) != tuple(reference.shape):
        return GateResult("wrong_result", math.nan,
                          f"output shape {tuple(result.shape)} != reference shape "
                          f"{tuple(reference.shape)}")
    total = result.numel()
    unwritten = int(poison_survived(result).sum().item())
    if unwritten:
        return GateResult("wrong_result", math.nan,
                          f"{unwritten} of {total} output elements unwritten (poison survived)")
    values = result.to(device=reference.device, dtype=torch.float64)
    non_finite = int((~torch.isfinite(values)).sum().item())
    if non_finite:
        return GateResult("wrong_result", math.nan,
                          f"{non_finite} of {total} output elements are NaN/Inf")
    if not bool(values.any().item()):
        return GateResult("wrong_result", 1.0, "output is all zeros (rel_err 1.0e+00)")

    rel_err = torch.linalg.vector_norm(values - reference).item() / reference_norm
    norm_ratio = torch.linalg.vector_norm(values).item() / reference_norm
    if rel_err <= tolerance:
        return GateResult("ok", rel_err, f"rel_err {rel_err:.1e} <= tol {tolerance:.1e} "
                                         f"(out/ref norm ratio {norm_ratio:.3f})")
    return GateResult("wrong_result", rel_err,
                      f"rel_err {rel_err:.1e} > tol {tolerance:.1e}: "
                      f"{_diagnose(values, reference, reference_norm, tolerance, norm_ratio)}")


def _diagnose(values: torch.Tensor, reference: torch.Tensor, reference_norm: float,
              tolerance: float, norm_ratio: float) -> str:
    """Name a wrong global scale when out ~ s * ref; otherwise give the norm ratio and cosine."""
    best_scale = (values * reference).sum().item() / reference_norm**2  # least-squares s
    residual = torch.linalg.vector_norm(values - best_scale * reference).item() / reference_norm
    if residual <= tolerance and abs(best_scale - 1.0) > SCALE_DIAGNOSIS_MIN_DEVIATION:
        return (f"wrong scale? out ~ {best_scale:.3g} x ref, out/ref norm ratio {norm_ratio:.2f} "
                f"(a cosine check would pass this)")
    cosine = best_scale / norm_ratio if norm_ratio else 0.0
    return f"out/ref norm ratio {norm_ratio:.2f}, cosine {cosine:.3f}"
