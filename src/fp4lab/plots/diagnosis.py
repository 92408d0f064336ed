"""Figures of chapter 04: speed by M against the reference run, the layer against its floors."""

from __future__ import annotations

import pandas as pd

from fp4lab.plots.common import caption, new_axes


def plot_speed_by_m(gemm: pd.DataFrame, backend: str, run_label: str,
                    reference: pd.DataFrame | None = None, reference_label: str = "reference"):
    """TFLOPS against M (log-log) per weight shape; the reference run dashed beside this one."""
    fig, ax = new_axes()
    for frame, label, style in ((gemm, run_label, "-o"), (reference, reference_label, "--s")):
        if frame is None or not len(frame):
            continue
        ok = frame[(frame["status"] == "ok") & (frame["backend"] == backend)]
        for (n, k), shape in ok.groupby(["n", "k"]):
            curve = shape.groupby("m")["tflops"].median()
            ax.plot(curve.index, curve.values, style, label=f"{label}: {n}x{k}", markersize=4)
    ax.set(xscale="log", yscale="log", xlabel="M (tokens in the GEMM)", ylabel="TFLOPS",
           title=f"{backend}: GEMM speed by M")
    ax.legend(fontsize=8)
    caption(fig, f"correct points only (status ok); run {run_label}")
    return fig


def plot_layer_breakdown(breakdown: dict, run_label: str):
    """One MoE layer at decode: the loop's measured time against the launch, memory, compute floors."""
    fig, ax = new_axes((8.0, 3.0))
    weights = breakdown.get("weight_dtype") or "unknown-dtype"
    bars = {"measured loop": (breakdown["loop_us"], "C3"), "launch floor": (breakdown["launch_floor_us"], "C0"),
            f"weight-read floor ({weights})": (breakdown["memory_floor_us"], "C1"),
            "compute floor": (breakdown["compute_floor_us"], "C2")}
    if weights != "fp4":  # the what-if: the same weights stored as FP4, read at the same bandwidth
        bars[f"what if: {breakdown['fmt']} weight read"] = (breakdown["fp4_read_floor_us"], "C4")
    bars = {name: bar for name, bar in bars.items() if pd.notna(bar[0])}
    ax.barh(list(bars), [value for value, _ in bars.values()], color=[color for _, color in bars.values()])
    ax.invert_yaxis()
    ax.set(xlabel="microseconds per MoE layer",
           title=f"batch {breakdown['batch']}: {breakdown['active_experts']:.0f} experts x "
                 f"{breakdown['mean_m']:.1f} tokens ({breakdown['backend']})")
    caption(fig, f"run {run_label}; {breakdown['shape_note']}; ceilings: {breakdown['ceilings_source']}")
    return fig


def plot_concurrency(concurrency: pd.DataFrame, run_label: str):
    """MoE GEMM time per token and layer as the decode batch grows."""
    fig, ax = new_axes((8.0, 3.5))
    ax.plot(concurrency["batch"], concurrency["us_per_token"], "-o")
    ax.set(xscale="log", xlabel="decode batch (concurrent requests)", ylabel="us per token per layer",
           title="what concurrency buys")
    caption(fig, f"run {run_label}; GEMM times from the sweep, tokens per expert from the routing model")
    return fig
