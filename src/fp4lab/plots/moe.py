"""Chapter 03's figures: tokens per expert, mean vs busiest, each method's layer time against
the decode batch, the layer model against measurement, and predicted utilization."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab.plots.common import (colour_handles, figure_legend, log_axis, new_figure, palette, style_handles,
                                 tokens_axis, widen_to_labels)
from fp4lab.plots.gemm import anatomy


def loads(loads_by_batch: dict[int, np.ndarray], table: pd.DataFrame):
    """Left: distribution of tokens per expert per step, one curve per batch. Right: the mean
    expert, the p99 and the busiest (mean over steps) against the batch."""
    fig, axes = new_figure(1, 2, height_in=3.6)
    hist_ax, trend_ax = axes[0]
    colours = palette([f"B={b}" for b in loads_by_batch])
    for batch, batch_loads in loads_by_batch.items():
        values = batch_loads.ravel()
        hist_ax.hist(values, bins=np.arange(values.max() + 2) - 0.5, histtype="step", density=True,
                     color=colours[f"B={batch}"], label=f"B={batch}")
    hist_ax.set(xlabel="tokens one expert gets in one step", ylabel="share of (expert, step)")
    per_batch = table.drop_duplicates("batch")
    trend = palette(["mean expert", "p99 expert", "busiest expert"])
    for column, label in (("mean_tokens_per_expert", "mean expert"), ("p99_tokens_per_expert", "p99 expert"),
                          ("mean_max_tokens_per_expert", "busiest expert")):
        trend_ax.plot(per_batch["batch"], per_batch[column], "-o", ms=3, color=trend[label], label=label)
    trend_ax.set(xlabel="decode batch B (tokens per step)", ylabel="tokens per expert")
    log_axis(trend_ax, which="x")
    log_axis(trend_ax)
    figure_legend(fig, axes, columns=4)
    return fig


FORMAT_STYLES = {"nvfp4": "-", "mxfp4": "--", "": ":"}     # line style: the FP4 format ("": bf16/fp8 weights)
FORMAT_LABELS = {"nvfp4": "NVFP4 weights", "mxfp4": "MXFP4 weights", "": "bf16 / fp8 weights"}


def layer_time_by_batch(layers: pd.DataFrame):
    """Each method's layer time (routed experts of one MoE layer, one device) against B: colour
    the method, line style its FP4 format (so a method's two formats read as a pair)."""
    fig, axes = new_figure(height_in=4.2)
    ax = axes[0, 0]
    layers = layers.assign(fmt=layers["fmt"].map(lambda f: f if isinstance(f, str) else ""))
    colours = palette(sorted(layers["method"].unique()))
    for (method, fmt), rows in layers.sort_values("batch").groupby(["method", "fmt"]):
        ax.plot(rows["batch"], rows["layer_us"] / 1000, FORMAT_STYLES.get(fmt, "-."), marker="o", ms=3,
                color=colours[method])
    ax.set(xlabel="decode batch B", ylabel="layer time (ms)")
    log_axis(ax)
    widen_to_labels(ax)
    tokens_axis(ax)
    shown = [fmt for fmt in FORMAT_STYLES if fmt in set(layers["fmt"])]
    figure_legend(fig, axes, columns=3, extra=colour_handles(colours) + style_handles(
        {FORMAT_LABELS[fmt]: FORMAT_STYLES[fmt] for fmt in shown}))
    return fig


def model_vs_measured(compared: pd.DataFrame):
    """The layer model's error against each measured point, per method and batch."""
    fig, axes = new_figure(height_in=3.4)
    ax = axes[0, 0]
    colours = palette(sorted(compared["method"].unique()))
    batches = sorted(compared["batch"].dropna().unique())
    width = 0.8 / max(1, len(colours))
    for offset, (method, rows) in enumerate(compared.groupby("method")):
        means = rows.groupby("batch")["error_pct"].mean().reindex(batches)
        ax.bar(np.arange(len(batches)) + (offset - (len(colours) - 1) / 2) * width, means, width,
               color=colours[method], label=method)
    band = 15.0
    ax.axhspan(-band, band, color="0.92", zorder=0, label=f"within {band:.0f}%")
    # symmetric, with room outside the band, so that it reads as a band and not as the background
    largest = float(np.nanmax(np.abs(compared["error_pct"]))) if compared["error_pct"].notna().any() else 0.0
    limit = max(band * 5 / 3, 1.15 * largest)
    ax.set_ylim(-limit, limit)
    ax.set_xticks(np.arange(len(batches)), [str(int(b)) for b in batches])
    ax.set(xlabel="decode batch B", ylabel="(model - measured) / measured (%)")
    figure_legend(fig, axes, columns=4)
    return fig


def utilization(table: pd.DataFrame, target: float):
    """Predicted utilization of the busiest rank (grouped kernel, bf16) per EP degree against B."""
    fig, axes = new_figure(height_in=3.4)
    ax = axes[0, 0]
    colours = palette([f"EP={int(ep)}" for ep in sorted(table["ep"].unique())])
    for ep, rows in table.groupby("ep"):
        ax.plot(rows["batch"], 100 * rows["grouped_utilization"], "-o", ms=3, color=colours[f"EP={int(ep)}"],
                label=f"EP={int(ep)}")
    ax.axhline(100 * target, color="0.3", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set(xlabel="decode batch B", ylabel="predicted utilization (% of bf16 peak)")
    log_axis(ax, which="x")
    figure_legend(fig, axes, columns=5)
    return fig


FUSED_STAGE_LABELS = {"load": "loads only", "decode": "loads and decode, no MMA", "full": "whole call",
                      "compute": "decode and MMAs without the weights' read"}


def fused_anatomy(table: pd.DataFrame):
    """Each anatomy build of fp4lab's fused MoE per (format, batch), in ms, with the weights' read
    floor as a tick: chapter 03's anatomy figure for a whole layer (frame: analysis.fused_anatomy)."""
    table = table.assign(mx=table["fmt"] != "nvfp4").sort_values(["batch", "mx"])   # NVFP4 on top
    labels = [f"{r.fmt.upper()}, B={int(r.batch)}" for r in table.itertuples(index=False)]
    in_ms = table.assign(**{column: table[column] / 1000 for column in FUSED_STAGE_LABELS},
                         copy_floor_us=table["read_floor_us"] / 1000)
    fig = anatomy(in_ms, labels, floor_label="weight-read floor (FP4 weights at the measured bandwidth)",
                  stage_labels=FUSED_STAGE_LABELS)
    fig.axes[0].set(xlabel="time per layer (ms)")
    return fig
