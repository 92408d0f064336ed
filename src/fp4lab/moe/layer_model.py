"""The MoE layer's GEMM time, predicted from one expert's measured dense GEMM curve.

Shape legend: `E` experts on the busiest rank, `m_e` tokens of expert e, `N`, `K` one expert
GEMM, `P` expert-parallel degree, `B` concurrency (tokens per decode step).

The model, and why:
- The dense curve t(m) is one expert's bf16 GEMM timed at M = 1..512 (cold L2, graph replay),
  interpolated linearly in log(m)-log(t) (power-law extrapolation past the ends).
- loop: a loop of per-expert GEMMs costs what each dense GEMM costs: sum over active e of t(m_e).
- grouped: one kernel streams every active expert's weights and does all the FLOPs, so it is a
  roofline with the ceilings this shape actually reached in the dense curve:
  max(bytes / best bandwidth, FLOPs / best FLOP rate) + one launch (the run's measured launch
  floor: an empty kernel's graph replay).
- padded: the same roofline for every expert at the busiest expert's load L (its FLOPs include the
  padding), but streaming at the device's measured copy bandwidth when the run has one: a batched
  GEMM over [E, L, K] is one large, regular kernel that keeps every SM loading, unlike one small
  expert GEMM. (With the dense curve's bandwidth the padded predictions were 22-59% slow on the
  H200 reference run, while the measured padded layers ran at 4.1-4.2 TB/s: benchmarks/NOTES.md.)
- With EP degree P the busiest rank sets the step time: predictions use its experts' loads.
The predictions are compared with the measured grouped-GEMM rows (`compare_with_measured`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp4lab.moe import presets, routing, stats

BF16_BYTES = 2.0
COMPARED_METHODS = {"loop-bf16": "loop", "grouped-bf16": "grouped", "padded-bf16": "padded"}


@dataclass(frozen=True)
class DenseCurve:
    """One expert GEMM's measured time against M: `m: [points]`, `us: [points]`."""

    n: int
    k: int
    m: np.ndarray
    us: np.ndarray
    device_bandwidth: float | None = None  # bytes per microsecond, the run's measured copy ceiling
    launch_us: float = 0.0                 # the run's measured launch floor (0 when not measured)

    @classmethod
    def from_rows(cls, rows: pd.DataFrame, n: int, k: int) -> "DenseCurve":
        """From ok rows with columns m, n, k, median_us (dense moe rows or gemm-sweep rows)."""
        ok = rows[(rows["status"] == "ok") & (rows["n"] == n) & (rows["k"] == k)]
        ok = ok.groupby("m", as_index=False)["median_us"].median().sort_values("m")
        if len(ok) < 2:
            raise ValueError(f"dense curve for N={n}, K={k}: need >= 2 measured M values, got {len(ok)}")
        return cls(n, k, ok["m"].to_numpy(dtype=float), ok["median_us"].to_numpy(dtype=float))

    def time_us(self, m) -> np.ndarray:
        """t(m) interpolated in log-log; power law from the two end points outside the range."""
        log_m, log_t = np.log(self.m), np.log(self.us)
        x = np.log(np.maximum(np.asarray(m, dtype=float), 1.0))
        inside = np.interp(x, log_m, log_t)
        low_slope = (log_t[1] - log_t[0]) / (log_m[1] - log_m[0])
        high_slope = (log_t[-1] - log_t[-2]) / (log_m[-1] - log_m[-2])
        result = np.where(x < log_m[0], log_t[0] + low_slope * (x - log_m[0]), inside)
        result = np.where(x > log_m[-1], log_t[-1] + high_slope * (x - log_m[-1]), result)
        return np.exp(result)

    def bytes_moved(self, m) -> np.ndarray:
        m = np.asarray(m, dtype=float)
        return BF16_BYTES * (self.n * self.k + m * (self.k + self.n))

    def best_bandwidth(self) -> float:
        """Bytes per microsecond: the best rate any measured point of this shape reached."""
        return float(np.max(self.bytes_moved(self.m) / self.us))

    def best_flop_rate(self) -> float:
        """FLOPs per microsecond: the best this shape reached over the measured M."""
        return float(np.max(2.0 * self.m * self.n * self.k / self.us))


def _active(loads) -> np.ndarray:
    loads = np.asarray(loads, dtype=float)
    return loads[loads > 0]


def predict_loop_us(curve: DenseCurve, loads) -> float:
    return float(curve.time_us(_active(loads)).sum())


def _one_kernel_us(curve: DenseCurve, loads: np.ndarray, bandwidth: float) -> float:
    stream = curve.bytes_moved(loads).sum() / bandwidth
    compute = 2.0 * loads.sum() * curve.n * curve.k / curve.best_flop_rate()
    return float(max(stream, compute) + curve.launch_us)


def predict_grouped_us(curve: DenseCurve, loads) -> float:
    return _one_kernel_us(curve, _active(loads), curve.best_bandwidth())


def predict_padded_us(curve: DenseCurve, loads) -> float:
    loads = np.asarray(loads, dtype=float)
    return _one_kernel_us(curve, np.full(len(loads), loads.max()),
                          curve.device_bandwidth or curve.best_bandwidth())


PREDICT = {"loop": predict_loop_us, "grouped": predict_grouped_us, "padded": predict_padded_us}


def dense_curves(moe_rows: pd.DataFrame, model: presets.ModelPreset,
                 device_bandwidth_tbps: float | None = None,
                 launch_us: float | None = None) -> dict[str, DenseCurve]:
    """{gemm: DenseCurve} from the `dense-bf16` rows of a moe table, with the run's measured copy
    bandwidth (TB/s, for the padded model) and launch floor (us), when it has them."""
    dense = moe_rows[moe_rows["method"] == "dense-bf16"]
    bandwidth = device_bandwidth_tbps * 1e6 if device_bandwidth_tbps else None  # TB/s -> B/us
    return {gemm: dataclasses.replace(DenseCurve.from_rows(dense, n, k), device_bandwidth=bandwidth,
                                      launch_us=float(launch_us or 0.0))
            for gemm, (n, k) in model.gemm_shapes().items()}


def compare_with_measured(moe_rows: pd.DataFrame, curves: dict[str, DenseCurve]) -> pd.DataFrame:
    """Each measured loop/grouped/padded row beside the model's prediction on the same loads."""
    measured = moe_rows[moe_rows["method"].isin(list(COMPARED_METHODS)) & (moe_rows["status"] == "ok")]
    rows = []
    for row in measured.itertuples(index=False):
        if row.gemm not in curves:
            continue
        kind = COMPARED_METHODS[row.method]
        predicted = PREDICT[kind](curves[row.gemm], np.asarray(row.loads))
        rows.append({"batch": row.batch, "ep": row.ep, "gemm": row.gemm, "method": row.method,
                     "model": kind, "measured_us": row.median_us, "predicted_us": predicted,
                     "error_pct": 100.0 * (predicted - row.median_us) / row.median_us})
    return pd.DataFrame(rows, columns=["batch", "ep", "gemm", "method", "model", "measured_us",
                                       "predicted_us", "error_pct"])


def predict_layer(model: presets.ModelPreset, curves: dict[str, DenseCurve], batch: int, ep: int = 1,
                  routing_spec: str = "uniform", steps: int = 16, seed: int = 0,
                  peak_tflops: float | None = None) -> dict:
    """Mean over routing steps of the busiest rank's MoE-layer GEMM time (gate_up + down)."""
    loads = routing.modelled_loads(routing_spec, model.experts, model.top_k, batch, steps, seed)  # [S, E]
    rank_loads = [stats.busiest_rank_experts(step, ep) for step in loads]                       # S x [E/P]
    result = {"batch": batch, "ep": ep}
    flops = np.mean([2.0 * r.sum() * sum(n * k for n, k in model.gemm_shapes().values()) for r in rank_loads])
    for kind, predict in PREDICT.items():
        micros = np.mean([sum(predict(curves[g], r) for g in model.gemm_shapes()) for r in rank_loads])
        result[f"{kind}_us"] = float(micros)
        result[f"{kind}_tflops"] = float(flops / micros / 1e6)
        if peak_tflops:
            result[f"{kind}_utilization"] = float(flops / micros / 1e6 / peak_tflops)
    return result


def layer_table(model: presets.ModelPreset, curves: dict[str, DenseCurve], batch_sizes, ep_degrees=(1,),
                routing_spec: str = "uniform", steps: int = 16, seed: int = 0,
                peak_tflops: float | None = None) -> pd.DataFrame:
    return pd.DataFrame([predict_layer(model, curves, b, p, routing_spec, steps, seed, peak_tflops)
                         for p in ep_degrees for b in batch_sizes if model.experts % p == 0])


def concurrency_for_utilization(table: pd.DataFrame, target: float, kind: str = "grouped") -> pd.DataFrame:
    """Per EP degree, the smallest batch in `table` whose predicted utilization reaches `target`."""
    if not 0 < target <= 1:
        raise ValueError(f"target utilization {target!r}: must be in (0, 1]")
    column = f"{kind}_utilization"
    if column not in table:
        raise ValueError(f"table has no {column!r}: pass peak_tflops to layer_table")
    rows = []
    for ep, group in table.groupby("ep"):
        reached = group[group[column] >= target].sort_values("batch")
        rows.append({"ep": ep, "target": target, "method": kind,
                     "batch_needed": int(reached["batch"].iloc[0]) if len(reached) else None,
                     "best_utilization": float(group[column].max())})
    return pd.DataFrame(rows)
