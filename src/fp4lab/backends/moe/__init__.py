"""The MoE method registry: every way fp4lab can run the expert GEMMs of a decode step.

GEMM methods time one expert GEMM (gate_up or down) over all experts; layer methods time the
whole routed MLP on FP4 weights. Importing this package imports no GPU library.
"""

from __future__ import annotations

from fp4lab.backends.moe.base import (
    ExpertProblem, LayerProblem, MethodUnavailable, MoeCall, MoeMethod, check_call,
)
from fp4lab.backends.moe.cuda_fused import CudaW4A16Moe
from fp4lab.backends.moe.blackwell import FlashInferCutlassMoe, FlashInferTrtllmMoe, SglFp4GroupMm
from fp4lab.backends.moe.humming import HummingMoeGrouped, HummingMoeIndexed, HummingW4A4Moe
from fp4lab.backends.moe.torch_methods import (
    GroupedBf16, GroupedFp8, LayerLoopBf16, LoopBf16, LoopTritonW4A16, PaddedBf16,
)
from fp4lab.backends.moe.triton_fused import TritonW4A16Moe

# fp4lab's own fused FP4 MoE kernels (the others are the libraries' and torch's)
OWN_LAYER_METHODS = ("cuda-w4a16-moe", "triton-w4a16-moe")

__all__ = ["ExpertProblem", "LayerProblem", "MethodUnavailable", "MoeCall", "MoeMethod",
           "check_call", "OWN_LAYER_METHODS", "REGISTRY", "get", "names"]

REGISTRY: dict[str, MoeMethod] = {
    method.name: method
    for method in (
        LoopBf16(),
        GroupedBf16(),
        PaddedBf16(),
        GroupedFp8(),
        LoopTritonW4A16(),
        LayerLoopBf16(),
        TritonW4A16Moe(),
        CudaW4A16Moe(),
        HummingMoeGrouped(), HummingMoeIndexed(), HummingW4A4Moe(),
        SglFp4GroupMm(),
        FlashInferCutlassMoe(),
        FlashInferTrtllmMoe(),
    )
}


def names(kind: str | None = None) -> list[str]:
    """Method names, all or of one kind ("gemm" or "layer")."""
    return [name for name, method in REGISTRY.items() if kind is None or method.kind == kind]


def get(name: str) -> MoeMethod:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown MoE method {name!r}; valid methods: {', '.join(REGISTRY)}") from None
