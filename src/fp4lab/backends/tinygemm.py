"""`tinygemm-int4`: torch's tinygemm kernel on int4 weights, the same-bytes reference, not FP4.

tinygemm (`torch._weight_int4pack_mm`, the int4 weight-only path of torchao and gpt-fast) reads
0.5 B per weight plus a bf16 scale and a bf16 zero per group of 128 along K: the bytes of FP4,
another number format. It shows what a mature 4-bit weight-only kernel does with those bytes.

The FP4 weights are dequantized and re-quantized to int4, asymmetric, group 128:
`w ~ (q - 8) * scale + zero` with q in 0..15, scale = (max - min) / 15 and zero = min + 8 * scale
per group; the gate compares the kernel with exactly those int4 weights (dequantized with the
bf16 scales and zeros the kernel reads), not with the FP4 weights.

Packing per device (torch's own ops):
- CUDA: `torch._convert_weight_to_int4pack(uint8 [N, K/2] with element 2i in the HIGH nibble,
  inner_k_tiles=8)`, then `torch._weight_int4pack_mm(a, packed, 128, scales_and_zeros)`;
- CPU: `torch._convert_weight_to_int4pack_for_cpu(int32 [N, K], inner_k_tiles=8)`, then
  `torch._weight_int4pack_mm_for_cpu(...)`, where this torch has them (then it runs in the tests).
`scales_and_zeros` is bf16 [K/128, N, 2]: [..., 0] the scale, [..., 1] the zero.
Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension, `G` = K / 128 groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp4lab.backends.base import (
    BF16_MIN_CAPABILITY, Backend, Requirements, prepared_from, resolve_device,
)
from fp4lab.dtypes import INT4_GROUP

INNER_K_TILES = 8
INT4_LEVELS = 15          # q in 0..15
INT4_MIDPOINT = 8         # tinygemm decodes (q - 8) * scale + zero


@dataclass(frozen=True)
class Int4Ops:
    """The two torch ops that pack and multiply int4 weights on one kind of device."""

    pack: str
    matmul: str
    packed_nibbles: bool      # pack takes uint8 [N, K/2] (True) or int32 codes [N, K] (False)


INT4_OPS = {
    "cuda": Int4Ops("_convert_weight_to_int4pack", "_weight_int4pack_mm", packed_nibbles=True),
    "cpu": Int4Ops("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu",
                   packed_nibbles=False),
}


def int4_quantize(w: torch.Tensor, group: int = INT4_GROUP):
    """float w [N, K] -> (codes uint8 [N, K] in 0..15, scales bf16 [N, G], zeros bf16 [N, G])."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"weights w have K={k}, not a multiple of the int4 group {group}")
    groups = w.float().reshape(n, k // group, group)                         # [N, G, 128]
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)                     # [N, G]
    scales = ((high - low) / INT4_LEVELS).clamp(min=1e-8)
    zeros = low + INT4_MIDPOINT * scales
    codes = ((groups - low.unsqueeze(-1)) / scales.unsqueeze(-1)).round().clamp(0, INT4_LEVELS)
    return codes.reshape(n, k).to(torch.uint8), scales.to(torch.bfloat16), zeros.to(torch.bfloat16)


def int4_dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """float32 [N, K]: what tinygemm multiplies, (q - 8) * scale + zero with the bf16 scale/zero."""
    n, k = codes.shape
    groups = codes.float().reshape(n, scales.shape[1], -1) - INT4_MIDPOINT   # [N, G, 128]
    return (groups * scales.float().unsqueeze(-1) + zeros.float().unsqueeze(-1)).reshape(n, k)


def scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """bf16 [G, N, 2] from scales and zeros [N, G]: tinygemm's qScaleAndZeros."""
    return torch.stack([scales.t(), zeros.t()], dim=-1).contiguous()


def pack_int4(codes: torch.Tensor, ops: Int4Ops) -> torch.Tensor:
    """codes uint8 [N, K] -> torch's tiled int4 layout for `ops`' device."""
    if ops.packed_nibbles:
        source = (codes[:, 0::2] << 4) | codes[:, 1::2]                       # [N, K/2]
    else:
        source = codes.to(torch.int32)                                       # [N, K]
    return getattr(torch, ops.pack)(source, INNER_K_TILES)


class TinygemmInt4(Backend):
    name = "tinygemm-int4"
    formats = ("nvfp4", "mxfp4")
    library = "torch"
    weight_dtype, act_dtype = "int4", "bf16"
    requires = Requirements(gpu=False, min_capability=BF16_MIN_CAPABILITY, unit="bf16 tensor cores")
    what = "torch._weight_int4pack_mm (tinygemm): int4 weights, group 128 scales and zeros, bf16 math"
    note = "int4 (not FP4): the same-bytes reference"

    def availability(self, device: str, import_check: bool = True) -> tuple[bool, str]:
        available, reason = super().availability(device, import_check)
        if not available:
            return available, reason
        ops = INT4_OPS[device_kind(device)]
        missing = [op for op in (ops.pack, ops.matmul) if not hasattr(torch, op)]
        if missing:
            return False, f"torch {torch.__version__} has no torch.{missing[0]}"
        return True, reason

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        device = resolve_device(device)
        ops = INT4_OPS[device_kind(device)]
        codes, scales, zeros = int4_quantize(formats.dequantize(w.to(device)))   # [N, K], [N, G]
        packed = pack_int4(codes, ops)
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()            # [M, K]
        matmul = getattr(torch, ops.matmul)

        def gemm(a_arg, packed_arg, scales_zeros, out):
            return matmul(a_arg, packed_arg, INT4_GROUP, scales_zeros)

        # tinygemm allocates its own output: nothing to poison, the gate checks what it returns
        return prepared_from(gemm, (a_bf16, packed, scales_and_zeros(scales, zeros)), None,
                             ref_a=a_bf16.float(), ref_w=int4_dequantize(codes, scales, zeros))


def device_kind(device: str) -> str:
    return "cpu" if resolve_device(device) == "cpu" else "cuda"
