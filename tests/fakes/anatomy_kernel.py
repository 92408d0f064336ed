"""A fake dissected kernel for the anatomy worker's test: `anatomy_variants` as the real kernels
have it (cuda_w4a16, triton_w4a16), every stage a correct bf16 GEMM except "mma", whose check
fails (the worker must store it as wrong_result, untimed).
Shape legend: a [M, K] bf16 activations, w [N, K] FP4 weights, out [M, N]."""

from __future__ import annotations

import torch

from fp4lab import correctness, formats
from fp4lab.backends.base import prepared_from
from fp4lab.backends.triton_w4a16 import AnatomyVariant

ANATOMY_STAGES = {"full": "the GEMM", "load": "loads only", "decode": "no MMA", "mma": "no reduction"}
CALLS: list[dict] = []          # what the worker asked for, for the test to read


def anatomy_variants(a, w, device, config=None, stages=tuple(ANATOMY_STAGES)):
    CALLS.append({"m": a.shape[0], "stages": tuple(stages), "device": device})
    ref_w = formats.dequantize(w).to(torch.bfloat16)                    # [N, K]
    variants = []
    for stage in stages:
        prepared = prepared_from(lambda a, w, out: torch.matmul(a, w.T, out=out), (a, ref_w),
                                 torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16),
                                 ref_a=a.float(), ref_w=ref_w.float(), info={"config": f"cuda fake {stage}"})
        if stage == "mma":
            check = lambda: correctness.GateResult("wrong_result", 1.0, "mma: partial tiles do not add up")
        else:
            check = lambda prepared=prepared: correctness.check_backend(prepared, correctness.TOLERANCE[w.fmt])
        variants.append(AnatomyVariant(stage, ANATOMY_STAGES[stage], prepared, w.nbytes, check))
    return variants
