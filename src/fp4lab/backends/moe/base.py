"""What every MoE method is: the problem it solves, the call it hands the timer, and its gate.

Two kinds of method, one row each per measured point:
- **GEMM methods** (`kind = "gemm"`) run one expert GEMM (gate_up or down) over every expert at the
  uneven loads routing produces: an `ExpertProblem` (bf16 operands, tokens already sorted by expert).
- **Layer methods** (`kind = "layer"`) run the whole routed MLP of a decode step, gate_up, the
  SiLU-and-multiply, down and the weighted sum over the top-k, on FP4 weights: a `LayerProblem`.

Both prepare a `MoeCall`; `check_call` gates it against a float64 reference on the very operands
it multiplies before `fp4lab.bench.time_call` times it.

Shape legend: `E` experts in the problem (all routed experts, or one EP rank's E/P), `T` tokens
(layer) or routed token rows (GEMM: the sum of the per-expert loads), `k` top-k, `H` hidden,
`I` moe_intermediate, `N`, `K` one expert GEMM (`w_e: [N, K]`), `m_e` tokens of expert e.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from fp4lab import correctness
from fp4lab.backends.base import Runnable
from fp4lab.formats import QuantizedTensor


class MethodUnavailable(Exception):
    """A method that cannot run on this problem here; the message is the reason in its row."""


# -- problems -------------------------------------------------------------------------------------

@dataclass
class ExpertProblem:
    """The operands of one grouped GEMM at real, uneven per-expert loads."""

    loads: np.ndarray            # [E] tokens per expert
    a: torch.Tensor              # [T, K] bf16, rows sorted by expert
    w: torch.Tensor              # [E, N, K] bf16
    offsets: torch.Tensor        # [E] int32, cumulative row ends (torch._grouped_mm's offs)

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.loads)[:-1]])

    @property
    def active(self) -> list[int]:
        return [e for e in range(len(self.loads)) if self.loads[e] > 0]

    @property
    def device(self) -> str:
        return "cuda" if self.a.is_cuda else "cpu"


@dataclass
class LayerProblem:
    """One decode step of one routed MoE layer with FP4 weights.

    `w13` stacks each expert's gate rows [0, I) over its up rows [I, 2I); the layer computes
    out[t] = sum_j weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = ids[t, j].
    """

    x: torch.Tensor              # [T, H] bf16
    topk_ids: torch.Tensor       # [T, k] int32
    topk_weights: torch.Tensor   # [T, k] float32, each row sums to 1
    w13: QuantizedTensor         # [E, 2I, H]
    w2: QuantizedTensor          # [E, H, I]

    @property
    def fmt(self) -> str:
        return self.w13.fmt

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.x.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2]

    @property
    def top_k(self) -> int:
        return self.topk_ids.shape[1]

    @property
    def device(self) -> str:
        return "cuda" if self.x.is_cuda else "cpu"

    @property
    def loads(self) -> np.ndarray:
        """[E] tokens routed to each expert."""
        ids = self.topk_ids.reshape(-1).to("cpu", torch.int64).numpy()
        return np.bincount(ids, minlength=self.experts)


# -- what a method hands the timer ----------------------------------------------------------------

@dataclass
class MoeCall:
    """A method ready to run: the timed `call`, rebindable over copies via `make_call`, and what
    its gate compares against.

    GEMM methods: `ref_a` [T, K] and `ref_w` [E, N, K] are the operands really multiplied and
    `to_rows` maps the output to [T, N]. Layer methods: the reference is the float64 layer on the
    problem's dequantized weights, with `reference_transform(stage, tensor)` applied where the
    kernel rounds what enters a GEMM ("input": x, "intermediate": the SiLU product), so a W4A4
    kernel is compared with the same quantized activations it multiplies.
    """

    call: Callable[[], torch.Tensor]
    args: tuple
    out: torch.Tensor | None
    make_call: Callable[[tuple, torch.Tensor | None], Callable[[], torch.Tensor]]
    tolerance_key: str                       # key of correctness.TOLERANCE
    weight_bytes: float                      # bytes of weights one call reads
    note: str = ""
    ref_a: torch.Tensor | None = None
    ref_w: torch.Tensor | None = None
    to_rows: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda out: out)
    reference_transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None
    graph: bool = True                       # False: cannot be captured in a CUDA graph (says why)


def bound_call(build: Callable[[tuple, torch.Tensor | None], Callable[[], torch.Tensor]], args: tuple,
               out: torch.Tensor | None, **fields) -> MoeCall:
    """A MoeCall whose call is `build(args, out)`."""
    return MoeCall(call=build(args, out), args=args, out=out, make_call=build, **fields)


class MoeMethod(Runnable):
    """An MoE method: `kind` "gemm" (one expert GEMM over all experts) or "layer" (the routed MLP)."""

    kind: str = "gemm"
    formats: tuple[str, ...] = ()            # layer methods: FP4 formats of the weights taken
    gemm_backend: str | None = None          # a loop method: the GEMM backend it calls per expert

    def prepare(self, problem, fmt: str | None = None) -> MoeCall:
        """Build the call for `problem`. GEMM methods that read FP4 weights quantize the
        problem's bf16 weights to `fmt`; layer methods take the format of the problem's weights."""
        raise NotImplementedError

    def unavailable_here(self, device: str) -> None:
        """Raise MethodUnavailable with the reason when the method cannot run on `device`."""
        available, reason = self.availability(device)
        if not available:
            raise MethodUnavailable(f"{self.name}: {reason}")


# -- references and the gate ----------------------------------------------------------------------

def grouped_reference(ref_a: torch.Tensor, ref_w: torch.Tensor, loads: np.ndarray) -> torch.Tensor:
    """float64 [T, N]: each expert's rows times its weights, via correctness.reference_gemm."""
    out = torch.empty(ref_a.shape[0], ref_w.shape[1], dtype=torch.float64, device=ref_a.device)
    start = 0
    for e, count in enumerate(loads):
        if count:
            out[start:start + count] = correctness.reference_gemm(ref_a[start:start + count], ref_w[e])
            start += int(count)
    return out


def layer_reference(problem: LayerProblem,
                    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """float64 [T, H]: the routed MLP on the problem's dequantized weights, one expert at a time
    (so a GLM-5 layer needs one expert's float64 weights at once, not the 38 GB of all)."""
    from fp4lab.formats import dequantize

    transform = transform or (lambda stage, tensor: tensor)
    x = transform("input", problem.x.float()).to(torch.float64)                     # [T, H]
    ids = problem.topk_ids.long()                                                   # [T, k]
    weights = problem.topk_weights.to(torch.float64)                                # [T, k]
    out = torch.zeros(x.shape[0], problem.hidden, dtype=torch.float64, device=x.device)
    intermediate = problem.intermediate
    for e in torch.unique(ids).tolist():
        token, slot = torch.nonzero(ids == e, as_tuple=True)                        # [m_e]
        w13 = dequantize(_expert(problem.w13, e)).to(torch.float64)                 # [2I, H]
        w2 = dequantize(_expert(problem.w2, e)).to(torch.float64)                   # [H, I]
        h = x[token] @ w13.T                                                        # [m_e, 2I]
        act = torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]  # [m_e, I]
        act = transform("intermediate", act.float()).to(torch.float64)
        out.index_add_(0, token, (act @ w2.T) * weights[token, slot].unsqueeze(1))
    return out


def _expert(q: QuantizedTensor, e: int) -> QuantizedTensor:
    """Expert e's slice [N, K] of a stacked [E, N, K] quantized tensor."""
    return QuantizedTensor(packed=q.packed[e], scales=q.scales[e], global_scale=_expert_scale(q, e),
                           fmt=q.fmt, shape=tuple(q.shape[1:]))


def _expert_scale(q: QuantizedTensor, e: int) -> torch.Tensor | None:
    if q.global_scale is None:
        return None
    return q.global_scale.reshape(-1)[e] if q.global_scale.numel() > 1 else q.global_scale


def check_call(call: MoeCall, problem) -> correctness.GateResult:
    """Poison the output (where the method has one), call once, compare with float64."""
    if isinstance(problem, LayerProblem):
        reference = layer_reference(problem, call.reference_transform)
    else:
        reference = grouped_reference(call.ref_a, call.ref_w, problem.loads)
    reference_norm = torch.linalg.vector_norm(reference).item()
    result = call.to_rows(correctness.run_poisoned(call))
    return correctness.compare(result, reference, reference_norm,
                               correctness.TOLERANCE[call.tolerance_key])


# -- building problems ----------------------------------------------------------------------------

def expert_bf16_weights(experts: int, n: int, k: int, device: str, seed: int = 0) -> torch.Tensor:
    """[E, N, K] bf16 weights scaled by 1/sqrt(K) so outputs stay O(1)."""
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    w = torch.randn(experts, n, k, generator=generator, device=device, dtype=torch.bfloat16)
    return w.mul_(k ** -0.5)


def make_expert_problem(loads: np.ndarray, n: int, k: int, device: str, seed: int = 0,
                        w: torch.Tensor | None = None) -> ExpertProblem:
    """Random bf16 operands for the given per-expert loads (weights reused when passed)."""
    loads = np.asarray(loads, dtype=np.int64)
    if loads.ndim != 1 or (loads < 0).any() or loads.sum() == 0:
        raise ValueError(f"loads must be non-negative token counts per expert with at least one "
                         f"token, got {loads.tolist()[:16]}")
    generator = torch.Generator(device=device).manual_seed(seed)
    if w is None:
        w = expert_bf16_weights(len(loads), n, k, device, seed)
    if tuple(w.shape) != (len(loads), n, k):
        raise ValueError(f"weights have shape {tuple(w.shape)}, expected {(len(loads), n, k)}")
    a = torch.randn(int(loads.sum()), k, generator=generator, device=device, dtype=torch.bfloat16)
    offsets = torch.tensor(np.cumsum(loads), dtype=torch.int32, device=device)
    return ExpertProblem(loads=loads, a=a, w=w, offsets=offsets)


def quantized_expert_weights(experts: int, n: int, k: int, fmt: str, device: str,
                             seed: int = 0) -> QuantizedTensor:
    """[E, N, K] weights quantized to `fmt`, one NVFP4 global scale per expert (as checkpoints
    store them), built one expert at a time so no [E, N, K] float32 temporary exists."""
    from fp4lab.formats import quantize

    packed, scales, global_scales = [], [], []
    generator = torch.Generator(device=device).manual_seed(seed + 2)
    for _ in range(experts):
        q = quantize(torch.randn(n, k, generator=generator, device=device) * k ** -0.5, fmt)
        packed.append(q.packed)
        scales.append(q.scales)
        if q.global_scale is not None:
            global_scales.append(q.global_scale.reshape(1))
    return QuantizedTensor(packed=torch.stack(packed), scales=torch.stack(scales),
                           global_scale=torch.cat(global_scales) if global_scales else None,
                           fmt=fmt, shape=(experts, n, k))


def make_layer_problem(ids: np.ndarray, experts: int, hidden: int, intermediate: int, fmt: str,
                       device: str, seed: int = 0,
                       weights: tuple[QuantizedTensor, QuantizedTensor] | None = None) -> LayerProblem:
    """A decode step routed by `ids` [T, k] (distinct experts per token), random activations and
    routing weights, FP4 weights (reused when `weights` = (w13, w2) is passed)."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.min() < 0 or ids.max() >= experts:
        raise ValueError(f"ids must be [T, k] expert ids in [0, {experts}), got shape {ids.shape}")
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(ids.shape[0], hidden, generator=generator, device=device).to(torch.bfloat16)
    logits = torch.randn(ids.shape, generator=generator, device=device)
    if weights is None:
        weights = (quantized_expert_weights(experts, 2 * intermediate, hidden, fmt, device, seed),
                   quantized_expert_weights(experts, hidden, intermediate, fmt, device, seed + 1))
    return LayerProblem(x=x, topk_ids=torch.as_tensor(ids, dtype=torch.int32, device=device),
                        topk_weights=torch.softmax(logits, dim=-1), w13=weights[0], w2=weights[1])


def layer_weight_bytes(problem: LayerProblem, experts: int | None = None) -> float:
    """Bytes of FP4 weights a layer call reads: the active experts' w13 and w2 (codes + scales)."""
    active = int((problem.loads > 0).sum()) if experts is None else experts
    per_expert = (problem.w13.nbytes + problem.w2.nbytes) / problem.experts
    return active * per_expert
