"""Chapter 00's figure: the spec sheet's dense peaks and the ridge points, GPU by GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab.plots.common import figure_legend, log_axis, new_figure, palette

DTYPES = ("fp4", "fp8", "bf16")


def peaks_and_ridges(sheet: pd.DataFrame, highlight: str | None = None):
    """Left: dense TFLOP/s per dtype (a missing bar: no such tensor core). Right: the FLOPs per
    byte a kernel must do to be compute-bound at each peak (the ridge point). One colour per
    dtype in both panels; the GPU in use is starred."""
    fig, axes = new_figure(1, 2, height_in=3.6)
    peaks_ax, ridge_ax = axes[0]
    colours = palette(DTYPES)
    names = [f"{key} *" if key == highlight else key for key in sheet["key"]]
    x = np.arange(len(sheet))
    width = 0.8 / len(DTYPES)
    for offset, dtype in enumerate(DTYPES):
        values = pd.to_numeric(sheet[f"{dtype}_tflops"], errors="coerce")
        peaks_ax.bar(x + (offset - 1) * width, values, width, color=colours[dtype], label=dtype)
        ridge = values * 1e12 / (sheet["memory_bw_tbps"].astype(float) * 1e12)
        ridge_ax.scatter(x, ridge, color=colours[dtype], s=36, zorder=3)
    for ax in (peaks_ax, ridge_ax):
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_xlim(-0.6, len(sheet) - 0.4)
        log_axis(ax)
    peaks_ax.set(ylabel="dense TFLOP/s (spec sheet)", title="Peak by dtype")
    ridge_ax.set(ylabel="FLOP per byte to be compute-bound", title="Ridge point (peak / bandwidth)")
    ridge_ax.margins(y=0.25)
    figure_legend(fig, axes, title="dtype")
    return fig
