"""Chapter 04's figures: the diagnosed layer against its floors, every path at decode, and what
concurrency buys per token."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab import text
from fp4lab.plots.common import figure_legend, log_axis, new_figure, palette, widen_to_labels


def layer_against_floors(path: dict, fp4_floor_us: float | None):
    """One MoE layer at decode: the diagnosed path's measured time beside its three floors and the
    FP4 what-if (the same experts' weights stored as FP4, read at the measured bandwidth)."""
    bars = {f"measured: {path['path']}": path["layer_us"], "launch floor": path["launch_floor_us"],
            f"weight-read floor ({path['weight_dtype']} weights)": path["memory_floor_us"],
            f"compute floor ({path['math_dtype']} peak)": path["compute_floor_us"]}
    if path["weight_dtype"] != "fp4" and fp4_floor_us:
        bars["what if: FP4 weight read"] = fp4_floor_us
    bars = {name: value for name, value in bars.items() if value is not None and np.isfinite(value)}
    colours = palette(list(bars))
    fig, axes = new_figure(height_in=0.45 * len(bars) + 1.2)
    ax = axes[0, 0]
    names = list(bars)
    ax.barh(names, [bars[n] / 1000 for n in names], color=[colours[n] for n in names])
    for y, name in enumerate(names):
        ax.text(bars[name] / 1000, y, f" {text.us(bars[name])}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set(xlabel="milliseconds per MoE layer")
    ax.set_xlim(0, 1.18 * max(bars.values()) / 1000)
    return fig


PATHS_DRAWN = 12      # the fastest paths drawn (the table below the figure holds them all)


def paths(frame: pd.DataFrame):
    """The fastest measured paths' layer times at decode (linear: bar lengths compare), the
    diagnosed one first, each with its weight-read floor."""
    frame = frame.head(PATHS_DRAWN)
    colours = palette(sorted(frame["weight_dtype"].unique()))
    fig, axes = new_figure(height_in=0.32 * len(frame) + 1.3)
    ax = axes[0, 0]
    y = np.arange(len(frame))
    # a loop of single GEMMs is a model (chapter 04's loop model), not a timed layer: hatched
    modelled = (frame["kind"] == "gemm-loop") if "kind" in frame else pd.Series(False, index=frame.index)
    bars = ax.barh(y, frame["layer_us"] / 1000, color=[colours[d] for d in frame["weight_dtype"]])
    for bar, model in zip(bars, modelled):
        if model:
            bar.set(hatch="//", edgecolor="white", alpha=0.6)
    ax.scatter(frame["memory_floor_us"] / 1000, y, marker="|", s=200, color="black", zorder=3,
               label="its weight-read floor")
    formats = frame["fmt"] if "fmt" in frame else [None] * len(frame)
    ax.set_yticks(y, [f"{p}{f' {f}' if isinstance(f, str) else ''} ({s})"      # a path's two formats told apart
                      for p, f, s in zip(frame["path"], formats, frame["source"])])
    ax.invert_yaxis()
    ax.set(xlabel="milliseconds per MoE layer")
    ax.set_xlim(0, 1.05 * float(frame["layer_us"].max()) / 1000)
    from matplotlib.patches import Patch

    # below the panel: inside it, the legend covers the longest bars
    extra = [Patch(color=colours[d], label=f"{d} weights") for d in colours]
    if modelled.any():
        extra.append(Patch(facecolor="lightgrey", hatch="//", edgecolor="grey",
                           label="modelled: a loop of single timed GEMMs"))
    figure_legend(fig, axes, extra=extra)
    return fig


def concurrency(table: pd.DataFrame, now: int):
    """GEMM time per token per layer as the decode batch grows (the concurrency lever)."""
    fig, axes = new_figure(height_in=3.0)
    ax = axes[0, 0]
    ax.plot(table["batch"], table["us_per_token"], "-o", ms=4, color=palette(["curve"])["curve"])
    # each point's value written beside it: a short log range leaves its lowest points between ticks
    for batch, us in zip(table["batch"], table["us_per_token"]):
        ax.annotate(f"{us:.3g}", (batch, us), xytext=(4, 4), textcoords="offset points", fontsize=8,
                    ha="left", color="0.25")
    ax.axvline(now, color="0.4", ls="--", lw=1)
    ax.annotate(f"B={now} now", (now, table["us_per_token"].max()), xytext=(4, 0),
                textcoords="offset points", fontsize=9, va="top")
    ax.set(xlabel="decode batch B", ylabel="us per token per layer")
    log_axis(ax, which="x")
    log_axis(ax)
    widen_to_labels(ax)
    return fig
