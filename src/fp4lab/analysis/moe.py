"""What the MoE sweep measured, read: routing statistics, each method's layer time at a decode
batch (the one number chapters 03 and 04 both state), and the layer model against measurement.

Shape legend: `B` decode batch, `S` routing steps, `E` routed experts, `k` top-k, `P` EP degree.
A method's *layer time* at batch B is the time of one MoE layer's routed experts on one device
(EP 1): gate_up + down for GEMM methods, the one measured call for layer methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.analysis.gemm import stored_ceilings
from fp4lab.analysis.run import RunView, view
from fp4lab.moe import layer_model, presets, routing, stats
from fp4lab.results import RunDir

BASELINE = "loop-bf16"          # the naive path: one torch.mm per active expert


@dataclass
class MoeResults:
    view: RunView
    frame: pd.DataFrame                 # this preset's rows (its CPU stand-in's on a smoke run)
    model: presets.ModelPreset          # the preset as measured (scaled on a CPU smoke run)

    @property
    def ok(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] == "ok"]

    @property
    def routing_models(self) -> list[str]:
        return sorted(self.frame["routing"].dropna().unique())

    def caption(self, what: str = "") -> str:
        scaled = "; a scaled-down CPU stand-in: its times say nothing about the model" if self.model.scaled else ""
        return self.view.caption(what) + f"; {self.model.name}{scaled}"


def moe_results(run_dir: str | RunDir, preset: str) -> MoeResults:
    """The run's moe rows of `preset` (or of its scaled CPU stand-in, whichever the run holds),
    with tflops and tbps derived."""
    run_view = view(run_dir)
    frame = run_view.run.read_table("moe")
    model = presets.get(preset)
    scaled = presets.scaled_down(model)
    if len(frame) and not (frame["preset"] == model.key).any() and (frame["preset"] == scaled.key).any():
        model = scaled
    frame = frame[frame["preset"] == model.key].copy()
    seconds = frame["median_us"] * 1e-6
    frame["tflops"] = frame["flops"] / seconds / 1e12
    frame["tbps"] = frame["bytes_moved"] / seconds / 1e12
    return MoeResults(run_view, frame, model)


def other_presets(run_dir: str | RunDir, preset: str) -> list[str]:
    """The model presets besides `preset` (and its scaled stand-in) whose MoE rows the run holds,
    in the order fp4lab.moe.presets lists them (a second model swept into the same run)."""
    frame = view(run_dir).run.read_table("moe")
    held = set(frame["preset"].dropna()) if len(frame) else set()
    shown = {presets.get(preset).key, presets.scaled_down(presets.get(preset)).key}
    return [key for key in presets.PRESETS if key in held - shown]


# -- routing statistics (the model, no measurement) ------------------------------------------------

def routing_table(model: presets.ModelPreset, batch_sizes, routing_spec: str, ep_degrees, steps: int,
                  seed: int = 0) -> tuple[pd.DataFrame, dict[int, np.ndarray]]:
    """One row per (B, P) of tokens-per-expert statistics, and the loads [S, E] per batch."""
    rows, loads_by_batch = [], {}
    for batch in batch_sizes:
        loads = routing.modelled_loads(routing_spec, model.experts, model.top_k, batch, steps, seed)  # [S, E]
        loads_by_batch[batch] = loads
        expert = stats.expert_load_stats(loads)
        for ep in ep_degrees:
            if model.experts % ep == 0:
                rows.append({"batch": batch, **expert, **stats.ep_stats(loads, ep)})
    return pd.DataFrame(rows), loads_by_batch


def tokens_per_expert(model: presets.ModelPreset, batch: int, routing_spec: str, steps: int,
                      seed: int = 0, ep: int = 1) -> dict[str, float]:
    """At decode batch B: mean and busiest tokens per expert (mean over steps), active experts;
    with EP > 1, those of the busiest rank."""
    loads = routing.modelled_loads(routing_spec, model.experts, model.top_k, batch, steps, seed)   # [S, E]
    summary = stats.expert_load_stats(loads)
    result = {"batch": batch, "experts": model.experts, "top_k": model.top_k, "ep": ep,
              "mean_m": summary["mean_tokens_per_expert"],
              "busiest_m": summary["mean_max_tokens_per_expert"],
              "active_experts": model.experts - summary["mean_idle_experts"],
              "closed_form_mean": batch * model.top_k / model.experts}
    if ep > 1:
        rank = stats.ep_stats(loads, ep)
        active = rank["mean_active_experts_busiest_rank"]
        # the busiest rank sets the step: its tokens spread over its own active experts
        result.update(active_experts=active, busiest_m=rank["mean_max_tokens_per_expert_busiest_rank"],
                      mean_m=rank["mean_max_tokens_per_rank"] / max(active, 1.0))
    return result


# -- layer time per method --------------------------------------------------------------------------

def nearest_batch(results: MoeResults, batch: int) -> int | None:
    measured = results.ok["batch"].dropna()
    if not len(measured):
        return None
    values = np.sort(measured.unique().astype(int))
    return int(values[np.abs(values - batch).argmin()])


def layer_times(results: MoeResults, batch: int, routing_spec: str | None = None,
                ep: int = 1) -> pd.DataFrame:
    """Each method's measured layer time at the measured batch nearest `batch` on one device,
    fastest first: layer_us (with its samples' 20th and 80th percentiles where one timed call is
    the layer, NaN where two GEMMs' times add up to it), the weights it read and their read
    floor, the lowest SM clock its rows' timer read (`sm_clock_mhz`, NaN where none; and the
    clock read before and after its bursts, `sm_clock_start_mhz` / `sm_clock_end_mhz`), and
    `speedup_vs_loop` (the loop of bf16 GEMMs' time over this method's: above 1 is faster than
    the loop). At `ep` > 1 the time is the busiest EP rank's share of the layer (its own experts
    and pairs)."""
    columns = ["method", "kind", "fmt", "weight_dtype", "batch", "layer_us", "layer_p20_us", "layer_p80_us",
               "weight_bytes", "sm_clock_mhz", "sm_clock_start_mhz", "sm_clock_end_mhz", "speedup_vs_loop"]
    ok = results.ok
    ok = ok[ok["batch"].notna() & (ok["ep"].fillna(1) == ep)]
    if routing_spec:
        ok = ok[ok["routing"] == routing_spec]
    at = nearest_batch(MoeResults(results.view, ok, results.model), batch) if len(ok) else None
    if at is None:
        return pd.DataFrame(columns=columns)
    ok = ok[ok["batch"] == at]
    rows = []
    for (method, fmt), group in ok.groupby(["method", ok["fmt"].fillna("")], sort=False):
        if group["kind"].iloc[0] == "gemm" and set(group["gemm"]) != {"gate_up", "down"}:
            continue                          # half a layer is not a layer time
        rows.append({"method": method, "kind": group["kind"].iloc[0], "fmt": fmt or None,
                     "weight_dtype": group["weight_dtype"].iloc[0], "batch": at,
                     "layer_us": float(group["median_us"].sum()),
                     # one timed call's spread; a sum of two GEMMs' percentiles is no percentile
                     **{f"layer_{q}_us": float(group[f"{q}_us"].iloc[0]) if len(group) == 1 else np.nan
                        for q in ("p20", "p80")},
                     "weight_bytes": float(group["weight_bytes"].sum()),
                     # the moe table is schema-typed: every clock column is there, NaN where unread
                     "sm_clock_mhz": float(group["sm_clock_mhz"].min()),
                     # the clock before its first burst and after its last (a burst may start at
                     # the boost clock and end under the power limit's)
                     "sm_clock_start_mhz": float(group["sm_clock_start_mhz"].max()),
                     "sm_clock_end_mhz": float(group["sm_clock_end_mhz"].min())})
    table = pd.DataFrame(rows, columns=columns[:-1])
    if not len(table):
        return pd.DataFrame(columns=columns)
    loop = table[table["method"] == BASELINE]["layer_us"]
    table["speedup_vs_loop"] = float(loop.min()) / table["layer_us"] if len(loop) else np.nan
    return table.sort_values("layer_us").reset_index(drop=True)


SLOW_CLOCK_SHARE = 0.97     # a row timed under this share of its table's usual SM clock is named


def slow_clock_rows(at: pd.DataFrame) -> tuple[float | None, pd.DataFrame]:
    """The SM clock most rows of a `layer_times` table were timed at, and the rows whose timer read
    a clock under SLOW_CLOCK_SHARE of it (their times are partly the clock's, not only the
    method's). (None, no rows) where the table records no clock."""
    clocks = at["sm_clock_mhz"].dropna() if "sm_clock_mhz" in at else pd.Series(dtype=float)
    if not len(clocks):
        return None, at.iloc[0:0]
    usual = float(clocks.mode().max())
    return usual, at[at["sm_clock_mhz"] < SLOW_CLOCK_SHARE * usual]


def expert_parallel_times(results: MoeResults, batch: int, routing_spec: str | None = None) -> pd.DataFrame:
    """Each method the MoE sweep timed on the busiest rank at an EP degree P > 1 with P x `batch`
    tokens a step (P GPUs each bring `batch`), beside its own time alone on one GPU at `batch`:
    the GPU time per token both ways and the gain (alone / spread; communication not included).
    Fastest spread first within each degree; empty where no such point was measured."""
    columns = ["method", "fmt", "weight_dtype", "ep", "tokens_per_step", "layer_us", "us_per_token",
               "alone_layer_us", "alone_us_per_token", "gain"]
    alone = layer_times_at(results, batch, routing_spec)
    rows = []
    for ep in sorted(int(ep) for ep in results.ok["ep"].dropna().unique() if ep > 1):
        for row in layer_times_at(results, ep * batch, routing_spec, ep).itertuples(index=False):
            same = alone[(alone["method"] == row.method) & alone["fmt"].fillna("").eq(row.fmt or "")]
            alone_us = float(same["layer_us"].iloc[0]) if len(same) else np.nan
            rows.append({"method": row.method, "fmt": row.fmt, "weight_dtype": row.weight_dtype,
                         "ep": ep, "tokens_per_step": ep * batch, "layer_us": row.layer_us,
                         "us_per_token": row.layer_us / batch, "alone_layer_us": alone_us,
                         "alone_us_per_token": alone_us / batch, "gain": alone_us / row.layer_us})
    return pd.DataFrame(rows, columns=columns)


def layer_times_at(results: MoeResults, batch: int, routing_spec: str | None = None,
                   ep: int = 1) -> pd.DataFrame:
    """`layer_times` where the sweep measured exactly `batch` at `ep`; empty where it did not
    (no nearest batch standing in for it)."""
    table = layer_times(results, batch, routing_spec, ep)
    return table[table["batch"] == batch]


def fastest_spread(results: MoeResults, batch: int, routing_spec: str | None = None,
                   spread: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """The fastest method on a busiest EP rank at P x `batch` tokens against the fastest method
    alone on one GPU at `batch` (each the best of its own setting: at 8x the tokens an expert a
    different kernel can win): their GPU times per token and the gain. None without both.
    `spread`: `expert_parallel_times` at the same batch, when the caller already has it."""
    if spread is None:
        spread = expert_parallel_times(results, batch, routing_spec)
    alone = layer_times_at(results, batch, routing_spec)
    if not len(spread) or not len(alone):
        return None
    best = spread.sort_values("us_per_token").iloc[0].to_dict()
    first = alone.iloc[0].to_dict()
    alone_us = float(first["layer_us"]) / batch
    return {"spread": best, "alone": {**first, "us_per_token": alone_us},
            "gain": alone_us / float(best["us_per_token"])}


def layer_times_by_batch(results: MoeResults, routing_spec: str | None = None) -> pd.DataFrame:
    """`layer_times` at every measured batch."""
    batches = sorted(results.ok["batch"].dropna().unique().astype(int))
    frames = [layer_times(results, batch, routing_spec) for batch in batches]
    frames = [frame for frame in frames if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else layer_times(results, 0)


def read_floor_us(weight_bytes: float, bandwidth_tbps: float | None) -> float:
    return weight_bytes / (bandwidth_tbps * 1e6) if bandwidth_tbps else np.nan


def copy_bandwidth_tbps(results: MoeResults) -> float | None:
    """The rate the weight-read floors use: the run's measured copy bandwidth, else the spec's."""
    measured, spec = stored_ceilings(results.view.info)
    return (measured or spec).bandwidth_tbps if (measured or spec) else None


# -- where fp4lab's fused kernel's time goes --------------------------------------------------------

FUSED_STAGES = ("load", "decode", "full")      # each anatomy build adds work to the one before
MATH_STAGE = "compute"                         # decode and MMAs without the weights' read
MATH_BOUND_SHARE = 0.9     # the math alone at least this share of the loads alone: it bounds the call too
FUSED_ANATOMY_COLUMNS = ["method", "fmt", "batch", *FUSED_STAGES, MATH_STAGE, "read_floor_us",
                         "load_rate_pct", "above_load_us", "decode_added_us", "mma_added_us", "load_share",
                         "math_to_load", "math_bound", "overlapped_us", "layer_us", "layer_apart_pct",
                         "full_p20_us", "full_p80_us", "full_sm_clock_mhz", "full_sm_clock_start_mhz",
                         "full_sm_clock_end_mhz", "layer_sm_clock_mhz"]


def fused_anatomy(results: MoeResults) -> pd.DataFrame:
    """Per dissected fused method, format and batch (the moe_anatomy table's ok rows of this
    preset): each build's time (loads only, also decoded, whole), the weights' read floor at the
    copy bandwidth, the rate the loads-only build reads them at (% of the copy bandwidth), the whole
    call's time above its loads alone, what the decode and the MMAs (with the epilogue) add to the
    build before them, the share of the whole call the loads alone take; where the run timed it,
    the call's work without the weights' read (`compute`), its ratio to the loads alone, whether
    it is about as long or longer (`math_bound`: then no overlap takes the call below it) and the
    longer of the two (the least
    the call could take were the two wholly overlapped; NaN without a compute build); and the moe
    table's time of the same call at the same point (EP 1; timed in the sweep's own worker, NaN
    where it has none) with how far apart the two are (%); the whole build's 20th and 80th
    percentiles and the SM clock its timer read, and the clock the table's timer read (a burst
    near the power limit splits its samples)."""
    run = results.view.run
    frame = run.read_table("moe_anatomy") if run.has_table("moe_anatomy") else None
    if frame is None or not len(frame):
        return pd.DataFrame(columns=FUSED_ANATOMY_COLUMNS)
    ok = frame[(frame["preset"] == results.model.key) & (frame["status"] == "ok")]
    if not len(ok):
        return pd.DataFrame(columns=FUSED_ANATOMY_COLUMNS)
    point = ["method", "fmt", "batch"]
    wide = ok.pivot_table(index=point, columns="stage", values="median_us", aggfunc="median")
    wide = wide.reindex(columns=[*FUSED_STAGES, MATH_STAGE]).reset_index()
    weights = ok.groupby(point)["weight_bytes"].max()
    bandwidth = copy_bandwidth_tbps(results)
    wide["read_floor_us"] = [read_floor_us(weights.get(tuple(key), np.nan), bandwidth)
                             for key in wide[point].itertuples(index=False)]
    wide["load_rate_pct"] = 100 * wide["read_floor_us"] / wide["load"]
    wide["above_load_us"] = wide["full"] - wide["load"]
    wide["decode_added_us"] = wide["decode"] - wide["load"]
    wide["mma_added_us"] = wide["full"] - wide["decode"]
    wide["load_share"] = 100 * wide["load"] / wide["full"]
    wide["math_to_load"] = wide[MATH_STAGE] / wide["load"]
    wide["math_bound"] = wide["math_to_load"] >= MATH_BOUND_SHARE       # False without a compute build
    wide["overlapped_us"] = wide[["load", MATH_STAGE]].max(axis=1, skipna=False)
    layers = results.ok[(results.ok["kind"] == "layer") & (results.ok["ep"].fillna(1) == 1)
                        & results.ok["routing"].isin(ok["routing"].unique())]     # as dissected
    # the table's time and clock of each dissected point, and the whole build's spread and clock
    for rows, columns, names in ((layers, ["median_us", "sm_clock_mhz"], ["layer_us", "layer_sm_clock_mhz"]),
                                 (ok[ok["stage"] == "full"],
                                  ["p20_us", "p80_us", "sm_clock_mhz", "sm_clock_start_mhz", "sm_clock_end_mhz"],
                                  ["full_p20_us", "full_p80_us", "full_sm_clock_mhz", "full_sm_clock_start_mhz",
                                   "full_sm_clock_end_mhz"])):
        per_point = rows.groupby(point)[columns].median()
        per_point.columns = names
        wide = wide.join(per_point, on=point)
    wide["layer_apart_pct"] = 100 * (wide["full"] / wide["layer_us"] - 1).abs()   # of the table's time
    return wide[FUSED_ANATOMY_COLUMNS].sort_values(point).reset_index(drop=True)


def math_in_other_format(table: pd.DataFrame, row) -> dict[str, Any] | None:
    """Where `row` (of `fused_anatomy`) has no compute build but the same method at the same batch
    in another format has one: that format and its math alone against its own loads (a run whose
    re-measure took one format only); None otherwise."""
    if not pd.isna(row["compute"]):
        return None
    other = table[(table["method"] == row["method"]) & (table["batch"] == row["batch"])
                  & (table["fmt"] != row["fmt"]) & table[MATH_STAGE].notna()]
    if not len(other):
        return None
    found = other.iloc[0]
    return {"fmt": found["fmt"], "compute": float(found[MATH_STAGE]), "load": float(found["load"]),
            "math_to_load": float(found["math_to_load"]), "math_bound": bool(found["math_bound"])}


def fused_anatomy_reason(results: MoeResults) -> str:
    """Why `fused_anatomy` is empty: the first failed build's reason, else "not measured"."""
    run = results.view.run
    frame = run.read_table("moe_anatomy") if run.has_table("moe_anatomy") else None
    if frame is not None and len(frame):
        failed = frame[(frame["preset"] == results.model.key) & frame["error"].notna()]
        if len(failed):
            return str(failed["error"].iloc[0])
    return "not measured"


# -- the layer model --------------------------------------------------------------------------------

def model_curves(results: MoeResults) -> dict[str, layer_model.DenseCurve] | None:
    """The dense curves of this run (None when the run has no dense-curve rows)."""
    measured, _ = stored_ceilings(results.view.info)
    dense = results.ok[results.ok["method"] == "dense-bf16"]
    try:
        return layer_model.dense_curves(dense, results.model,
                                        measured.bandwidth_tbps if measured else None,
                                        measured.launch_us if measured else None)
    except ValueError:
        return None


def model_vs_measured(results: MoeResults) -> pd.DataFrame:
    curves = model_curves(results)
    if curves is None:
        return pd.DataFrame(columns=["batch", "ep", "gemm", "method", "model", "measured_us",
                                     "predicted_us", "error_pct"])
    return layer_model.compare_with_measured(results.ok, curves)


def model_error(compared: pd.DataFrame) -> pd.DataFrame:
    """Mean |error| of the layer model per method."""
    if not len(compared):
        return pd.DataFrame(columns=["method", "mean_abs_error_pct", "points"])
    grouped = compared.groupby("method")["error_pct"]
    return pd.DataFrame({"mean_abs_error_pct": grouped.apply(lambda e: e.abs().mean()),
                         "points": grouped.size()}).reset_index()
