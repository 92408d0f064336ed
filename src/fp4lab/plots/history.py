"""Figures of chapter 05: how each point's time moved between two runs."""

from __future__ import annotations

from fp4lab.plots.common import caption, new_axes


def plot_time_ratios(comparison):
    """Time now / time then per point against M, one colour per backend; the regression line dashed."""
    fig, ax = new_axes()
    for backend, rows in comparison.ratios.groupby("backend"):
        ax.scatter(rows["m"], rows["time_ratio"], label=backend, s=18)
    ax.axhline(1.0, color="0.4", linewidth=1)
    ax.axhline(1 + comparison.threshold, color="C3", linestyle="--", linewidth=1,
               label=f"regression: {comparison.threshold:.0%} slower")
    ax.set(xscale="log", xlabel="M", ylabel="time now / time then",
           title=f"{comparison.run_id} vs {comparison.other_kind} {comparison.other_id}")
    ax.legend(fontsize=8)
    caption(fig, comparison.label + "; correct points in both runs, joined on backend, fmt, m, n, k")
    return fig
