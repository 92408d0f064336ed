"""Backends built on torch alone: the bf16 baseline, row-wise FP8 and native FP4 `_scaled_mm`.

Shape legend: `M` activation rows, `N` weight rows (output features), `K` reduction dimension.
"""

from __future__ import annotations

import torch

from fp4lab.backends.base import (
    BLACKWELL_FP4_CAPABILITIES, FP8_MIN_CAPABILITY, OUTPUT_DTYPE, Backend, Requirements,
    prepared_from, resolve_device,
)
from fp4lab.formats import E4M3_MAX as FP8_MAX


def empty_output(m: int, n: int, device: str) -> torch.Tensor:
    return torch.empty(m, n, dtype=OUTPUT_DTYPE, device=device)


class TorchBf16(Backend):
    """cuBLAS (or the CPU's) bf16 matmul of a[M, K] with the dequantized weights: the baseline."""

    name = "torch-bf16"
    formats = ("nvfp4", "mxfp4")
    library = "torch"
    weight_dtype, act_dtype = "bf16", "bf16"
    requires = Requirements(gpu=False)
    what = "bf16 matmul of the dequantized weights (cuBLAS on a GPU)"

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        device = resolve_device(device)
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()  # [M, K]
        w_bf16 = formats.dequantize(w).to(device=device, dtype=torch.bfloat16)  # [N, K]
        out = empty_output(a.shape[0], w.shape[0], device)  # [M, N]
        return prepared_from(bf16_gemm, (a_bf16, w_bf16), out,
                             ref_a=a_bf16.float(), ref_w=w_bf16.float())


def bf16_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ w[N, K].T -> out [M, N]."""
    return torch.mm(a, w.t(), out=out)


def rowwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (e4m3 [R, K], float32 decode scale [R, 1]): one scale per row."""
    amax = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    scale = amax / FP8_MAX
    x_fp8 = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x_fp8, scale


class TorchFp8(Backend):
    """`torch._scaled_mm` on e4m3 operands with row-wise scales: what FP8 offers on Hopper."""

    name = "torch-fp8"
    formats = ("nvfp4", "mxfp4")
    library = "torch"
    weight_dtype, act_dtype = "fp8", "fp8"
    requires = Requirements(min_capability=FP8_MIN_CAPABILITY, unit="FP8 tensor cores")
    what = "cuBLASLt FP8 e4m3 GEMM with row-wise scales, bf16 out"

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        device = resolve_device(device)
        a_fp8, a_scale = rowwise_fp8(a.to(device))  # [M, K], [M, 1]
        w_fp8, w_scale = rowwise_fp8(formats.dequantize(w).to(device))  # [N, K], [N, 1]
        out = empty_output(a.shape[0], w.shape[0], device)
        # _scaled_mm wants mat2 column-major [K, N] and its scale as [1, N]
        args = (a_fp8, w_fp8, a_scale, w_scale.t().contiguous())
        return prepared_from(fp8_gemm, args, out, ref_a=a_fp8.float() * a_scale,
                             ref_w=w_fp8.float() * w_scale)


def fp8_gemm(a_fp8, w_fp8, a_scale, w_scale_row, out):
    """a_fp8 [M, K] @ w_fp8[N, K].T, scales [M, 1] and [1, N] -> out [M, N] bf16."""
    return torch._scaled_mm(a_fp8, w_fp8.t(), scale_a=a_scale, scale_b=w_scale_row,
                            out_dtype=OUTPUT_DTYPE, out=out)


class TorchFp4(Backend):
    """`torch._scaled_mm` with `float4_e2m1fn_x2` operands and 128x4-swizzled block scales.

    Activations are quantized to the same format as the weights in `prepare` (a real deployment
    quantizes them per call; this times the GEMM alone, like the other native-FP4 adapters).
    """

    name = "torch-fp4"
    formats = ("nvfp4", "mxfp4")
    library = "torch"
    weight_dtype, act_dtype = "fp4", "fp4"
    requires = Requirements(capabilities=BLACKWELL_FP4_CAPABILITIES, unit="FP4 tensor cores")
    what = "cuBLASLt block-scaled FP4 GEMM"

    def runtime_reason(self) -> str | None:
        if not hasattr(torch, "float4_e2m1fn_x2"):
            return f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype"
        if not hasattr(torch.nn.functional, "scaled_mm"):
            return (f"torch {torch.__version__} has no torch.nn.functional.scaled_mm, "
                    "which NVFP4's two-level (block + tensor) scales need")
        return None

    def prepare(self, a, w, device):
        self.check_inputs(a, w)
        device = resolve_device(device)
        args, ref_a, ref_w = fp4_operands(a, w, device)
        gemm = nvfp4_scaled_mm if w.fmt == "nvfp4" else mxfp4_scaled_mm
        out = None if w.fmt == "nvfp4" else empty_output(a.shape[0], w.shape[0], device)
        return prepared_from(gemm, args, out, ref_a=ref_a, ref_w=ref_w)


def fp4_operands(a: torch.Tensor, w, device: str):
    """The torch-fp4 call's args and the dequantized operands it multiplies.

    args: a_fp4 [M, K/2] fp4x2, w_fp4 [N, K/2] fp4x2, a_sf / w_sf swizzled [rows_pad, K/B pad],
    and for nvfp4 the float32 decode scales 1/global_scale of each operand.
    """
    from fp4lab import formats

    w = w.to(device)
    a_q = formats.quantize(a.to(device=device, dtype=torch.bfloat16), w.fmt)
    scale_dtype = torch.float8_e4m3fn if w.fmt == "nvfp4" else torch.float8_e8m0fnu
    a_sf = formats.swizzle_scales(a_q.scales).view(scale_dtype)
    w_sf = formats.swizzle_scales(w.scales).view(scale_dtype)
    args = (a_q.packed.view(torch.float4_e2m1fn_x2), w.packed.view(torch.float4_e2m1fn_x2),
            a_sf, w_sf)
    if w.fmt == "nvfp4":
        args += (decode_scale(a_q.global_scale), decode_scale(w.global_scale))
    return args, formats.dequantize(a_q), formats.dequantize(w)


def decode_scale(global_scale: torch.Tensor) -> torch.Tensor:
    """formats stores the ENCODE scale (448*6/amax); the kernels multiply by its inverse."""
    return (1.0 / global_scale.float()).reshape(1)


def nvfp4_scaled_mm(a_fp4, w_fp4, a_sf, w_sf, a_decode, w_decode, out):
    """Two-level NVFP4 (block e4m3 x tensor fp32) in one kernel; the new API returns its own
    output (no `out=`), so `Prepared.out` is None for nvfp4."""
    from torch.nn.functional import ScalingType, SwizzleType, scaled_mm

    recipe = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
    swizzle = [SwizzleType.SWIZZLE_32_4_4, SwizzleType.NO_SWIZZLE]
    return scaled_mm(a_fp4, w_fp4.t(), [a_sf, a_decode], recipe, [w_sf, w_decode], recipe,
                     swizzle_a=swizzle, swizzle_b=swizzle, output_dtype=OUTPUT_DTYPE)


def mxfp4_scaled_mm(a_fp4, w_fp4, a_sf, w_sf, out):
    """MXFP4: e8m0 block scales only, so the classic `_scaled_mm` with `out=` does it all."""
    return torch._scaled_mm(a_fp4, w_fp4.t(), scale_a=a_sf, scale_b=w_sf,
                            out_dtype=OUTPUT_DTYPE, out=out)
