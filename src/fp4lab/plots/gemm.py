"""Chapter 01's figures: speed against M per weight shape, every 4-bit method against the FP4
read floor and cuBLAS bf16, and the roofline. Frames in (from fp4lab.analysis.gemm), figures out.

Shape legend: M tokens, N output features, K reduction dim; a[M, K] @ w[N, K]^T.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp4lab import text
from fp4lab.plots.common import (backend_palette, colour_handles, figure_legend, grid_shape, hide_unused,
                                 log_axis, marker_handles, new_figure, palette, style_handles, tokens_axis,
                                 widen_to_labels)


def _shapes(frame: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(n), int(k)) for n, k in zip(frame["n"], frame["k"])}, key=lambda s: -s[0] * s[1])


FORMAT_MARKERS = {"nvfp4": "o", "mxfp4": "s"}


def speed_by_m(runs: dict[str, pd.DataFrame], metric: str = "tflops", ylabel: str = "TFLOP/s achieved"):
    """`metric` against M (log-log), one panel per weight shape, one colour per backend; a second
    run (the reference) on the same panel where it measured the same shape, dashed.

    `runs` maps a label ("this run", "H200 reference") to its ok rows (first = solid)."""
    frames = {label: frame.dropna(subset=[metric]) for label, frame in runs.items() if frame is not None}
    everything = pd.concat(list(frames.values())) if frames else pd.DataFrame()
    if not len(everything):
        raise ValueError(f"no correct points with {metric} to draw")
    shapes = _shapes(everything)
    colours = backend_palette(sorted(everything["backend"].unique()))
    rows, columns = grid_shape(len(shapes))
    fig, axes = new_figure(rows, columns, sharex=True)
    styles = dict(zip(frames, ["-", "--", ":"]))
    for ax, (n, k) in zip(axes.flat, shapes):
        for label, frame in frames.items():
            shape = frame[(frame["n"] == n) & (frame["k"] == k)]
            # bf16, fp8 and int4 weights have no FP4 format: the sweep's rows under each format
            # are one kernel, drawn once, without a format's marker
            fp4_fmt = shape["fmt"].where(shape["weight_dtype"] == "fp4", "")
            for (backend, fmt), points in shape.groupby(["backend", fp4_fmt]):
                curve = points.groupby("m")[metric].median().sort_index()
                ax.plot(curve.index, curve.values, styles[label], color=colours[backend],
                        marker=FORMAT_MARKERS.get(fmt, ""), markersize=3.5, linewidth=1.4,
                        alpha=1.0 if styles[label] == "-" else 0.7)
        ax.set(title=f"N={n}, K={k}")
        log_axis(ax)
        tokens_axis(ax, everything["m"])
    for ax in axes[-1]:
        ax.set_xlabel("M (tokens)")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    hide_unused(axes, len(shapes))
    # colour: the backend, once; marker: the format; line style: the run (only when two are drawn)
    extra = colour_handles(colours) + marker_handles({f"{fmt} weights": m for fmt, m in FORMAT_MARKERS.items()})
    if len(frames) > 1:
        extra += style_handles({label: styles[label] for label in frames})
    figure_legend(fig, axes, extra=extra)
    return fig


def four_bit_vs_floor(points: pd.DataFrame, baseline: str = "torch-bf16"):
    """Time per call over the FP4 weight-read floor against M for every 4-bit-weight method and
    the bf16 baseline, one panel per (format, shape), the floor a black dashed line at 1: how
    close each gets. Over the floor, not in microseconds: a slow method at large M (tinygemm's
    60 ms) no longer squeezes the decode Ms, a few microseconds apart, into the bottom tick."""
    panels = sorted({(fmt, int(n), int(k)) for fmt, n, k in zip(points["fmt"], points["n"], points["k"])},
                    key=lambda p: (p[0], -p[1] * p[2]))
    colours = backend_palette(sorted(points["backend"].unique()))
    rows, columns = grid_shape(len(panels))
    fig, axes = new_figure(rows, columns, sharex=True)
    for ax, (fmt, n, k) in zip(axes.flat, panels):
        shape = points[(points["fmt"] == fmt) & (points["n"] == n) & (points["k"] == k)]
        for backend, rows_ in shape.groupby("backend"):
            curve = (rows_["median_us"] / rows_["fp4_floor_us"]).groupby(rows_["m"]).median().sort_index()
            ax.plot(curve.index, curve.values, "-o", markersize=3, color=colours[backend],
                    linewidth=2.0 if backend == baseline else 1.3, label=backend)
        ax.axhline(1.0, linestyle="--", color="black", linewidth=1.2,
                   label="FP4 weight-read floor (measured bandwidth) = 1")
        ax.set(title=f"{fmt}, N={n}, K={k}")
        log_axis(ax)
        tokens_axis(ax, points["m"])
    for ax in axes[-1]:
        ax.set_xlabel("M (tokens)")
    for ax in axes[:, 0]:
        ax.set_ylabel("time / FP4 weight-read floor")
    hide_unused(axes, len(panels))
    figure_legend(fig, axes)
    return fig


def own_against_peers(table: pd.DataFrame, aim: float, aim_up_to_m: int, level_up_to_m: int):
    """fp4lab's fastest own kernel over the fastest peer (the peer's time / fp4lab's, above 1:
    fp4lab's is faster) against M, a line per (format, shape) coloured by shape, with the aims:
    `aim` up to `aim_up_to_m` tokens, level from there to `level_up_to_m`."""
    shapes = sorted({(int(n), int(k)) for n, k in zip(table["n"], table["k"])}, key=lambda s: -s[0] * s[1])
    colours = palette([f"{n}x{k}" for n, k in shapes])
    fig, axes = new_figure(height_in=3.6)
    ax = axes[0, 0]
    for (fmt, n, k), rows in table.groupby(["fmt", "n", "k"]):
        rows = rows.sort_values("m")
        ax.plot(rows["m"], rows["speedup"], "-", marker=FORMAT_MARKERS.get(fmt, "^"), markersize=4,
                color=colours[f"{int(n)}x{int(k)}"], linewidth=1.3)
    ax.plot([1, aim_up_to_m], [aim, aim], color="black", linewidth=1.6, linestyle=":",
            label=f"aim up to M = {aim_up_to_m}: {aim:g}x as fast as the fastest peer")
    above = sorted(m for m in table["m"].unique() if aim_up_to_m < m <= level_up_to_m)
    if above:     # drawn over the measured Ms it covers, so M = 16 shows one aim, not two
        ax.plot([above[0], above[-1]], [1, 1], color="black", linewidth=1.6, linestyle="-.",
                label=f"aim at M = {above[0]}-{above[-1]}: level with it")
    ax.axhline(1.0, color="0.6", linewidth=0.8, zorder=0)
    ax.set(xlabel="M (tokens)", ylabel="fp4lab's speed-up over\nthe fastest peer")
    tokens_axis(ax, table["m"])
    log_axis(ax)
    widen_to_labels(ax)
    shape_handles = colour_handles({f"N x K = {name}": colour for name, colour in colours.items()})
    format_handles = marker_handles({fmt: FORMAT_MARKERS.get(fmt, "^") for fmt in sorted(table["fmt"].unique())})
    figure_legend(fig, axes, columns=3, extra=shape_handles + format_handles)
    return fig


ROOF_DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 3)))


def roofline(points: pd.DataFrame, roofs: dict[str, tuple[float, dict[str, float | None]]]):
    """Achieved TFLOP/s against arithmetic intensity (FLOP per byte moved) under the roofs.

    `roofs` maps "measured" / "spec" to (bandwidth TB/s, {math dtype: peak TFLOP/s})."""
    points = points.dropna(subset=["tflops", "tbps"])
    if not len(points):
        raise ValueError("no correct points with tflops and tbps to place on the roofline")
    intensity = points["tflops"] / points["tbps"]
    fig, axes = new_figure(height_in=4.2)
    ax = axes[0, 0]
    colours = backend_palette(sorted(points["backend"].unique()))
    for backend, rows in points.groupby("backend"):
        ax.scatter(rows["tflops"] / rows["tbps"], rows["tflops"], s=14, color=colours[backend],
                   label=backend, zorder=3)
    grid = np.logspace(np.log10(intensity.min() / 2), np.log10(intensity.max() * 2), 200)
    # roofs in greys (black measured, grey spec sheet), one dash per math dtype: the colours are
    # the backends' (a roof in torch-fp8's orange read as fp8's points)
    dtypes = list(dict.fromkeys(dtype for _, peaks in roofs.values() for dtype, peak in peaks.items() if peak))
    dashes = {dtype: ROOF_DASHES[i % len(ROOF_DASHES)] for i, dtype in enumerate(dtypes)}
    for source, (bandwidth, peaks) in roofs.items():
        for dtype, peak in peaks.items():
            if peak and bandwidth:
                ax.plot(grid, np.minimum(peak, bandwidth * grid), linestyle=dashes[dtype],
                        color="black" if source == "measured" else "0.6", linewidth=1.1,
                        label=f"roof: {source} {dtype} ({text.sig(peak)} TFLOP/s)")
    ax.set(xlabel="arithmetic intensity (FLOP per byte moved)", ylabel="TFLOP/s achieved")
    log_axis(ax, which="x")
    log_axis(ax)
    figure_legend(fig, axes, columns=3)
    return fig


STAGE_LABELS = {"stream": "bytes as a stream", "load": "loads only", "decode": "decode, no math", "math": "math on bf16 weights",
                "mma": "MMAs, no split-K reduction", "full": "full kernel", "decode_x2": "decode done twice"}


def anatomy(table: pd.DataFrame, labels: list[str] | None = None,
            floor_label: str = "copy floor (FP4 bytes at the measured bandwidth)",
            stage_labels: dict[str, str] = STAGE_LABELS):
    """Each stage variant's time per point (a dense GEMM's (shape, M), or `labels` in the table's
    order), with the copy floor (black) and, where the table has one, the launch floor (grey) as
    ticks: where an FP4 weight-only kernel's time goes. `stage_labels`: the stage columns drawn, in
    order, and their legend names."""
    rows = table if labels is not None else table.sort_values(["n", "k", "m"])
    rows = rows.reset_index(drop=True)
    if labels is None:
        labels = [f"{int(r.n)}x{int(r.k)}, M={int(r.m)} ({r.fmt})" for r in rows.itertuples(index=False)]
    stages = [s for s in stage_labels if s in rows and rows[s].notna().any()]
    colours = palette([stage_labels[s] for s in stages])
    fig, axes = new_figure(height_in=0.5 * len(rows) * max(1, len(stages)) / 2.5 + 1.6)
    ax = axes[0, 0]
    height = 0.8 / len(stages)
    for offset, stage in enumerate(stages):
        positions = np.arange(len(rows)) + (offset - (len(stages) - 1) / 2) * height
        ax.barh(positions, rows[stage], height, color=colours[stage_labels[stage]], label=stage_labels[stage])
    y = np.arange(len(rows))
    ax.scatter(rows["copy_floor_us"], y, marker="|", s=260, color="black", zorder=3, label=floor_label)
    if "launch_floor_us" in rows and rows["launch_floor_us"].notna().any():
        ax.scatter(rows["launch_floor_us"], y, marker="|", s=260, color="0.55", zorder=3, label="launch floor")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set(xlabel="time per call (us)")
    figure_legend(fig, axes, columns=3)
    return fig
