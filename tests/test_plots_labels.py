"""Figure labels read as numbers: plain log-axis ticks, times in the unit that fits them, and a
legend that stays off the bars. (What the browser check saw on the smoke and reference books.)"""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from fp4lab.plots import common, diagnosis


def tick_labels(ax, which: str = "y") -> list[str]:
    FigureCanvasAgg(ax.figure).draw()
    axis = getattr(ax, f"{which}axis")
    return [t.get_text() for t in axis.get_ticklabels() + axis.get_ticklabels(minor=True) if t.get_text()]


@pytest.mark.parametrize("low, high, expected", [
    (0.25, 5.0, {"0.3", "0.4", "1", "2", "3"}),       # under two decades: minor ticks labelled too
    (10.0, 2000.0, {"10", "100", "1000"}),
    (1e4, 2e8, {"10k", "100k", "1M", "10M", "100M"}),   # chapter 05's bytes: no 1e+06 beside 100000
])
def test_log_axis_labels_are_plain_numbers(low, high, expected):
    fig, axes = common.new_figure()
    ax = axes[0, 0]
    ax.plot([1, 2], [low, high])
    common.log_axis(ax)
    labels = tick_labels(ax)
    assert expected <= set(labels)
    assert not [label for label in labels if "10^" in label or "times" in label or "$" in label or "e+" in label]


def test_a_widened_log_axis_ends_on_labelled_values_and_labels_its_minor_ticks():
    """Chapter 03's layer times (1.2-13 ms) sat under a lowest label of 2: widened, the axis runs
    1-20 and still labels 2, 3, 4 and 6 (matplotlib drops minor labels past one decade)."""
    fig, axes = common.new_figure()
    ax = axes[0, 0]
    ax.plot([1, 2], [1.2, 13.0])
    common.log_axis(ax)
    common.widen_to_labels(ax)
    assert ax.get_ylim() == pytest.approx((1.0, 20.0))
    assert {"1", "2", "3", "4", "6", "10", "20"} <= set(tick_labels(ax))


def test_the_floor_bars_say_microseconds_when_a_floor_is_under_a_millisecond():
    path = {"path": "grouped-fp8", "layer_us": 3460.0, "launch_floor_us": 4.78, "memory_floor_us": 2280.0,
            "compute_floor_us": 217.0, "weight_dtype": "fp8", "math_dtype": "fp8"}
    fig = diagnosis.layer_against_floors(path, fp4_floor_us=1280.0)
    texts = [t.get_text().strip() for t in fig.axes[0].texts]
    assert texts == ["3.46 ms", "4.78 us", "2.28 ms", "217 us", "1.28 ms"]


def test_the_paths_legend_sits_below_the_bars():
    frame = pd.DataFrame({"path": ["grouped-fp8", "loop-bf16"], "source": ["MoE sweep", "MoE sweep"],
                          "layer_us": [3460.0, 6950.0], "memory_floor_us": [2280.0, 4560.0],
                          "weight_dtype": ["fp8", "bf16"]})
    fig = diagnosis.paths(frame)
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["bf16 weights", "fp8 weights",
                                                                  "its weight-read floor"]


def test_a_modelled_loop_is_hatched_and_named_in_the_legend():
    """A newcomer read the modelled GEMM loops as timed layers: same colour, same bars."""
    frame = pd.DataFrame({"path": ["cuda-w4a16-moe", "cuda-w4a16 loop"], "source": ["MoE sweep", "GEMM sweep"],
                          "kind": ["layer", "gemm-loop"], "layer_us": [1760.0, 4170.0],
                          "memory_floor_us": [1280.0, 1280.0], "weight_dtype": ["fp4", "fp4"]})
    fig = diagnosis.paths(frame)
    bars = [patch for patch in fig.axes[0].patches]
    assert [bar.get_hatch() for bar in bars] == [None, "//"]
    assert "modelled: a loop of single timed GEMMs" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_library_error_names_its_file_without_the_machine_install_paths():
    """A compiler's diagnostic (gemlite on the H200) names the failing file by its full install
    path: the book and the rows show it from the package on."""
    import pandas as pd

    from fp4lab.plots.tables import Col, html_table
    from fp4lab.sweep.worker import first_line

    cause = ("PassManager::run failed (/work/main/.venv/lib/python3.12/site-packages/gemlite/"
             "triton_kernels/gemm_splitK_kernels.py:537:0: error: Failures)")
    table = html_table(pd.DataFrame({"why": [cause]}), [Col("why", "why not")])
    assert "(gemlite/triton_kernels/gemm_splitK_kernels.py:537:0: error" in table
    assert "/work/" not in table and "site-packages" not in table
    row_error = first_line(RuntimeError(cause.replace("/work/main/.venv/lib", "/usr/lib")))
    assert row_error == "RuntimeError: PassManager::run failed (gemlite/triton_kernels/gemm_splitK_kernels.py:537:0: error: Failures)"


def test_the_roofs_take_no_backend_colour():
    """The roofs were drawn in tab10's first colours, which are torch-bf16's and torch-fp8's: the
    measured bf16 roof in fp8's orange (the newcomer's read of the reference book)."""
    from matplotlib.colors import to_rgb

    from fp4lab.plots import gemm

    points = pd.DataFrame({"backend": ["torch-bf16", "torch-fp8", "triton-w4a16"],
                           "tflops": [10.0, 20.0, 5.0], "tbps": [4.0, 4.1, 2.0]})
    roofs = {"measured": (4.24, {"bf16": 750.0, "fp8": 1400.0}),
             "spec": (4.8, {"bf16": 989.0, "fp8": 1979.0, "fp4": None})}
    fig = gemm.roofline(points, roofs)
    backend_colours = {tuple(round(c, 4) for c in to_rgb(colour))
                       for colour in common.backend_palette(points["backend"]).values()}
    roof_lines = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("roof:")]
    assert len(roof_lines) == 4
    assert not {tuple(round(c, 4) for c in to_rgb(line.get_color())) for line in roof_lines} & backend_colours
    styles = {(line.get_label().split()[1], line.get_label().split()[2]): (line.get_color(), line.get_linestyle())
              for line in roof_lines}
    assert len(set(styles.values())) == 4           # each roof its own look: source x dtype


def test_the_four_bit_figure_plots_time_over_the_floor_so_decode_is_not_squeezed():
    """A 60 ms point at M = 16384 made the microsecond axis span five decades, the decode Ms a few
    us apart on its bottom tick; over the floor each curve starts near 1 and the floor is 1."""
    from fp4lab.plots import gemm as gemm_plots

    rows = []
    for m, floor in ((1, 9.0), (16, 9.5), (16384, 130.0)):
        rows += [{"backend": "torch-bf16", "fmt": "nvfp4", "n": 8192, "k": 8192, "m": m,
                  "median_us": 3.6 * floor, "fp4_floor_us": floor},
                 {"backend": "tinygemm-int4", "fmt": "nvfp4", "n": 8192, "k": 8192, "m": m,
                  "median_us": 2.2 * floor if m < 16384 else 60000.0, "fp4_floor_us": floor}]
    fig = gemm_plots.four_bit_vs_floor(pd.DataFrame(rows))
    ax = fig.axes[0]
    curves = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert curves["torch-bf16"] == pytest.approx([3.6, 3.6, 3.6])
    assert curves["tinygemm-int4"][:2] == pytest.approx([2.2, 2.2])
    floor = [label for label in curves if label.startswith("FP4 weight-read floor")]
    assert len(floor) == 1 and set(curves[floor[0]]) == {1.0}
    assert ax.get_ylabel() == "time / FP4 weight-read floor"


def test_the_history_figure_fills_a_point_that_moved_beyond_the_spread_either_way():
    """Chapter 06's text counts points faster beyond the noise, which the figure drew hollow as
    if within it: filled is now any point beyond the p20-p80 spread, slower or faster."""
    from fp4lab.plots import history

    ratios = pd.DataFrame({"backend": ["a"] * 3, "m": [1, 16, 256], "time_ratio": [1.3, 1.0, 0.7],
                           "beyond_spread": [True, False, False], "faster_beyond_spread": [False, False, True]})
    fig = history.time_ratios(ratios, 0.1)
    filled, hollow = fig.axes[0].collections[:2]
    assert sorted(x for x, _ in filled.get_offsets()) == [1, 256]
    assert [x for x, _ in hollow.get_offsets()] == [16]
    assert not hollow.get_facecolors()[:, 3].any()          # no fill: facecolors "none"


def test_the_power_figure_draws_one_line_a_backend_its_median_shaded_over_its_range():
    """Chapter 02 drew a line for each backend x shape x format (some forty crossing lines): now
    a backend's median over its shapes and formats at each M, over a band of their range (so an
    M's NVFP4 and MXFP4 points draw no vertical jump either)."""
    from fp4lab.plots import power

    points = pd.DataFrame({"backend": ["b"] * 6, "n": [64, 64, 128] * 2, "k": [64] * 6, "m": [1, 1, 1, 16, 16, 16],
                           "fmt": ["nvfp4", "mxfp4", "nvfp4"] * 2,
                           "avg_power_w": [100.0, 300.0, 200.0, 120.0, 320.0, 220.0],
                           "tflops_per_w": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    power_ax = power.per_point(points, 700.0).axes[0]
    drawn = [line for line in power_ax.get_lines() if line.get_marker() == "o"]
    assert [tuple(line.get_ydata()) for line in drawn] == [(200.0, 220.0)]
    band = power_ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 100.0 and band.max() == 320.0


def test_a_legend_of_long_labels_takes_fewer_columns_and_stays_inside_the_figure():
    """Chapter 03's anatomy legend, three columns of long labels, widened its saved figure to
    1121 px, and the page shrank it (legend text ~7 px): the legend now drops columns to fit."""
    import io

    from PIL import Image

    fig, axes = common.new_figure()
    for i in range(5):
        axes[0, 0].plot([0, 1], [i, i], label=f"a long label number {i} that says what the build leaves out")
    common.figure_legend(fig, axes, columns=3)
    assert fig.legends[0]._ncols < 3 and len(fig.legends) == 1
    saved = io.BytesIO()
    fig.savefig(saved, format="png", bbox_inches="tight")
    assert Image.open(saved).size[0] <= common.PAGE_WIDTH_IN * common.DPI + 20


def test_a_legend_label_holding_mathtext_is_measured_as_text():
    """Fitting the legend lays its labels out: a backend named `$\\frac{...}$` must not parse."""
    fig, axes = common.new_figure()
    axes[0, 0].plot([0, 1], [0, 1], label="$\\frac{<svg onload=alert(1)>}$ #26")
    common.figure_legend(fig, axes)
    assert fig.legends[0].get_texts()[0].get_text().startswith("$\\frac{")


@pytest.mark.parametrize("errors, lowest, highest", [
    ([-2.5, 1.7, 9.6, -5.3], -25.0, 25.0),    # all inside the band: room above and below it
    ([-2.5, 40.0], -46.0, 46.0),              # a bar past the band: the axis holds it
])
def test_the_models_band_reads_as_a_band_and_every_bar_fits(errors, lowest, highest):
    from fp4lab.plots import moe

    compared = pd.DataFrame({"method": ["grouped-bf16", "loop-bf16"] * (len(errors) // 2),
                             "batch": [64, 64, 512, 512][:len(errors)], "error_pct": errors})
    fig = moe.model_vs_measured(compared)
    assert fig.axes[0].get_ylim() == pytest.approx((lowest, highest))


def test_the_speed_figure_marks_formats_on_fp4_weights_only_and_ticks_the_measured_ms():
    """A reader saw nvfp4 / mxfp4 markers on the torch-bf16 line (bf16 weights have no FP4
    format: the sweep's rows under each format are one kernel) and an M = 4096 tick where nothing
    ran."""
    from fp4lab.plots import gemm as gemm_plots

    rows = [{"backend": backend, "fmt": fmt, "weight_dtype": dtype, "n": 8192, "k": 8192, "m": m,
             "tflops": tflops * m}
            for backend, dtype, tflops in (("torch-bf16", "bf16", 2.0), ("triton-w4a16", "fp4", 3.0))
            for fmt in ("nvfp4", "mxfp4") for m in (1, 16, 16384)]
    fig = gemm_plots.speed_by_m({"run": pd.DataFrame(rows)})
    ax = fig.axes[0]
    markers = sorted(line.get_marker() for line in ax.get_lines())
    assert markers == ["", "o", "s"]     # bf16 once, unmarked; the FP4 kernel once a format
    assert tick_labels(ax, "x") == ["1", "16", "16384"]
