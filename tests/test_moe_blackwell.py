"""The Blackwell FP4 MoE methods (backends/moe/blackwell.py), checked where the libraries cannot run.

The shared fake `flashinfer` (tests/fakes/flashinfer.py) and a fake `sgl_kernel` expose functions
with the signatures of the real ones (parameter names copied from flashinfer-python 0.7.2.post1
fused_moe/core.py and sgl-kernel's gemm.py); each binds its arguments with
`inspect.signature(...).bind`, records them, and computes the layer or GEMM from exactly what it
was given, with the conventions the real kernels document ([up; gate] rows, encode global scales,
per-expert alphas, 128x4 scales). The method's call then goes through the one gate, `check_call`:
a wrong convention shows up as a wrong result.
"""

from __future__ import annotations

import inspect
import sys
import types

import numpy as np
import pytest
import torch

from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe import base, blackwell
from fp4lab.moe import routing
from fakes import flashinfer as flashinfer_fake
from fakes.flashinfer import (Recorder, documented_cutlass_fused_moe,
                              documented_trtllm_fp4_block_scale_routed_moe, units, unswizzled)


def documented_cutlass_fp4_group_mm(a_fp4, b_fp4, a_blockscale, b_blockscale, alphas, out_dtype,
                                    device, params):
    """sgl_kernel.cutlass_fp4_group_mm."""


def group_mm_result(call):
    params = call["params"]
    a, b = call["a_fp4"], call["b_fp4"]                                            # [R, K/2], [E, N, K/2]
    k, n = a.shape[1] * 2, b.shape[1]
    out = torch.empty(a.shape[0], n, dtype=call["out_dtype"])
    for e, (m, _, _) in enumerate(params["problem_sizes"].tolist()):
        if not m:
            continue
        start, sf_start = int(params["expert_offsets"][e]), int(params["blockscale_offsets"][e])
        rows_padded = -(-m // 128) * 128
        block = call["a_blockscale"][sf_start:sf_start + rows_padded]
        a_units = units(a[start:start + m], unswizzled(block, m, k), k)
        b_units = units(b[e], unswizzled(call["b_blockscale"][e], n, k), k)
        out[start:start + m] = (a_units @ b_units.T * call["alphas"][e]).to(out.dtype)
    return out


@pytest.fixture
def fake_flashinfer(monkeypatch):
    return flashinfer_fake.install(monkeypatch)


@pytest.fixture
def fake_sgl_kernel(monkeypatch):
    module = types.ModuleType("sgl_kernel")
    module.cutlass_fp4_group_mm = Recorder(documented_cutlass_fp4_group_mm, group_mm_result)
    monkeypatch.setitem(sys.modules, "sgl_kernel", module)
    return module


def layer_problem(tokens=6, experts=4, top_k=2, hidden=64, intermediate=32, fmt="nvfp4"):
    ids = routing.sample_expert_ids("uniform", experts, top_k, tokens, 1, seed=5)[0]   # [T, k]
    return base.make_layer_problem(ids, experts, hidden=hidden, intermediate=intermediate,
                                   fmt=fmt, device="cpu", seed=1)


# -- the layer methods -----------------------------------------------------------------------------

def test_cutlass_fused_moe_passes_the_layer_gate_with_its_conventions(fake_flashinfer):
    problem = layer_problem()
    call = moe_methods.get("flashinfer-cutlass-moe-nvfp4").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.ok, gate.message
    recorded = fake_flashinfer.cutlass_fused_moe.calls[-1]
    assert recorded["output"] is call.out and recorded["output_dtype"] == torch.bfloat16
    assert recorded["fc1_expert_weights"].dtype == torch.int64                   # packed bytes as long
    assert recorded["fc1_expert_weights"].shape == (4, 64, 64 // 16)
    a1, w1_scales, alpha1, a2, w2_scales, alpha2 = recorded["quant_scales"]
    assert w1_scales.dtype == torch.int32 and w1_scales.shape == (4, 128, 1)   # [E, 2I pad 128, (H/16) bytes / 4]
    assert alpha1.shape == (4,) and torch.allclose(alpha1, 1 / (a1 * problem.w13.global_scale))
    assert torch.allclose(alpha2, 1 / (a2 * problem.w2.global_scale))


def test_the_gate_catches_gate_and_up_in_fp4labs_order(fake_flashinfer, monkeypatch):
    monkeypatch.setattr(blackwell, "up_then_gate", lambda w13: w13)              # forget the swap
    problem = layer_problem()
    call = moe_methods.get("flashinfer-cutlass-moe-nvfp4").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.status == "wrong_result" and gate.rel_err > 0.2


def test_the_layer_reference_quantizes_the_activations_the_kernel_quantizes(fake_flashinfer):
    problem = layer_problem()
    call = moe_methods.get("flashinfer-cutlass-moe-nvfp4").prepare(problem)
    out = call.call().double()
    with_transform = base.layer_reference(problem, call.reference_transform)
    without = base.layer_reference(problem)
    error = lambda ref: (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
    # W4A4 measured on its own activations: only the bf16 output rounding remains
    assert error(with_transform) < 4e-3 and error(without) > 10 * error(with_transform)


def test_the_intermediate_scale_is_calibrated_with_headroom():
    problem = layer_problem()
    scales = blackwell.layer_scales(problem)
    assert scales["input"].item() == pytest.approx(448 * 6 / problem.x.float().abs().amax().item())
    # a2 = 448*6 / (2 amax): the calibrated activations sit one binade under the e4m3 ceiling
    assert 0 < scales["intermediate"].item() < 448 * 6


def test_trtllm_routed_moe_passes_the_layer_gate(fake_flashinfer):
    problem = layer_problem(hidden=128, intermediate=64)
    call = moe_methods.get("flashinfer-trtllm-moe-nvfp4").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.ok, gate.message
    recorded = fake_flashinfer.trtllm_fp4_block_scale_routed_moe.calls[-1]
    ids, weights = recorded["topk_ids"]
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert recorded["hidden_states"].dtype == torch.uint8 and recorded["hidden_states"].shape == (6, 64)
    assert recorded["hidden_states_scale"].dtype == torch.float8_e4m3fn          # linear [T, H/16]
    assert recorded["gemm1_weights_scale"].shape == (4, 128, 8)
    assert recorded["routing_method_type"] == blackwell.TRTLLM_ROUTING_TOPK
    assert recorded["output"] is call.out and recorded["intermediate_size"] == 64
    assert len(fake_flashinfer.reorder_rows_for_gated_act_gemm.calls) == 2 * 4   # weights + scales


def test_trtllm_needs_rows_and_scale_columns_the_kernel_pads_to(fake_flashinfer):
    problem = layer_problem(hidden=64, intermediate=32)          # H/16 = 4 but 2I = 64 < 128 rows
    with pytest.raises(base.MethodUnavailable, match="padded to 128"):
        moe_methods.get("flashinfer-trtllm-moe-nvfp4").prepare(problem)


@pytest.mark.parametrize("name", ["flashinfer-cutlass-moe-nvfp4", "flashinfer-trtllm-moe-nvfp4"])
def test_layer_methods_take_nvfp4_layers_only(fake_flashinfer, name):
    with pytest.raises(base.MethodUnavailable, match="takes nvfp4 weights, not mxfp4"):
        moe_methods.get(name).prepare(layer_problem(fmt="mxfp4"))


# -- the grouped GEMM ------------------------------------------------------------------------------

def test_sgl_fp4_group_mm_passes_the_expert_gemm_gate(fake_sgl_kernel):
    loads = np.array([3, 0, 5, 1])
    problem = base.make_expert_problem(loads, n=64, k=128, device="cpu", seed=2)
    call = moe_methods.get("sgl-fp4-group-mm").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.ok, gate.message
    recorded = fake_sgl_kernel.cutlass_fp4_group_mm.calls[-1]
    params = recorded["params"]
    assert params["problem_sizes"].tolist() == [[3, 64, 128], [0, 64, 128], [5, 64, 128], [1, 64, 128]]
    assert params["expert_offsets"].tolist() == [0, 3, 3, 8]
    assert params["blockscale_offsets"].tolist() == [0, 128, 128, 256]   # each expert's rows padded to 128
    assert recorded["a_blockscale"].shape == (3 * 128, 8) and recorded["a_fp4"].shape == (9, 64)
    assert recorded["b_blockscale"].shape == (4, 128, 8) and recorded["alphas"].shape == (4,)
    assert call.weight_bytes == 3 * (64 * 128 // 2 + 64 * 128 // 16)


def test_the_expert_gate_catches_a_wrong_alpha(fake_sgl_kernel, monkeypatch):
    problem = base.make_expert_problem(np.array([2, 4]), n=32, k=64, device="cpu", seed=3)
    monkeypatch.setattr(blackwell, "per_expert_global", lambda q: torch.ones(q.shape[0]))
    call = moe_methods.get("sgl-fp4-group-mm").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.status == "wrong_result"


# -- where they run, and the signatures ------------------------------------------------------------

def test_capability_rules():
    cutlass, trtllm, sgl = (moe_methods.get(name) for name in (
        "flashinfer-cutlass-moe-nvfp4", "flashinfer-trtllm-moe-nvfp4", "sgl-fp4-group-mm"))
    for method in (cutlass, trtllm, sgl):
        assert "sm_90 (Hopper)" in method.capability_reason((9, 0))
        assert method.capability_reason((10, 0)) is None
        assert method.math_dtype == "fp4"
    assert cutlass.capability_reason((12, 0)) is None and sgl.capability_reason((12, 0)) is None
    assert "sm_100/sm_103" in trtllm.capability_reason((12, 0))
    assert cutlass.kind == trtllm.kind == "layer" and sgl.kind == "gemm"


@pytest.mark.parametrize("recorded, documented", [
    (blackwell.CUTLASS_FUSED_MOE, documented_cutlass_fused_moe),
    (blackwell.TRTLLM_ROUTED_MOE, documented_trtllm_fp4_block_scale_routed_moe),
    (blackwell.FP4_GROUP_MM, documented_cutlass_fp4_group_mm),
])
def test_the_recorded_calls_fit_the_sources_signatures(recorded, documented):
    assert blackwell.signature_reason(documented, recorded) is None
    parameters = inspect.signature(documented).parameters
    assert set(recorded.optional) <= set(parameters)


def test_an_installed_function_without_a_parameter_is_a_reason_not_a_crash(monkeypatch):
    def older_cutlass_fused_moe(input, token_selected_experts, token_final_scales,
                                fc1_expert_weights, fc2_expert_weights, output_dtype, quant_scales):
        """no output= yet"""

    module = types.ModuleType("flashinfer")
    module.cutlass_fused_moe = older_cutlass_fused_moe
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    method = moe_methods.get("flashinfer-cutlass-moe-nvfp4")
    reason = method.runtime_reason()
    assert "flashinfer.cutlass_fused_moe of the installed package takes no output" in reason
    with pytest.raises(base.MethodUnavailable, match="takes no output"):
        method.prepare(layer_problem())
    del module.cutlass_fused_moe
    assert "does not exist in the installed package" in method.runtime_reason()


def test_optional_parameters_are_dropped_where_the_installed_function_lacks_them():
    seen = {}

    def newer_group_mm(a_fp4, b_fp4, a_blockscale, b_blockscale, alphas, out_dtype, params):
        seen.update(locals())

    assert blackwell.signature_reason(newer_group_mm, blackwell.FP4_GROUP_MM) is None
    blackwell.keyword_call(newer_group_mm, blackwell.FP4_GROUP_MM, a_fp4=1, b_fp4=2, a_blockscale=3,
                           b_blockscale=4, alphas=5, out_dtype=6, device="cuda", params={})
    assert "device" not in seen and seen["alphas"] == 5


def test_without_a_gpu_they_say_why():
    for name in ("flashinfer-cutlass-moe-nvfp4", "flashinfer-trtllm-moe-nvfp4", "sgl-fp4-group-mm"):
        available, reason = moe_methods.get(name).availability("cpu")
        assert not available and reason
