"""Chapter 00 figure: the spec sheet's dense peaks and bandwidth, GPU by GPU."""

from __future__ import annotations

from fp4lab.hardware import PEAK_KEYS
from fp4lab.plots.common import caption, new_axes


def peaks_and_bandwidth(table, highlight_key: str | None = None):
    """Left: dense TFLOP/s per operand type (log scale; a missing bar = no such tensor core).
    Right: FLOPs per byte of memory traffic needed to be compute-bound at the bf16 and fp4 peak."""
    fig, (peaks_ax, ridge_ax) = new_axes(ncols=2)
    names = [f"{key} *" if key == highlight_key else key for key in table["key"]]
    width = 0.8 / len(PEAK_KEYS)
    positions = range(len(table))
    for offset, kind in enumerate(PEAK_KEYS):
        values = table[f"{kind}_tflops"].astype(float)
        peaks_ax.bar([p + (offset - 1.5) * width for p in positions], values, width, label=kind)
    peaks_ax.set(yscale="log", ylabel="dense TFLOP/s (spec sheet)", title="Peak by operand type")
    peaks_ax.set_xticks(list(positions), names, rotation=30, ha="right")
    peaks_ax.legend(fontsize=8, ncols=2)
    for kind, marker in (("bf16", "o"), ("fp4", "s")):
        # ridge point: FLOP/s / (bytes/s) = the arithmetic intensity where the roofline bends
        ridge = table[f"{kind}_tflops"].astype(float) * 1e12 / (table["memory_bw_tbps"] * 1e12)
        ridge_ax.scatter(names, ridge, marker=marker, s=50, label=f"{kind} peak / bandwidth")
    ridge_ax.set(yscale="log", ylabel="FLOP per byte to be compute-bound", title="Ridge point")
    ridge_ax.tick_params(axis="x", rotation=30)
    ridge_ax.legend(fontsize=8)
    note = "* = the device in use. " if highlight_key else ""
    caption(fig, note + "Source: fp4lab.hardware.SPECS (vendor datasheets; dense = sparse/2 where "
                        "only sparse figures are published). Not measured.")
    return fig
