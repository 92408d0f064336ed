"""Expert GEMMs at the loads routing produces: a loop, one grouped call, dense padding, FP4 paths.

Shape legend: `E` experts in the group (all routed experts, or one EP rank's E/P), `T` routed
token rows (sum of the per-expert loads), `m_e` tokens of expert e, `N`, `K` one expert GEMM
(`w_e: [N, K]`), `L` the busiest expert's load (the padding length).

Methods (each goes through the correctness gate against a float64 reference on the very operands
it multiplies, then through `fp4lab.bench.time_call`):
- `loop-bf16`: one `torch.mm` per active expert (the naive path). Timed as a CUDA-graph replay,
  so per-kernel launch cost is graph-amortized (~1.3 us per kernel on the H200), not eager.
- `grouped-bf16`: one `torch._grouped_mm(a [T, K], w^T [E, K, N], offs int32 cumulative ends)`.
- `padded-bf16`: every expert padded to L rows, one `torch.bmm` over `[E, L, K]`: the time the
  waste of padding costs. Only the useful rows' FLOPs are credited.
- `grouped-fp8`: `torch._scaled_grouped_mm` on e4m3 operands with row-wise scales (a per token,
  w per output row), where torch implements it (sm_90+); otherwise unavailable with torch's reason.
- `loop-triton-w4a16`: a loop of fp4lab's FP4 weight-only kernel per expert (the Hopper FP4 path),
  where that backend exists and runs here.
- `flashinfer-cutlass-moe`, `grouped-fp4`: FP4 grouped kernels, reported with why they cannot run.

Tokens are assumed already permuted into expert order (the permutation is the same for every
method and is not timed). Weights of a GLM-5 layer (19 GB bf16) dwarf the 60 MB L2, so they are
naturally cold; small problems (scaled CPU presets, the dense curve) rotate copies instead.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from fp4lab.moe import presets, routing, stats

METHODS = ("loop-bf16", "grouped-bf16", "padded-bf16", "grouped-fp8", "loop-triton-w4a16",
           "flashinfer-cutlass-moe", "grouped-fp4")
DENSE_METHOD = "dense-bf16"
DENSE_M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMMS = ("gate_up", "down")
# a problem whose weights exceed this many L2s is cold without rotating copies
NATURALLY_COLD_L2_MULTIPLE = 4
FP8_MAX = 448.0


class MethodUnavailable(Exception):
    """A method that cannot run here; the message is the reason shown in the row."""


@dataclass
class SweepConfig:
    """One grouped-GEMM sweep, as data (the notebook and `moe-sweep` build the same object)."""

    preset: str = "glm-5"
    batch_sizes: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    routing: str = "uniform"
    ep_degrees: tuple[int, ...] = (1,)
    steps: int = 64                   # routing steps drawn; the typical one is timed
    seed: int = 0
    device: str = "auto"
    scaled: bool = False              # tiny stand-in preset (CPU smoke); rows say scaled=True
    methods: tuple[str, ...] = METHODS
    gemms: tuple[str, ...] = GEMMS
    dense_m_values: tuple[int, ...] = DENSE_M_VALUES
    timer_repeats: int = 30
    timer_warmup_s: float = 1.0

    def validate(self) -> "SweepConfig":
        presets.get(self.preset)
        routing.parse_routing(self.routing)
        for name in ("batch_sizes", "ep_degrees", "dense_m_values"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0
                                 for v in values):
                raise ValueError(f"{name}={values!r}: expected a non-empty list of positive integers")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; valid: {', '.join(METHODS)}")
        bad_gemms = [g for g in self.gemms if g not in GEMMS]
        if bad_gemms:
            raise ValueError(f"unknown gemms {bad_gemms}; valid: {', '.join(GEMMS)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA GPU")
        experts = self.model().experts
        for ep in self.ep_degrees:
            if experts % ep:
                raise ValueError(f"ep={ep}: {experts} experts do not split evenly over {ep} ranks")
        if self.steps <= 0 or self.timer_repeats <= 0:
            raise ValueError(f"steps={self.steps} and timer_repeats={self.timer_repeats} must be positive")
        return self

    def model(self) -> presets.ModelPreset:
        model = presets.get(self.preset)
        return presets.scaled_down(model) if self.scaled else model

    def resolved_device(self) -> str:
        return "cuda" if self.device == "auto" and torch.cuda.is_available() else (
            "cpu" if self.device == "auto" else self.device)


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


@dataclass
class GroupedCall:
    """A method ready to run: the timed `call`, rebindable via `make_call`, and its reference."""

    call: Callable[[], torch.Tensor]
    args: tuple
    out: torch.Tensor | None
    make_call: Callable[[tuple, torch.Tensor | None], Callable[[], torch.Tensor]]
    ref_a: torch.Tensor                      # [T, K] the activations really multiplied
    ref_w: torch.Tensor                      # [E, N, K] the weights really multiplied
    operand_dtype: str                       # "bf16" | "fp8" | "fp4"
    tolerance_key: str                       # key of correctness.TOLERANCE
    weight_bytes_per_value: float
    to_rows: Callable[[torch.Tensor], torch.Tensor] = lambda out: out   # output -> [T, N]
    note: str = ""


def _bound(build: Callable[[tuple, torch.Tensor | None], Callable[[], torch.Tensor]], args: tuple,
           out: torch.Tensor | None, **fields) -> GroupedCall:
    return GroupedCall(call=build(args, out), args=args, out=out, make_call=build, **fields)


def make_problem(loads: np.ndarray, n: int, k: int, device: str, seed: int = 0,
                 w: torch.Tensor | None = None) -> ExpertProblem:
    """Random bf16 operands for the given per-expert loads (weights reused when passed)."""
    loads = np.asarray(loads, dtype=np.int64)
    if loads.ndim != 1 or (loads < 0).any() or loads.sum() == 0:
        raise ValueError(f"loads must be non-negative token counts per expert with at least one "
                         f"token, got {loads.tolist()[:16]}")
    generator = torch.Generator(device=device).manual_seed(seed)
    if w is None:
        w = make_weights(len(loads), n, k, device, seed)
    if tuple(w.shape) != (len(loads), n, k):
        raise ValueError(f"weights have shape {tuple(w.shape)}, expected {(len(loads), n, k)}")
    a = torch.randn(int(loads.sum()), k, generator=generator, device=device, dtype=torch.bfloat16)
    offsets = torch.tensor(np.cumsum(loads), dtype=torch.int32, device=device)
    return ExpertProblem(loads=loads, a=a, w=w, offsets=offsets)


def make_weights(experts: int, n: int, k: int, device: str, seed: int = 0) -> torch.Tensor:
    """[E, N, K] bf16 weights scaled by 1/sqrt(K) so outputs stay O(1)."""
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    w = torch.randn(experts, n, k, generator=generator, device=device, dtype=torch.bfloat16)
    return w.mul_(k ** -0.5)


# --- the methods ---------------------------------------------------------------------------------

def prepare_loop_bf16(problem: ExpertProblem) -> GroupedCall:
    segments = [(e, int(s), int(s + problem.loads[e])) for e, s in zip(range(len(problem.loads)),
                                                                        problem.starts)
                if problem.loads[e] > 0]

    def build(args, out):
        a, w = args

        def call():
            for e, start, end in segments:
                torch.mm(a[start:end], w[e].t(), out=out[start:end])
            return out
        return call

    out = torch.empty(problem.a.shape[0], problem.w.shape[1], dtype=torch.bfloat16, device=problem.a.device)
    return _bound(build, (problem.a, problem.w), out, ref_a=problem.a, ref_w=problem.w,
                  operand_dtype="bf16", tolerance_key="bf16", weight_bytes_per_value=2.0,
                  note=f"{len(segments)} torch.mm calls")


def prepare_grouped_bf16(problem: ExpertProblem) -> GroupedCall:
    if not hasattr(torch, "_grouped_mm"):
        raise MethodUnavailable(f"torch {torch.__version__} has no torch._grouped_mm")

    def build(args, out):
        a, w, offsets = args
        return lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offsets)

    # torch._grouped_mm has no out= form: the output is fresh, so there is nothing to poison
    return _bound(build, (problem.a, problem.w, problem.offsets), None, ref_a=problem.a,
                  ref_w=problem.w, operand_dtype="bf16", tolerance_key="bf16", weight_bytes_per_value=2.0,
                  note="torch._grouped_mm")


def prepare_padded_bf16(problem: ExpertProblem) -> GroupedCall:
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
    return _bound(build, (a_padded, problem.w), out, ref_a=problem.a, ref_w=problem.w,
                  operand_dtype="bf16", tolerance_key="bf16", weight_bytes_per_value=2.0,
                  to_rows=lambda result: result.reshape(-1, n)[row_index],
                  note=f"bmm over [{experts}, {longest}, {k}]")


def _fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (e4m3 values [..., K], float32 scales [...]) with x ~ values * scales."""
    scale = x.float().abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale.unsqueeze(-1)).to(torch.float8_e4m3fn), scale


def prepare_grouped_fp8(problem: ExpertProblem) -> GroupedCall:
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise MethodUnavailable(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
    a_fp8, a_scale = _fp8_rowwise(problem.a)              # [T, K], [T]
    w_fp8, w_scale = _fp8_rowwise(problem.w)              # [E, N, K], [E, N]

    def build(args, out):
        a, w, sa, sw, offsets = args
        return lambda: torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sw, offs=offsets,
                                                out_dtype=torch.bfloat16)

    args = (a_fp8, w_fp8, a_scale, w_scale, problem.offsets)
    try:  # one call decides availability: torch raises NotImplementedError where unsupported
        build(args, None)()
    except (NotImplementedError, RuntimeError) as exc:
        raise MethodUnavailable("torch._scaled_grouped_mm: " + str(exc).splitlines()[0][:200]) from None
    ref_a = a_fp8.float() * a_scale.unsqueeze(-1)
    ref_w = w_fp8.float() * w_scale.unsqueeze(-1)
    return _bound(build, args, None, ref_a=ref_a, ref_w=ref_w, operand_dtype="fp8", tolerance_key="fp8",
                  weight_bytes_per_value=1.0, note="torch._scaled_grouped_mm, row-wise scales")


def prepare_loop_triton_w4a16(problem: ExpertProblem) -> GroupedCall:
    from fp4lab import backends, formats

    try:
        backend = backends.get("triton-w4a16")
    except (KeyError, ValueError) as exc:
        raise MethodUnavailable(f"the triton-w4a16 backend is not in this fp4lab build ({exc})") from None
    device = "cuda" if problem.a.is_cuda else "cpu"
    available, reason = backend.availability(device)
    if not available:
        raise MethodUnavailable(f"triton-w4a16: {reason}")
    fmt = backend.formats[0]
    parts = []                                   # one Prepared per active expert, in row order
    for e, start in zip(range(len(problem.loads)), problem.starts):
        if problem.loads[e]:
            rows = problem.a[start:start + int(problem.loads[e])]
            parts.append(backend.prepare(rows, formats.quantize(problem.w[e], fmt), device))
    ref_w = torch.stack([formats.dequantize(formats.quantize(problem.w[e], fmt))
                         for e in range(len(problem.loads))])

    def build(args, out):
        calls = [part.make_call(part_args, part.out) for part, part_args in zip(parts, args)]
        return lambda: [call() for call in calls]

    return _bound(build, tuple(part.args for part in parts), None,
                  ref_a=torch.cat([part.ref_a for part in parts]), ref_w=ref_w,
                  operand_dtype="fp4", tolerance_key=fmt,
                  weight_bytes_per_value=0.5 + 1 / formats.BLOCK_SIZE[fmt],
                  to_rows=torch.cat, note=f"{len(parts)} triton-w4a16 calls ({fmt})")


def _gpu_capability(problem: ExpertProblem) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(problem.a.device) if problem.a.is_cuda else None


def prepare_flashinfer_cutlass_moe(problem: ExpertProblem) -> GroupedCall:
    capability = _gpu_capability(problem)
    if capability is None:
        raise MethodUnavailable("FlashInfer cutlass_fused_moe runs only on a CUDA GPU")
    if capability[0] == 9:
        raise MethodUnavailable(
            "FlashInfer cutlass_fused_moe (BF16 x MXFP4, the sm_90 path) JIT-compiles 248 CUDA files "
            "on first use: ~an hour on 16 cores (shared/H200.md), not built for this run")
    raise MethodUnavailable("FlashInfer cutlass_fused_moe is a fused MoE (both GEMMs + activation), "
                            "not wired into this per-GEMM measurement yet")


def prepare_grouped_fp4(problem: ExpertProblem) -> GroupedCall:
    capability = _gpu_capability(problem)
    if capability is None or capability[0] < 10:
        where = "the CPU" if capability is None else f"sm_{capability[0]}{capability[1]}"
        raise MethodUnavailable(f"FlashInfer grouped_mm_fp4 / sgl-kernel cutlass_fp4_group_mm need "
                                f"FP4 tensor cores (sm_100/sm_120); this is {where}")
    raise MethodUnavailable("FP4 grouped kernels (FlashInfer grouped_mm_fp4, sgl-kernel "
                            "cutlass_fp4_group_mm) are not wired into fp4lab yet")


PREPARE: dict[str, Callable[[ExpertProblem], GroupedCall]] = {
    "loop-bf16": prepare_loop_bf16,
    "grouped-bf16": prepare_grouped_bf16,
    "padded-bf16": prepare_padded_bf16,
    "grouped-fp8": prepare_grouped_fp8,
    "loop-triton-w4a16": prepare_loop_triton_w4a16,
    "flashinfer-cutlass-moe": prepare_flashinfer_cutlass_moe,
    "grouped-fp4": prepare_grouped_fp4,
}


# --- correctness and timing ----------------------------------------------------------------------

def grouped_reference(ref_a: torch.Tensor, ref_w: torch.Tensor, loads: np.ndarray) -> torch.Tensor:
    """float64 [T, N]: each expert's rows times its weights, via correctness.reference_gemm."""
    from fp4lab.correctness import reference_gemm

    out = torch.empty(ref_a.shape[0], ref_w.shape[1], dtype=torch.float64, device=ref_a.device)
    start = 0
    for e, count in enumerate(loads):
        if count:
            out[start:start + count] = reference_gemm(ref_a[start:start + count], ref_w[e])
            start += int(count)
    return out


def check_grouped(prepared: GroupedCall, loads: np.ndarray):
    """Poison the output (where the method has one), call once, compare rows with float64."""
    from fp4lab import correctness

    reference = grouped_reference(prepared.ref_a, prepared.ref_w, loads)
    if prepared.out is not None:
        correctness.poison(prepared.out)
    result = prepared.to_rows(prepared.call())
    if result.is_cuda:
        torch.cuda.synchronize(result.device)
    return correctness.compare(result, reference, torch.linalg.vector_norm(reference).item(),
                               correctness.TOLERANCE[prepared.tolerance_key])


def naturally_cold(weight_bytes: float, device: str) -> bool:
    if device != "cuda":
        return False
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    return weight_bytes > NATURALLY_COLD_L2_MULTIPLE * l2_bytes


def time_grouped(prepared: GroupedCall, config: SweepConfig, device: str, weight_bytes: float):
    from fp4lab.bench import TimerConfig, time_call

    timer = TimerConfig(repeats=config.timer_repeats, warmup_s=config.timer_warmup_s,
                        cold_l2=not naturally_cold(weight_bytes, device))
    return time_call(prepared.make_call, prepared.args, prepared.out, timer, device)


# --- one measured point -> one row ---------------------------------------------------------------

@dataclass
class Point:
    """What a row says about the problem, whatever the method."""

    preset: str
    gemm: str
    n: int
    k: int
    batch: int | None
    routing: str
    ep: int
    loads: np.ndarray
    scaled: bool
    extra: dict = field(default_factory=dict)

    def base_row(self, run_id: str, method: str, device: str) -> dict:
        active = self.loads[self.loads > 0]
        return {"run_id": run_id, "preset": self.preset, "batch": self.batch, "routing": self.routing,
                "ep": self.ep, "gemm": self.gemm, "method": method, "n": self.n, "k": self.k,
                "experts": int(len(self.loads)), "tokens": int(self.loads.sum()),
                "max_tokens": int(self.loads.max()), "mean_tokens": float(self.loads.mean()),
                "active_experts": int(len(active)), "loads": self.loads.tolist(),
                "scaled": self.scaled, "device": device, **self.extra}


def measure_point(point: Point, method: str, problem: ExpertProblem, config: SweepConfig,
                  run_id: str, device: str) -> dict:
    """Gate, then time one method on one problem; never raises for a method's own failure."""
    row = point.base_row(run_id, method, device)
    row.update(status="unavailable", error="", rel_err=math.nan, median_us=math.nan,
               p20_us=math.nan, p80_us=math.nan, tflops=math.nan, tbps=math.nan, note="")
    try:
        prepared = PREPARE[method](problem)
    except MethodUnavailable as exc:
        row["error"] = str(exc)
        return row
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0]}
    row["operand_dtype"], row["note"] = prepared.operand_dtype, prepared.note
    try:
        gate = check_grouped(prepared, problem.loads)
        row.update(rel_err=gate.rel_err, gate_message=gate.message)
        if not gate.ok:
            return {**row, "status": "wrong_result", "error": gate.message}
        weight_bytes = point.n * point.k * prepared.weight_bytes_per_value * len(problem.loads)
        timing = time_grouped(prepared, config, device, weight_bytes)
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0]}
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return {**row, "status": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    tokens, active = int(problem.loads.sum()), int((problem.loads > 0).sum())
    flops = 2.0 * tokens * point.n * point.k                       # useful FLOPs only
    moved = (active * point.n * point.k * prepared.weight_bytes_per_value
             + tokens * (point.k + point.n) * 2)                     # weights read + a in + out
    seconds = timing.median_us * 1e-6
    row.update(status="ok", median_us=timing.median_us, p20_us=timing.p20_us, p80_us=timing.p80_us,
               tflops=flops / seconds / 1e12, tbps=moved / seconds / 1e12, graph=timing.graph,
               cold_l2=timing.cold_l2, sm_clock_mhz=timing.sm_clock_mhz,
               timer_note=timing.note)
    return row


def format_row(row: dict) -> str:
    """One fixed-width line per measured point."""
    where = f"B={row['batch']}" if row.get("batch") is not None else f"m={row.get('m')}"
    head = (f"{row['preset']:<16} {row['gemm']:<7} {where:<7} ep={row['ep']:<2} "
            f"{row['method']:<22} {row['status']:<12}")
    if row["status"] != "ok":
        return head + " " + str(row["error"])[:100]
    return (head + f" rel_err={row['rel_err']:.1e} median={row['median_us']:10.1f} us "
            f"{row['tflops']:8.2f} TFLOPS {row['tbps']:6.3f} TB/s max/mean={row['max_tokens']}/"
            f"{row['mean_tokens']:.1f}")


# --- the sweep -----------------------------------------------------------------------------------

def point_loads(config: SweepConfig, model: presets.ModelPreset, batch: int, ep: int) -> tuple[np.ndarray, int]:
    """Loads [E/P] of the busiest EP rank in the typical routing step, and that rank's index."""
    loads = routing.expert_loads(config.routing, model.experts, model.top_k, batch, config.steps,
                                 config.seed)                                      # [S, E]
    step = loads[stats.representative_step(loads)]                                 # [E]
    per_rank = step.reshape(ep, -1)                                                 # [P, E/P]
    rank = int(per_rank.sum(axis=1).argmax())
    return per_rank[rank], rank


def sweep_points(config: SweepConfig) -> list[tuple[str, int | None, int]]:
    """(gemm, batch or None for the dense curve, ep) in the order they are measured."""
    points = []
    for gemm in config.gemms:
        points += [(gemm, None, 1)] + [(gemm, batch, ep) for batch in config.batch_sizes for ep in config.ep_degrees]
    return points


def run_sweep(config: SweepConfig, run, progress: bool = True) -> list[dict]:
    """Measure every (gemm, batch, ep, method) and the dense curve; rows go to `run`'s moe table."""
    from tqdm.auto import tqdm

    from fp4lab import results

    config.validate()
    model, device = config.model(), config.resolved_device()
    if "provenance" not in run.run_json():
        run.update_run_json(None, {"provenance": results.provenance()})
    run.update_run_json("moe", {"config": dataclasses.asdict(config), "model": dataclasses.asdict(model)})
    rows: list[dict] = []
    points = sweep_points(config)
    bar = tqdm(points, desc=f"moe {model.key}", disable=not progress)
    for gemm, batch, ep in bar:
        n, k = model.gemm_shapes()[gemm]
        weights = make_weights(model.experts, n, k, device, config.seed) if batch is not None else None
        point_rows = (measure_dense_curve(config, model, gemm, run.run_id, device) if batch is None
                      else measure_batch(config, model, gemm, batch, ep, weights, run.run_id, device))
        run.append_rows("moe", point_rows)
        rows += point_rows
        for row in point_rows:
            bar.write(format_row(row))
        del weights
    return rows


def measure_batch(config: SweepConfig, model: presets.ModelPreset, gemm: str, batch: int, ep: int,
                  weights: torch.Tensor, run_id: str, device: str) -> list[dict]:
    n, k = model.gemm_shapes()[gemm]
    loads, rank = point_loads(config, model, batch, ep)
    per_rank = model.experts // ep
    problem = make_problem(loads, n, k, device, config.seed, w=weights[rank * per_rank:(rank + 1) * per_rank])
    point = Point(model.key, gemm, n, k, batch, config.routing, ep, loads, model.scaled,
                  extra={"top_k": model.top_k, "total_experts": model.experts, "ep_rank": rank})
    return [measure_point(point, method, problem, config, run_id, device) for method in config.methods]


def measure_dense_curve(config: SweepConfig, model: presets.ModelPreset, gemm: str, run_id: str,
                        device: str) -> list[dict]:
    """One expert's GEMM at M = dense_m_values (the curve the layer model interpolates)."""
    n, k = model.gemm_shapes()[gemm]
    weights = make_weights(1, n, k, device, config.seed)
    rows = []
    for m in config.dense_m_values:
        loads = np.array([m])
        point = Point(model.key, gemm, n, k, None, config.routing, 1, loads, model.scaled,
                      extra={"m": int(m), "top_k": model.top_k, "total_experts": model.experts})
        problem = make_problem(loads, n, k, device, config.seed, w=weights)
        row = measure_point(point, "loop-bf16", problem, config, run_id, device)
        rows.append({**row, "method": DENSE_METHOD})
    return rows
