"""FP4 MoE methods on Blackwell's FP4 tensor cores (NVFP4 weights and activations, W4A4).

- `flashinfer-cutlass-moe-nvfp4` (layer): `flashinfer.cutlass_fused_moe`, the whole routed MLP in
  one call (activation quantize, gate_up grouped GEMM, SwiGLU, re-quantize, down, finalize);
  sm_100/103 and sm_120/121.
- `flashinfer-trtllm-moe-nvfp4` (layer): `flashinfer.trtllm_fp4_block_scale_routed_moe`, the
  TensorRT-LLM-gen kernels with precomputed routing; datacenter Blackwell (sm_100/103) only.
- `sgl-fp4-group-mm` (gemm): `sgl_kernel.cutlass_fp4_group_mm`, one grouped NVFP4 GEMM over every
  expert at its load; the ExpertProblem's bf16 operands are quantized to NVFP4 here, in prepare.

Conventions the kernels share, from their sources (flashinfer-python 0.7.2.post1; sglang):
- gate_up weights are [up rows; gate rows] (FlashInfer tests/moe/test_trtllm_cutlass_fused_moe.py
  `w3, w1 = chunk(w31)`, silu(x @ w1) * (x @ w3); test_trtllm_gen_fused_moe.py run_moe_dequant,
  silu(second half) * first half), while fp4lab's w13 stacks gate over up: the halves are swapped.
- global scales are NVFP4 *encode* scales (448 * 6 / amax), as in fp4lab; the GEMMs take
  alpha = 1 / (activation scale * weight scale) per expert.
- The kernels quantize activations to NVFP4 (block 16, e4m3 scales) with a per-tensor scale:
  the layer input with `a1`, the SwiGLU product with `a2`. The gate's reference applies the same
  round trip (fp4lab's quantizer, `reference_transform`), so W4A4 kernels are compared on the
  activations they multiply. `a1` comes from the input's amax; `a2` is calibrated on the first
  experts' SwiGLU product with a factor of headroom, as deployments calibrate it offline.
Each call is made with keywords whose names are checked against the installed function
(`inspect.signature`, `runtime_reason`) and, in the tests, against these recorded signatures.

Shape legend: `T` tokens, `k` top-k, `E` experts, `H` hidden, `I` moe_intermediate,
`N`, `K` one expert GEMM, `R` routed token rows (sum of the loads), `m_e` rows of expert e.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

import torch

from fp4lab import formats
from fp4lab.backends.base import (
    BLACKWELL_FP4_CAPABILITIES, DATACENTER_BLACKWELL_CAPABILITIES, Requirements, round_up,
)
from fp4lab.backends.moe.base import (
    ExpertProblem, LayerProblem, MethodUnavailable, MoeCall, MoeMethod, bound_call,
    layer_weight_bytes,
)
from fp4lab.formats import QuantizedTensor

TRTLLM_EPILOGUE_TILE_M = 128
TRTLLM_ROUTING_TOPK = 5          # RoutingMethodType.TopK: the given weights, no softmax
CALIBRATION_EXPERTS = 8          # experts whose SwiGLU product sets a2
CALIBRATION_HEADROOM = 2.0       # a2 leaves one binade above the calibrated amax


@dataclass(frozen=True)
class RecordedSignature:
    """The parameters fp4lab passes to a library function, by name, and where they come from."""

    module: str
    function: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()   # passed only where the installed version has them
    source: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.function}"


CUTLASS_FUSED_MOE = RecordedSignature(
    "flashinfer", "cutlass_fused_moe",
    required=("input", "token_selected_experts", "token_final_scales", "fc1_expert_weights",
              "fc2_expert_weights", "output_dtype", "quant_scales", "output"),
    source="flashinfer-python 0.7.2.post1 flashinfer/fused_moe/core.py")
TRTLLM_ROUTED_MOE = RecordedSignature(
    "flashinfer", "trtllm_fp4_block_scale_routed_moe",
    required=("topk_ids", "routing_bias", "hidden_states", "hidden_states_scale", "gemm1_weights",
              "gemm1_weights_scale", "gemm1_bias", "gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit",
              "gemm2_weights", "gemm2_weights_scale", "gemm2_bias", "output1_scale_scalar",
              "output1_scale_gate_scalar", "output2_scale_scalar", "num_experts", "top_k", "n_group",
              "topk_group", "intermediate_size", "local_expert_offset", "local_num_experts",
              "routed_scaling_factor", "routing_method_type", "do_finalize", "output"),
    source="flashinfer-python 0.7.2.post1 flashinfer/fused_moe/core.py")
FP4_GROUP_MM = RecordedSignature(
    "sgl_kernel", "cutlass_fp4_group_mm",
    required=("a_fp4", "b_fp4", "a_blockscale", "b_blockscale", "alphas", "out_dtype", "params"),
    optional=("device",),
    source="sgl-kernel python/sgl_kernel/gemm.py; params as sglang srt/layers/moe/"
           "cutlass_moe_params.py CutlassMoEParams.to_gemm1_args builds them")


def signature_reason(function, recorded: RecordedSignature) -> str | None:
    """Why the installed `function` does not take fp4lab's call, or None when it does."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None          # a builtin without a signature: the call itself decides
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    missing = [name for name in recorded.required if name not in parameters]
    if missing:
        return (f"{recorded.qualname} of the installed package takes no {', '.join(missing)} "
                f"(fp4lab's call was recorded from {recorded.source})")
    return None


def keyword_call(function, recorded: RecordedSignature, **arguments):
    """`function(**arguments)`, dropping the optional ones the installed version lacks."""
    try:
        names = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        names = set(arguments)
    kept = {name: value for name, value in arguments.items()
            if name in recorded.required or name in names}
    return function(**kept)


class Fp4MoeMethod(MoeMethod):
    """What the three share: NVFP4 W4A4 on Blackwell, one recorded library call."""

    weight_dtype, act_dtype = "fp4", "fp4"
    formats = ("nvfp4",)
    recorded: RecordedSignature

    def library_function(self):
        return getattr(importlib.import_module(self.recorded.module), self.recorded.function)

    def runtime_reason(self) -> str | None:
        try:
            function = self.library_function()
        except AttributeError:
            return f"{self.recorded.qualname} does not exist in the installed package"
        return signature_reason(function, self.recorded)

    def checked_function(self):
        """The library function, or MethodUnavailable with the reason it cannot take the call."""
        reason = self.runtime_reason()
        if reason:
            raise MethodUnavailable(f"{self.name}: {reason}")
        return self.library_function()


# -- NVFP4 pieces shared by the methods ------------------------------------------------------------

def encode_scale(amax: float) -> torch.Tensor:
    """float32 scalar 448 * 6 / amax (1 for zero), the NVFP4 per-tensor encode scale."""
    value = formats.E4M3_MAX * formats.E2M1_MAX / amax if amax > 0 else 1.0
    return torch.tensor(value, dtype=torch.float32)


def nvfp4_round_trip(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """float32 x after NVFP4 quantization with `global_scale`: what a W4A4 kernel multiplies."""
    return formats.dequantize(formats.nvfp4_quantize(x, global_scale=global_scale))


def activation_transform(scales: dict[str, torch.Tensor]):
    """reference_transform quantizing each stage's activations as the kernel does."""
    def transform(stage: str, tensor: torch.Tensor) -> torch.Tensor:
        return nvfp4_round_trip(tensor, scales[stage]) if stage in scales else tensor
    return transform


def up_then_gate(w13: QuantizedTensor) -> QuantizedTensor:
    """fp4lab's [gate; up] rows of each expert as the kernels' [up; gate]."""
    intermediate = w13.shape[1] // 2
    order = torch.cat([torch.arange(intermediate, 2 * intermediate), torch.arange(intermediate)])
    order = order.to(w13.packed.device)
    return QuantizedTensor(packed=w13.packed[:, order].contiguous(),
                           scales=w13.scales[:, order].contiguous(),
                           global_scale=w13.global_scale, fmt=w13.fmt, shape=w13.shape)


def layer_scales(problem: LayerProblem) -> dict[str, torch.Tensor]:
    """The kernels' activation encode scales: "input" (a1) from x, "intermediate" (a2) from
    the SwiGLU product of the first CALIBRATION_EXPERTS active experts, with headroom."""
    device = problem.x.device
    a1 = encode_scale(problem.x.float().abs().amax().item())
    ids = problem.topk_ids.long()                                                  # [T, k]
    intermediate, amax = problem.intermediate, 0.0
    for e in torch.unique(ids).tolist()[:CALIBRATION_EXPERTS]:
        token = torch.nonzero(ids == e, as_tuple=True)[0]
        w13 = formats.dequantize(one_expert(problem.w13, e))                       # [2I, H]
        x = nvfp4_round_trip(problem.x[token].float(), a1)                          # [m_e, H]
        h = x @ w13.T                                                               # [m_e, 2I]
        act = torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]
        amax = max(amax, act.abs().amax().item())
    a2 = encode_scale(amax * CALIBRATION_HEADROOM)
    return {"input": a1.to(device), "intermediate": a2.to(device)}


def one_expert(q: QuantizedTensor, e: int) -> QuantizedTensor:
    """Expert e's [N, K] of an [E, N, K] stack, with its own global scale."""
    scale = q.global_scale.reshape(-1)[e] if q.global_scale.numel() > 1 else q.global_scale
    return QuantizedTensor(packed=q.packed[e], scales=q.scales[e], global_scale=scale, fmt=q.fmt,
                           shape=tuple(q.shape[1:]))


def per_expert_global(q: QuantizedTensor) -> torch.Tensor:
    """[E] float32 encode scales of an expert stack (one scalar broadcast where there is one)."""
    return q.global_scale.float().reshape(-1).expand(q.shape[0]).contiguous()


def layer_call(problem: LayerProblem, build, args: tuple, scales: dict[str, torch.Tensor]) -> MoeCall:
    """A layer method's MoeCall: a bf16 [T, H] output the kernel writes (the gate poisons it) and
    the reference quantizing activations with the kernel's scales."""
    out = torch.empty(problem.x.shape[0], problem.hidden, dtype=torch.bfloat16,
                      device=problem.x.device)                                      # [T, H]
    return bound_call(build, args, out, tolerance_key="nvfp4", weight_bytes=layer_weight_bytes(problem),
                      reference_transform=activation_transform(scales),
                      note=f"a1 {scales['input'].item():.4g}, a2 {scales['intermediate'].item():.4g} "
                           f"(calibrated)")


def check_layer(problem, method: MoeMethod) -> None:
    if not isinstance(problem, LayerProblem):
        raise MethodUnavailable(f"{method.name}: a layer method takes a LayerProblem, "
                                f"got {type(problem).__name__}")
    if problem.fmt not in method.formats:
        raise MethodUnavailable(f"{method.name}: takes {'/'.join(method.formats)} weights, "
                                f"not {problem.fmt}")


# -- FlashInfer cutlass_fused_moe ------------------------------------------------------------------

class FlashInferCutlassMoe(Fp4MoeMethod):
    name, library, kind = "flashinfer-cutlass-moe-nvfp4", "flashinfer", "layer"
    requires = Requirements(capabilities=BLACKWELL_FP4_CAPABILITIES, unit="FP4 tensor cores",
                            module="flashinfer", pip_name="flashinfer-python")
    recorded = CUTLASS_FUSED_MOE
    what = "flashinfer.cutlass_fused_moe, NVFP4 weights and activations (W4A4), one fused layer"
    note = ("SM120 grouped block-scaled FP4 produced invalid output before NVIDIA/cutlass#3096 / "
            "flashinfer#2723: the gate decides")

    def prepare(self, problem: LayerProblem, fmt: str | None = None) -> MoeCall:
        check_layer(problem, self)
        function = self.checked_function()
        scales = layer_scales(problem)
        w13, w2 = up_then_gate(problem.w13), problem.w2
        a1, a2 = scales["input"], scales["intermediate"]
        quant_scales = [
            a1, swizzled_int32(w13.scales), (1.0 / (a1 * per_expert_global(w13))).float(),
            a2, swizzled_int32(w2.scales), (1.0 / (a2 * per_expert_global(w2))).float(),
        ]
        # packed bytes as int64, as the kernel takes them: [E, 2I, H/16], [E, H, I/16]
        weights = (w13.packed.view(torch.long), w2.packed.view(torch.long))

        def build(args, out):
            x, ids, route_weights, fc1, fc2 = args

            def call():
                keyword_call(function, self.recorded, input=x, token_selected_experts=ids,
                             token_final_scales=route_weights, fc1_expert_weights=fc1,
                             fc2_expert_weights=fc2, output_dtype=torch.bfloat16,
                             quant_scales=quant_scales, output=out)
                return out
            return call

        args = (problem.x, problem.topk_ids, problem.topk_weights, *weights)
        return layer_call(problem, build, args, scales)


def swizzled_int32(scales: torch.Tensor) -> torch.Tensor:
    """[E, rows, K/16] e4m3 scales as the 128x4 layout the kernels read, viewed as int32."""
    return formats.swizzle_scales(scales.view(torch.uint8)).view(torch.int32)


# -- FlashInfer TensorRT-LLM-gen routed MoE --------------------------------------------------------

class FlashInferTrtllmMoe(Fp4MoeMethod):
    name, library, kind = "flashinfer-trtllm-moe-nvfp4", "flashinfer", "layer"
    requires = Requirements(capabilities=DATACENTER_BLACKWELL_CAPABILITIES, unit="FP4 tensor cores, "
                            "trtllm-gen kernels", module="flashinfer", pip_name="flashinfer-python")
    recorded = TRTLLM_ROUTED_MOE
    what = "flashinfer.trtllm_fp4_block_scale_routed_moe, NVFP4 W4A4, precomputed routing"

    def prepare(self, problem: LayerProblem, fmt: str | None = None) -> MoeCall:
        check_layer(problem, self)
        function = self.checked_function()
        import flashinfer

        scales = layer_scales(problem)
        a1, a2 = scales["input"], scales["intermediate"]
        x_q = formats.nvfp4_quantize(problem.x, global_scale=a1)                    # [T, H/2], [T, H/16]
        w13, w2 = up_then_gate(problem.w13), problem.w2
        gemm1 = trtllm_weights(w13, flashinfer, gated=True)
        gemm2 = trtllm_weights(w2, flashinfer, gated=False)
        g13, g2 = per_expert_global(w13), per_expert_global(w2)
        output_scales = {"output1_scale_scalar": (a2 / (g13 * a1)).float(),
                         "output1_scale_gate_scalar": (1.0 / (g13 * a1)).float(),
                         "output2_scale_scalar": (1.0 / (a2 * g2)).float()}
        experts, intermediate = problem.experts, problem.intermediate

        def build(args, out):
            packed, block_scales, ids, route_weights = args

            def call():
                keyword_call(
                    function, self.recorded, topk_ids=(ids, route_weights), routing_bias=None,
                    hidden_states=packed, hidden_states_scale=block_scales,
                    gemm1_weights=gemm1[0], gemm1_weights_scale=gemm1[1], gemm1_bias=None,
                    gemm1_alpha=None, gemm1_beta=None, gemm1_clamp_limit=None,
                    gemm2_weights=gemm2[0], gemm2_weights_scale=gemm2[1], gemm2_bias=None,
                    **output_scales, num_experts=experts, top_k=problem.top_k, n_group=None,
                    topk_group=None, intermediate_size=intermediate, local_expert_offset=0,
                    local_num_experts=experts, routed_scaling_factor=None,
                    routing_method_type=TRTLLM_ROUTING_TOPK, do_finalize=True, output=out)
                return out
            return call

        args = (x_q.packed, x_q.scales, problem.topk_ids, problem.topk_weights)
        return layer_call(problem, build, args, scales)


def trtllm_weights(q: QuantizedTensor, flashinfer, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per expert: rows interleaved for the fused gated activation (gate_up only), shuffled for
    the transposed MMA output (epilogue tile 128); scales likewise, then FlashInfer's 128x4."""
    packed, scales = [], []
    experts, rows, k = q.shape
    for e in range(experts):
        w, s = q.packed[e], q.scales[e].view(torch.uint8)                          # [N, K/2], [N, K/16]
        if gated:
            w = flashinfer.reorder_rows_for_gated_act_gemm(w)
            s = flashinfer.reorder_rows_for_gated_act_gemm(s)
        packed.append(flashinfer.shuffle_matrix_a(w.contiguous(), TRTLLM_EPILOGUE_TILE_M))
        shuffled = flashinfer.shuffle_matrix_sf_a(s.contiguous(), TRTLLM_EPILOGUE_TILE_M)
        if shuffled.numel() != rows * (k // 16):
            raise MethodUnavailable(
                f"flashinfer-trtllm-moe-nvfp4 needs expert rows N padded to 128 and K/16 to 4: "
                f"N={rows}, K={k} gave {shuffled.numel()} scale bytes, not {rows * (k // 16)}")
        scales.append(shuffled.reshape(rows, k // 16))
    return torch.stack(packed), torch.stack(scales).view(torch.float8_e4m3fn)


# -- sgl-kernel cutlass_fp4_group_mm (one expert GEMM) ---------------------------------------------

class SglFp4GroupMm(Fp4MoeMethod):
    name, library, kind = "sgl-fp4-group-mm", "sgl-kernel", "gemm"
    requires = Requirements(capabilities=BLACKWELL_FP4_CAPABILITIES, unit="FP4 tensor cores",
                            module="sgl_kernel", pip_name="sgl-kernel")
    recorded = FP4_GROUP_MM
    what = "sgl_kernel.cutlass_fp4_group_mm, NVFP4 x NVFP4 grouped GEMM over every expert"

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        if not isinstance(problem, ExpertProblem):
            raise MethodUnavailable(f"{self.name}: a GEMM method takes an ExpertProblem, "
                                    f"got {type(problem).__name__}")
        function = self.checked_function()
        device = problem.a.device
        w_q = stacked_nvfp4(problem.w)                                              # [E, N, K]
        a_gs = encode_scale(problem.a.float().abs().amax().item()).to(device)
        a_q = formats.nvfp4_quantize(problem.a, global_scale=a_gs)                  # [R, K/2], [R, K/16]
        a_blockscale, blockscale_starts = per_expert_swizzled(a_q.scales, problem.loads)
        experts, n, k = problem.w.shape
        params = group_mm_params(problem.loads, problem.starts, blockscale_starts, n, k, device)
        alphas = (1.0 / (a_gs * per_expert_global(w_q))).float()                    # [E]
        b_blockscale = formats.swizzle_scales(w_q.scales)                  # [E, N_pad, K/16 pad]

        def build(args, out):
            a_packed, a_scales, b_packed, b_scales, alpha = args
            return lambda: keyword_call(
                function, self.recorded, a_fp4=a_packed, b_fp4=b_packed, a_blockscale=a_scales,
                b_blockscale=b_scales, alphas=alpha, out_dtype=torch.bfloat16, device=device,
                params=params)

        args = (a_q.packed, a_blockscale, w_q.packed, b_blockscale, alphas)
        per_expert = n * k // 2 + n * k // formats.BLOCK_SIZE["nvfp4"]
        return bound_call(build, args, None, ref_a=formats.dequantize(a_q),
                          ref_w=formats.dequantize(w_q), tolerance_key="nvfp4",
                          weight_bytes=len(problem.active) * per_expert,
                          note=f"{len(problem.active)} experts, activations quantized in prepare")


def stacked_nvfp4(w: torch.Tensor) -> QuantizedTensor:
    """[E, N, K] bf16 -> NVFP4 with one global scale per expert (as checkpoints store them)."""
    parts = [formats.nvfp4_quantize(w[e]) for e in range(w.shape[0])]
    return QuantizedTensor(packed=torch.stack([p.packed for p in parts]),
                           scales=torch.stack([p.scales for p in parts]),
                           global_scale=torch.stack([p.global_scale.reshape(()) for p in parts]),
                           fmt="nvfp4", shape=tuple(w.shape))


def per_expert_swizzled(scales: torch.Tensor, loads) -> tuple[torch.Tensor, list[int]]:
    """Rows of [R, K/16] scales, grouped by expert, each group swizzled 128x4 on its own (rows
    padded to 128), concatenated: the layout and row starts the grouped kernel reads."""
    blocks, starts, row, padded = [], [], 0, 0
    for count in (int(c) for c in loads):
        starts.append(padded)
        if count:
            blocks.append(formats.swizzle_scales(scales[row:row + count]))
        row += count
        padded += round_up(count, formats.SWIZZLE_ROWS) if count else 0
    return torch.cat(blocks), starts


def group_mm_params(loads, starts, blockscale_starts, n: int, k: int, device) -> dict:
    """The params dict sglang's CutlassMoEParams.to_gemm1_args hands cutlass_fp4_group_mm."""
    experts = len(loads)
    problem_sizes = torch.tensor([[int(m), n, k] for m in loads], dtype=torch.int32, device=device)

    def scratch(*shape):
        return torch.empty(shape, dtype=torch.int64, device=device)

    return {"ab_strides": torch.full((experts,), k, dtype=torch.int64, device=device),
            "c_strides": torch.full((experts,), n, dtype=torch.int64, device=device),
            "problem_sizes": problem_sizes,                                         # [E, 3]
            "expert_offsets": torch.tensor([int(s) for s in starts], dtype=torch.int32, device=device),
            "blockscale_offsets": torch.tensor(blockscale_starts, dtype=torch.int32, device=device),
            # scratch the newer versions fill themselves
            **{name: scratch(experts) for name in ("a_ptrs", "b_ptrs", "out_ptrs", "a_scales_ptrs",
                                                    "b_scales_ptrs", "alpha_ptrs")},
            "layout_sfa": scratch(experts, 5), "layout_sfb": scratch(experts, 5)}
