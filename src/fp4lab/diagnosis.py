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

SAME_SPEED_WITHIN = 0.05   # two times closer than this are "about as fast", not "1.0x as fast"
TABLE_SOURCES = {"gemm": "01 GEMM sweep (gemm.parquet)", "moe": "03 MoE (moe.parquet)",
                 "telemetry": "02 power and clocks (telemetry.parquet)"}
VERDICTS = ("launch-bound", "memory-bound", "compute-bound", "power-bound", "communication-bound")


@dataclass
class DiagnosisConfig:
    preset: str = "glm-5"
    decode_batch: int = 512          # B: concurrent decode requests
    backend: str = "auto"            # "auto": the backend with the fastest MoE layer at decode
    routing: str = "uniform"         # fp4lab.moe.routing spec
    steps: int = 64                  # routing steps drawn for the load statistics
    seed: int = 0
    power_bound_fraction: float = 0.9  # decode-point power over the limit that counts as power-bound
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
def choose_backend(at_decode: pd.DataFrame, backend: str = "auto") -> tuple[str | None, str]:
    """The backend to diagnose and why, from `what_if_backends` (every correct backend's layer
    time at the decode point, fastest first).

    `auto` takes the fastest there: the diagnosis is about the best path this GPU has, not the
    backend that happened to measure the most points.
    """
    measured = list(at_decode["backend"]) if len(at_decode) else []
    if backend != "auto":
        if backend not in measured:
            raise ValueError(f"backend={backend!r} has no correct points in this run; "
                             f"measured: {', '.join(sorted(measured)) or 'none'}")
        return backend, f"The diagnosed backend is {backend}, because the backend parameter names it"
    if not measured:
        return None, "No backend has a correct point, so none is diagnosed"
    best = at_decode.iloc[0]
    reason = (f"The diagnosed backend is {best.backend}: of the {len(measured)} backends with correct "
              f"points it runs one MoE layer at the decode point fastest ({best.layer_us:.0f} us")
    if len(measured) > 1:
        runner_up = at_decode.iloc[1]
        reason += f"; next is {runner_up.backend} at {runner_up.layer_us:.0f} us"
    return best.backend, reason + ")"


def backend_dtypes(name: str) -> dict[str, str | None] | None:
    """The weight, activation and math dtypes of a registered backend (None when not registered).

    Weight-only backends declare `weight_dtype` (FP4 weights read, bf16 math); others read what
    they multiply (`operand_dtype`).
    """
    from fp4lab import backends, roofline

    try:
        backend = backends.get(name)
    except ValueError:
        return None
    return {"weight_dtype": backend.weight_dtype, "act_dtype": backend.act_dtype,
            "math_dtype": backend.math_dtype}


def compare_speed(fast_us: float, slow_us: float) -> str:
    """`2.1x as fast as` / `about as fast as` (within SAME_SPEED_WITHIN): how `fast_us` compares."""
    ratio = slow_us / fast_us
    if abs(ratio - 1) <= SAME_SPEED_WITHIN:
        return "about as fast as"
    return f"{two_digits(ratio)}x as fast as"


def two_digits(value: float) -> str:
    """Two significant digits, keeping a trailing zero and no exponent below a million: 2.0, 0.84, 510."""
    rounded = float(f"{value:.2g}")
    return f"{rounded:.1f}" if 1 <= rounded < 10 else f"{rounded:g}"


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


def measured_shape(rows: pd.DataFrame, n: int, k: int) -> tuple[int, int, bool, str]:
    """(n, k) when `rows` measured it, else the measured shape closest in weight size; the note says which."""
    shapes = rows[["n", "k"]].drop_duplicates()
    if ((shapes["n"] == n) & (shapes["k"] == k)).any():
        return n, k, True, f"measured at {n}x{k}"
    nearest = (np.log(shapes["n"] * shapes["k"]) - np.log(n * k)).abs().idxmin()
    sn, sk = int(shapes.loc[nearest, "n"]), int(shapes.loc[nearest, "k"])
    return sn, sk, False, f"nearest measured shape {sn}x{sk}, not the preset's {n}x{k}"


def gemm_time_at(gemm: pd.DataFrame, backend: str, n: int, k: int, m: float,
                 fmt: str | None = None) -> dict[str, Any] | None:
    """The measured GEMM time at (n, k) and M = m, interpolated linearly between measured Ms.

    Uses the preset's exact (n, k) when the sweep measured it, else the measured shape closest in
    weight size, and says so in `shape_note`. Outside the measured M range: the nearest M. With
    `fmt`, only that format's rows when the backend measured it (FP4 kernels differ per format).
    """
    ok = gemm[(gemm["status"] == "ok") & (gemm["backend"] == backend)]
    if fmt and (ok["fmt"] == fmt).any():
        ok = ok[ok["fmt"] == fmt]
    if not len(ok):
        return None
    sn, sk, exact, note = measured_shape(ok, n, k)
    curve = ok[(ok["n"] == sn) & (ok["k"] == sk)].groupby("m")["median_us"].median().sort_index()
    median_us = float(np.interp(m, curve.index.to_numpy(float), curve.to_numpy(float)))
    inside = curve.index.min() <= m <= curve.index.max()
    return {"median_us": median_us, "n": sn, "k": sk, "exact_shape": bool(exact),
            "shape_note": note + ("" if inside else f"; M={m:.0f} outside the measured M range")}


# -- where the time goes ---------------------------------------------------------------------
def decode_layer(tables: RunTables, config: DiagnosisConfig, backend: str, fmt: str = "nvfp4",
                 batch: int | None = None, ep: int = 1) -> dict[str, Any] | None:
    """One MoE layer at decode as a loop of per-expert GEMMs, timed from the sweep (no ceilings needed).

    loop_us = active experts x (gate_up + down GEMM time at the mean expert M).
    """
    from fp4lab.moe import presets

    if tables.gemm is None:
        return None
    load = expert_loads(config, batch, ep)
    times = {}
    for gemm_name, (n, k) in presets.get(config.preset).gemm_shapes().items():
        times[gemm_name] = gemm_time_at(tables.gemm, backend, n, k, max(load["mean_m"], 1.0), fmt)
        if times[gemm_name] is None:
            return None
    return {
        **load, "backend": backend, "fmt": fmt,
        "loop_us": load["active_experts"] * sum(t["median_us"] for t in times.values()),
        "gate_up_us": times["gate_up"]["median_us"], "down_us": times["down"]["median_us"],
        # the shapes whose times were used: a stand-in shape gets stand-in floors
        "shapes": [(t["n"], t["k"]) for t in times.values()],
        "shape_note": "; ".join(sorted({t["shape_note"] for t in times.values()})),
        "exact_shapes": all(t["exact_shape"] for t in times.values()),
    }


def weight_read_us(shapes: list[tuple[int, int]], experts: float, dtype: str, fmt: str,
                   bandwidth_tbps: float) -> float:
    """Time to read `experts` experts' weights ([N, K] per shape, stored as `dtype`) once."""
    from fp4lab.roofline import operand_bytes

    per_expert = sum(operand_bytes(n, k, dtype, fmt) for n, k in shapes)
    return experts * per_expert / (bandwidth_tbps * 1e12) * 1e6


def layer_breakdown(tables: RunTables, config: DiagnosisConfig, backend: str, fmt: str = "nvfp4",
                    batch: int | None = None, ep: int = 1) -> dict[str, Any] | None:
    """The decode layer (`decode_layer`) against its floors.

    Floors: launch (2 kernels per active expert x launch_us); weight read (the active experts'
    weights in the bytes this backend reads, at the measured bandwidth; NaN for a backend no longer
    registered, whose dtype is unknown); compute (2 x routed tokens x weights per expert / the peak
    of the backend's math dtype). `fp4_read_floor_us` is the what-if: the same weights as FP4 in
    `fmt`, read at the same bandwidth, whatever this backend reads.
    """
    limits = ceilings(tables.run_json)
    layer = decode_layer(tables, config, backend, fmt, batch, ep)
    if layer is None or limits is None:
        return None
    dtypes = backend_dtypes(backend)
    bandwidth = float(limits["bandwidth_tbps"])
    active = layer["active_experts"]
    routed_tokens = layer["batch"] * layer["top_k"] / ep
    peak = (limits.get("peak_tflops") or {}).get(dtypes["math_dtype"]) if dtypes else None
    values_per_expert = sum(n * k for n, k in layer["shapes"])
    return {
        **layer, **(dtypes or {"weight_dtype": None, "act_dtype": None, "math_dtype": None}),
        "launch_floor_us": 2 * active * float(limits["launch_us"]) if limits.get("launch_us") else np.nan,
        "memory_floor_us": weight_read_us(layer["shapes"], active, dtypes["weight_dtype"], fmt, bandwidth)
        if dtypes else np.nan,
        "fp4_read_floor_us": weight_read_us(layer["shapes"], active, "fp4", fmt, bandwidth),
        "compute_floor_us": 2 * routed_tokens * values_per_expert / (peak * 1e12) * 1e6 if peak else np.nan,
        "bandwidth_tbps": bandwidth,
        "ceilings_source": limits.get("source", "unknown"),
    }


def decode_m_values(measured: np.ndarray, mean_m: float, busiest_m: float) -> list[int]:
    """The measured Ms a decode step runs at: those in [mean, busiest] expert load, else the one
    nearest the mean."""
    measured = np.sort(np.asarray(measured, dtype=float))
    inside = measured[(measured >= mean_m) & (measured <= busiest_m)]
    if len(inside):
        return [int(m) for m in inside]
    return [int(measured[np.abs(measured - mean_m).argmin()])]


def power_state(tables: RunTables, config: DiagnosisConfig, backend: str,
                batch: int | None = None) -> dict[str, Any] | None:
    """The GPU's power at the decode operating point against its limit, when NVML measured it.

    The operating point is the backend's rows at the preset's expert shapes (or the nearest
    measured ones) and at the Ms the decode step runs (`decode_m_values`); its power is the median
    `avg_power_w` of those rows' energy windows. Large-M points, which can sit at the limit, say
    nothing about decode.
    """
    from fp4lab.moe import presets

    if tables.gemm is None or "avg_power_w" not in tables.gemm:
        return None
    limit = tables.run_json.get("provenance", {}).get("device", {}).get("power_limit_w")
    ok = tables.ok_gemm
    ok = ok[(ok["backend"] == backend) & ok["avg_power_w"].notna()]
    if not len(ok) or not limit:
        return None
    load = expert_loads(config, batch)
    picked, m_values, notes = [], set(), set()
    for n, k in presets.get(config.preset).gemm_shapes().values():
        sn, sk, _, note = measured_shape(ok, n, k)
        shape_rows = ok[(ok["n"] == sn) & (ok["k"] == sk)]
        at = decode_m_values(shape_rows["m"].unique(), load["mean_m"], load["busiest_m"])
        picked.append(shape_rows[shape_rows["m"].isin(at)])
        m_values.update(at)
        notes.add(note)
    watts = float(pd.concat(picked)["avg_power_w"].median())
    return {"avg_power_w": watts, "power_limit_w": float(limit), "fraction": watts / float(limit),
            "m_values": sorted(m_values), "points": int(sum(len(p) for p in picked)),
            "shape_note": "; ".join(sorted(notes))}


def verdict(breakdown: dict[str, Any], power: dict[str, Any] | None,
            config: DiagnosisConfig) -> dict[str, Any]:
    """The bottleneck: power-bound when the GPU sits at its limit, else the largest floor.

    `explained` is the share of the measured layer time that floor accounts for; the rest is
    time the kernels spend above every floor (small tiles, idle SMs, synchronisation).
    """
    if power and power["fraction"] >= config.power_bound_fraction:
        return {"verdict": "power-bound", "floor_us": np.nan, "explained": np.nan,
                "reason": f"at the decode point (M={_m_list(power['m_values'])}) the GPU drew "
                          f"{power['avg_power_w']:.0f} W, {power['fraction']:.0%} of the "
                          f"{power['power_limit_w']:.0f} W limit"}
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


def _m_list(m_values: list[int]) -> str:
    return ", ".join(str(m) for m in m_values)


# -- what would change it ----------------------------------------------------------------------
def what_if_concurrency(tables: RunTables, config: DiagnosisConfig, backend: str,
                        factors=(0.25, 0.5, 1, 2, 4)) -> pd.DataFrame:
    """Layer time and time per routed token as the decode batch changes (sweep times, routing model)."""
    rows = []
    for factor in factors:
        batch = max(1, int(round(config.decode_batch * factor)))
        point = decode_layer(tables, config, backend, batch=batch)
        if point is None:
            continue
        rows.append({"batch": batch, "mean_m": point["mean_m"], "busiest_m": point["busiest_m"],
                     "active_experts": point["active_experts"], "layer_us": point["loop_us"],
                     "us_per_token": point["loop_us"] / batch})
    return pd.DataFrame(rows)


def what_if_backends(tables: RunTables, config: DiagnosisConfig) -> pd.DataFrame:
    """Every correct backend's layer time at the decode point, fastest first, with the dtype of
    the weights it reads (None for a backend no longer registered)."""
    if tables.gemm is None:
        return pd.DataFrame()
    rows = []
    for backend in sorted(set(tables.ok_gemm["backend"])):
        point = decode_layer(tables, config, backend)
        if point is not None:
            dtypes = backend_dtypes(backend) or {}
            rows.append({"backend": backend, "layer_us": point["loop_us"],
                         "weight_dtype": dtypes.get("weight_dtype"), "shape_note": point["shape_note"]})
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
        point = decode_layer(tables, config, backend, ep=ep)
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


def what_if_grouped(moe: pd.DataFrame | None, preset: str, batch: int,
                    routing: str | None = None) -> pd.DataFrame:
    """Measured MoE layer time per method (loop, grouped, ...) at the batch nearest B, fastest first.

    One GPU's whole layer: rows of expert-parallel ranks (ep > 1) are left out, or each method's
    time would add every rank of every EP degree; with `routing`, only rows of that routing model.
    """
    if moe is None or not len(moe):
        return pd.DataFrame()
    ok = moe[(moe["status"] == "ok") & moe["batch"].notna()]
    ok = ok[ok["preset"].astype(str).str.startswith(preset)]
    if "ep" in ok:
        ok = ok[ok["ep"].fillna(1) == 1]
    if routing and "routing" in ok:
        ok = ok[ok["routing"] == routing]
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
    backend_reason: str = ""


def diagnose(run_dir: str | Path, config: DiagnosisConfig) -> Diagnosis:
    """Everything chapter 04 shows, for one run folder."""
    if not str(run_dir):
        raise ValueError("run_dir is empty: pass the run folder to diagnose (make report passes it)")
    tables = load_run(run_dir)
    at_decode = what_if_backends(tables, config)
    backend, reason = choose_backend(at_decode, config.backend)
    empty = pd.DataFrame()
    breakdown = layer_breakdown(tables, config, backend) if backend else None
    power = power_state(tables, config, backend) if backend else None
    return Diagnosis(
        tables=tables, config=config, backend=backend, backend_reason=reason,
        gate=gate_failures(tables.gemm),
        seed=seed_table(tables.gemm, backend) if backend else empty,
        breakdown=breakdown, power=power,
        verdict=verdict(breakdown, power, config) if breakdown else None,
        concurrency=what_if_concurrency(tables, config, backend) if backend else empty,
        backends=at_decode, ep=what_if_ep(tables, config, backend) if backend else empty,
        graphs=what_if_graphs(tables.gemm),
        grouped=what_if_grouped(tables.moe, config.preset, config.decode_batch, config.routing))


def cannot_conclude(d: Diagnosis) -> list[str]:
    """What is missing and what that leaves unanswered."""
    lines = [f"No {source}: the chapter failed, did not run, or measured nothing on this machine."
             for source in d.tables.missing]
    if d.tables.gemm is not None and d.backend is None:
        lines.append("The GEMM sweep has no correct point: no speed can be trusted, so no verdict.")
    if d.backend and d.breakdown is None:
        lines.append("The run has no ceilings (run.json sweep.ceilings): floors and the verdict cannot be computed.")
    if d.breakdown and d.breakdown["weight_dtype"] is None:
        lines.append(f"{d.backend} is not a registered backend, so the bytes of its weights and its "
                     "weight-read floor are unknown.")
    if d.backend and d.power is None:
        lines.append("No power measured at the decode point (no NVML energy windows): whether power "
                     "limits decode is not judged.")
    if d.tables.moe is None:
        lines.append("Without MoE measurements the grouped-kernel what-if is not available; "
                     "layer times below are built from single GEMM times.")
    return lines


def seed_sentences(d: Diagnosis) -> list[str]:
    low, high = d.seed.iloc[0], d.seed.iloc[-1]
    out = [f"With {d.backend}, GEMMs reach {low.tflops_max:.3g} TFLOPS at M={low.m} "
           f"({low.pct_peak_max:.3g}% of peak, {low.regime}) and {high.tflops_max:.3g} TFLOPS at "
           f"M={high.m} ({high.pct_peak_max:.3g}% of peak, {high.regime})."]
    over = d.seed[d.seed["pct_peak_max"] > 100]
    if len(over):
        out.append(f"At {len(over)} M values a point exceeds 100% of the measured peak: this run's peak "
                   "probe is slower than its own sweep (older runs; fp4lab.sweep.raise_measured_ceilings "
                   "raises the peak to the best point).")
    return out


def verdict_sentence(d: Diagnosis) -> str:
    v, b = d.verdict, d.breakdown
    meaning = {"launch-bound": "launching two kernels per active expert",
               "memory-bound": f"reading the active experts' {b.get('weight_dtype')} weights once at "
                               f"{b['bandwidth_tbps']:.2f} TB/s",
               "compute-bound": f"the arithmetic at the {b.get('math_dtype')} peak"}.get(v["verdict"])
    explained = "" if not np.isfinite(v["explained"]) else \
        f"; that floor explains {v['explained']:.0%} of the layer time, the rest is kernel time above every floor"
    what = f" ({meaning})" if meaning and np.isfinite(v["floor_us"]) else ""
    return f"Verdict: {v['verdict']}{what}: {v['reason']}{explained}."


def power_sentence(d: Diagnosis) -> str | None:
    p = d.power
    if not p or (d.verdict and d.verdict["verdict"] == "power-bound"):
        return None
    return (f"Power does not limit decode: at the decode point (M={_m_list(p['m_values'])} on the expert "
            f"shapes) {d.backend}'s GEMMs drew {p['avg_power_w']:.0f} W, the median of {p['points']} "
            f"energy windows, {p['fraction']:.0%} of the {p['power_limit_w']:.0f} W limit.")


def fp4_sentence(d: Diagnosis) -> str | None:
    """What FP4 weights could buy here: the FP4 read floor beside what FP4 backends measured."""
    b = d.breakdown
    if not b:
        return None
    floor = b["fp4_read_floor_us"]
    text = (f"FP4 weights: with {b['fmt']} weights read at the floor ({b['active_experts']:.0f} experts at "
            f"{b['bandwidth_tbps']:.2f} TB/s) the layer would take {floor:.0f} us")
    if b["weight_dtype"] != "fp4":
        text += f", against {b['loop_us']:.0f} us measured with {d.backend} ({b['weight_dtype']} weights)"
    if np.isfinite(b["launch_floor_us"]):
        text += f"; as a per-expert loop it cannot go below its launch floor of {b['launch_floor_us']:.0f} us"
    fp4 = d.backends[d.backends["weight_dtype"] == "fp4"] if len(d.backends) else d.backends
    if len(fp4):
        best = fp4.iloc[0]
        text += (f". The fastest FP4-weight backend measured here, {best.backend}, takes "
                 f"{best.layer_us:.0f} us, {two_digits(best.layer_us / floor)}x its read floor")
        if best.backend != d.backend:
            text += f" and {compare_speed(best.layer_us, b['loop_us'])} {d.backend}"
    device = d.tables.run_json.get("provenance", {}).get("device", {})
    if device.get("kind") == "cuda" and isinstance(device.get("native_fp4"), list) and not device["native_fp4"]:
        text += (f" ({device.get('name') or 'this device'} has no FP4 tensor cores: FP4 runs there "
                 "only as weight-only kernels that decode the weights to bf16 for the math)")
    return text + "."


def findings(d: Diagnosis) -> list[str]:
    """The chapter's conclusions as sentences, every number taken from the run."""
    out = []
    if len(d.gate):
        names = ", ".join(f"{r.backend} ({r.fmt})" for r in d.gate.itertuples())
        out.append(f"{len(d.gate)} backend/format pairs failed the correctness gate and are excluded: {names}.")
    if d.backend:
        out.append(d.backend_reason + ".")
    if len(d.seed):
        out += seed_sentences(d)
    b = d.breakdown
    if b:
        out.append(f"At a decode batch of {b['batch']} the {d.config.preset} router gives each of "
                   f"{b['active_experts']:.0f} active experts {b['mean_m']:.1f} tokens on average and the "
                   f"busiest {b['busiest_m']:.1f}; one MoE layer as a loop of per-expert GEMMs takes "
                   f"{b['loop_us']:.0f} us ({b['shape_note']}).")
    if d.verdict:
        out.append(verdict_sentence(d))
    out += [line for line in (power_sentence(d), fp4_sentence(d)) if line]
    if len(d.concurrency) > 1 and b:
        best = d.concurrency.iloc[d.concurrency["us_per_token"].argmin()]
        now = b["loop_us"] / b["batch"]
        if best.batch != b["batch"]:
            out.append(f"Concurrency: at batch {best.batch:.0f} a token costs {best.us_per_token:.2f} us of "
                       f"MoE GEMM time per layer, against {now:.2f} us at batch {b['batch']} "
                       f"({two_digits(now / best.us_per_token)}x as much per token now).")
    if len(d.grouped) > 1 and d.grouped["vs_loop"].notna().all():
        best = d.grouped.iloc[0]
        out.append(f"Grouped kernels: at batch {best.batch:.0f} on one device the fastest measured method is "
                   f"{best.method} at {best.layer_us:.0f} us, "
                   f"{compare_speed(best.layer_us, best.layer_us / best.vs_loop)} the fastest per-expert loop.")
    if len(d.ep) > 1:
        last = d.ep.iloc[-1]
        first = d.ep.iloc[0]
        out.append(f"Expert parallelism: with EP={last.ep:.0f} the busiest rank's layer takes "
                   f"{last.layer_us_busiest_rank:.0f} us against {first.layer_us_busiest_rank:.0f} us on one device "
                   f"(communication not included: this run measured one device).")
    if len(d.graphs):
        median = d.graphs["speedup"].median()
        out.append(f"CUDA graphs: over {len(d.graphs)} points measured both ways, graph replay is "
                   f"{compare_speed(1.0, median)} eager launches (median).")
    if len(d.backends) > 1 and d.backend:
        best = d.backends.iloc[0]
        mine = d.backends.set_index("backend")["layer_us"].get(d.backend)
        if best.backend != d.backend and mine:
            out.append(f"Another backend: {best.backend} would take {best.layer_us:.0f} us per layer, "
                       f"{compare_speed(best.layer_us, mine)} {d.backend}.")
    return out


def gate_alarm_html(gate: pd.DataFrame) -> str:
    """The loud box for backends that failed the correctness gate (styled by the book's theme,
    and by its inline style where the theme is absent, as in the shared single file)."""
    return ('<div class="admonition danger" style="border-left:6px solid #c00;padding:0.5em 1em">'
            f'<p class="admonition-title"><b>{len(gate)} backend/format pairs FAILED the correctness gate: '
            'their numbers are excluded from this diagnosis</b></p>'
            + gate.to_html(index=False) + "</div>")
