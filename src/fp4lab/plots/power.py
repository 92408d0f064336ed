"""Chapter 02's figures: power and SM clock against time (with which backend ran when), power
and TFLOPS/W per sweep point, and the throttle reasons. Frames in, figures out."""

from __future__ import annotations

import pandas as pd

from fp4lab.plots.common import (colour_handles, figure_legend, log_axis, new_figure, palette, style_handles,
                                 tokens_axis)


def _seconds(frame: pd.DataFrame, t0: float) -> pd.Series:
    return frame["t"] - t0


def _windows(ax, points: pd.DataFrame, t0: float, colours: dict) -> None:
    """Shade each energy window in its backend's colour: which backend ran when."""
    for row in points.dropna(subset=["window_start_s", "window_end_s"]).itertuples(index=False):
        ax.axvspan(row.window_start_s - t0, row.window_end_s - t0, color=colours[row.backend],
                   alpha=0.18, lw=0, zorder=0, label=f"window: {row.backend}")


def timeline(telemetry: pd.DataFrame, points: pd.DataFrame, limit_w: float | None):
    """Top: instant and ~1 s averaged power with the enforced limit; bottom: the SM clock. Shaded
    spans are the sweep's energy windows, coloured by the backend measured in them."""
    fig, axes = new_figure(2, 1, height_in=5.4, sharex=True)
    power_ax, clock_ax = axes[:, 0]
    t0 = float(telemetry["t"].min())
    colours = palette(sorted(points["backend"].unique())) if len(points) else {}
    gpus = telemetry["gpu"].nunique()
    for ax in (power_ax, clock_ax):
        _windows(ax, points, t0, colours)
    lines = palette(["instant", "average"] + [f"clock {g}" for g in sorted(telemetry["gpu"].unique())])
    for gpu, rows in telemetry.groupby("gpu"):
        tag = f" (GPU {gpu})" if gpus > 1 else ""
        power_ax.plot(_seconds(rows, t0), rows["power_instant_w"], lw=0.9, color=lines["instant"],
                      label=f"instant power{tag}")
        power_ax.plot(_seconds(rows, t0), rows["power_avg_w"], lw=1.8, color=lines["average"],
                      label=f"~1 s average (nvmlDeviceGetPowerUsage){tag}")
        clock_ax.plot(_seconds(rows, t0), rows["sm_clock_mhz"], lw=1.1, color=lines[f"clock {gpu}"],
                      label=f"SM clock{tag}")
    if limit_w:
        power_ax.axhline(limit_w, color="firebrick", ls="--", lw=1.2, label=f"enforced limit {limit_w:.0f} W")
    top = max(limit_w or 0, telemetry[["power_instant_w", "power_avg_w"]].max().max())
    power_ax.set(ylabel="board power (W)", ylim=(0, 1.12 * top))
    clock_ax.set(ylabel="SM clock (MHz)", ylim=(0, None), xlabel="seconds since the first sample")
    figure_legend(fig, axes, columns=3)
    return fig


SHAPE_STYLES = ("-", "--", ":", "-.")     # line style: the weight shape (colour: the backend)


def per_point(points: pd.DataFrame, limit_w: float | None):
    """Power in each point's energy window and TFLOPS/W against M: colour the backend, line style
    the weight shape (one colour per backend x shape made 18 near-identical hues)."""
    fig, axes = new_figure(1, 2, height_in=4.2, sharex=True)
    power_ax, efficiency_ax = axes[0]
    points = points.assign(shape=points["n"].astype(int).astype(str) + "x" + points["k"].astype(int).astype(str))
    colours = palette(sorted(points["backend"].unique()))
    largest_first = points.assign(size=points["n"] * points["k"]).sort_values("size", ascending=False, kind="stable")
    styles = {shape: SHAPE_STYLES[i % len(SHAPE_STYLES)] for i, shape in enumerate(largest_first["shape"].unique())}
    for (backend, shape), rows in points.sort_values("m").groupby(["backend", "shape"]):
        for ax, column in ((power_ax, "avg_power_w"), (efficiency_ax, "tflops_per_w")):
            ax.plot(rows["m"], rows[column], styles[shape], marker="o", ms=3, color=colours[backend])
    if limit_w:
        power_ax.axhline(limit_w, color="firebrick", ls="--", lw=1.2, label=f"limit {limit_w:.0f} W")
        power_ax.set_ylim(0, 1.12 * max(limit_w, points["avg_power_w"].max()))
    for ax in (power_ax, efficiency_ax):
        tokens_axis(ax)
        ax.set_xlabel("M (tokens)")
    power_ax.set(ylabel="average power in the window (W)")
    efficiency_ax.set(ylabel="TFLOPS per watt")
    log_axis(efficiency_ax)
    figure_legend(fig, axes, columns=3, extra=colour_handles(colours) + style_handles(styles))
    return fig


def throttle_reasons(shares: dict[str, float], benign: set[str]):
    """Share of readings in which each clocks-event reason was active (red: throttling)."""
    fig, axes = new_figure(height_in=max(2.0, 0.35 * len(shares) + 1.0))
    ax = axes[0, 0]
    names = list(shares)
    ax.barh(names, [100 * shares[name] for name in names],
            color=["0.6" if name in benign else "firebrick" for name in names])
    ax.set(xlabel="% of readings", xlim=(0, 100))
    ax.invert_yaxis()
    return fig
