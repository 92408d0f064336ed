"""The MoE method registry and its two gates (expert GEMMs and whole layers), on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe import base
from fp4lab.moe import routing


def small_layer(fmt: str, tokens: int = 12, experts: int = 8, top_k: int = 2):
    ids = routing.sample_expert_ids("uniform", experts, top_k, tokens, 1, seed=3)[0]   # [T, k]
    return base.make_layer_problem(ids, experts, hidden=64, intermediate=32, fmt=fmt, device="cpu")


def test_registry_kinds_and_dtypes():
    assert "layer-loop-bf16" in moe_methods.names("layer")
    assert "loop-bf16" in moe_methods.names("gemm") and "loop-bf16" not in moe_methods.names("layer")
    for name in moe_methods.names():
        method = moe_methods.get(name)
        assert method.kind in ("gemm", "layer") and method.math_dtype in ("fp4", "fp8", "bf16")
    with pytest.raises(ValueError, match="unknown MoE method 'magic'"):
        moe_methods.get("magic")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_layer_baseline_passes_the_layer_gate(fmt):
    problem = small_layer(fmt)
    call = moe_methods.get("layer-loop-bf16").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.ok, gate.message
    assert call.weight_bytes == len(np.unique(problem.topk_ids)) * (
        2 * 32 * 64 * 2 + 64 * 32 * 2)                    # active experts x bf16 (w13 + w2)


def test_layer_gate_catches_a_dropped_expert():
    problem = small_layer("nvfp4")
    call = moe_methods.get("layer-loop-bf16").prepare(problem)
    dropped = problem.topk_ids[0, 0].item()
    kept = problem.topk_ids.clone()
    kept[problem.topk_ids == dropped] = -1               # a kernel that skips one expert's tokens
    original = call.call

    def buggy():
        out = original()
        row = (kept == -1).any(dim=1)
        return out.masked_fill(row.unsqueeze(1), 0.0)
    call.call = buggy
    gate = moe_methods.check_call(call, problem)
    assert gate.status == "wrong_result" and gate.rel_err > 0.1


def test_layer_reference_applies_the_kernel_transform():
    problem = small_layer("nvfp4")
    plain = base.layer_reference(problem)
    halved = base.layer_reference(problem, lambda stage, t: t * 0.5 if stage == "input" else t)
    assert not torch.allclose(plain, halved)


def test_stacked_expert_weights_keep_one_global_scale_per_expert():
    from fp4lab.formats import dequantize

    w = base.quantized_expert_weights(3, 16, 32, "nvfp4", "cpu")
    assert w.global_scale.shape == (3,)
    for e in range(3):
        assert torch.equal(dequantize(w)[e], dequantize(base._expert(w, e)))
