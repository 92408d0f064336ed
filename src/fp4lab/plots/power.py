"""Chapter 02 figures: power and SM clock against time, power and TFLOPS/W per sweep point."""

from __future__ import annotations

from fp4lab.plots.common import caption, new_axes
from fp4lab.telemetry.summary import BENIGN_REASONS, RunPower, reason_counts


def _seconds(frame):
    return frame["t"] - frame["t"].min()


def _shade_windows(ax, power: RunPower) -> None:
    """Grey spans where the sweep ran its energy windows, so points line up with the timeline."""
    points, t0 = power.points, power.telemetry["t"].min()
    if not len(points) or "window_start_s" not in points:
        return
    for start, end in points[["window_start_s", "window_end_s"]].dropna().itertuples(index=False):
        ax.axvspan(start - t0, end - t0, color="0.85", zorder=0, lw=0)


def power_timeline(power: RunPower):
    """Instant vs ~1 s averaged power over time, with the enforced limit drawn in."""
    fig, ax = new_axes()
    frame = power.telemetry
    _shade_windows(ax, power)
    for gpu, rows in frame.groupby("gpu"):
        label = f" (GPU {gpu})" if frame["gpu"].nunique() > 1 else ""
        ax.plot(_seconds(rows), rows["power_instant_w"], lw=1.0, label=f"instant{label}")
        ax.plot(_seconds(rows), rows["power_avg_w"], lw=2.0, label=f"~1 s average (nvmlDeviceGetPowerUsage){label}")
    if power.power_limit_w:
        ax.axhline(power.power_limit_w, color="firebrick", ls="--", lw=1.2,
                   label=f"enforced limit {power.power_limit_w:.0f} W")
    top = max(power.power_limit_w or 0, frame[["power_instant_w", "power_avg_w"]].max().max())
    ax.set(xlabel="seconds since first sample", ylabel="board power (W)", ylim=(0, 1.12 * top),
           title="Power against time")
    ax.legend(loc="upper right", fontsize=8)
    caption(fig, power.caption())
    return fig


def clock_timeline(power: RunPower):
    """SM clock over time; grey spans are the sweep's energy windows."""
    fig, ax = new_axes()
    frame = power.telemetry
    _shade_windows(ax, power)
    for gpu, rows in frame.groupby("gpu"):
        ax.plot(_seconds(rows), rows["sm_clock_mhz"], lw=1.2,
                label=f"SM clock GPU {gpu}" if frame["gpu"].nunique() > 1 else "SM clock")
    ax.set(xlabel="seconds since first sample", ylabel="SM clock (MHz)", ylim=(0, None),
           title="SM clock against time")
    ax.legend(loc="lower right", fontsize=8)
    caption(fig, power.caption())
    return fig


def power_per_point(power: RunPower):
    """Average power and TFLOPS/W of each sweep point against M (log2), one line per backend x shape."""
    fig, (ax_power, ax_eff) = new_axes(ncols=2)
    points = power.points.assign(shape=lambda p: p["n"].astype(int).astype(str) + "x" + p["k"].astype(int).astype(str))
    for (backend, shape), rows in points.sort_values("m").groupby(["backend", "shape"]):
        ax_power.plot(rows["m"], rows["avg_power_w"], marker="o", label=f"{backend} {shape}")
        ax_eff.plot(rows["m"], rows["tflops_per_w"], marker="o", label=f"{backend} {shape}")
    if power.power_limit_w:
        ax_power.axhline(power.power_limit_w, color="firebrick", ls="--", lw=1.2, label="limit")
        ax_power.set_ylim(0, 1.12 * max(power.power_limit_w, points["avg_power_w"].max()))
    for ax in (ax_power, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
    ax_power.set(ylabel="average power in the window (W)", title="Power per point")
    ax_power.set_ylim(bottom=0)
    ax_eff.set(ylabel="TFLOPS/W", title="Energy efficiency per point")
    ax_eff.set_yscale("log")
    ax_power.legend(fontsize=7)
    caption(fig, power.caption())
    return fig


def throttle_reasons_chart(power: RunPower):
    """Share of samples in which each clocks-event reason was active."""
    fig, ax = new_axes(figsize=(6.0, 3.0))
    reasons = power.telemetry["throttle_reasons"]
    counts = reason_counts(reasons)
    total = int(reasons.notna().sum())
    names = sorted(counts, key=lambda name: -counts[name])
    colors = ["0.6" if name in BENIGN_REASONS else "firebrick" for name in names]
    ax.barh(names, [100 * counts[name] / total for name in names], color=colors)
    ax.set(xlabel="% of samples", xlim=(0, 100), title="Clocks-event reasons (red: throttling)")
    caption(fig, power.caption())
    return fig
