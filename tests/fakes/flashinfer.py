"""A fake `flashinfer` for the adapters' CPU tests (the GEMM backends' `mm_fp4`, the Blackwell MoE
methods' fused layers), and the `Recorder` the fake `sgl_kernel`s of those tests use too.

Each function has the signature of the real one (parameter names and defaults copied from
docs.flashinfer.ai and flashinfer-python 0.7.2.post1 fused_moe/core.py); it binds its arguments
with `inspect.signature(...).bind` (a wrong keyword or arity fails), records them, and computes
its result from exactly what it was given, with the conventions the real kernels document
([up; gate] rows, encode global scales, per-expert alphas, 128x4 scales), so a wrong transpose,
layout, order or alpha shows up as a wrong number.
Install with `install(monkeypatch)`, which returns the module.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

from fp4lab import formats

SCALE_DTYPES = {"nvfp4": torch.float8_e4m3fn, "mxfp4": torch.uint8}


# -- the real signatures (names and defaults as in the sources) ------------------------------------

def documented_mm_fp4(a, b, a_descale, b_descale, alpha=None, out_dtype=torch.bfloat16,
                      out=None, block_size=16, use_8x4_sf_layout=False, backend="auto",
                      use_nvfp4=True, enable_pdl=True):
    """flashinfer.gemm.mm_fp4 as documented at docs.flashinfer.ai."""


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

def units(packed: torch.Tensor, scales: torch.Tensor, k: int, fmt: str = "nvfp4") -> torch.Tensor:
    """e2m1 codes x linear block scales, no global scale: float32 [rows, K]."""
    q = formats.QuantizedTensor(packed=packed.contiguous().view(torch.uint8),
                                scales=scales.contiguous().view(SCALE_DTYPES[fmt]),
                                global_scale=torch.tensor(1.0) if fmt == "nvfp4" else None, fmt=fmt,
                                shape=(packed.shape[0], k))
    return formats.dequantize(q)


def unswizzled(swizzled: torch.Tensor, rows: int, k: int, fmt: str = "nvfp4") -> torch.Tensor:
    return formats.unswizzle_scales(swizzled.contiguous().view(torch.uint8).reshape(-1), rows,
                                    k // formats.BLOCK_SIZE[fmt])


def decoded(packed: torch.Tensor, swizzled: torch.Tensor, fmt: str) -> torch.Tensor:
    """What a kernel reading `packed` [R, K/2] and 128x4 `swizzled` scales multiplies."""
    rows, k = packed.shape[0], packed.shape[1] * 2
    return units(packed, unswizzled(swizzled, rows, k, fmt), k, fmt)


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


def mm_fp4_result(call):
    fmt = "nvfp4" if call["use_nvfp4"] else "mxfp4"
    a = decoded(call["a"], call["a_descale"], fmt)                 # [M, K]
    w = decoded(call["b"].T, call["b_descale"].T, fmt)             # [N, K]
    product = a @ w.T * (1.0 if call["alpha"] is None else call["alpha"].item())
    return call["out"].copy_(product)


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


def install(monkeypatch) -> types.ModuleType:
    """The fake as `flashinfer` in sys.modules for the test; returns it (its Recorders' `calls`)."""
    module = types.ModuleType("flashinfer")
    module.mm_fp4 = Recorder(documented_mm_fp4, mm_fp4_result)
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
