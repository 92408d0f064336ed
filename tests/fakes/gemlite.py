"""A fake `gemlite` (0.6.0.post2's API as fp4lab uses it): `gemlite.helper.A16W4_MXFP` /
`A16W4_NVFP` with `from_packed_weights`, and `gemlite.forward_functional`.

The fake linear stores what gemlite stores (W_q as the [K/2, N] transpose of the packed rows,
scales transposed, NVFP4's meta_scale inverted) and `forward_functional` decodes exactly the
tensors it is handed, so a wrong nibble order, scale dtype or meta scale shows as wrong numbers.
`fail_nvfp4` makes the NVFP4 kernel fail to compile the way Triton does on sm_90: an MLIR
`error:` line on file descriptor 2, then `RuntimeError: PassManager::run failed`.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import os
import sys
import types
from dataclasses import dataclass, field

import torch

from fp4lab import formats

MLIR_ERROR = ("loc(\"gemm_kernel\"): error: Failures have been detected while processing an "
              "MLIR pass pipeline (TritonGPUAccelerateMatmul)\n")


def documented_forward_functional(x, bias, tensor_args, meta_args, matmul_type=-1):
    """gemlite.core.forward_functional."""


@dataclass
class FakeGemlite:
    built: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    fail_nvfp4: bool = False


class FakeLinear:
    def __init__(self, fmt, w_q, scales, meta_scale):
        self.fmt = fmt
        self.W_q = w_q.t()                         # [K/2, N], as gemlite keeps it
        self.scales = scales.t()                   # [K/B, N]
        self.zeros = torch.tensor([[]], dtype=torch.int32)
        self.meta_scale = meta_scale

    def get_tensor_args(self):
        return [self.W_q, self.scales, self.zeros, self.meta_scale]

    def get_meta_args(self):
        return [0, 4, 16 if self.fmt == "nvfp4" else 32]


def processors(state: FakeGemlite):
    class A16W4_MXFP:
        def __init__(self, device="cuda:0", dtype=None):
            assert dtype == torch.bfloat16
            self.device = device

        def from_packed_weights(self, W_q_packed, scales, bias=None):
            assert W_q_packed.dtype == torch.uint8 and scales.dtype == torch.float8_e8m0fnu
            assert scales.shape[1] * 32 == W_q_packed.shape[1] * 2
            state.built.append(("mxfp4", W_q_packed, scales))
            return FakeLinear("mxfp4", W_q_packed, scales.view(torch.uint8),
                              torch.tensor(1.0))

    class A16W4_NVFP:
        def __init__(self, device="cuda:0", dtype=None):
            assert dtype == torch.bfloat16
            self.device = device

        def from_packed_weights(self, weight_packed, bias=None, scales=None, meta_scale=None):
            assert weight_packed.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn
            assert meta_scale is not None and meta_scale.dtype == torch.float32
            state.built.append(("nvfp4", weight_packed, scales, meta_scale))
            # gemlite keeps 1 / meta_scale: the kernel multiplies its accumulator by it
            return FakeLinear("nvfp4", weight_packed, scales, (1.0 / meta_scale).reshape(()))

    return A16W4_MXFP, A16W4_NVFP


def forward_function(state: FakeGemlite):
    signature = inspect.signature(documented_forward_functional)

    def forward_functional(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = bound.arguments
        state.calls.append(call)
        w_q, scales, zeros, meta_scale = call["tensor_args"]
        group = call["meta_args"][2]
        if group == 16 and state.fail_nvfp4:
            os.write(2, MLIR_ERROR.encode())
            raise RuntimeError("PassManager::run failed")
        packed = w_q.t()                                                   # [N, K/2]
        n, k = packed.shape[0], packed.shape[1] * 2
        values = formats.e2m1_decode(formats.unpack_nibbles(packed)).reshape(n, k // group, group)
        if group == 16:
            block = scales.t().view(torch.float8_e4m3fn).float() * meta_scale.float()
        else:
            block = formats.exp2_exact(scales.t().to(torch.int32) - 127)
        w = (values * block.unsqueeze(-1)).reshape(n, k)
        return (call["x"].float() @ w.T).to(call["x"].dtype)

    return forward_functional


def install(monkeypatch) -> FakeGemlite:
    state = FakeGemlite()
    package, helper = types.ModuleType("gemlite"), types.ModuleType("gemlite.helper")
    for module in (package, helper):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    helper.A16W4_MXFP, helper.A16W4_NVFP = processors(state)
    package.helper = helper
    package.forward_functional = forward_function(state)
    monkeypatch.setitem(sys.modules, "gemlite", package)
    monkeypatch.setitem(sys.modules, "gemlite.helper", helper)
    return state
