"""humming's MoE GEMMs as whole FP4 layers: gate_up, SiLU-and-multiply, down, the routing weights.

Two layouts of the routed rows, as humming's MoE kernels take them (one kernel per GEMM, every
expert in it):
- **grouped contiguous** (`humming-moe-grouped`): the T*k routed rows gathered into expert order,
  `expert_layout` int64 [E+1] the row offset where each expert's rows start (the last = T*k);
  `compute_config={"gemm_type": "grouped_contiguous"}`.
- **indexed** (`humming-moe-indexed`, vLLM's fused-MoE layout): the tokens stay where they are;
  `sorted_ids` int32 lists the flat route ids t*k+j of each expert, padded per expert to a
  multiple of the kernel's block_shape[0] with the sentinel T*k, `expert_ids` int32 names the
  expert of each block and `num_tokens_padded` int32 [1] their total. The block size is the one
  of the tuning interval humming's heuristics pick for T*k routes; fp4lab passes those intervals
  as `tuning_config`, so the kernel that runs is the one the ids were aligned to. The first GEMM
  reads token id // k (`top_k=k`), the second reads the intermediate row id itself (`top_k=1`).
Routing's index arithmetic (the sort, the offsets, the alignment) is done in `prepare`, as the
routing step of a serving engine; the gathers, the SiLU-and-multiply and the weighted sum over the
top-k are torch ops between the two humming GEMMs, inside the timed call. CUDA-graph capturable:
humming launches plain kernels (its TMA descriptors are kernel parameters).

`humming-w4a4-moe` (Blackwell only) quantizes both GEMMs' activations to NVFP4 with static
tensor scales: the input's from x, the intermediate's calibrated on this batch in `prepare` (one
untimed run of the first GEMM); the gate's reference rounds the same way (`reference_transform`).
Caveat: the kernel quantizes ITS bf16 intermediate, the reference its float64 one; where the two
straddle an e2m1 rounding boundary the FP4 codes differ by a step. On the fake (tests) that costs
0.5-2.5% relative error against the 2% tolerance, so this gate can report wrong_result for a
correct kernel: comparing with the kernel's own intermediate needs a hook the gate lacks.

Shape legend: see `fp4lab.backends.moe.base`; `R` = T*k routed rows, `P` padded routed rows,
`B` the indexed kernel's block of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fp4lab.backends.humming import (
    NVFP4_ACTIVATIONS, REQUIRES_W4A4, REQUIRES_W4A16, HummingGemm, activation_tensor_scale,
    compile_cache_dir, load_layer, nvfp4_static_activations, timed_first_call,
)
from fp4lab.backends.moe.base import LayerProblem, MoeCall, MoeMethod, bound_call, layer_weight_bytes

GROUPED = {"gemm_type": "grouped_contiguous"}
INDEXED = {"gemm_type": "indexed"}


# -- routing index arithmetic (prepare time) ------------------------------------------------------

def grouped_routes(topk_ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(route ids [R] int64 in expert order, expert_layout int64 [E+1]) for topk_ids [T, k]."""
    flat = topk_ids.reshape(-1).long()                                       # [R]
    order = torch.argsort(flat, stable=True)                                 # [R]
    counts = torch.bincount(flat, minlength=experts)                         # [E]
    layout = torch.zeros(experts + 1, dtype=torch.int64, device=flat.device)
    layout[1:] = torch.cumsum(counts, dim=0)
    return order, layout


@dataclass(frozen=True)
class IndexedRoutes:
    sorted_ids: torch.Tensor          # [P] int32 flat route ids, T*k = padding
    expert_ids: torch.Tensor          # [P / B] int32
    num_tokens_padded: torch.Tensor   # [1] int32, = P

    def kwargs(self) -> dict:
        return {"sorted_ids": self.sorted_ids, "expert_ids": self.expert_ids,
                "num_tokens_padded": self.num_tokens_padded}


def indexed_routes(topk_ids: torch.Tensor, experts: int, block: int) -> IndexedRoutes:
    """Each expert's flat route ids, padded to a multiple of `block` with the sentinel T*k."""
    flat = topk_ids.reshape(-1).long()                                       # [R]
    order, layout = grouped_routes(topk_ids, experts)                        # [R], [E+1]
    counts = layout[1:] - layout[:-1]                                        # [E]
    blocks = (counts + block - 1) // block                                   # [E]
    padded_starts = torch.zeros_like(blocks)
    padded_starts[1:] = torch.cumsum(blocks * block, dim=0)[:-1]
    rank = torch.arange(len(order), device=flat.device) - layout[flat[order]]    # within expert
    total = int(blocks.sum()) * block
    sorted_ids = torch.full((total,), len(flat), dtype=torch.int32, device=flat.device)
    sorted_ids[padded_starts[flat[order]] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(experts, device=flat.device), blocks)
    return IndexedRoutes(sorted_ids, expert_ids.to(torch.int32),
                         torch.tensor([total], dtype=torch.int32, device=flat.device))


def indexed_block(intervals: list, routes: int) -> int:
    """block_shape[0] of the tuning interval (lo, hi] holding `routes`, as humming's launcher
    picks it."""
    for low, high, tuning in intervals:
        if low < routes <= high:
            return int(tuning["block_shape"][0])
    raise ValueError(f"humming's tuning intervals do not cover {routes} routed rows")


def silu_and_mul(h: torch.Tensor, intermediate: int) -> torch.Tensor:
    """h [R, 2I] (gate | up) -> silu(gate) * up [R, I]."""
    return torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]


# -- the methods ----------------------------------------------------------------------------------

@dataclass
class LayerGemms:
    """The two humming layers of an MoE layer and how the activations enter them."""

    gate_up: HummingGemm       # w13 [E, 2I, H]
    down: HummingGemm          # w2 [E, H, I]
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None   # W4A4's reference_transform


class HummingMoeLayer(MoeMethod):
    """Shared by both layouts: the two humming layers, compile time, the call's plumbing."""

    kind, library = "layer", "humming"
    formats = ("nvfp4", "mxfp4")
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = REQUIRES_W4A16
    layout = ""

    def prepare(self, problem: LayerProblem, fmt: str | None = None) -> MoeCall:
        self.check_problem(problem)
        gemms = self.load(problem)
        build, args, out = self.layer_call(problem, gemms)
        call = bound_call(build, args, out, tolerance_key=problem.fmt,
                          weight_bytes=layer_weight_bytes(problem),
                          reference_transform=gemms.transform, note=self.call_note(problem))
        compile_s = timed_first_call(call.call)
        call.note += f"; first call (JIT compile or cache load, {compile_cache_dir()}) {compile_s:.1f} s"
        return call

    def check_problem(self, problem: LayerProblem) -> None:
        if problem.fmt not in self.formats:
            raise ValueError(f"MoE method {self.name!r} takes formats {list(self.formats)}, "
                             f"not fmt={problem.fmt!r}")

    def load(self, problem: LayerProblem) -> LayerGemms:
        return LayerGemms(gate_up=load_layer(problem.w13, problem.device),
                          down=load_layer(problem.w2, problem.device))

    def call_note(self, problem: LayerProblem) -> str:
        return (f"humming {self.layout} MoE GEMMs ({problem.fmt} weights), torch between them: "
                f"gather/scatter, SiLU*up, routing weights")

    def layer_call(self, problem: LayerProblem, gemms: LayerGemms):
        raise NotImplementedError


class HummingMoeGrouped(HummingMoeLayer):
    name = "humming-moe-grouped"
    layout = "grouped-contiguous"
    what = ("humming grouped-contiguous MoE GEMMs (gate_up, down) over rows gathered by expert, "
            "SiLU*up and the weighted scatter-add in torch")

    def layer_call(self, problem, gemms):
        order, layout = grouped_routes(problem.topk_ids, problem.experts)    # [R], [E+1]
        token = order // problem.top_k                                       # [R]
        rows, device = len(order), problem.x.device
        h = torch.empty(rows, 2 * problem.intermediate, dtype=torch.bfloat16, device=device)
        y = torch.empty(rows, problem.hidden, dtype=torch.bfloat16, device=device)
        intermediate = problem.intermediate

        def build(args, out):
            x, weights, w13, w2 = args

            def call():
                gathered = x.index_select(0, token)                                   # [R, H]
                gemms.gate_up(gathered, w13, h, expert_layout=layout, compute_config=GROUPED)
                act = silu_and_mul(h, intermediate)                                   # [R, I]
                gemms.down(act, w2, y, expert_layout=layout, compute_config=GROUPED)  # [R, H]
                route_weight = weights.reshape(-1).index_select(0, order).unsqueeze(1)
                out.zero_()
                return out.index_add_(0, token, y.float() * route_weight)             # [T, H]
            return call

        out = torch.empty(problem.x.shape[0], problem.hidden, dtype=torch.float32, device=device)
        args = (problem.x, problem.topk_weights, gemms.gate_up.tensors, gemms.down.tensors)
        return build, args, out


class HummingMoeIndexed(HummingMoeLayer):
    name = "humming-moe-indexed"
    layout = "indexed"
    what = ("humming indexed MoE GEMMs (vLLM's sorted_ids / expert_ids layout), SiLU*up and the "
            "weighted top-k sum in torch")

    def layer_call(self, problem, gemms):
        from humming.tune import get_heuristics_config

        tokens, top_k, device = problem.x.shape[0], problem.top_k, problem.x.device
        routes = tokens * top_k
        plans = []                                   # (tuning intervals, aligned routes) per GEMM
        for gemm in (gemms.gate_up, gemms.down):
            intervals = get_heuristics_config(gemm.config, gemm_type="indexed", device=device)
            block = indexed_block(intervals, routes)
            plans.append((intervals, indexed_routes(problem.topk_ids, problem.experts, block)))
        (tuning13, routes13), (tuning2, routes2) = plans
        h = torch.empty(routes, 2 * problem.intermediate, dtype=torch.bfloat16, device=device)
        y = torch.empty(routes, problem.hidden, dtype=torch.bfloat16, device=device)
        intermediate, hidden = problem.intermediate, problem.hidden

        def build(args, out):
            x, weights, w13, w2 = args

            def call():
                gemms.gate_up(x, w13, h, top_k=top_k, compute_config=INDEXED,
                              tuning_config=tuning13, **routes13.kwargs())             # [R, 2I]
                act = silu_and_mul(h, intermediate)                                   # [R, I]
                gemms.down(act, w2, y, top_k=1, compute_config=INDEXED,
                           tuning_config=tuning2, **routes2.kwargs())                 # [R, H]
                weighted = y.view(tokens, top_k, hidden).float() * weights.unsqueeze(-1)
                return torch.sum(weighted, dim=1, out=out)                            # [T, H]
            return call

        out = torch.empty(tokens, hidden, dtype=torch.float32, device=device)
        args = (problem.x, problem.topk_weights, gemms.gate_up.tensors, gemms.down.tensors)
        return build, args, out


class HummingW4A4Moe(HummingMoeGrouped):
    """The grouped layout with NVFP4 activations into both GEMMs (FP4 tensor cores)."""

    name = "humming-w4a4-moe"
    formats = ("nvfp4",)
    act_dtype = "fp4"
    requires = REQUIRES_W4A4
    what = ("humming grouped-contiguous W4A4 MoE GEMMs: NVFP4 weights and activations (static "
            "tensor scales, group scales per call), SiLU*up and the scatter-add in torch")

    def load(self, problem):
        experts = problem.experts
        x_scale = activation_tensor_scale(problem.x)
        gate_up = load_layer(problem.w13, problem.device, NVFP4_ACTIVATIONS,
                             {"input_scale": x_scale.expand(experts).contiguous()})
        act_scale = activation_tensor_scale(self.calibration_intermediate(problem, gate_up))
        down = load_layer(problem.w2, problem.device, NVFP4_ACTIVATIONS,
                          {"input_scale": act_scale.expand(experts).contiguous()})
        scales = {"input": x_scale, "intermediate": act_scale}

        def transform(stage, tensor):
            # the kernel quantizes a bf16 intermediate: round the reference's to bf16 first
            if stage == "intermediate":
                tensor = tensor.to(torch.bfloat16).float()
            return nvfp4_static_activations(tensor, scales[stage])

        return LayerGemms(gate_up=gate_up, down=down, transform=transform)

    def calibration_intermediate(self, problem, gate_up: HummingGemm) -> torch.Tensor:
        """silu(gate) * up of this batch through the first GEMM: what the down GEMM's static
        activation scale is calibrated on (untimed)."""
        order, layout = grouped_routes(problem.topk_ids, problem.experts)
        gathered = problem.x.index_select(0, order // problem.top_k)
        h = gate_up(gathered, gate_up.tensors, None, expert_layout=layout, compute_config=GROUPED)
        return silu_and_mul(h, problem.intermediate)

    def call_note(self, problem):
        return super().call_note(problem) + "; NVFP4 activations (static scales calibrated in prepare)"
