"""Chapter 06's figure: how each point's time moved between two runs."""

from __future__ import annotations

import pandas as pd

from fp4lab.plots.common import backend_palette, figure_legend, log_axis, new_figure, tokens_axis


def time_ratios(ratios: pd.DataFrame, threshold: float | None):
    """Time now / time then per point against M, one colour per backend; above the dashed line a
    point is slower than the threshold (filled: moved beyond the measurement spread, slower or
    faster; hollow: within it)."""
    fig, axes = new_figure(height_in=3.6)
    ax = axes[0, 0]
    colours = backend_palette(sorted(ratios["backend"].unique()))
    for backend, rows in ratios.groupby("backend"):
        moved = rows["beyond_spread"] | rows["faster_beyond_spread"]
        beyond, within = rows[moved], rows[~moved]
        ax.scatter(beyond["m"], beyond["time_ratio"], s=22, color=colours[backend], label=backend)
        ax.scatter(within["m"], within["time_ratio"], s=22, facecolors="none", edgecolors=colours[backend])
    ax.axhline(1.0, color="0.4", lw=1)
    if threshold:
        ax.axhline(1 + threshold, color="firebrick", ls="--", lw=1, label=f"{threshold:.0%} slower")
    ax.set(xlabel="M (tokens)", ylabel="time now / time then")
    log_axis(ax)
    tokens_axis(ax)
    figure_legend(fig, axes, columns=4,
                  title="filled: moved beyond the p20-p80 spread (slower or faster); hollow: within it")
    return fig
