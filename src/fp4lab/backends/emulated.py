"""`emulated`: dequantize the FP4 weights, then a bf16 matmul. Runs anywhere, CPU included.

Unlike `torch-bf16`, the dequantization is inside the timed call: this measures what a framework
without FP4 kernels pays per call (decode the whole weight, write it out, read it back).
Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension.
"""

from __future__ import annotations

import torch

from fp4lab.backends.base import OUTPUT_DTYPE, Backend, Requirements, prepared_from, resolve_device


class Emulated(Backend):
    name = "emulated"
    formats = ("nvfp4", "mxfp4")
    library = "torch"
    # what must move: the FP4 weights it reads (its bf16 copy is overhead the roofline charges it)
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = Requirements(gpu=False)
    what = "dequantize to bf16 in every call, then bf16 matmul"

    def prepare(self, a, w, device):
        from fp4lab import formats

        self.check_inputs(a, w)
        device = resolve_device(device)
        w = w.to(device)
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()  # [M, K]
        out = torch.empty(a.shape[0], w.shape[0], dtype=OUTPUT_DTYPE, device=device)  # [M, N]
        args = (a_bf16, w.packed, w.scales, w.global_scale)
        gemm = make_emulated_gemm(w.fmt, tuple(w.shape))
        # the call rounds the decoded weights to bf16, so that is what it multiplies
        ref_w = formats.dequantize(w).to(torch.bfloat16).float()
        return prepared_from(gemm, args, out, ref_a=a_bf16.float(), ref_w=ref_w)


def make_emulated_gemm(fmt: str, shape: tuple[int, int]):
    from fp4lab.formats import QuantizedTensor, dequantize

    def gemm(a, packed, scales, global_scale, out):
        w = QuantizedTensor(packed=packed, scales=scales, global_scale=global_scale, fmt=fmt,
                            shape=shape)
        w_bf16 = dequantize(w).to(torch.bfloat16)  # [N, K]
        return torch.mm(a, w_bf16.t(), out=out)

    return gemm
