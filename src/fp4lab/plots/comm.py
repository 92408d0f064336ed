"""Chapter 05's figures: each collective's time against its message size, and each layout's step
time against the decode batch. Frames in, figures out."""

from __future__ import annotations

import pandas as pd

from fp4lab.plots.common import figure_legend, log_axis, new_figure, palette, tokens_axis


def _series_label(row) -> str:
    extra = f" {row.dtype}" if row.op.startswith("all_to_all") else ""
    routing = f" {row.routing}" if isinstance(row.routing, str) and row.routing != "uniform" else ""
    return f"{row.op}{extra}{routing}, {row.world_size} rank{'s' if row.world_size > 1 else ''}"


def comm_times(ok: pd.DataFrame):
    """Median time (slowest rank) against the per-rank buffer, one line per op x ranks x dtype."""
    fig, axes = new_figure(1, 1, height_in=4.0)
    ax = axes[0, 0]
    frame = ok.assign(series=[_series_label(row) for row in ok.itertuples(index=False)])
    colours = palette(sorted(frame["series"].unique()))
    for series, rows in frame.sort_values("bytes").groupby("series"):
        ax.plot(rows["bytes"], rows["median_us"], "-o", ms=3, color=colours[series], label=series)
    log_axis(ax, which="x")
    log_axis(ax, which="y")
    ax.set(xlabel="bytes per rank", ylabel="median time (us)")
    figure_legend(fig, axes, columns=2)
    return fig


def layout_steps(layouts: pd.DataFrame, decode_batch: int):
    """Step time (MoE part) per layout against the decode batch; the decode batch marked."""
    fig, axes = new_figure(1, 2, height_in=3.8)
    step_ax, share_ax = axes[0]
    timed = layouts.dropna(subset=["step_us"])
    colours = palette(list(dict.fromkeys(layouts["layout"])))
    for layout, rows in timed.sort_values("batch").groupby("layout", sort=False):
        step_ax.plot(rows["batch"], rows["step_us"] / 1e3, "-o", ms=3, color=colours[layout], label=layout)
        share_ax.plot(rows["batch"], 100 * rows["comm_share"], "-o", ms=3, color=colours[layout], label=layout)
    for ax in (step_ax, share_ax):
        tokens_axis(ax)
        ax.axvline(decode_batch, color="0.5", ls=":", lw=1)
        ax.set_xlabel("decode batch B (tokens per step)")
    log_axis(step_ax)
    step_ax.set(ylabel="MoE part of a step (ms)")
    share_ax.set(ylabel="share in communication (%)", ylim=(0, 100))
    figure_legend(fig, axes, title="layout", columns=4)
    return fig
