"""Chapter 01's figures and tables: what the GEMM sweep measured, beside a reference GPU.

Every function takes the tidy gemm table (one row per backend x fmt x N x K x M, see
results.GEMM_COLUMNS) and, where it draws roofs, the run's `run.json["sweep"]["ceilings"]`.
Shape legend: M tokens, N output features, K reduction dim; the GEMM is [M, K] @ [K, N].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.plots.common import caption, new_axes
from fp4lab.results import RunDir, device_label, reference_run

STATUSES = ("ok", "wrong_result", "unavailable", "error", "oom")

# The seed's table, as published (docs/REFERENCES.md): FlashInfer CUTLASS FP4 on an RTX PRO 6000
# Blackwell (sm_120), shapes ~ M x 2048 x 6144 and larger; % of an estimated ~2000 dense TOPS.
SEED_SM120_SOURCE = ("seed document (opencode session, msg 869): FlashInfer CUTLASS FP4 GEMMs on "
                     "RTX PRO 6000 Blackwell (sm_120); % of an estimated ~2000 TOPS dense peak")
SEED_SM120_TABLE = pd.DataFrame({
    "M": ["1", "64", "256", "512", "1024", "4096+"],
    "TFLOPS": ["0.3-0.8", "15-55", "81-219", "161-437", "849", "1190-1313"],
    "% of peak": ["<0.1%", "1-3%", "4-11%", "8-22%", "42%", "60-66%"],
    "regime (as the seed read it)": ["launch overhead / memory", "launch overhead",
                                     "starting to compute", "", "", "saturating near 1300"],
})


# -- runs -------------------------------------------------------------------------------------

def find_reference_run(reference_dir: str | Path = "") -> Path | None:
    """`reference_dir` if given ("none": no reference), else the newest committed GEMM run."""
    return reference_run(reference_dir, "gemm")


def load_run(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    run = RunDir.open(path)
    return run.read_table("gemm"), run.run_json()


def gpu_label(info: dict[str, Any]) -> str:
    return device_label(info)


def caption_text(info: dict[str, Any]) -> str:
    """Provenance for a figure: run, device, timer conditions, versions."""
    prov, sweep = info.get("provenance", {}), info.get("sweep", {})
    config = sweep.get("config", {})
    timer = config.get("timer", {})
    versions = prov.get("versions", {})
    conditions = ", ".join(f"{key}={value}" for key, value in timer.items()
                           if key in ("cold_l2", "use_graph", "warmup_s"))
    return (f"run {info.get('run_id', '?')} on {gpu_label(info)}; median of "
            f"{config.get('repeats', '?')} repeats ({conditions}); torch {versions.get('torch')}, "
            f"fp4lab {prov.get('fp4lab_git_sha')}")


# -- availability -----------------------------------------------------------------------------

def availability_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Points per backend (rows) and status (columns)."""
    counts = frame.groupby(["backend", "status"]).size().unstack(fill_value=0)
    return counts.reindex(columns=[s for s in STATUSES if s in counts.columns], fill_value=0)


def availability_reasons(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per backend and failing status: how many points, and the first message."""
    failed = frame[frame["status"] != "ok"]
    grouped = failed.groupby(["backend", "status"], sort=True)
    return pd.DataFrame({"points": grouped.size(), "reason": grouped["error"].first()}).reset_index()


def availability_matrix(frame: pd.DataFrame, info: dict[str, Any] | None = None):
    """Heatmap of points per backend x status: which backends ran, which could not and why."""
    import seaborn as sns

    counts = availability_counts(frame)
    fig, ax = new_axes((7.0, 0.45 * len(counts) + 1.5))
    sns.heatmap(counts, annot=True, fmt="d", cmap="Blues", cbar=False, linewidths=0.5, ax=ax)
    ax.set_xlabel("status")
    ax.set_ylabel("backend")
    ax.set_title("Points per backend and status")
    if info:
        caption(fig, caption_text(info))
    return fig


# -- speed against M --------------------------------------------------------------------------

def _shapes(frame: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(n), int(k)) for n, k in zip(frame["n"], frame["k"])})


def _draw_metric(ax, frame: pd.DataFrame, metric: str, colors: dict[str, Any], dashed: bool,
                 suffix: str) -> None:
    for (backend, fmt), points in frame.groupby(["backend", "fmt"]):
        points = points.sort_values("m")
        style = "--" if dashed else ("-" if fmt == "nvfp4" else ":")
        ax.plot(points["m"], points[metric], style, marker="o", markersize=3,
                color=colors[backend], alpha=0.55 if dashed else 1.0,
                label=f"{backend} {fmt}{suffix}")


def metric_vs_m(frame: pd.DataFrame, metric: str, ylabel: str, info: dict[str, Any] | None = None,
                reference: pd.DataFrame | None = None, reference_label: str = "reference"):
    """`metric` against M (log2 x, log y), one panel per weight shape, one line per backend x fmt.

    The reference run, when given, is drawn dashed in the same colours.
    """
    import matplotlib.pyplot as plt

    measured = frame[frame["status"] == "ok"].dropna(subset=[metric])
    ref = None
    if reference is not None and len(reference):
        ref = reference[reference["status"] == "ok"].dropna(subset=[metric])
    if measured.empty and (ref is None or ref.empty):
        raise ValueError(f"no ok points with {metric} to plot")
    shapes = _shapes(pd.concat([measured, ref]) if ref is not None else measured)
    backends = sorted(set(measured["backend"]) | (set(ref["backend"]) if ref is not None else set()))
    palette = plt.get_cmap("tab10")
    colors = {backend: palette(i % 10) for i, backend in enumerate(backends)}
    fig, axes = new_axes(ncols=len(shapes))
    axes = np.atleast_1d(axes)
    for ax, (n, k) in zip(axes, shapes):
        _draw_metric(ax, measured[(measured["n"] == n) & (measured["k"] == k)], metric, colors,
                     False, "")
        if ref is not None:
            _draw_metric(ax, ref[(ref["n"] == n) & (ref["k"] == k)], metric, colors, True,
                         f" ({reference_label})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={n}, K={k}")
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=7, loc="best")
    if info:
        caption(fig, caption_text(info))
    return fig


def tflops_vs_m(frame, info=None, reference=None, reference_label="reference"):
    return metric_vs_m(frame, "tflops", "achieved TFLOP/s", info, reference, reference_label)


def pct_peak_vs_m(frame, info=None, reference=None, reference_label="reference",
                  against: str = "spec"):
    """% of the spec (or measured) peak for each backend's operand dtype, against M."""
    if against not in ("spec", "measured"):
        raise ValueError(f"against: {against!r} is not 'spec' or 'measured'")
    return metric_vs_m(frame, f"pct_peak_{against}", f"% of {against} peak", info, reference,
                       reference_label)


# -- roofline ---------------------------------------------------------------------------------

def roofs(ceilings: dict[str, Any], intensity: np.ndarray) -> dict[str, np.ndarray]:
    """Attainable TFLOP/s = min(peak, bandwidth x intensity) per (source, dtype) ceiling."""
    lines = {}
    for source in ("measured", "spec"):
        values = ceilings.get(source) or {}
        bandwidth = values.get("bandwidth_tbps")
        if not bandwidth:
            continue
        for dtype, peak in (values.get("peak_tflops") or {}).items():
            if peak:
                lines[f"{source} {dtype}"] = np.minimum(peak, bandwidth * intensity)
    return lines


def roofline_chart(frame: pd.DataFrame, ceilings: dict[str, Any], info: dict[str, Any] | None = None):
    """Achieved TFLOP/s against arithmetic intensity (FLOP per byte moved), under the roofs."""
    import matplotlib.pyplot as plt

    measured = frame[(frame["status"] == "ok")].dropna(subset=["tflops", "tbps"])
    if measured.empty:
        raise ValueError("no ok points with tflops and tbps to place on the roofline")
    intensity = measured["tflops"] / measured["tbps"]          # FLOP per byte
    fig, ax = new_axes()
    palette = plt.get_cmap("tab10")
    for i, (backend, points) in enumerate(measured.groupby("backend")):
        ax.scatter(points["tflops"] / points["tbps"], points["tflops"], s=14,
                   color=palette(i % 10), label=backend, zorder=3)
    grid = np.logspace(np.log10(intensity.min() / 2), np.log10(intensity.max() * 2), 200)
    for label, line in roofs(ceilings or {}, grid).items():
        ax.plot(grid, line, "-" if label.startswith("measured") else "--", lw=1, color="0.3",
                alpha=0.8)
        ax.annotate(label, (grid[-1], line[-1]), fontsize=7, ha="right", va="bottom", color="0.3")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Roofline: measured (solid) and spec (dashed) ceilings")
    ax.legend(fontsize=7)
    if info:
        caption(fig, caption_text(info))
    return fig


# -- tables and numbers for the prose ---------------------------------------------------------

def best_backend(frame: pd.DataFrame) -> str:
    """The backend with the highest TFLOP/s at the largest M it measured correctly."""
    measured = frame[frame["status"] == "ok"].dropna(subset=["tflops"])
    if measured.empty:
        raise ValueError("no ok points: no backend measured anything correctly")
    top_m = measured[measured["m"] == measured["m"].max()]
    return str(top_m.loc[top_m["tflops"].idxmax(), "backend"])


def _span(values: pd.Series, unit: str = "") -> str:
    """`low-high` to three significant digits, or one value when they agree within 5%."""
    low, high = values.min(), values.max()
    if np.isclose(low, high, rtol=0.05):
        return f"{high:.3g}{unit}"
    return f"{low:.3g}-{high:.3g}{unit}"


def seed_table(frame: pd.DataFrame, backend: str | None = None) -> pd.DataFrame:
    """The seed's table from this run: M -> TFLOPS -> % of peak -> regime (ranges over shapes)."""
    backend = backend or best_backend(frame)
    measured = frame[(frame["backend"] == backend) & (frame["status"] == "ok")]
    if measured.empty:
        raise ValueError(f"backend: {backend!r} has no ok points in this run")
    rows = []
    for m, points in measured.groupby("m"):
        pct = points["pct_peak_spec"].dropna()
        pct_of = "spec"
        if pct.empty:
            pct, pct_of = points["pct_peak_measured"].dropna(), "measured"
        rows.append({"M": int(m), "TFLOPS": _span(points["tflops"]),
                     "% of peak": _span(pct, "%") + f" ({pct_of})" if len(pct) else "-",
                     "regime": ", ".join(sorted(set(points["bound"].dropna()))) or "-"})
    table = pd.DataFrame(rows)
    table.attrs["backend"] = backend
    return table


def headline(frame: pd.DataFrame, backend: str | None = None) -> dict[str, Any]:
    """Numbers the chapter's sentences are built from, for one backend (default: the best)."""
    backend = backend or best_backend(frame)
    measured = frame[(frame["backend"] == backend) & (frame["status"] == "ok")]
    smallest = measured[measured["m"] == measured["m"].min()]
    at_small = smallest.loc[smallest["tflops"].idxmax()]
    largest = measured.loc[measured["tflops"].idxmax()]
    half = measured[measured["pct_peak_measured"] >= 50]
    failing = frame[frame["status"].isin(["wrong_result", "error", "oom"])]
    return {
        "backend": backend,
        "small_m": int(at_small["m"]),
        "small_tflops": float(at_small["tflops"]),
        "small_pct_spec": _float_or_none(at_small["pct_peak_spec"]),
        "small_bound": at_small["bound"],
        "small_shape": (int(at_small["n"]), int(at_small["k"])),
        "best_tflops": float(largest["tflops"]),
        "best_m": int(largest["m"]),
        "best_pct_spec": _float_or_none(largest["pct_peak_spec"]),
        "half_measured_m": int(half["m"].min()) if len(half) else None,
        "available": sorted(frame.loc[frame["status"] == "ok", "backend"].unique()),
        "unavailable": sorted(frame.loc[frame["status"] == "unavailable", "backend"].unique()),
        "failing": failing.groupby(["backend", "status"]).size().to_dict(),
    }


def _float_or_none(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def fp4_weights_at_decode(frame: pd.DataFrame, bandwidth_tbps: float | None,
                          baseline: str = "torch-bf16") -> pd.DataFrame:
    """Per shape and format at the smallest M: the fastest correct backend that reads FP4 weights
    against the bf16 baseline, and the FP4 weight-read floor at the measured bandwidth.

    This is the decode question on any GPU: FP4 weights move ~0.56 B per value instead of 2, so at
    small M (weight-read bound) they should win by up to ~3.5x, if the kernel keeps up.
    """
    from fp4lab import backends, roofline
    from fp4lab.sweep_worker import roofline_dtypes

    ok = frame[frame["status"] == "ok"]
    if not len(ok):
        return pd.DataFrame()
    m = int(ok["m"].min())
    at_m = ok[ok["m"] == m]
    reads_fp4 = {name for name in at_m["backend"].unique()
                 if name in backends.names() and roofline_dtypes(backends.get(name))[0] == "fp4"}
    rows = []
    for (fmt, n, k), group in at_m.groupby(["fmt", "n", "k"]):
        fp4 = group[group["backend"].isin(reads_fp4)]
        base = group[group["backend"] == baseline]
        if not len(fp4) or not len(base):
            continue
        best = fp4.loc[fp4["median_us"].idxmin()]
        floor = (roofline.gemm_bytes(m, int(n), int(k), "fp4", fmt, "bf16") / (bandwidth_tbps * 1e6)
                 if bandwidth_tbps else None)
        rows.append({"fmt": fmt, "n": int(n), "k": int(k), "m": m, "fp4_backend": best["backend"],
                     "fp4_us": float(best["median_us"]), f"{baseline}_us": float(base["median_us"].iloc[0]),
                     "speedup": float(base["median_us"].iloc[0] / best["median_us"]),
                     "fp4_floor_us": floor})
    return pd.DataFrame(rows)


def fp4_decode_finding(table: pd.DataFrame) -> str | None:
    """One sentence from `fp4_weights_at_decode`'s table: the best case and the range over cases."""
    if not len(table):
        return None
    best = table.loc[table["speedup"].idxmax()]
    floor = (f"; the FP4 weight-read floor there is {best['fp4_floor_us']:.3g} us"
             if pd.notna(best["fp4_floor_us"]) else "")
    verdict = "faster" if best["speedup"] > 1 else "slower"
    return (f"FP4 weights at M={int(best['m'])}: the best case is {best['fp4_backend']} on "
            f"{int(best['n'])}x{int(best['k'])} {best['fmt']} at {best['fp4_us']:.3g} us, {verdict} than "
            f"torch-bf16's {best['torch-bf16_us']:.3g} us ({best['speedup']:.2g}x){floor}; over "
            f"{len(table)} shape/format cases the FP4 reader runs at "
            f"{table['speedup'].min():.2g}-{table['speedup'].max():.2g}x the bf16 speed.")
