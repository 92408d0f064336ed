"""The Blackwell FP4 MoE methods (backends/moe/blackwell.py), checked where the libraries cannot run.

Fake `flashinfer` / `sgl_kernel` modules expose functions with the signatures of the real ones
(parameter names copied from flashinfer-python 0.7.2.post1 fused_moe/core.py and sgl-kernel's
gemm.py); each binds its arguments with `inspect.signature(...).bind`, records them, and computes
the layer or GEMM from exactly what it was given, with the conventions the real kernels document
([up; gate] rows, encode global scales, per-expert alphas, 128x4 scales). The method's call then
goes through the one gate, `check_call`: a wrong convention shows up as a wrong result.
"""

from __future__ import annotations

import inspect
import sys
import types

import numpy as np
import pytest
import torch

from fp4lab import formats
from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe import base, blackwell
from fp4lab.moe import routing


# -- the real signatures (names and defaults as in the sources) ------------------------------------

def documented_cutlass_fused_moe(input, token_selected_experts, token_final_scales,
                                 fc1_expert_weights, fc2_expert_weights, output_dtype, quant_scales,
                                 fc1_expert_biases=None, fc2_expert_biases=None, input_sf=None,
                                 swiglu_alpha=None, swiglu_beta=None, swiglu_limit=None, tp_size=1,
                                 tp_rank=0, ep_size=1, ep_rank=0, cluster_size=1, cluster_rank=0,
                                 output=None, enable_alltoall=False,
                                 use_deepseek_fp8_block_scale=False, use_w4_group_scaling=False,
                                 use_mxfp8_act_scaling=False, min_latency_mode=False,
                                 use_packed_weights=False, use_wfp4afp8_humming=False,
                                 tune_max_num_tokens=8192, enable_pdl=None, activation_type=None,
                                 swizzled_input_sf=True, use_fused_finalize=True, profile_ids=None,
                                 workspace_buffer=None, *, clamped_relu2_limit=None, situ_beta=None,
                                 situ_linear_beta=None, backend="cutlass"):
    """flashinfer.cutlass_fused_moe."""


def documented_trtllm_fp4_block_scale_routed_moe(
        topk_ids, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
        gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights,
        gemm2_weights_scale, gemm2_bias, output1_scale_scalar, output1_scale_gate_scalar,
        output2_scale_scalar, num_experts, top_k, n_group, topk_group, intermediate_size,
        local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type=0,
        do_finalize=True, enable_pdl=None, activation_type=3, per_token_scale=None, output=None,
        tune_max_num_tokens=8192, gemm1_lora_delta=None, valid_hidden_size=None,
        valid_intermediate_size=None, num_fused_shared_experts=None,
        hidden_states_scale_layout=None):
    """flashinfer.trtllm_fp4_block_scale_routed_moe."""


def documented_reorder_rows_for_gated_act_gemm(x):
    """flashinfer.reorder_rows_for_gated_act_gemm."""


def documented_shuffle_matrix_a(input_tensor, epilogue_tile_m):
    """flashinfer.shuffle_matrix_a."""


def documented_shuffle_matrix_sf_a(input_tensor, epilogue_tile_m, num_elts_per_sf=16):
    """flashinfer.shuffle_matrix_sf_a: linear scales in, 128x4-interleaved bytes out."""


def documented_cutlass_fp4_group_mm(a_fp4, b_fp4, a_blockscale, b_blockscale, alphas, out_dtype,
                                    device, params):
    """sgl_kernel.cutlass_fp4_group_mm."""


class Recorder:
    def __init__(self, documented, result=None):
        self.signature = inspect.signature(documented)
        self.__signature__ = self.signature         # what inspect.signature of the fake reports
        self.result = result
        self.calls = []

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        self.calls.append(bound.arguments)
        return self.result(bound.arguments) if self.result else args[0]


# -- what the kernels compute, from what they are handed -------------------------------------------

def units(packed: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """e2m1 codes x e4m3 block scales, no global scale: float32 [rows, K]."""
    q = formats.QuantizedTensor(packed=packed.contiguous().view(torch.uint8),
                                scales=scales.contiguous().view(torch.float8_e4m3fn),
                                global_scale=torch.tensor(1.0), fmt="nvfp4",
                                shape=(packed.shape[0], k))
    return formats.dequantize(q)


def unswizzled(swizzled: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    return formats.unswizzle_scales(swizzled.contiguous().view(torch.uint8).reshape(-1), rows, k // 16)


def quantized_units(x: torch.Tensor, global_scale) -> torch.Tensor:
    """What the kernel's NVFP4 quantizer makes of x, in units of its global scale."""
    return formats.dequantize(formats.nvfp4_quantize(x.float(), global_scale=global_scale)) * global_scale


def route(out: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, expert_out) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * expert_out(e, x rows of t) for e = ids[t, j]."""
    result = torch.zeros(out.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        result.index_add_(0, token, expert_out(e, token) * weights[token, slot].unsqueeze(1))
    return out.copy_(result)


def fused_moe_result(call):
    a1, w1_scales, alpha1, a2, w2_scales, alpha2 = call["quant_scales"]
    fc1 = call["fc1_expert_weights"].view(torch.uint8)                             # [E, 2I, H/2]
    fc2 = call["fc2_expert_weights"].view(torch.uint8)                             # [E, H, I/2]
    hidden, intermediate = fc1.shape[2] * 2, fc1.shape[1] // 2
    x = quantized_units(call["input"], a1)

    def expert_out(e, token):
        w1 = units(fc1[e], unswizzled(w1_scales[e], 2 * intermediate, hidden), hidden)
        w2 = units(fc2[e], unswizzled(w2_scales[e], hidden, intermediate), intermediate)
        h = x[token] @ w1.T * alpha1[e]
        up, gate = h[:, :intermediate], h[:, intermediate:]                        # [up; gate] rows
        act = quantized_units(torch.nn.functional.silu(gate) * up, a2)
        return act @ w2.T * alpha2[e]
    return route(call["output"], call["token_selected_experts"].long(), call["token_final_scales"],
                 expert_out)


def interleave(x):
    """[r0 .. rN/2-1, rN/2 .. rN-1] -> [r0, rN/2, r1, rN/2+1, ...], like TensorRT-LLM's reorder."""
    half = x.shape[0] // 2
    return torch.stack([x[:half], x[half:]], dim=1).reshape(x.shape)


def deinterleave(x):
    return torch.cat([x[0::2], x[1::2]])


def trtllm_result(call):
    ids, weights = call["topk_ids"]
    g1, g1_scales = call["gemm1_weights"], call["gemm1_weights_scale"]            # [E, 2I, H/2]
    g2, g2_scales = call["gemm2_weights"], call["gemm2_weights_scale"]
    hidden, intermediate = g1.shape[2] * 2, call["intermediate_size"]
    x = units(call["hidden_states"], call["hidden_states_scale"], hidden)          # [T, H]

    def expert_out(e, token):
        w1 = units(deinterleave(g1[e]), deinterleave(unswizzled(g1_scales[e], 2 * intermediate, hidden)),
                   hidden)
        w2 = units(g2[e], unswizzled(g2_scales[e], hidden, intermediate), intermediate)
        acc = x[token] @ w1.T
        up = acc[:, :intermediate] * call["output1_scale_scalar"][e]
        gate = acc[:, intermediate:] * call["output1_scale_gate_scalar"][e]
        act = quantized_units(torch.nn.functional.silu(gate) * up, torch.tensor(1.0))
        return act @ w2.T * call["output2_scale_scalar"][e]
    return [route(call["output"], ids.long(), weights, expert_out)]


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
    module = types.ModuleType("flashinfer")
    module.cutlass_fused_moe = Recorder(documented_cutlass_fused_moe, fused_moe_result)
    module.trtllm_fp4_block_scale_routed_moe = Recorder(documented_trtllm_fp4_block_scale_routed_moe,
                                                        trtllm_result)
    module.reorder_rows_for_gated_act_gemm = Recorder(documented_reorder_rows_for_gated_act_gemm,
                                                      lambda call: interleave(call["x"]))
    # identity row shuffle keeps the numbers checkable; the scale layout is FlashInfer's 128x4
    module.shuffle_matrix_a = Recorder(documented_shuffle_matrix_a)
    module.shuffle_matrix_sf_a = Recorder(
        documented_shuffle_matrix_sf_a,
        lambda call: formats.swizzle_scales(call["input_tensor"]).reshape(-1))
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


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
