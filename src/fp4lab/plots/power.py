"""Chapter 02's figures: power and SM clock against time (with which backend ran when), power
and TFLOPS/W per sweep point, and the throttle reasons. Frames in, figures out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab.plots.common import (backend_palette, colour_handles, figure_legend, log_axis, new_figure, palette,
                                 tokens_axis)
from fp4lab.schema import TELEMETRY_SESSION_GAP_S


GAP_SHOWN_S = 2.0   # a pause between sampling sessions is cut from the time axis down to this, and marked


class SampledTime:
    """Seconds since the first sample with the pauses between resumed sessions cut out, so a run
    resumed after half an hour draws its sessions side by side, not a straight line over the gap."""

    def __init__(self, t: pd.Series):
        times = np.unique(t.to_numpy(dtype=float))
        gaps = np.diff(times)
        cut = np.flatnonzero(gaps > TELEMETRY_SESSION_GAP_S)
        self.t0, self.starts = times[0], times[cut + 1]
        self.firsts = np.concatenate([[times[0]], self.starts])     # each session's first sample ...
        self.lasts = np.concatenate([times[cut], [times[-1]]])       # ... and its last
        self.removed = np.concatenate([[0.0], np.cumsum(gaps[cut] - GAP_SHOWN_S)])

    def sampled(self, t) -> np.ndarray:
        """Whether each time falls inside a sampling session (within a pause's length of its
        samples): a time outside every session has no place on the cut axis."""
        t = np.asarray(t, dtype=float)
        index = np.clip(np.searchsorted(self.firsts, t, side="right") - 1, 0, len(self.firsts) - 1)
        gap = TELEMETRY_SESSION_GAP_S
        return (t >= self.firsts[index] - gap) & (t <= self.lasts[index] + gap)

    def session(self, t) -> np.ndarray:
        return np.searchsorted(self.starts, np.asarray(t, dtype=float), side="right")

    def __call__(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        return t - self.t0 - self.removed[self.session(t)]

    def cuts(self) -> np.ndarray:
        """Where the axis was cut, in axis seconds (the middle of each shown gap)."""
        return self(self.starts) - GAP_SHOWN_S / 2


def _windows(ax, points: pd.DataFrame, axis: SampledTime, colours: dict) -> int:
    """Shade each energy window in its backend's colour: which backend ran when. Windows of points
    measured while no telemetry was kept (a resumed sweep's) are left out: how many is returned."""
    windows = points.dropna(subset=["window_start_s", "window_end_s"])
    inside = axis.sampled(windows["window_start_s"]) & axis.sampled(windows["window_end_s"])
    for row in windows[inside].itertuples(index=False):
        ax.axvspan(axis(row.window_start_s), axis(row.window_end_s), color=colours[row.backend],
                   alpha=0.18, lw=0, zorder=0, label=f"window: {row.backend}")
    return int((~inside).sum())


def _plot(ax, rows: pd.DataFrame, column: str, axis: SampledTime, **style) -> None:
    """One line per sampling session (no line drawn across a cut), labelled once."""
    for index, (_, session) in enumerate(rows.groupby(axis.session(rows["t"]))):
        ax.plot(axis(session["t"]), session[column], **(style if index == 0 else {**style, "label": None}))


def timeline(telemetry: pd.DataFrame, points: pd.DataFrame, limit_w: float | None):
    """Top: instant and ~1 s averaged power with the enforced limit; bottom: the SM clock. Shaded
    spans are the sweep's energy windows, coloured by the backend measured in them; dotted
    verticals mark where a resumed run's pause between sessions was cut from the time axis."""
    fig, axes = new_figure(2, 1, height_in=5.4, sharex=True)
    power_ax, clock_ax = axes[:, 0]
    telemetry = telemetry.sort_values("t")
    axis = SampledTime(telemetry["t"])
    colours = backend_palette(sorted(points["backend"].unique())) if len(points) else {}
    gpus = telemetry["gpu"].nunique()
    for ax in (power_ax, clock_ax):
        unsampled = _windows(ax, points, axis, colours)
        for index, cut in enumerate(axis.cuts()):
            ax.axvline(cut, color="0.35", ls=":", lw=1.0, label="run resumed (pause cut)" if index == 0 else None)
    lines = palette(["instant", "average"] + [f"clock {g}" for g in sorted(telemetry["gpu"].unique())])
    for gpu, rows in telemetry.groupby("gpu"):
        tag = f" (GPU {gpu})" if gpus > 1 else ""
        _plot(power_ax, rows, "power_instant_w", axis, lw=0.9, color=lines["instant"], label=f"instant power{tag}")
        _plot(power_ax, rows, "power_avg_w", axis, lw=1.8, color=lines["average"],
              label=f"~1 s average (nvmlDeviceGetPowerUsage){tag}")
        _plot(clock_ax, rows, "sm_clock_mhz", axis, lw=1.1, color=lines[f"clock {gpu}"], label=f"SM clock{tag}")
    if limit_w:
        power_ax.axhline(limit_w, color="firebrick", ls="--", lw=1.2, label=f"enforced limit {limit_w:.0f} W")
    top = max(limit_w or 0, telemetry[["power_instant_w", "power_avg_w"]].max().max())
    power_ax.set(ylabel="board power (W)", ylim=(0, 1.12 * top))
    cut = len(axis.starts) > 0
    xlabel = "seconds of sampling" + (" (pauses between sessions cut)" if cut else " since the first sample")
    clock_ax.set(ylabel="SM clock (MHz)", ylim=(0, None), xlabel=xlabel)
    if unsampled:
        windows = f"{unsampled} energy window" + ("s" if unsampled != 1 else "")
        clock_ax.annotate(f"{windows} measured outside these sessions (no telemetry kept) not shaded", (1, 0),
                          xycoords="axes fraction", xytext=(-4, 4), textcoords="offset points", ha="right",
                          va="bottom", fontsize=8, color="0.3")
    figure_legend(fig, axes, columns=3)
    return fig


def per_point(points: pd.DataFrame, limit_w: float | None):
    """Power in each point's energy window and TFLOPS/W against M, one line a backend: its median
    over the swept shapes and formats at each M, shaded over their range (a line for each backend
    x shape x format drew some forty crossing lines in chapter 02)."""
    fig, axes = new_figure(1, 2, height_in=4.2, sharex=True)
    power_ax, efficiency_ax = axes[0]
    colours = backend_palette(sorted(points["backend"].unique()))
    for ax, column in ((power_ax, "avg_power_w"), (efficiency_ax, "tflops_per_w")):
        spread = points.groupby(["backend", "m"])[column].agg(["median", "min", "max"]).reset_index()
        for backend, rows in spread.groupby("backend"):
            ax.fill_between(rows["m"], rows["min"], rows["max"], color=colours[backend], alpha=0.12, lw=0)
            ax.plot(rows["m"], rows["median"], "-o", ms=3, color=colours[backend])
    if limit_w:
        power_ax.axhline(limit_w, color="firebrick", ls="--", lw=1.2, label=f"limit {limit_w:.0f} W")
        power_ax.set_ylim(0, 1.12 * max(limit_w, points["avg_power_w"].max()))
    for ax in (power_ax, efficiency_ax):
        tokens_axis(ax)
        ax.set_xlabel("M (tokens)")
    power_ax.set(ylabel="mean power in the point's window (W)")
    efficiency_ax.set(ylabel="TFLOPS per watt")
    log_axis(efficiency_ax)
    figure_legend(fig, axes, columns=4, extra=colour_handles(colours))
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
