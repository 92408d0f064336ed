"""The MoE sweep: every MoE method at the per-expert loads routing produces, one row each.

The methods live in `fp4lab.backends.moe` (each gated against float64 on the operands it
multiplies, then timed by `fp4lab.bench.time_call`). Weights of a GLM-5 layer (19 GB bf16) dwarf
the 60 MB L2, so they are naturally cold; small problems (scaled CPU presets, the dense curve)
rotate copies instead.

Shape legend: `E` experts in the group (all routed experts, or one EP rank's E/P), `T` routed
token rows (sum of the per-expert loads), `N`, `K` one expert GEMM (`w_e: [N, K]`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe.base import (
    ExpertProblem, MethodUnavailable, check_call, expert_bf16_weights as make_weights,
    make_expert_problem as make_problem,
)
from fp4lab.moe import presets, routing, stats

METHODS = tuple(moe_methods.names("gemm"))
DENSE_METHOD = "dense-bf16"
DENSE_M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMMS = ("gate_up", "down")
# a problem whose weights exceed this many L2s is cold without rotating copies
NATURALLY_COLD_L2_MULTIPLE = 4


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


def naturally_cold(weight_bytes: float, device: str) -> bool:
    if device != "cuda":
        return False
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    return weight_bytes > NATURALLY_COLD_L2_MULTIPLE * l2_bytes


def time_grouped(prepared, config: SweepConfig, device: str, weight_bytes: float):
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
        moe_methods.get(method).unavailable_here(device)
        prepared = moe_methods.get(method).prepare(problem)
    except MethodUnavailable as exc:
        row["error"] = str(exc)
        return row
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0]}
    row["weight_dtype"], row["note"] = moe_methods.get(method).weight_dtype, prepared.note
    try:
        gate = check_call(prepared, problem)
        row.update(rel_err=gate.rel_err, gate_message=gate.message)
        if not gate.ok:
            return {**row, "status": "wrong_result", "error": gate.message}
        timing = time_grouped(prepared, config, device, prepared.weight_bytes)
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0]}
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return {**row, "status": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    tokens, active = int(problem.loads.sum()), int((problem.loads > 0).sum())
    flops = 2.0 * tokens * point.n * point.k                       # useful FLOPs only
    moved = prepared.weight_bytes + tokens * (point.k + point.n) * 2   # weights read + a in + out
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
