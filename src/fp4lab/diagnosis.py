"""The numbers behind chapter 04: the bottleneck at decode, and what would change it.

Everything here is computed from a run folder (gemm rows, moe rows, run.json ceilings) plus the
routing model of `fp4lab.moe`; nothing is a typed-in figure. Each function returns a table or a
dict the chapter turns into sentences, and says what it could not conclude when a table is
missing (a chapter failed) instead of guessing.

Shape legend (MoE): `B` decode batch (concurrent requests, one token each), `E` routed experts,
`k` top-k, `P` expert-parallel degree, `m` tokens one expert receives (the GEMM's M).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.results import RunDir

# weight bytes per value: 4-bit codes plus one scale per block (e4m3 per 16, e8m0 per 32)
WEIGHT_BYTES_PER_VALUE = {"nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}
TABLE_SOURCES = {"gemm": "01 GEMM sweep (gemm.parquet)", "moe": "03 MoE (moe.parquet)",
                 "telemetry": "02 power and clocks (telemetry.parquet)"}
VERDICTS = ("launch-bound", "memory-bound", "compute-bound", "power-bound", "communication-bound")


@dataclass
class DiagnosisConfig:
    preset: str = "glm-5"
    decode_batch: int = 512          # B: concurrent decode requests
    backend: str = "auto"            # "auto": the backend with the most correct points
    routing: str = "uniform"         # fp4lab.moe.routing spec
    steps: int = 64                  # routing steps drawn for the load statistics
    seed: int = 0
    power_bound_fraction: float = 0.9  # average power over the limit that counts as power-bound
    ep_degrees: tuple[int, ...] = (1, 2, 4, 8)


def validate(config: DiagnosisConfig) -> DiagnosisConfig:
    """Checks the chapter's parameters; a bad one raises a ValueError naming it."""
    from fp4lab.moe import presets, routing

    presets.get(config.preset)
    routing.parse_routing(config.routing)
    for name in ("decode_batch", "steps"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if not isinstance(config.backend, str) or not config.backend:
        raise ValueError(f"backend={config.backend!r}: a backend name or 'auto'")
    if not 0 < config.power_bound_fraction <= 1:
        raise ValueError(f"power_bound_fraction={config.power_bound_fraction!r}: must be in (0, 1]")
    return config


# -- the run's tables --------------------------------------------------------------------------
@dataclass
class RunTables:
    run_id: str
    run_json: dict[str, Any]
    gemm: pd.DataFrame | None
    moe: pd.DataFrame | None
    telemetry: pd.DataFrame | None
    missing: list[str] = field(default_factory=list)   # "01 GEMM sweep (gemm.parquet)", ...

    @property
    def ok_gemm(self) -> pd.DataFrame:
        if self.gemm is None:
            return pd.DataFrame()
        return self.gemm[self.gemm["status"] == "ok"]


def load_run(run_dir: str | Path) -> RunTables:
    """The run's tables; a table that is absent or empty is listed in `missing`."""
    run = RunDir.open(run_dir)
    tables, missing = {}, []
    for name, source in TABLE_SOURCES.items():
        frame = run.read_table(name) if run.has_table(name) else None
        tables[name] = frame if frame is not None and len(frame) else None
        if tables[name] is None:
            missing.append(source)
    return RunTables(run.run_id, run.run_json(), missing=missing, **tables)


def ceilings(run_json: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU's ceilings for this run: measured when the sweep measured them, else the spec sheet."""
    stored = run_json.get("sweep", {}).get("ceilings") or {}
    for key in ("measured", "spec"):
        if isinstance(stored.get(key), dict) and stored[key].get("bandwidth_tbps"):
            return {**stored[key], "source": stored[key].get("source", key)}
    return stored if stored.get("bandwidth_tbps") else None


# -- correctness gate --------------------------------------------------------------------------
def gate_failures(gemm: pd.DataFrame | None) -> pd.DataFrame:
    """Backends that returned wrong results: points failed, worst relative error, one message."""
    columns = ["backend", "fmt", "points_failed", "points_total", "worst_rel_err", "example_error"]
    if gemm is None or not len(gemm):
        return pd.DataFrame(columns=columns)
    wrong = gemm[gemm["status"] == "wrong_result"]
    rows = []
    for (backend, fmt), group in wrong.groupby(["backend", "fmt"]):
        total = int(((gemm["backend"] == backend) & (gemm["fmt"] == fmt)).sum())
        error = group["error"].dropna() if "error" in group else pd.Series(dtype=str)
        rows.append({"backend": backend, "fmt": fmt, "points_failed": len(group), "points_total": total,
                     "worst_rel_err": float(group["rel_err"].max()),
                     "example_error": error.iloc[0] if len(error) else ""})
    return pd.DataFrame(rows, columns=columns)


# -- the seed-style table ----------------------------------------------------------------------
def choose_backend(gemm: pd.DataFrame | None, backend: str = "auto") -> str | None:
    """`auto`: the backend with the most correct points (ties: the faster median TFLOPS)."""
    ok = gemm[gemm["status"] == "ok"] if gemm is not None and len(gemm) else pd.DataFrame()
    if backend != "auto":
        if not len(ok) or backend not in set(ok["backend"]):
            measured = sorted(set(ok["backend"])) if len(ok) else []
            raise ValueError(f"backend={backend!r} has no correct points in this run; "
                             f"measured: {', '.join(measured) or 'none'}")
        return backend
    if not len(ok):
        return None
    ranked = ok.groupby("backend").agg(points=("m", "size"), tflops=("tflops", "median"))
    return ranked.sort_values(["points", "tflops"], ascending=False).index[0]


def seed_table(gemm: pd.DataFrame, backend: str) -> pd.DataFrame:
    """Per M for one backend: TFLOPS range over shapes, % of peak, the regime the sweep classified."""
    ok = gemm[(gemm["status"] == "ok") & (gemm["backend"] == backend)]
    if not len(ok):
        return pd.DataFrame(columns=["m", "tflops_min", "tflops_max", "pct_peak_min", "pct_peak_max", "regime"])
    pct = "pct_peak_measured" if ok["pct_peak_measured"].notna().any() else "pct_peak_spec"
    table = ok.groupby("m").agg(tflops_min=("tflops", "min"), tflops_max=("tflops", "max"),
                                pct_peak_min=(pct, "min"), pct_peak_max=(pct, "max"),
                                regime=("bound", _most_common)).reset_index()
    return table


def _most_common(values: pd.Series) -> str:
    values = values.dropna()
    return str(values.mode().iloc[0]) if len(values) else "unclassified"


# -- the decode point --------------------------------------------------------------------------
def expert_loads(config: DiagnosisConfig, batch: int | None = None, ep: int = 1) -> dict[str, float]:
    """Tokens per expert at decode batch B under the routing model (mean and busiest expert)."""
    from fp4lab.moe import presets, routing, stats

    preset = presets.get(config.preset)
    batch = batch or config.decode_batch
    loads = routing.expert_loads(config.routing, preset.experts, preset.top_k, batch,  # [S, E]
                                 config.steps, config.seed)
    summary = stats.expert_load_stats(loads)
    result = {"batch": batch, "experts": preset.experts, "top_k": preset.top_k,
              "mean_m": summary["mean_tokens_per_expert"],
              "busiest_m": summary["mean_max_tokens_per_expert"],
              "active_experts": preset.experts - summary["mean_idle_experts"]}
    if ep > 1:
        rank = stats.ep_stats(loads, ep)
        active = rank["mean_active_experts_busiest_rank"]
        # the busiest rank sets the step: its tokens spread over its own active experts
        result.update(ep=ep, active_experts=active,
                      busiest_m=rank["mean_max_tokens_per_expert_busiest_rank"],
                      mean_m=rank["mean_max_tokens_per_rank"] / max(active, 1.0))
    return result


def gemm_time_at(gemm: pd.DataFrame, backend: str, n: int, k: int, m: float) -> dict[str, Any] | None:
    """The measured GEMM time at (n, k) and M = m, interpolated linearly between measured Ms.

    Uses the preset's exact (n, k) when the sweep measured it, else the measured shape closest in
    weight size, and says so in `shape_note`. Outside the measured M range: the nearest M.
    """
    ok = gemm[(gemm["status"] == "ok") & (gemm["backend"] == backend)]
    if not len(ok):
        return None
    shapes = ok[["n", "k"]].drop_duplicates()
    exact = ((shapes["n"] == n) & (shapes["k"] == k)).any()
    if exact:
        sn, sk, note = n, k, f"measured at {n}x{k}"
    else:
        nearest = (np.log(shapes["n"] * shapes["k"]) - np.log(n * k)).abs().idxmin()
        sn, sk = int(shapes.loc[nearest, "n"]), int(shapes.loc[nearest, "k"])
        note = f"nearest measured shape {sn}x{sk}, not the preset's {n}x{k}"
    curve = ok[(ok["n"] == sn) & (ok["k"] == sk)].groupby("m")["median_us"].median().sort_index()
    median_us = float(np.interp(m, curve.index.to_numpy(float), curve.to_numpy(float)))
    inside = curve.index.min() <= m <= curve.index.max()
    return {"median_us": median_us, "n": sn, "k": sk, "exact_shape": bool(exact),
            "shape_note": note + ("" if inside else f"; M={m:.0f} outside the measured M range")}


# -- where the time goes ---------------------------------------------------------------------
def layer_breakdown(tables: RunTables, config: DiagnosisConfig, backend: str, fmt: str = "nvfp4",
                    batch: int | None = None, ep: int = 1) -> dict[str, Any] | None:
    """One MoE layer at decode, one kernel per active expert and GEMM (the loop), against its floors.

    time = active experts x (gate_up + down GEMM time at the mean expert M), from the sweep;
    floors: launch (2 kernels per active expert x launch_us), weight read (active experts' FP4
    weights / bandwidth), compute (2 x tokens x k x FLOPs per token / peak).
    """
    from fp4lab.moe import presets

    preset = presets.get(config.preset)
    limits = ceilings(tables.run_json)
    if tables.gemm is None or limits is None:
        return None
    load = expert_loads(config, batch, ep)
    times = {}
    for gemm_name, (n, k) in preset.gemm_shapes().items():
        times[gemm_name] = gemm_time_at(tables.gemm, backend, n, k, max(load["mean_m"], 1.0))
        if times[gemm_name] is None:
            return None
    per_expert_us = sum(t["median_us"] for t in times.values())
    # floors for the shapes whose times were used: a stand-in shape gets stand-in floors
    values_per_expert = sum(t["n"] * t["k"] for t in times.values())
    routed_tokens = load["batch"] * load["top_k"] / ep
    peak = (limits.get("peak_tflops") or {})
    peak_tflops = peak.get("fp4") or peak.get("bf16")
    compute_us = (2 * routed_tokens * values_per_expert / (peak_tflops * 1e12) * 1e6) if peak_tflops else np.nan
    return {
        **load, "backend": backend, "fmt": fmt,
        "loop_us": load["active_experts"] * per_expert_us,
        "gate_up_us": times["gate_up"]["median_us"], "down_us": times["down"]["median_us"],
        "shape_note": "; ".join(sorted({t["shape_note"] for t in times.values()})),
        "exact_shapes": all(t["exact_shape"] for t in times.values()),
        "launch_floor_us": 2 * load["active_experts"] * float(limits["launch_us"]),
        "memory_floor_us": load["active_experts"] * values_per_expert * WEIGHT_BYTES_PER_VALUE.get(fmt, 2.0)
        / (float(limits["bandwidth_tbps"]) * 1e12) * 1e6,
        "compute_floor_us": compute_us,
        "ceilings_source": limits.get("source", "unknown"),
    }


def power_state(tables: RunTables, backend: str) -> dict[str, Any] | None:
    """Average power of the backend's timed windows against the power limit, when NVML measured it."""
    if tables.gemm is None or "avg_power_w" not in tables.gemm:
        return None
    rows = tables.ok_gemm[tables.ok_gemm["backend"] == backend]["avg_power_w"].dropna()
    limit = tables.run_json.get("provenance", {}).get("device", {}).get("power_limit_w")
    if not len(rows) or not limit:
        return None
    return {"max_avg_power_w": float(rows.max()), "power_limit_w": float(limit),
            "fraction": float(rows.max()) / float(limit)}


def verdict(breakdown: dict[str, Any], power: dict[str, Any] | None,
            config: DiagnosisConfig) -> dict[str, Any]:
    """The bottleneck: power-bound when the GPU sits at its limit, else the largest floor.

    `explained` is the share of the measured layer time that floor accounts for; the rest is
    time the kernels spend above every floor (small tiles, idle SMs, synchronisation).
    """
    if power and power["fraction"] >= config.power_bound_fraction:
        return {"verdict": "power-bound", "floor_us": np.nan, "explained": np.nan,
                "reason": f"average power reached {power['fraction']:.0%} of the {power['power_limit_w']:.0f} W limit"}
    floors = {"launch-bound": breakdown["launch_floor_us"], "memory-bound": breakdown["memory_floor_us"],
              "compute-bound": breakdown["compute_floor_us"]}
    floors = {name: value for name, value in floors.items() if np.isfinite(value)}
    name = max(floors, key=floors.get)
    explained = floors[name] / breakdown["loop_us"] if breakdown["loop_us"] > 0 else np.nan
    reason = (f"the largest floor ({name.split('-')[0]}) is {floors[name]:.1f} us of a "
              f"{breakdown['loop_us']:.1f} us layer")
    if explained > 1:  # faster than a floor: the ceilings are not this device's (e.g. a CPU)
        reason += (f", yet the layer ran faster than that floor, so the {breakdown['ceilings_source']} "
                   "ceilings do not describe this device and the verdict is unreliable")
        explained = np.nan
    return {"verdict": name, "floor_us": floors[name], "explained": explained, "reason": reason}


# -- what would change it ----------------------------------------------------------------------
def what_if_concurrency(tables: RunTables, config: DiagnosisConfig, backend: str,
                        factors=(0.25, 0.5, 1, 2, 4)) -> pd.DataFrame:
    """Layer time and time per routed token as the decode batch changes (sweep times, routing model)."""
    rows = []
    for factor in factors:
        batch = max(1, int(round(config.decode_batch * factor)))
        point = layer_breakdown(tables, config, backend, batch=batch)
        if point is None:
            continue
        rows.append({"batch": batch, "mean_m": point["mean_m"], "busiest_m": point["busiest_m"],
                     "active_experts": point["active_experts"], "layer_us": point["loop_us"],
                     "us_per_token": point["loop_us"] / batch})
    return pd.DataFrame(rows)


def what_if_backends(tables: RunTables, config: DiagnosisConfig) -> pd.DataFrame:
    """Every correct backend's layer time at the decode point, fastest first."""
    if tables.gemm is None:
        return pd.DataFrame()
    rows = []
    for backend in sorted(set(tables.ok_gemm["backend"])):
        point = layer_breakdown(tables, config, backend)
        if point is not None:
            rows.append({"backend": backend, "layer_us": point["loop_us"], "shape_note": point["shape_note"]})
    frame = pd.DataFrame(rows)
    return frame.sort_values("layer_us").reset_index(drop=True) if len(frame) else frame


def what_if_ep(tables: RunTables, config: DiagnosisConfig, backend: str) -> pd.DataFrame:
    """The busiest EP rank's layer time per degree P (communication not measured: single GPU)."""
    from fp4lab.moe import presets

    experts = presets.get(config.preset).experts
    rows = []
    for ep in config.ep_degrees:
        if experts % ep:
            continue
        point = layer_breakdown(tables, config, backend, ep=ep)
        if point is not None:
            rows.append({"ep": ep, "active_experts_busiest_rank": point["active_experts"],
                         "layer_us_busiest_rank": point["loop_us"]})
    return pd.DataFrame(rows)


def what_if_graphs(gemm: pd.DataFrame | None) -> pd.DataFrame:
    """Points measured both with and without CUDA-graph replay: the speed-up graphs give."""
    if gemm is None or "graph" not in gemm:
        return pd.DataFrame()
    ok = gemm[gemm["status"] == "ok"].dropna(subset=["graph"])
    keys = ["backend", "fmt", "m", "n", "k"]
    both = ok.pivot_table(index=keys, columns="graph", values="median_us", aggfunc="median")
    if True not in both.columns or False not in both.columns:
        return pd.DataFrame()
    both = both.dropna().rename(columns={True: "graph_us", False: "eager_us"}).reset_index()
    both["speedup"] = both["eager_us"] / both["graph_us"]
    return both


def what_if_grouped(moe: pd.DataFrame | None, preset: str, batch: int) -> pd.DataFrame:
    """Measured MoE layer time per method (loop, grouped, ...) at the batch nearest B, fastest first."""
    if moe is None or not len(moe):
        return pd.DataFrame()
    ok = moe[(moe["status"] == "ok")]
    ok = ok[ok["preset"].astype(str).str.startswith(preset)]
    if not len(ok):
        return pd.DataFrame()
    nearest = ok["batch"].iloc[(ok["batch"] - batch).abs().argmin()]
    at = ok[ok["batch"] == nearest].groupby("method")["median_us"].sum().sort_values()
    frame = at.rename("layer_us").reset_index()
    frame["batch"] = nearest
    loops = [method for method in at.index if str(method).startswith("loop")]
    frame["vs_loop"] = frame["layer_us"] / at[loops[0]] if loops else np.nan
    return frame


# -- the whole diagnosis and its sentences -------------------------------------------------------
@dataclass
class Diagnosis:
    tables: RunTables
    config: DiagnosisConfig
    backend: str | None
    gate: pd.DataFrame
    seed: pd.DataFrame
    breakdown: dict[str, Any] | None
    power: dict[str, Any] | None
    verdict: dict[str, Any] | None
    concurrency: pd.DataFrame
    backends: pd.DataFrame
    ep: pd.DataFrame
    graphs: pd.DataFrame
    grouped: pd.DataFrame


def diagnose(run_dir: str | Path, config: DiagnosisConfig) -> Diagnosis:
    """Everything chapter 04 shows, for one run folder."""
    if not str(run_dir):
        raise ValueError("run_dir is empty: pass the run folder to diagnose (make report passes it)")
    tables = load_run(run_dir)
    backend = choose_backend(tables.gemm, config.backend)
    empty = pd.DataFrame()
    breakdown = layer_breakdown(tables, config, backend) if backend else None
    power = power_state(tables, backend) if backend else None
    return Diagnosis(
        tables=tables, config=config, backend=backend, gate=gate_failures(tables.gemm),
        seed=seed_table(tables.gemm, backend) if backend else empty,
        breakdown=breakdown, power=power,
        verdict=verdict(breakdown, power, config) if breakdown else None,
        concurrency=what_if_concurrency(tables, config, backend) if backend else empty,
        backends=what_if_backends(tables, config), ep=what_if_ep(tables, config, backend) if backend else empty,
        graphs=what_if_graphs(tables.gemm),
        grouped=what_if_grouped(tables.moe, config.preset, config.decode_batch))


def cannot_conclude(d: Diagnosis) -> list[str]:
    """What is missing and what that leaves unanswered."""
    lines = [f"No {source}: the chapter failed, did not run, or measured nothing on this machine."
             for source in d.tables.missing]
    if d.tables.gemm is not None and d.backend is None:
        lines.append("The GEMM sweep has no correct point: no speed can be trusted, so no verdict.")
    if d.backend and d.breakdown is None:
        lines.append("The run has no ceilings (run.json sweep.ceilings): floors and the verdict cannot be computed.")
    if d.tables.moe is None:
        lines.append("Without MoE measurements the grouped-kernel what-if is not available; "
                     "layer times below are built from single GEMM times.")
    return lines


def findings(d: Diagnosis) -> list[str]:
    """The chapter's conclusions as sentences, every number taken from the run."""
    out = []
    if len(d.gate):
        names = ", ".join(f"{r.backend} ({r.fmt})" for r in d.gate.itertuples())
        out.append(f"{len(d.gate)} backend/format pairs failed the correctness gate and are excluded: {names}.")
    if len(d.seed):
        low, high = d.seed.iloc[0], d.seed.iloc[-1]
        out.append(f"With {d.backend}, GEMMs reach {low.tflops_max:.3g} TFLOPS at M={low.m} "
                   f"({low.pct_peak_max:.3g}% of peak, {low.regime}) and {high.tflops_max:.3g} TFLOPS at "
                   f"M={high.m} ({high.pct_peak_max:.3g}% of peak, {high.regime}).")
    b = d.breakdown
    if b:
        out.append(f"At a decode batch of {b['batch']} the {d.config.preset} router gives each of "
                   f"{b['active_experts']:.0f} active experts {b['mean_m']:.1f} tokens on average and the "
                   f"busiest {b['busiest_m']:.1f}; one MoE layer as a loop of per-expert GEMMs takes "
                   f"{b['loop_us']:.0f} us ({b['shape_note']}).")
    if d.verdict:
        v = d.verdict
        explained = "" if not np.isfinite(v["explained"]) else \
            f"; that floor explains {v['explained']:.0%} of the layer time, the rest is kernel time above every floor"
        out.append(f"Verdict: {v['verdict']}: {v['reason']}{explained}.")
    if len(d.concurrency) > 1 and b:
        best = d.concurrency.iloc[d.concurrency["us_per_token"].argmin()]
        now = b["loop_us"] / b["batch"]
        out.append(f"Concurrency: at batch {best.batch:.0f} a token costs {best.us_per_token:.2f} us of "
                   f"MoE GEMM time per layer against {now:.2f} us at {b['batch']} "
                   f"({now / best.us_per_token:.2g}x).")
    if len(d.grouped) > 1 and d.grouped["vs_loop"].notna().all():
        best = d.grouped.iloc[0]
        out.append(f"Grouped kernels: at batch {best.batch:.0f} the fastest measured method is {best.method} "
                   f"at {best.layer_us:.0f} us, {1 / best.vs_loop:.2g}x as fast as the per-expert loop.")
    if len(d.ep) > 1:
        last = d.ep.iloc[-1]
        first = d.ep.iloc[0]
        out.append(f"Expert parallelism: with EP={last.ep:.0f} the busiest rank's layer takes "
                   f"{last.layer_us_busiest_rank:.0f} us against {first.layer_us_busiest_rank:.0f} us on one GPU "
                   f"(communication not included: this run measured one GPU).")
    if len(d.graphs):
        out.append(f"CUDA graphs: over {len(d.graphs)} points measured both ways, graph replay is "
                   f"{d.graphs['speedup'].median():.2g}x faster than eager launches (median).")
    if len(d.backends) > 1 and d.backend:
        best = d.backends.iloc[0]
        mine = d.backends.set_index("backend")["layer_us"].get(d.backend)
        if best.backend != d.backend and mine:
            out.append(f"Another backend: {best.backend} would take {best.layer_us:.0f} us per layer, "
                       f"{mine / best.layer_us:.2g}x faster than {d.backend}.")
    return out


def gate_alarm_html(gate: pd.DataFrame) -> str:
    """The loud box for backends that failed the correctness gate (styled by the book's theme,
    and by its inline style where the theme is absent, as in the shared single file)."""
    return ('<div class="admonition danger" style="border-left:6px solid #c00;padding:0.5em 1em">'
            f'<p class="admonition-title"><b>{len(gate)} backend/format pairs FAILED the correctness gate: '
            'their numbers are excluded from this diagnosis</b></p>'
            + gate.to_html(index=False) + "</div>")
