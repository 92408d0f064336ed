"""MoE GEMM methods built on torch alone, and the loop of fp4lab's FP4 weight-only kernel.

- `loop-bf16`: one `torch.mm` per active expert (the naive path). Timed as a CUDA-graph replay,
  so per-kernel launch cost is graph-amortized (the run's measured launch floor), not eager.
- `grouped-bf16`: one `torch._grouped_mm(a [T, K], w^T [E, K, N], offs int32 cumulative ends)`.
- `padded-bf16`: every expert padded to L rows (the busiest expert's load), one `torch.bmm` over
  `[E, L, K]`: the time the waste of padding costs. Only the useful rows' FLOPs are credited.
- `grouped-fp8`: `torch._scaled_grouped_mm` on e4m3 operands with row-wise scales (a per token,
  w per output row), where torch implements it (sm_90+); otherwise unavailable with torch's reason.
- `loop-triton-w4a16`: a loop of fp4lab's FP4 weight-only GEMM, one call per active expert.

Tokens are assumed already permuted into expert order (the same for every method, not timed).
Shape legend: see `fp4lab.backends.moe.base`.
"""

from __future__ import annotations

import torch

from fp4lab.backends.base import FP8_MIN_CAPABILITY, Requirements
from fp4lab.backends.moe.base import (
    ExpertProblem, MethodUnavailable, MoeCall, MoeMethod, bound_call,
)
from fp4lab.formats import E4M3_MAX


def _empty_rows(problem: ExpertProblem) -> torch.Tensor:
    return torch.empty(problem.a.shape[0], problem.w.shape[1], dtype=torch.bfloat16,
                       device=problem.a.device)                                     # [T, N]


class LoopBf16(MoeMethod):
    name, library, gemm_backend = "loop-bf16", "torch", "torch-bf16"
    weight_dtype, act_dtype = "bf16", "bf16"
    what = "one torch.mm per active expert"

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        segments = [(e, int(s), int(s + problem.loads[e]))
                    for e, s in zip(range(len(problem.loads)), problem.starts) if problem.loads[e] > 0]

        def build(args, out):
            a, w = args

            def call():
                for e, start, end in segments:
                    torch.mm(a[start:end], w[e].t(), out=out[start:end])
                return out
            return call

        return bound_call(build, (problem.a, problem.w), _empty_rows(problem), ref_a=problem.a,
                          ref_w=problem.w, tolerance_key="bf16",
                          weight_bytes=len(segments) * problem.w[0].nbytes,
                          note=f"{len(segments)} torch.mm calls")


class GroupedBf16(MoeMethod):
    name, library = "grouped-bf16", "torch"
    weight_dtype, act_dtype = "bf16", "bf16"
    what = "one torch._grouped_mm over every expert"

    def runtime_reason(self) -> str | None:
        if not hasattr(torch, "_grouped_mm"):
            return f"torch {torch.__version__} has no torch._grouped_mm"
        return None

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        reason = self.runtime_reason()
        if reason:
            raise MethodUnavailable(reason)

        def build(args, out):
            a, w, offsets = args
            return lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offsets)

        # torch._grouped_mm has no out= form: the output is fresh, so there is nothing to poison
        return bound_call(build, (problem.a, problem.w, problem.offsets), None, ref_a=problem.a,
                          ref_w=problem.w, tolerance_key="bf16",
                          weight_bytes=len(problem.active) * problem.w[0].nbytes,
                          note="torch._grouped_mm")


class PaddedBf16(MoeMethod):
    name, library = "padded-bf16", "torch"
    weight_dtype, act_dtype = "bf16", "bf16"
    what = "every expert padded to the busiest one's load, one torch.bmm"

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        experts, longest, k = len(problem.loads), int(problem.loads.max()), problem.a.shape[1]
        a_padded = torch.zeros(experts, longest, k, dtype=torch.bfloat16, device=problem.a.device)  # [E, L, K]
        row_index = []                                   # where each token row sits in [E * L]
        for e, start in zip(range(experts), problem.starts):
            count = int(problem.loads[e])
            a_padded[e, :count] = problem.a[start:start + count]
            row_index.extend(range(e * longest, e * longest + count))
        row_index = torch.tensor(row_index, dtype=torch.long, device=problem.a.device)  # [T]
        n = problem.w.shape[1]

        def build(args, out):
            a, w = args
            return lambda: torch.bmm(a, w.transpose(1, 2), out=out)

        out = torch.empty(experts, longest, n, dtype=torch.bfloat16, device=problem.a.device)  # [E, L, N]
        return bound_call(build, (a_padded, problem.w), out, ref_a=problem.a, ref_w=problem.w,
                          tolerance_key="bf16", weight_bytes=problem.w.nbytes,
                          to_rows=lambda result: result.reshape(-1, n)[row_index],
                          note=f"bmm over [{experts}, {longest}, {k}]")


def fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (e4m3 values [..., K], float32 decode scales [...]) with x ~ values * scales."""
    scale = x.float().abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
    values = (x.float() / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


class GroupedFp8(MoeMethod):
    name, library = "grouped-fp8", "torch"
    weight_dtype, act_dtype = "fp8", "fp8"
    requires = Requirements(min_capability=FP8_MIN_CAPABILITY, unit="FP8 tensor cores")
    what = "torch._scaled_grouped_mm on e4m3 operands, row-wise scales"

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        if not hasattr(torch, "_scaled_grouped_mm"):
            raise MethodUnavailable(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
        a_fp8, a_scale = fp8_rowwise(problem.a)              # [T, K], [T]
        w_fp8, w_scale = fp8_rowwise(problem.w)              # [E, N, K], [E, N]

        def build(args, out):
            a, w, sa, sw, offsets = args
            return lambda: torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sw, offs=offsets,
                                                    out_dtype=torch.bfloat16)

        args = (a_fp8, w_fp8, a_scale, w_scale, problem.offsets)
        try:  # one call decides: torch raises NotImplementedError where unsupported
            build(args, None)()
        except (NotImplementedError, RuntimeError) as exc:
            raise MethodUnavailable("torch._scaled_grouped_mm: " + str(exc).splitlines()[0][:200]) from None
        return bound_call(build, args, None, ref_a=a_fp8.float() * a_scale.unsqueeze(-1),
                          ref_w=w_fp8.float() * w_scale.unsqueeze(-1), tolerance_key="fp8",
                          weight_bytes=len(problem.active) * problem.w[0].numel(),
                          note="torch._scaled_grouped_mm, row-wise scales")


class LoopTritonW4A16(MoeMethod):
    """fp4lab's FP4 weight-only GEMM (the dense backend), once per active expert."""

    name, library, gemm_backend = "loop-triton-w4a16", "triton", "triton-w4a16"
    weight_dtype, act_dtype = "fp4", "bf16"
    formats = ("nvfp4", "mxfp4")

    @property
    def requires(self):
        from fp4lab import backends

        return backends.get("triton-w4a16").requires

    what = "one triton-w4a16 call per active expert"

    def prepare(self, problem: ExpertProblem, fmt: str | None = None) -> MoeCall:
        from fp4lab import backends, formats

        fmt = fmt or "nvfp4"
        backend = backends.get("triton-w4a16")
        device = problem.device
        self.unavailable_here(device)
        parts, ref_w = [], []                      # one Prepared per active expert, in row order
        for e, start in zip(range(len(problem.loads)), problem.starts):
            weights = formats.quantize(problem.w[e], fmt)
            ref_w.append(formats.dequantize(weights))
            if problem.loads[e]:
                rows = problem.a[start:start + int(problem.loads[e])]
                parts.append(backend.prepare(rows, weights, device))

        def build(args, out):
            calls = [part.make_call(part_args, part.out) for part, part_args in zip(parts, args)]
            return lambda: [call() for call in calls]

        n, k = problem.w.shape[1:]
        per_expert = n * k // 2 + n * k // formats.BLOCK_SIZE[fmt]
        return bound_call(build, tuple(part.args for part in parts), None,
                          ref_a=torch.cat([part.ref_a for part in parts]), ref_w=torch.stack(ref_w),
                          tolerance_key=fmt, weight_bytes=len(parts) * per_expert,
                          to_rows=torch.cat, note=f"{len(parts)} triton-w4a16 calls ({fmt})")


class LayerLoopBf16(MoeMethod):
    """The routed MLP as torch runs it without FP4 kernels: the FP4 weights dequantized to bf16
    once, then per active expert gate_up, SiLU-and-multiply, down and the weighted scatter-add.
    The layer-method baseline, and the one that runs anywhere (the CPU smoke run included)."""

    name, library, kind = "layer-loop-bf16", "torch", "layer"
    formats = ("nvfp4", "mxfp4")
    weight_dtype, act_dtype = "bf16", "bf16"
    what = "per-expert torch.mm loop over dequantized bf16 weights, SiLU*up, weighted scatter-add"

    def prepare(self, problem, fmt: str | None = None) -> MoeCall:
        from fp4lab.formats import dequantize

        ids = problem.topk_ids.long()                                               # [T, k]
        active = torch.unique(ids).tolist()
        routes = {e: torch.nonzero(ids == e, as_tuple=True) for e in active}       # e -> (token, slot)
        w13 = dequantize(problem.w13).to(torch.bfloat16)                            # [E, 2I, H]
        w2 = dequantize(problem.w2).to(torch.bfloat16)                              # [E, H, I]
        intermediate = problem.intermediate

        def build(args, out):
            x, w13_arg, w2_arg, weights = args

            def call():
                out.zero_()
                for e in active:
                    token, slot = routes[e]
                    h = x[token] @ w13_arg[e].t()                                   # [m_e, 2I]
                    act = torch.nn.functional.silu(h[:, :intermediate]) * h[:, intermediate:]
                    scaled = (act @ w2_arg[e].t()).float() * weights[token, slot].unsqueeze(1)
                    out.index_add_(0, token, scaled)
                return out
            return call

        out = torch.empty(problem.x.shape[0], problem.hidden, dtype=torch.float32,
                          device=problem.x.device)                                  # [T, H]
        per_expert = (w13[0].nbytes + w2[0].nbytes)
        return bound_call(build, (problem.x, w13, w2, problem.topk_weights), out,
                          tolerance_key="bf16", weight_bytes=len(active) * per_expert,
                          note=f"{len(active)} experts x (2 torch.mm + SiLU*up + index_add)")
