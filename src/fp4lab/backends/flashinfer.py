"""FlashInfer's `mm_fp4` with its three native-FP4 backends: cutlass, cudnn and trtllm.

Documented call (flashinfer.gemm.mm_fp4):
    mm_fp4(a [M, K/2] uint8, b [K/2, N] column-major (= w_packed.T), a_descale (128x4 swizzled),
           b_descale (= w_swizzled.T), alpha (float32, 1/(gs_a*gs_b)), out_dtype, out,
           block_size=16|32, use_8x4_sf_layout=False, backend=..., use_nvfp4=...)
Global scales stay float32 (FlashInfer #3398: a bf16 global scale gave wrong results that passed a
cosine check). trtllm swaps A and B internally, so its weights and their scales are shuffled
(`shuffle_matrix_a` / `shuffle_matrix_sf_a`, epilogue tile 128) once, here in `prepare`.
Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp4lab.backends.base import (
    BLACKWELL_FP4_CAPABILITIES, DATACENTER_BLACKWELL_CAPABILITIES, OUTPUT_DTYPE, Backend,
    Requirements, prepared_from, resolve_device, round_up,
)

TRTLLM_EPILOGUE_TILE_M = 128


@dataclass(frozen=True)
class FlashInferVariant:
    backend: str                                # mm_fp4's `backend=` string
    formats: tuple[str, ...]
    capabilities: tuple[tuple[int, int], ...]   # where FlashInfer ships this backend
    shuffle_weights: bool = False


VARIANTS = {
    "flashinfer-cutlass": FlashInferVariant("cutlass", ("nvfp4",), BLACKWELL_FP4_CAPABILITIES),
    "flashinfer-cudnn": FlashInferVariant("cudnn", ("nvfp4", "mxfp4"), BLACKWELL_FP4_CAPABILITIES),
    # trtllm-gen kernels exist for datacenter Blackwell only
    "flashinfer-trtllm": FlashInferVariant("trtllm", ("nvfp4",), DATACENTER_BLACKWELL_CAPABILITIES,
                                           shuffle_weights=True),
}


class FlashInferMmFp4(Backend):
    library = "flashinfer"
    weight_dtype, act_dtype = "fp4", "fp4"

    def __init__(self, name: str):
        self.name = name
        self.variant = VARIANTS[name]
        self.formats = self.variant.formats
        self.requires = Requirements(capabilities=self.variant.capabilities, unit="FP4 tensor cores",
                                     module="flashinfer", pip_name="flashinfer-python")
        self.what = f"flashinfer.mm_fp4(backend={self.variant.backend!r})"

    def prepare(self, a, w, device):
        self.check_inputs(a, w)
        import flashinfer

        args, ref_a, ref_w = self.operands(a, w, resolve_device(device), flashinfer)
        out = torch.empty(a.shape[0], w.shape[0], dtype=OUTPUT_DTYPE, device=args[0].device)
        gemm = make_mm_fp4_gemm(flashinfer.mm_fp4, self.variant.backend, w.fmt)
        return prepared_from(gemm, args, out, ref_a=ref_a, ref_w=ref_w)

    def operands(self, a, w, device, flashinfer):
        """(a_packed [M, K/2] u8, w_packed [N, K/2] u8, a_sf, w_sf, alpha) and the references.

        Scales are 128x4-swizzled [rows_pad128, (K/B)_pad4]: e4m3 for nvfp4, uint8 e8m0 for mxfp4.
        """
        from fp4lab import formats

        w = w.to(device)
        a_q = formats.quantize(a.to(device=device, dtype=torch.bfloat16), w.fmt)
        a_sf = formats.swizzle_scales(a_q.scales)
        if self.variant.shuffle_weights:
            w_packed, w_sf = trtllm_shuffled_weights(w, flashinfer)
        else:
            w_packed, w_sf = w.packed, formats.swizzle_scales(w.scales)
        alpha = mm_fp4_alpha(a_q.global_scale, w.global_scale)
        args = (a_q.packed, w_packed, a_sf, w_sf, alpha)
        return args, formats.dequantize(a_q), formats.dequantize(w)


def mm_fp4_alpha(gs_a: torch.Tensor | None, gs_w: torch.Tensor | None) -> torch.Tensor | None:
    """alpha = 1/(gs_a*gs_w) as a float32 [1] tensor; None for mxfp4 (no global scales)."""
    if gs_a is None and gs_w is None:
        return None
    return (1.0 / (gs_a.float() * gs_w.float())).reshape(1).to(torch.float32)


def trtllm_shuffled_weights(w, flashinfer):
    """Rows reordered for trtllm's swapped-operand epilogue; scales shuffled from linear then
    laid out 128x4 by FlashInfer itself, reshaped to the padded [N_pad, (K/16)_pad] grid."""
    n, k = w.shape
    packed = flashinfer.shuffle_matrix_a(w.packed.view(torch.uint8), TRTLLM_EPILOGUE_TILE_M)
    scales = flashinfer.shuffle_matrix_sf_a(w.scales.view(torch.uint8), TRTLLM_EPILOGUE_TILE_M)
    rows, cols = round_up(n, 128), round_up(k // 16, 4)
    if scales.numel() != rows * cols:
        raise ValueError(f"flashinfer-trtllm needs weight rows N padded to 128 and K/16 to 4; "
                         f"N={n}, K={k} gave {scales.numel()} scale bytes, not {rows * cols}")
    return packed, scales.reshape(rows, cols).view(torch.float8_e4m3fn)


def make_mm_fp4_gemm(mm_fp4, backend: str, fmt: str):
    block_size = 16 if fmt == "nvfp4" else 32

    def gemm(a_packed, w_packed, a_sf, w_sf, alpha, out):
        return mm_fp4(a_packed, w_packed.T, a_sf, w_sf.T, alpha, OUTPUT_DTYPE, out,
                      block_size=block_size, use_8x4_sf_layout=False, backend=backend,
                      use_nvfp4=fmt == "nvfp4")

    return gemm
