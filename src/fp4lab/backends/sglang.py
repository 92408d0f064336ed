"""sgl-kernel's CUTLASS NVFP4 GEMM.

Documented call (sgl_kernel.cutlass_scaled_fp4_mm):
    cutlass_scaled_fp4_mm(a [M, K/2] uint8, b [N, K/2] uint8 (row-major: no transpose),
                          block_scale_a, block_scale_b (float8_e4m3fn, 128x4 swizzled
                          [rows_pad128, (K/16)_pad4]), alpha (float32, 1/(gs_a*gs_b)), out_dtype)
It allocates its own output (no `out=`), so `Prepared.out` is None and the gate checks the
returned tensor. Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension.
"""

from __future__ import annotations

import torch

from fp4lab.backends.base import (
    BLACKWELL_FP4_CAPABILITIES, OUTPUT_DTYPE, Backend, Requirements, prepared_from, resolve_device,
)


class SglCutlass(Backend):
    name = "sgl-cutlass"
    formats = ("nvfp4",)
    library = "sgl-kernel"
    weight_dtype, act_dtype = "fp4", "fp4"
    requires = Requirements(capabilities=BLACKWELL_FP4_CAPABILITIES, unit="FP4 tensor cores",
                            module="sgl_kernel", pip_name="sgl-kernel")
    what = "sgl_kernel.cutlass_scaled_fp4_mm"

    def prepare(self, a, w, device):
        self.check_inputs(a, w)
        import sgl_kernel

        from fp4lab import formats
        from fp4lab.backends.flashinfer import mm_fp4_alpha

        device = resolve_device(device)
        w = w.to(device)
        a_q = formats.quantize(a.to(device=device, dtype=torch.bfloat16), w.fmt)
        args = (a_q.packed, w.packed, formats.swizzle_scales(a_q.scales),
                formats.swizzle_scales(w.scales), mm_fp4_alpha(a_q.global_scale, w.global_scale))
        gemm = make_sgl_gemm(sgl_kernel.cutlass_scaled_fp4_mm)
        return prepared_from(gemm, args, None, ref_a=formats.dequantize(a_q),
                             ref_w=formats.dequantize(w))


def make_sgl_gemm(cutlass_scaled_fp4_mm):
    def gemm(a_packed, w_packed, a_sf, w_sf, alpha, out):
        return cutlass_scaled_fp4_mm(a_packed, w_packed, a_sf, w_sf, alpha, OUTPUT_DTYPE)

    return gemm
