"""Which way to spread an MoE decode step over GPUs: TP, TP x PP or EP, from measured GEMMs and comm.

Shape legend: `B` decode batch (tokens per step), `S` routing steps drawn, `E` routed experts,
`k` top-k, `H` hidden, `I` moe_intermediate, `L` MoE layers, `N` GPUs, `a` TP degree, `b` PP
stages, `m_e` tokens of expert e.

The model (one MoE layer = the routed experts plus the shared experts; attention, norms and the
dense leading layers are left out, so the step times are the MoE part of a step):
- Expert GEMMs: one expert is gate_up `[2I, H]` then down `[H, I]`; an expert with `m_e` tokens
  costs gemm_us(2I, H, m_e) + gemm_us(H, I, m_e) (the caller's GEMM time function, e.g. built
  from the GEMM sweep; the layer is then a loop of the experts' GEMMs as measured, launches
  included); idle experts cost nothing; shared experts see every token of the rank.
  Loads come from `fp4lab.moe.routing` for the decode batch, averaged over S drawn steps.
- TP-a: every rank holds every expert with gate_up's N and down's K split a ways, sees all B
  tokens, and all-reduces the layer output `[B, H]` bf16 over the a ranks.
  layer = sum_e [gemm(2I/a, H, m_e) + gemm(H, I/a, m_e)] + all_reduce_a(B x H x 2 bytes).
- TP-a x PP-b (N = a*b): the L layers split into b stages of L/b layers, each stage TP-a; the
  batch splits into b microbatches of B/b so that every stage stays busy (a microbatched
  pipeline). In steady state each stage runs all b microbatches through its L/b layers per step
  and hands each microbatch's activations `[B/b, H]` to the next stage:
  step = L x layer_TPa(B/b) + b x send_recv(B/b x H x 2 bytes).
  Every sequence gets one token per step, so the per-token latency is the step time and the
  throughput B / step. (Without microbatches one stage works at a time: step = L x layer_TPa(B)
  + (b-1) x send_recv(B): the same weight reads, so no better when memory-bound.) Each stage
  still reads its weights once per microbatch: b times as often as TP-N per step, which is
  why a memory-bound TP4 x PP2 runs about 2x slower than TP8 (the seed's observation).
- EP-N: each rank holds E/N experts (contiguous blocks) and B/N of the batch (attention data
  parallel, as DeepEP and pplx-kernels count "tokens per GPU"); the busiest rank's expert GEMMs
  set the layer time, plus the dispatch and combine all-to-alls at B/N tokens per rank:
  layer = max_rank sum_{e on rank} [gemm(2I, H, m_e) + gemm(H, I, m_e)] + dispatch + combine.
- TP and EP: step = L x layer; latency = step; throughput = B / step.
Comm times are read from the measured `comm` rows of the same group size (log-log interpolation
in the message size; below the smallest size the smallest size's time, a latency floor; above the
largest, time grows in proportion to size). A layout whose comm was not measured at its group
size has no time, and says so. The step is communication-bound when comm is at least half of it;
otherwise memory- or compute-bound by the larger of the expert GEMMs' summed roofline floors
(given the ceilings), "gemm" without ceilings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from fp4lab import roofline
from fp4lab.comm import ops, splits
from fp4lab.moe import routing
from fp4lab.moe.presets import ModelPreset

GemmTime = Callable[[int, int, int], float]   # gemm_us(n, k, m): [m, k] x [n, k]^T, microseconds
COMM_BOUND_SHARE = 0.5


# -- comm curves ----------------------------------------------------------------------------------

def message_size(op: str, tokens: int, hidden: int, dtype: str = "bf16",
                 top_k: int | None = None) -> float:
    """The size comm curves are read at: the bytes of `[T, H]` for all_reduce and send_recv; for
    the all-to-alls the mean per-rank buffer T x k x H x bytes (the routing's skew stays in the
    measured time, so rows of one routing model are read at their even size)."""
    if op in ops.ALL_TO_ALL_OPS:
        return float(tokens * top_k * hidden * ops.ELEMENT_BYTES[dtype])
    return float(ops.activation_bytes(tokens, hidden, dtype))


@dataclass(frozen=True)
class CommCurve:
    """Measured time against message size for one op, group size, dtype and routing."""

    size: np.ndarray      # [points] bytes, ascending
    us: np.ndarray        # [points] median microseconds

    def time_us(self, size: float) -> float:
        if size <= self.size[0]:
            return float(self.us[0])
        if size >= self.size[-1]:
            return float(self.us[-1] * size / self.size[-1])
        return float(np.exp(np.interp(np.log(size), np.log(self.size), np.log(self.us))))


class CommTable:
    """The ok rows of a run's `comm` table, as curves to read times from."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame[frame["status"] == "ok"] if len(frame) else frame

    def curve(self, op: str, world_size: int, dtype: str = "bf16",
              routing_spec: str | None = None) -> CommCurve | None:
        if not len(self.frame):
            return None
        rows = self.frame[(self.frame["op"] == op) & (self.frame["world_size"] == world_size)
                          & (self.frame["dtype"] == dtype)]
        if op in ops.ALL_TO_ALL_OPS:
            rows = rows[rows["routing"] == routing_spec]
        if not len(rows):
            return None
        sizes = rows.apply(lambda r: message_size(op, int(r["tokens"]), int(r["hidden"]),
                                                  r["dtype"], _int_or_none(r["top_k"])), axis=1)
        curve = pd.DataFrame({"size": sizes, "us": rows["median_us"]}).groupby("size")["us"]
        curve = curve.median().sort_index()
        return CommCurve(curve.index.to_numpy(dtype=float), curve.to_numpy(dtype=float))

    def time_us(self, op: str, world_size: int, size: float, dtype: str = "bf16",
                routing_spec: str | None = None) -> float | None:
        """Measured time at `size` bytes; 0 on one rank (nothing to send); None if not measured."""
        if world_size == 1:
            return 0.0
        curve = self.curve(op, world_size, dtype, routing_spec)
        return None if curve is None else curve.time_us(size)


def _int_or_none(value) -> int | None:
    return None if pd.isna(value) else int(value)


# -- layouts --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("tp", "pp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Layout.{name} must be an integer >= 1, got {value!r}")
        if self.ep > 1 and (self.tp > 1 or self.pp > 1):
            raise ValueError("Layout: EP is modelled alone (tp = pp = 1)")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.ep

    @property
    def label(self) -> str:
        if self.ep > 1:
            return f"EP{self.ep}"
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")


def layouts_for(gpus: int) -> list[Layout]:
    """TP-N, every TP-a x PP-b with a*b = N and b >= 2, and EP-N (N > 1)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
    found = [Layout(tp=gpus)]
    found += [Layout(tp=gpus // stages, pp=stages) for stages in range(2, gpus + 1)
              if gpus % stages == 0]
    return found + ([Layout(ep=gpus)] if gpus > 1 else [])


@dataclass(frozen=True)
class StepModel:
    """Everything a layout's step time is computed from."""

    preset: ModelPreset
    gemm_us: GemmTime
    comm: CommTable
    routing: str = "uniform"
    dispatch_dtype: str = "bf16"
    combine_dtype: str = "bf16"
    steps: int = 8                            # S routing steps averaged
    seed: int = 0
    ceilings: roofline.Ceilings | None = None  # for memory- vs compute-bound; None: "gemm"
    weight_dtype: str = "fp4"                 # what the GEMM floors assume the weights are
    fmt: str | None = "nvfp4"

    def loads(self, batch: int) -> np.ndarray:
        """Tokens per expert `[S, E]` for a batch of `batch` tokens."""
        return routing.modelled_loads(self.routing, self.preset.experts, self.preset.top_k,
                                      batch, self.steps, self.seed)


@dataclass
class GemmCost:
    """Summed time and roofline floors of a set of expert GEMMs (microseconds)."""

    us: float = 0.0
    memory_floor_us: float = 0.0
    compute_floor_us: float = 0.0

    def __add__(self, other: "GemmCost") -> "GemmCost":
        return GemmCost(self.us + other.us, self.memory_floor_us + other.memory_floor_us,
                        self.compute_floor_us + other.compute_floor_us)

    def scaled(self, factor: float) -> "GemmCost":
        return GemmCost(self.us * factor, self.memory_floor_us * factor,
                        self.compute_floor_us * factor)


def _gemm_cost(model: StepModel, n: int, k: int, m: int) -> GemmCost:
    if m <= 0:
        return GemmCost()
    cost = GemmCost(float(model.gemm_us(n, k, m)))
    if model.ceilings is not None:
        floors = roofline.floors(m, n, k, model.weight_dtype, model.fmt, model.ceilings, "bf16")
        cost.memory_floor_us = floors["memory_floor_us"] or 0.0
        cost.compute_floor_us = floors["compute_floor_us"] or 0.0
    return cost


def expert_costs(model: StepModel, loads: np.ndarray, tp: int = 1) -> np.ndarray:
    """GemmCost of each expert at its load, gate_up then down split `tp` ways: `[S, E]` objects."""
    preset = model.preset
    gate_up = (math.ceil(2 * preset.moe_intermediate / tp), preset.hidden)
    down = (preset.hidden, math.ceil(preset.moe_intermediate / tp))
    by_load = {int(m): _gemm_cost(model, *gate_up, int(m)) + _gemm_cost(model, *down, int(m))
               for m in np.unique(loads)}
    return np.vectorize(by_load.__getitem__, otypes=[object])(loads)


def shared_cost(model: StepModel, tokens: int, tp: int = 1) -> GemmCost:
    preset = model.preset
    one = (_gemm_cost(model, math.ceil(2 * preset.moe_intermediate / tp), preset.hidden, tokens)
           + _gemm_cost(model, preset.hidden, math.ceil(preset.moe_intermediate / tp), tokens))
    return one.scaled(preset.shared_experts)


def _mean_cost(costs: list[GemmCost]) -> GemmCost:
    total = sum(costs, GemmCost())
    return total.scaled(1 / len(costs))


def tp_layer_gemm(model: StepModel, tokens: int, tp: int) -> GemmCost:
    """One TP-a layer's expert GEMMs on one rank at `tokens` tokens, averaged over the steps."""
    costs = expert_costs(model, model.loads(tokens), tp)                      # [S, E]
    return _mean_cost([sum(step, GemmCost()) for step in costs]) + shared_cost(model, tokens, tp)


def ep_layer_gemm(model: StepModel, batch: int, ep: int) -> GemmCost:
    """One EP-N layer's expert GEMMs on the busiest rank (by time), averaged over the steps."""
    costs = expert_costs(model, model.loads(batch))                           # [S, E]
    owner = splits.expert_owner(model.preset.experts, ep)                     # [E]
    busiest = []
    for step in costs:
        per_rank = [sum(step[owner == rank], GemmCost()) for rank in range(ep)]
        busiest.append(max(per_rank, key=lambda cost: cost.us))
    return _mean_cost(busiest) + shared_cost(model, math.ceil(batch / ep))


def layout_step(model: StepModel, layout: Layout, batch: int) -> dict:
    """One row: the layout's per-layer GEMM and comm time, step time, throughput, share, bound."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    preset, layers = model.preset, model.preset.moe_layers
    row = {"layout": layout.label, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep,
           "gpus": layout.gpus, "batch": batch, "preset": preset.key, "routing": model.routing}
    missing = []

    def comm(op, world, tokens, dtype="bf16", spec=None):
        size = message_size(op, tokens, preset.hidden, dtype, preset.top_k)
        time_us = model.comm.time_us(op, world, size, dtype, spec)
        if time_us is None:
            missing.append(f"{op} at {world} ranks" + (f" ({dtype}, {spec})" if spec else ""))
        return time_us or 0.0

    if layout.ep > 1:
        per_rank = math.ceil(batch / layout.ep)
        gemm = ep_layer_gemm(model, batch, layout.ep)
        layer_comm = (comm(ops.DISPATCH, layout.ep, per_rank, model.dispatch_dtype, model.routing)
                      + comm(ops.COMBINE, layout.ep, per_rank, model.combine_dtype, model.routing))
        stage_comm = 0.0
    else:
        micro = math.ceil(batch / layout.pp)
        gemm = tp_layer_gemm(model, micro, layout.tp)
        layer_comm = comm(ops.ALL_REDUCE, layout.tp, micro)
        stage_comm = layout.pp * comm(ops.SEND_RECV, layout.gpus, micro) if layout.pp > 1 else 0.0
    gemm_per_step = gemm.scaled(layers)
    comm_per_step = layers * layer_comm + stage_comm
    step_us = gemm_per_step.us + comm_per_step
    share = comm_per_step / step_us if step_us > 0 else 0.0
    row.update(layer_gemm_us=gemm.us, layer_comm_us=layer_comm, stage_comm_us=stage_comm,
               step_gemm_us=gemm_per_step.us, step_comm_us=comm_per_step,
               step_us=step_us, tokens_per_s=batch / step_us * 1e6 if step_us > 0 else None,
               comm_share=share, bound=_bound(share, gemm_per_step, model.ceilings is not None),
               missing="; ".join(missing))
    if missing:  # a number without its comm would flatter the layout: no number at all
        for key in ("step_us", "tokens_per_s", "comm_share", "bound", "layer_comm_us",
                    "step_comm_us"):
            row[key] = None
    return row


def _bound(share: float, gemm: GemmCost, have_floors: bool) -> str:
    if share >= COMM_BOUND_SHARE:
        return "communication"
    if not have_floors:
        return "gemm"
    return "memory" if gemm.memory_floor_us >= gemm.compute_floor_us else "compute"


def compare_layouts(model: StepModel, gpus: int, batch: int,
                    layouts: list[Layout] | None = None) -> pd.DataFrame:
    """One row per layout at one decode batch, fastest first; `vs_best` = step / fastest step."""
    table = pd.DataFrame([layout_step(model, layout, batch)
                          for layout in (layouts or layouts_for(gpus))])
    best = table["step_us"].min(skipna=True)
    table["vs_best"] = table["step_us"] / best if pd.notna(best) else None
    return table.sort_values("step_us", na_position="last").reset_index(drop=True)


def fastest_layout(table: pd.DataFrame) -> dict:
    """The fastest layout of a `compare_layouts` table, how much faster than the next, and why."""
    timed = table.dropna(subset=["step_us"]).sort_values("step_us")
    if timed.empty:
        reasons = "; ".join(sorted(set(table["missing"]) - {""}))
        return {"layout": None, "sentence": f"no layout has every comm measurement ({reasons})"}
    best = timed.iloc[0]
    runner_up = timed.iloc[1] if len(timed) > 1 else None
    margin = float(runner_up["step_us"] / best["step_us"]) if runner_up is not None else None
    sentence = (f"{best['layout']} is fastest at B={best['batch']}: {best['step_us'] / 1e3:.2f} ms "
                f"per step ({best['tokens_per_s']:.0f} tok/s), {best['bound']}-bound with "
                f"{100 * best['comm_share']:.0f}% of the step in communication")
    if runner_up is not None:
        sentence += f"; {margin:.2f}x ahead of {runner_up['layout']}"
    return {"layout": best["layout"], "step_us": float(best["step_us"]),
            "runner_up": None if runner_up is None else runner_up["layout"], "margin": margin,
            "bound": best["bound"], "comm_share": float(best["comm_share"]), "sentence": sentence}


def layout_sweep(model: StepModel, gpus: int, batches) -> pd.DataFrame:
    """compare_layouts over several decode batches, one frame."""
    return pd.concat([compare_layouts(model, gpus, int(b)) for b in batches], ignore_index=True)


def floor_gemm_time(ceilings: roofline.Ceilings, weight_dtype: str = "fp4",
                    fmt: str | None = "nvfp4") -> GemmTime:
    """A GEMM time function from the roofline alone: the larger of the memory and compute floors,
    bf16 activations, no launch (a grouped kernel launches once per layer, not per expert).
    A lower bound, for when no GEMM sweep is at hand; label it so."""
    def gemm_us(n: int, k: int, m: int) -> float:
        floors = roofline.floors(m, n, k, weight_dtype, fmt, ceilings, "bf16")
        return max(floors["memory_floor_us"] or 0.0, floors["compute_floor_us"] or 0.0)
    return gemm_us


# -- published figures ----------------------------------------------------------------------------

REFERENCES_FILE = "docs/REFERENCES.md"    # every published figure's source, with its link
PUBLISHED_COLUMNS = ["source", "system", "link", "op", "world_size", "tokens", "hidden", "top_k",
                     "dtype", "us", "note"]


def published_comm_figures() -> pd.DataFrame:
    """Published EP all-to-all latencies at decode sizes, each with its source (docs/REFERENCES.md).
    `tokens` are per rank; dtype None where the source does not say."""
    deepep = f"DeepEP low-latency kernels (as tabulated in {REFERENCES_FILE})"
    pplx = f"pplx-kernels README ({REFERENCES_FILE})"
    pr173 = f"deepseek-ai/DeepEP PR#173 ({REFERENCES_FILE})"
    flashinfer = f"FlashInfer benchmarks/MoE_benchmarks.md ({REFERENCES_FILE})"
    rows = []
    for ep, dispatch, combine in ((8, 77, 114), (32, 155, 273), (256, 194, 360)):
        rows += _pair(deepep, "H800", "RDMA 400 Gb/s", ep, 128, 7168, 8, (None, None),
                      dispatch, combine)
    rows += _pair(pplx, "H100", "NVLink", 8, 1, 7168, 8, ("fp8", "bf16"), 41.6, 41.7)
    rows += _pair(pplx, "H100", "NVLink", 8, 128, 7168, 8, ("fp8", "bf16"), 83.6, 102.3)
    rows += _pair(f"DeepEP, as measured in the {pplx}", "H100", "RDMA", 8, 128, 7168, 8,
                  (None, None), 163, 318)
    rows += _pair(pr173, "H20", "NVLink", 8, 128, 7168, 8, (None, None), 37, 59,
                  note="after the PR (before: 172 / 319 us)")
    rows += _pair(flashinfer, "B200", "NVLink", 8, 128, None, None, ("bf16", "bf16"), 43.9, 43.8)
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def _pair(source, system, link, ep, tokens, hidden, top_k, dtypes, dispatch_us, combine_us,
          note=""):
    return [dict(source=source, system=system, link=link, op=op, world_size=ep, tokens=tokens,
                 hidden=hidden, top_k=top_k, dtype=dtype, us=float(us), note=note)
            for op, dtype, us in ((ops.DISPATCH, dtypes[0], dispatch_us),
                                  (ops.COMBINE, dtypes[1], combine_us))]


def published_beside_measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The published figures with this run's time at the same op, ranks, tokens per rank, hidden
    size and top-k, uniform routing (the published benchmarks route at random), and dtype where
    the source names one; NaN where the run has no such point."""
    published = published_comm_figures()
    ok = frame[(frame["status"] == "ok") & (frame["routing"] == "uniform")] if len(frame) else frame

    def measured(ref) -> float | None:
        if not len(ok) or ref["hidden"] is None or pd.isna(ref["hidden"]):
            return None
        match = ok[(ok["op"] == ref["op"]) & (ok["world_size"] == ref["world_size"])
                   & (ok["tokens"] == ref["tokens"]) & (ok["hidden"] == ref["hidden"])
                   & (ok["top_k"] == ref["top_k"])]
        if ref["dtype"] is not None:
            match = match[match["dtype"] == ref["dtype"]]
        return float(match["median_us"].median()) if len(match) else None

    published["measured_us"] = published.apply(measured, axis=1)
    return published
