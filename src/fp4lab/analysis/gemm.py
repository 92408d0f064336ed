"""What the GEMM sweep measured, read: derived columns, the run's ceilings, and the tables the
book states (availability, the seed-style table, every 4-bit method at decode).

The rows hold raw times and the dtypes they were measured with; everything else is computed here,
once, from the run's own ceilings:
- `measured` ceilings: the run's probes (a device copy for bandwidth, a large GEMM per dtype, an
  empty kernel's graph replay for the launch floor), each peak raised to the best correct point of
  its math dtype in the same run (a sweep point can beat the 8192^3 probe; no point may sit above
  100% of the measured peak). The raise is reported, never written back;
- `spec` ceilings: the device's spec sheet, when it has one.
"% of peak" always names its peak: `pct_peak_spec` or `pct_peak_measured`.

Shape legend: M tokens, N output features, K reduction dim; a[M, K] @ w[N, K]^T.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fp4lab import roofline, schema
from fp4lab.analysis.run import RunView, view
from fp4lab.dtypes import WEIGHT_LABELS
from fp4lab.results import RunDir

STATUSES = ("ok", "wrong_result", "unavailable", "error", "oom", "timeout")
BASELINE = "torch-bf16"                # cuBLAS bf16: the yardstick every 4-bit method is set against
FOUR_BIT = ("fp4", "int4")             # weight dtypes that move ~0.5 B per weight


@dataclass
class GemmResults:
    view: RunView
    frame: pd.DataFrame                          # the lead GPU's rows, with the derived columns
    every_gpu: pd.DataFrame                      # every GPU's rows (a per-GPU sweep), derived
    measured: roofline.Ceilings | None
    spec: roofline.Ceilings | None
    raised: dict[str, str] = field(default_factory=dict)   # dtype -> which point raised its peak

    @property
    def ok(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] == "ok"]

    @property
    def bandwidth_tbps(self) -> float | None:
        """The run's measured copy bandwidth, else the spec sheet's."""
        for ceilings in (self.measured, self.spec):
            if ceilings is not None and ceilings.bandwidth_tbps:
                return float(ceilings.bandwidth_tbps)
        return None

    @property
    def launch_us(self) -> float | None:
        return float(self.measured.launch_us) if self.measured and self.measured.launch_us else None

    def caption(self, what: str = "") -> str:
        config = ((self.view.info.get("sweep") or {}).get("config") or {})
        conditions = timer_words(config.get("timer") or {}, self.view.is_gpu)
        return self.view.caption(what) + (f"; timer: {conditions}" if conditions else "")


# -- ceilings -------------------------------------------------------------------------------------

def stored_ceilings(info: dict[str, Any]) -> tuple[roofline.Ceilings | None, roofline.Ceilings | None]:
    """(measured, spec) as the sweep stored them in run.json, None where absent."""
    stored = (info.get("sweep") or {}).get("ceilings") or {}
    found = []
    for source in ("measured", "spec"):
        values = stored.get(source)
        found.append(roofline.Ceilings(**values) if isinstance(values, dict) and values.get("bandwidth_tbps")
                     else None)
    return found[0], found[1]


def raise_peaks(measured: roofline.Ceilings | None, frame: pd.DataFrame) -> tuple[roofline.Ceilings | None, dict]:
    """The measured ceilings with each peak raised to the best correct point of its math dtype."""
    if measured is None:
        return None, {}
    peaks, raised = dict(measured.peak_tflops), {}
    ok = frame[(frame["status"] == "ok") & frame["tflops"].notna()]
    for dtype, rows in ok.groupby("math_dtype"):
        best = rows.loc[rows["tflops"].idxmax()]
        probe = peaks.get(dtype)
        if probe is not None and best["tflops"] > probe:
            peaks[dtype] = float(best["tflops"])
            fmt = f" {best['fmt']}" if best.get("weight_dtype") == "fp4" else ""   # bf16/fp8 weights have no FP4 format
            raised[dtype] = (f"raised from the probe's {probe:.1f} to {best['tflops']:.1f} TFLOP/s by "
                             f"{best['backend']}{fmt} M={best['m']} {best['n']}x{best['k']}, "
                             f"the best correct {dtype} point of the run")
    return dataclasses.replace(measured, peak_tflops=peaks), raised


# -- derived columns ------------------------------------------------------------------------------

def _bytes_and_flops(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    moved, flops = [], []
    for row in frame.itertuples(index=False):
        if pd.isna(row.weight_dtype) or pd.isna(row.m):
            moved.append(np.nan)
            flops.append(np.nan)
            continue
        moved.append(roofline.gemm_bytes(int(row.m), int(row.n), int(row.k), row.weight_dtype, row.fmt,
                                         row.act_dtype))
        flops.append(roofline.gemm_flops(int(row.m), int(row.n), int(row.k)))
    return np.asarray(moved, dtype=float), np.asarray(flops, dtype=float)


def derive(frame: pd.DataFrame, measured: roofline.Ceilings | None,
           spec: roofline.Ceilings | None) -> pd.DataFrame:
    """Add bytes, flops, tflops, tbps, % of the measured and spec peaks and bandwidth, the
    floors against the measured (else spec) ceilings, `bound`, and tflops_per_w."""
    frame = frame.copy()
    frame["bytes"], frame["flops"] = _bytes_and_flops(frame)
    seconds = frame["median_us"] * 1e-6
    frame["tflops"] = frame["flops"] / seconds / 1e12
    frame["tbps"] = frame["bytes"] / seconds / 1e12
    frame["tflops_per_w"] = frame["flops"] / frame["energy_per_call_j"] / 1e12
    for source, ceilings in (("measured", measured), ("spec", spec)):
        peaks = frame["math_dtype"].map(lambda dtype: (ceilings.peak_tflops.get(dtype) if ceilings else None))
        frame[f"pct_peak_{source}"] = 100 * frame["tflops"] / pd.to_numeric(peaks, errors="coerce")
        bandwidth = ceilings.bandwidth_tbps if ceilings and ceilings.bandwidth_tbps else np.nan
        frame[f"pct_bandwidth_{source}"] = 100 * frame["tbps"] / bandwidth
    basis = measured or spec
    frame["memory_floor_us"] = frame["bytes"] / (basis.bandwidth_tbps * 1e6) if basis else np.nan
    peak = frame["math_dtype"].map(lambda dtype: basis.peak_tflops.get(dtype) if basis else None)
    frame["compute_floor_us"] = frame["flops"] / (pd.to_numeric(peak, errors="coerce") * 1e6)
    frame["launch_floor_us"] = basis.launch_us if basis and basis.launch_us else np.nan
    floors = frame[["launch_floor_us", "memory_floor_us", "compute_floor_us"]].astype(float)
    largest = floors.fillna(-np.inf).idxmax(axis=1).str.replace("_floor_us", "", regex=False)
    frame["bound"] = largest.where(floors.notna().any(axis=1))
    return frame


def lead_gpu(frame: pd.DataFrame) -> float | None:
    """The GPU whose rows the book's tables read: the lowest index measured (None on a CPU)."""
    indices = frame["gpu_index"].dropna() if "gpu_index" in frame else ()
    return float(indices.min()) if len(indices) else None


def of_gpu(frame: pd.DataFrame, gpu: float | None) -> pd.DataFrame:
    """The rows of one GPU (every row when `gpu` is None: a CPU run, or one device)."""
    return frame if gpu is None else frame[frame["gpu_index"] == gpu]


def gemm_results(run_dir: str | RunDir) -> GemmResults:
    """The run's gemm table, derived, with its ceilings. A per-GPU sweep's tables and
    findings read its lead GPU (the ceilings were measured there); `every_gpu` holds all, for
    the spread across GPUs."""
    run_view = view(run_dir)
    frame = run_view.run.read_table("gemm")
    measured, spec = stored_ceilings(run_view.info)
    first = derive(frame, measured, spec)                 # tflops for finding the best points
    lead = lead_gpu(first)
    measured, raised = raise_peaks(measured, of_gpu(first, lead))
    every = derive(frame, measured, spec) if raised else first
    return GemmResults(run_view, of_gpu(every, lead).reset_index(drop=True), every, measured, spec, raised)


def timer_words(timer: dict, on_gpu: bool = True) -> str:
    """The timer's conditions in words: '30 repeats, cold L2 (copies rotated), CUDA-graph replay'
    (on a CPU only the repeats: cold L2 and graph replay are GPU settings). Cold L2 is each call
    reading its own copy of the inputs, the copies together several times the L2 (`bench`), not a
    flush between calls: the calls run back to back."""
    words = []
    if timer.get("repeats"):
        words.append(f"{timer['repeats']} repeats")
    if not on_gpu:
        return ", ".join(words)
    if "cold_l2" in timer:
        words.append("cold L2 (copies rotated)" if timer["cold_l2"] else "L2 left warm")
    if "use_graph" in timer:
        words.append("CUDA-graph replay" if timer["use_graph"] else "eager launches")
    return ", ".join(words)


# -- tables ---------------------------------------------------------------------------------------

def availability(results: GemmResults) -> pd.DataFrame:
    """One row per backend: points per status, and the first reason of each failing status."""
    frame = results.frame
    if not len(frame):
        return pd.DataFrame(columns=["backend", "weights", *STATUSES, "why not"])
    rows = []
    for backend, group in frame.groupby("backend", sort=False):
        counts = group["status"].value_counts()
        failing = group[group["status"] != "ok"]
        reasons = failing.groupby("status")["error"].first()
        rows.append({"backend": backend, "weights": weight_label(group["weight_dtype"].iloc[0]),
                     **{status: int(counts.get(status, 0)) for status in STATUSES},
                     "why not": "; ".join(f"{status}: {reason}" for status, reason in reasons.items()
                                          if isinstance(reason, str)) or None})
    table = pd.DataFrame(rows)
    shown = [status for status in STATUSES if table[status].sum() > 0]
    return table[["backend", "weights", *shown, "why not"]]


def ceilings_table(results: GemmResults) -> pd.DataFrame:
    """Every ceiling the book divides by, measured beside the spec sheet's, with how it was
    measured (the probe's own timer line) and, for a peak, whether the run's best point raised it."""
    measured, spec = results.measured, results.spec
    details = (measured.details if measured else {}) or {}
    rows = [{"ceiling": "copy bandwidth (TB/s)", "measured": measured.bandwidth_tbps if measured else None,
             "spec": spec.bandwidth_tbps if spec else None, "how": details.get("bandwidth")}]
    for dtype in ("bf16", "fp8", "fp4"):
        peak = (measured.peak_tflops or {}).get(dtype) if measured else None
        sheet = (spec.peak_tflops or {}).get(dtype) if spec else None
        if peak is None and sheet is None:
            continue
        unprobed = str(details.get("not_measured") or "")          # e.g. "fp4: no probe for this dtype on ..."
        how = details.get(dtype) or (unprobed if unprobed.startswith(f"{dtype}:") else None)
        if dtype in results.raised:
            how = f"{how}; {results.raised[dtype]}" if how else results.raised[dtype]
        rows.append({"ceiling": f"{dtype} peak (TFLOP/s)", "measured": peak, "spec": sheet, "how": how})
    rows.append({"ceiling": "launch floor (us)", "measured": measured.launch_us if measured else None,
                 "spec": None, "how": details.get("launch")})
    return pd.DataFrame(rows, columns=["ceiling", "measured", "spec", "how"])


def why_not_groups(table: pd.DataFrame) -> list[tuple[list[str], str]]:
    """The availability table's reasons, each once with the backends that share it, in table order:
    six backends that all need FP4 tensor cores are one line, not six copies of a long cell."""
    groups: dict[str, list[str]] = {}
    for backend, reason in zip(table["backend"], table["why not"]):
        if isinstance(reason, str) and reason:
            groups.setdefault(reason, []).append(backend)
    return [(backends, reason) for reason, backends in groups.items()]


def weight_label(dtype) -> str:
    return WEIGHT_LABELS.get(dtype, str(dtype)) if isinstance(dtype, str) else "—"


def seed_table(results: GemmResults, backend: str) -> pd.DataFrame:
    """The seed's table for one backend: per M, the TFLOP/s range over the swept shapes and
    formats, the % of the spec peak and of the measured peak, and the regime the roofline assigns."""
    ok = results.ok[results.ok["backend"] == backend]
    rows = []
    for m, group in ok.groupby("m"):
        rows.append({"M": int(m), "TFLOP/s min": group["tflops"].min(), "TFLOP/s max": group["tflops"].max(),
                     "% of spec peak": group["pct_peak_spec"].max(),
                     "% of measured peak": group["pct_peak_measured"].max(),
                     "regime": ", ".join(sorted(set(group["bound"].dropna()))) or None})
    return pd.DataFrame(rows, columns=["M", "TFLOP/s min", "TFLOP/s max", "% of spec peak",
                                       "% of measured peak", "regime"])


def seed_math_dtype(results: GemmResults, backend: str) -> str | None:
    """The math dtype whose peak `seed_table`'s "% of peak" columns divide `backend`'s TFLOP/s by
    (bf16 for a weight-only FP4 kernel on Hopper); None when its rows hold none or several."""
    dtypes = results.ok.loc[results.ok["backend"] == backend, "math_dtype"].dropna().unique()
    return str(dtypes[0]) if len(dtypes) == 1 else None


def seed_regimes(seed: pd.DataFrame) -> dict[str, Any] | None:
    """What a seed table says in one line: the largest M still bound by launches or memory and
    the best share of the measured math peak up to it; the first M where compute is a bound and
    the best share from there (with its M). None for an empty table."""
    if not len(seed):
        return None
    computes = seed["regime"].fillna("").str.contains("compute")
    before, after = seed[~computes], seed[computes]
    summary: dict[str, Any] = {"memory_until": None, "memory_best_pct": None, "compute_from": None,
                               "compute_best_pct": None, "compute_best_m": None}
    if len(before):
        summary.update(memory_until=int(before["M"].max()),
                       memory_best_pct=float(before["% of measured peak"].max()))
    if len(after):
        best = after.loc[after["% of measured peak"].idxmax()]
        summary.update(compute_from=int(after["M"].min()), compute_best_pct=float(best["% of measured peak"]),
                       compute_best_m=int(best["M"]))
    return summary


def four_bit_points(results: GemmResults) -> pd.DataFrame:
    """Every correct point of a 4-bit-weight backend and of the bf16 baseline, with the FP4
    weight-read floor of its shape at the run's bandwidth (chapter 01 draws it as the dashed line at 1)."""
    ok = results.ok
    chosen = ok[ok["weight_dtype"].isin(FOUR_BIT) | (ok["backend"] == BASELINE)].copy()
    bandwidth = results.bandwidth_tbps
    chosen["fp4_floor_us"] = [
        roofline.gemm_bytes(int(r.m), int(r.n), int(r.k), "fp4", r.fmt, "bf16") / (bandwidth * 1e6)
        if bandwidth else np.nan for r in chosen.itertuples(index=False)]
    return chosen


def fastest_fp4(results: GemmResults) -> pd.DataFrame:
    """Per format, shape and M: the fastest correct 4-bit method, the bf16 baseline, the FP4
    read floor, the speed-up over bf16 and the share of the floor reached."""
    points = four_bit_points(results)
    rows = []
    for (fmt, n, k, m), group in points.groupby(["fmt", "n", "k", "m"]):
        four = group[group["weight_dtype"].isin(FOUR_BIT)]
        base = group[group["backend"] == BASELINE]
        if not len(four):
            continue
        best = four.loc[four["median_us"].idxmin()]
        base_us = float(base["median_us"].iloc[0]) if len(base) else np.nan
        rows.append({"fmt": fmt, "n": int(n), "k": int(k), "m": int(m), "backend": best["backend"],
                     "weights": weight_label(best["weight_dtype"]), "us": float(best["median_us"]),
                     "bf16_us": base_us, "speedup_vs_bf16": base_us / float(best["median_us"]),
                     "floor_us": float(best["fp4_floor_us"]),
                     "pct_of_floor": 100 * float(best["fp4_floor_us"]) / float(best["median_us"])})
    return pd.DataFrame(rows, columns=["fmt", "n", "k", "m", "backend", "weights", "us", "bf16_us",
                                       "speedup_vs_bf16", "floor_us", "pct_of_floor"])


def fastest_fp4_per_m(results: GemmResults) -> pd.DataFrame:
    """Per M: which 4-bit method is fastest on the most (format, shape) cases, and its median
    speed-up over bf16 there (the book's "fastest FP4 path per M"). Methods tied for the most
    cases get a row each, so a tie is shown as one, not settled by row order."""
    table = fastest_fp4(results)
    rows = []
    for m, group in table.groupby("m"):
        wins = group["backend"].value_counts()
        for winner in sorted(wins.index[wins == wins.max()]):
            mine = group[group["backend"] == winner]
            rows.append({"m": int(m), "backend": winner, "cases won": f"{len(mine)} of {len(group)}",
                         "median speed-up vs bf16": float(mine["speedup_vs_bf16"].median()),
                         "median % of FP4 floor": float(mine["pct_of_floor"].median())})
    return pd.DataFrame(rows, columns=["m", "backend", "cases won", "median speed-up vs bf16",
                                       "median % of FP4 floor"])


# the yardstick for fp4lab's own kernels: the fastest of cuBLAS bf16 and the FP4 libraries that run on
# Hopper (torch-fp8 is left out: it reads fp8 weights and runs fp8 MMAs, a different numerics)
PEERS = ("torch-bf16", "humming-w4a16", "tinygemm-int4", "gemlite-w4a16")
PEER_TARGET = 1.5          # fp4lab's aim at decode sizes: 1.5x as fast as the fastest peer
PEER_TARGET_UP_TO_M = 16   # ... up to this M; above it, no slower than the fastest peer
PEER_LEVEL_UP_TO_M = 256   # ... up to this M (prefill sizes above it are shown, with no aim)
MMA_DOMINANT = 2.0         # a bf16 MMA floor this many times the FP4 read: the MMAs set a weight-only kernel's floor


def own_against_peers(results: GemmResults) -> pd.DataFrame:
    """Per format, shape and M where both ran correctly: fp4lab's fastest own kernel against the
    fastest peer, `speedup` = the peer's time over fp4lab's (above 1: fp4lab's is faster), the
    FP4 read floor and the bf16 MMA floor (the GEMM's FLOPs at the measured bf16 peak: a weight-only
    kernel decodes its weights to bf16 and runs the same MMAs as cuBLAS), and the share of that
    peak each side reaches."""
    points = four_bit_points(results)
    ceilings = results.measured or results.spec
    peak = (ceilings.peak_tflops.get("bf16") if ceilings else None) or np.nan
    rows = []
    for (fmt, n, k, m), group in points.groupby(["fmt", "n", "k", "m"]):
        own, peers = group[group["backend"].isin(schema.OWN_GEMM_BACKENDS)], group[group["backend"].isin(PEERS)]
        if not len(own) or not len(peers):
            continue
        mine, theirs = own.loc[own["median_us"].idxmin()], peers.loc[peers["median_us"].idxmin()]
        mma_floor = roofline.gemm_flops(int(m), int(n), int(k)) / (peak * 1e6)
        rows.append({"fmt": fmt, "n": int(n), "k": int(k), "m": int(m),
                     "own": mine["backend"], "own_build": mine.get("config"), "own_us": float(mine["median_us"]),
                     "peer": theirs["backend"], "peer_us": float(theirs["median_us"]),
                     "speedup": float(theirs["median_us"]) / float(mine["median_us"]),
                     "read_floor_us": float(mine["fp4_floor_us"]), "mma_floor_us": mma_floor,
                     "own_pct_mma": 100 * mma_floor / float(mine["median_us"]),
                     "peer_pct_mma": 100 * mma_floor / float(theirs["median_us"])})
    columns = ["fmt", "n", "k", "m", "own", "own_build", "own_us", "peer", "peer_us", "speedup", "read_floor_us",
               "mma_floor_us", "own_pct_mma", "peer_pct_mma"]
    return pd.DataFrame(rows, columns=columns)


def own_against_peers_per_m(table: pd.DataFrame) -> pd.DataFrame:
    """Per M, over formats and shapes: how many points reach the aim (PEER_TARGET up to
    PEER_TARGET_UP_TO_M, level up to PEER_LEVEL_UP_TO_M, none above: NaN), the speed-up's median
    and range, fp4lab's kernel and the peer fastest most often, the median share of the bf16
    peak each reaches (medians), how many times the FP4 read floor the bf16 MMA floor is, and
    `mma_bound` where that is MMA_DOMINANT or more; `short_min`/`short_max`: the speed-ups of the
    points short of the aim."""
    rows = []
    for m, group in table.groupby("m"):
        aim = PEER_TARGET if m <= PEER_TARGET_UP_TO_M else 1.0 if m <= PEER_LEVEL_UP_TO_M else np.nan
        peers, own = group["peer"].value_counts(), group["own"].value_counts()
        short = group["speedup"][group["speedup"] < aim] if np.isfinite(aim) else group["speedup"].iloc[:0]
        rows.append({"m": int(m), "aim": aim, "points": len(group), "own": own.index[0],
                     "own_points": int(own.iloc[0]),
                     "at_aim": int((group["speedup"] >= aim).sum()) if np.isfinite(aim) else None,
                     "median_speedup": float(group["speedup"].median()),
                     "min_speedup": float(group["speedup"].min()), "max_speedup": float(group["speedup"].max()),
                     "peer": peers.index[0], "peer_points": int(peers.iloc[0]),
                     "peer_pct_mma": float(group["peer_pct_mma"].median()),
                     "own_pct_mma": float(group["own_pct_mma"].median()),
                     "mma_over_read": float((group["mma_floor_us"] / group["read_floor_us"]).median()),
                     "short_min": float(short.min()) if len(short) else np.nan,
                     "short_max": float(short.max()) if len(short) else np.nan})
    frame = pd.DataFrame(rows, columns=["m", "aim", "points", "own", "own_points", "at_aim", "median_speedup",
                                        "min_speedup", "max_speedup", "peer", "peer_points", "peer_pct_mma",
                                        "own_pct_mma", "mma_over_read", "short_min", "short_max"])
    frame["mma_bound"] = frame["mma_over_read"] >= MMA_DOMINANT
    return frame


PDL_NOTE = ("launches with programmatic dependent launch (PDL): timed several calls in a row like every "
            "method, each call may start while the call before it finishes (its first weight loads, "
            "or its launch, overlap that call's last CTAs), where a plain launch waits for the "
            "previous kernel to end; in a model the kernel before it must allow the early launch too")


def launch_notes(results: GemmResults) -> list[str]:
    """'<backend> launches with PDL ... (<n> of its <m> points)' for each correctly measured method
    whose rows say they were launched with programmatic dependent launch (`launch` pdl-*), in
    the run's order."""
    notes = []
    ok = results.ok
    for name, group in (ok.groupby("backend", sort=False) if len(ok) else []):
        dependent = group["launch"].fillna("").str.startswith("pdl")
        if dependent.any():
            notes.append(f"{name} {PDL_NOTE} ({int(dependent.sum())} of its {len(group)} points)")
    return notes


def failure_counts(results: GemmResults) -> dict[tuple[str, str], int]:
    """{(backend, status): points} of the points with no time: failed the gate, errored, ran out
    of memory or timed out."""
    frame = results.frame
    return frame[frame["status"].isin(["wrong_result", "error", "oom", "timeout"])] \
        .groupby(["backend", "status"]).size().to_dict()


def headline(results: GemmResults) -> dict[str, Any]:
    """The numbers chapter 01's findings are built from."""
    ok = results.ok
    frame = results.frame
    statuses = frame.groupby("status")["backend"].unique().to_dict() if len(frame) else {}
    found: dict[str, Any] = {
        "backends_ok": sorted(ok["backend"].unique()),
        "backends_unavailable": sorted(set(statuses.get("unavailable", [])) - set(ok["backend"])),
        "failures": failure_counts(results),
        "bandwidth_tbps": results.bandwidth_tbps, "launch_us": results.launch_us,
        "raised": results.raised,
    }
    if not len(ok):
        return found
    best = ok.loc[ok["tflops"].idxmax()]
    smallest = ok[ok["m"] == ok["m"].min()]
    quickest = smallest.loc[smallest["tbps"].idxmax()]
    found.update(best=best.to_dict(), smallest=quickest.to_dict())
    return found


# -- the kernel's anatomy ---------------------------------------------------------------------------

ANATOMY_STAGES = schema.ANATOMY_STAGES


def anatomy(results: GemmResults) -> pd.DataFrame:
    """Per dissected kernel, format, shape and M: each stage variant's time beside the copy floor
    (the FP4 weights and activations at the measured bandwidth) and the launch floor, the share of
    the full kernel the loads alone take, how the kernel's config moves its tiles (`loads`) and
    adds its split-K partials (`reduction`).
    The "stream" stage (the same bytes read by one streaming launch: no stage of either kernel)
    is the point's, shown in every kernel's row."""
    frame = results.view.run.read_table("anatomy")
    frame = of_gpu(frame, lead_gpu(frame)) if len(frame) else frame
    ok = frame[(frame["status"] == "ok") & frame["stage"].isin(ANATOMY_STAGES)] if len(frame) else frame
    columns = ["backend", "fmt", "n", "k", "m", "loads", "reduction", *ANATOMY_STAGES, "copy_floor_us",
               "launch_floor_us", "load_share"]
    kernels = ok[ok["stage"] != "stream"] if len(ok) else ok
    if not len(kernels):
        return pd.DataFrame(columns=columns)
    point = ["fmt", "n", "k", "m"]
    wide = kernels.pivot_table(index=["backend", *point], columns="stage", values="median_us", aggfunc="median")
    wide = wide.reindex(columns=[s for s in ANATOMY_STAGES if s != "stream"]).reset_index()
    stream = ok[ok["stage"] == "stream"].groupby(point)["median_us"].median()
    wide["stream"] = [stream.get(tuple(key), np.nan) for key in wide[point].itertuples(index=False)]
    config = (kernels[kernels["stage"] == "full"].groupby(["backend", *point])["config"].first()
              if "config" in kernels else pd.Series(dtype=object))        # runs from before the column
    wide["loads"] = [load_path(config.get(tuple(key)))
                     for key in wide[["backend", *point]].itertuples(index=False)]
    wide["reduction"] = [reduction_path(config.get(tuple(key)), int(key.k))
                         for key in wide[["backend", *point]].itertuples(index=False)]
    bandwidth = results.bandwidth_tbps
    wide["copy_floor_us"] = [roofline.gemm_bytes(int(r.m), int(r.n), int(r.k), "fp4", r.fmt, "bf16") /
                             (bandwidth * 1e6) if bandwidth else np.nan for r in wide.itertuples(index=False)]
    wide["launch_floor_us"] = results.launch_us if results.launch_us else np.nan
    wide["load_share"] = 100 * wide["load"] / wide["full"]
    return wide[columns]


NESTED_STAGES = schema.ANATOMY_KERNELS["cuda-w4a16"]   # each variant adds one stage to the one before


def stage_increments(row) -> dict[str, float]:
    """What each of the CUDA kernel's nested stages adds to the one before it (us), from one row of
    `anatomy`: {"decode": decode - load, "mma": mma - decode, "full": full - mma}."""
    return {stage: row[stage] - row[before] for before, stage in zip(NESTED_STAGES, NESTED_STAGES[1:])}


def anatomy_kernel(table: pd.DataFrame) -> str | None:
    """The dissected kernel whose full kernel is fastest (median over the points every dissected
    kernel measured): the one the book's anatomy figure and findings show. None without rows."""
    timed = table.dropna(subset=["full"])
    if not len(timed):
        return None
    point = ["fmt", "n", "k", "m"]
    shared = timed.groupby(point)["backend"].transform("nunique") == timed["backend"].nunique()
    common = timed[shared] if shared.any() else timed
    return str(common.groupby("backend")["full"].median().idxmin())


def load_path(config_label) -> str:
    """How a kernel config moves its weight tiles, from its label: the CUDA kernel's ("cuda ...")
    16-byte loads straight into registers; a `TileConfig.label()`'s "TMA" or "cp.async" (its
    " tma" word), "... from tile-ordered bytes" with its " tiles" word (layout "tiles"); "—"
    when unknown."""
    if not isinstance(config_label, str):
        return "—"
    words = config_label.split()
    if words[:1] == ["cuda"]:
        return "16-byte loads to registers"
    return (("TMA" if "tma" in words else "cp.async")
            + (" from tile-ordered bytes" if "tiles" in words else ""))


def reduction_path(config_label, k: int) -> str:
    """How a CUDA kernel config ("cuda g<groups> ... k<kwarps> ... [c<cluster>]") adds its split-K
    partials at reduction length K: "no split-K" where one CTA covers K, "in a 6-CTA cluster"
    (distributed shared memory), else float atomics at L2; "—" for other kernels' labels."""
    if not isinstance(config_label, str) or config_label.split()[:1] != ["cuda"]:
        return "—"
    fields = {word[0]: int(word[1:]) for word in config_label.split()[1:]
              if word[:1] in "gkc" and word[1:].isdigit()}
    if "g" not in fields or "k" not in fields:
        return "—"
    if k <= 64 * fields["g"] * fields["k"]:
        return "no split-K (one CTA covers K)"
    if fields.get("c", 1) > 1:
        return f"split-K added in a {fields['c']}-CTA cluster (distributed shared memory)"
    return "split-K added by float atomics at L2"


# -- across GPUs ------------------------------------------------------------------------------------

DECODE_M = 64                         # "decode-sized" M, as chapter 02's power regime
SPREAD_COLUMNS = ["gpu_index", "pci_bus_id", "points", "median_vs_box", "slowest_vs_box",
                  "median_power_w", "median_sm_clock_mhz"]


def gpu_spread(results: GemmResults) -> pd.DataFrame:
    """Per GPU, over the correct points at decode-sized M that every GPU measured: its time
    against the box's median of the same point (median and worst ratio: > 1 is slower), its
    median power and SM clock in the energy windows. A slow or throttling card stands out; one
    row on a one-GPU box."""
    every = results.every_gpu
    ok = every[(every["status"] == "ok") & (every["m"] <= DECODE_M) & every["gpu_index"].notna()]
    if not len(ok):
        return pd.DataFrame(columns=SPREAD_COLUMNS)
    point = ["backend", "fmt", "n", "k", "m"]
    gpus = ok["gpu_index"].nunique()
    shared = ok.groupby(point)["gpu_index"].transform("nunique") == gpus
    ok = ok[shared].copy()
    ok["vs_box"] = ok["median_us"] / ok.groupby(point)["median_us"].transform("median")
    grouped = ok.groupby("gpu_index")
    table = pd.DataFrame({
        "pci_bus_id": grouped["pci_bus_id"].first(), "points": grouped.size(),
        "median_vs_box": grouped["vs_box"].median(), "slowest_vs_box": grouped["vs_box"].max(),
        "median_power_w": grouped["avg_power_w"].median(),
        "median_sm_clock_mhz": grouped["window_sm_clock_mhz"].median()}).reset_index()
    return table[SPREAD_COLUMNS]
