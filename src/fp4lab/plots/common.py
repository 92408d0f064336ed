"""One look for every figure: readable at the book's page width (about 8 inches: text of 9 pt
and more at its rendered size), a palette that never repeats a colour inside a figure, one legend
per figure. The caption (provenance) is the page's, under the figure. Plots draw frames they
are given: no I/O, no analysis."""

from __future__ import annotations

import math

import matplotlib
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PAGE_WIDTH_IN = 8.0
DPI = 110
BASE_FONT_PT = 10


def apply_style() -> None:
    sns.set_theme(style="whitegrid", context="notebook", rc={
        "font.size": BASE_FONT_PT, "axes.titlesize": BASE_FONT_PT + 1, "axes.labelsize": BASE_FONT_PT,
        "xtick.labelsize": BASE_FONT_PT - 1, "ytick.labelsize": BASE_FONT_PT - 1,
        "legend.fontsize": BASE_FONT_PT - 1, "figure.dpi": DPI, "savefig.dpi": DPI})


def palette(names) -> dict[str, tuple]:
    """A distinct colour per name (husl beyond 10 names, so no two lines share one)."""
    names = list(dict.fromkeys(names))
    colours = sns.color_palette("tab10" if len(names) <= 10 else "husl", len(names))
    return dict(zip(names, colours))


# each GEMM backend's colour in every figure of the book: the ones that run on Hopper take the
# strong tab10 colours first (tests/test_power_timeline.py checks that every registered backend
# is listed; plots do not import the backends)
BACKEND_COLOUR_ORDER = ("torch-bf16", "torch-fp8", "triton-w4a16", "humming-w4a16", "tinygemm-int4",
                        "gemlite-w4a16", "cuda-w4a16", "emulated", "humming-w4a4", "torch-fp4", "flashinfer-cutlass",
                        "flashinfer-cudnn", "flashinfer-trtllm", "sgl-cutlass")


def backend_palette(names) -> dict[str, tuple]:
    """A colour per backend that is the same in every figure (chapter 01's speed and FP4-floor
    figures once gave triton-w4a16 two colours), distinct across all of them."""
    order = list(dict.fromkeys([*BACKEND_COLOUR_ORDER, *names]))
    colours = sns.color_palette("tab10", 10) + sns.color_palette("tab20", 20)[1::2]
    if len(order) > len(colours):
        colours = sns.color_palette("husl", len(order))
    return {name: colours[order.index(name)] for name in dict.fromkeys(names)}


def new_figure(nrows: int = 1, ncols: int = 1, height_in: float | None = None, **kwargs):
    """A figure of the page's width: (fig, axes) with axes always a 2-D array. The figure is not
    registered with pyplot, so it appears on a page only where the page shows it."""
    apply_style()
    height = height_in or (3.4 if nrows == 1 else 2.9 * nrows)
    fig = Figure(figsize=(PAGE_WIDTH_IN, height), layout="constrained", dpi=DPI)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, axes


def grid_shape(panels: int, max_columns: int = 2) -> tuple[int, int]:
    columns = min(max_columns, max(1, panels))
    return -(-panels // columns), columns


def hide_unused(axes, used: int) -> None:
    for ax in axes.flat[used:]:
        ax.set_visible(False)


def plain_number(value: float) -> str:
    """A tick label without an exponent: 0.4, 30, 2000, 10k, 2.5M (matplotlib's `g` puts 1e+06
    beside 100000 on one axis, which reads as two scales); a count that is not round in its unit
    stays whole (16384, not 16.384k)."""
    for threshold, scale, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(value) >= threshold:
            scaled = value / scale
            if scaled == round(scaled, 1) or abs(value) >= 1e6:
                return f"{scaled:.3g}{suffix}"
            break
    return f"{value:g}"


def tokens_axis(ax, measured=None) -> None:
    """A log2 axis of token counts labelled 1, 2, 4, ... (not 2^n); ticked at the `measured`
    counts where given (a tick at 4096 where nothing ran reads as a measured point)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted({int(m) for m in measured}) if measured is not None else []
    ax.xaxis.set_major_locator(FixedLocator(ticks) if ticks else LogLocator(base=2))
    if ticks:
        ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: plain_number(value)))


def log_axis(*axes, which: str = "y") -> None:
    """Log scale on `which` ("x" or "y") of each axis, labelled in plain numbers (0.4, 30, 2000):
    matplotlib labels the minor ticks of a short log range as 4x10^-1, which reads as noise."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, value, pos=None):   # the base class decides which ticks get a label
            return plain_number(value) if super().__call__(value, pos) else ""

    for ax in axes:
        getattr(ax, f"set_{which}scale")("log")
        axis = getattr(ax, f"{which}axis")
        axis.set_major_formatter(PlainLogFormatter())
        axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


LABELLED_STEPS = (1, 2, 3, 4, 6, 10)   # the values a log axis of about one decade labels, x 10^k


def widen_to_labels(ax, which: str = "y") -> None:
    """Widen a log axis, once its data is drawn, to the nearest labelled values outside it (1, 2,
    3, 4 or 6 x 10^k): its lowest and highest points then sit between two labelled ticks, not
    below the last one (a layer at 1.2 ms under an axis whose lowest label is 2)."""
    def outward(value: float, down: bool) -> float:
        decade = 10.0 ** math.floor(math.log10(value))
        mantissa = value / decade
        steps = [s for s in LABELLED_STEPS if (s <= mantissa * (1 + 1e-9) if down else s >= mantissa * (1 - 1e-9))]
        return (max(steps) if down else min(steps)) * decade

    from matplotlib.ticker import FuncFormatter

    low, high = getattr(ax, f"get_{which}lim")()
    low, high = outward(low, True), outward(high, False)
    getattr(ax, f"set_{which}lim")(low, high)
    if math.log10(high / low) <= 2:   # matplotlib stops labelling minor ticks past one decade
        def label(value, _pos) -> str:
            mantissa = round(value / 10.0 ** math.floor(math.log10(value)), 6)
            return plain_number(value) if mantissa in LABELLED_STEPS[1:-1] else ""
        getattr(ax, f"{which}axis").set_minor_formatter(FuncFormatter(label))


def marker_handles(markers: dict[str, str]) -> list:
    """Legend entries for what a marker shape means (black, no line)."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="0.2", marker=marker, linestyle="none", label=label)
            for label, marker in markers.items()]


def colour_handles(colours: dict[str, str]) -> list:
    """Legend entries for what a colour means (a plain line: no marker to be mistaken for a format)."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=colour, linewidth=2.0, label=label) for label, colour in colours.items()]


def style_handles(styles: dict[str, str]) -> list:
    """Legend entries for what a line style means (grey line, no marker): {"this run": "-"}."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="0.35", linestyle=style, linewidth=1.4, label=label)
            for label, style in styles.items()]


def figure_legend(fig, axes, title: str | None = None, columns: int = 3, extra: list | None = None) -> None:
    """One legend for the whole figure, below the panels, covering every line drawn; in at most
    `columns` columns, fewer where long labels would make it wider than the figure (a saved
    figure then grows to hold it, and the page shrinks it, text and all)."""
    handles, labels = {}, []
    for handle in extra or []:
        handles[handle.get_label()] = handle
        labels.append(handle.get_label())
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if not handles:
        return
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ncols in range(min(columns, len(labels)), 0, -1):
        # labels are data, as the page draws them (chapters.page.png): a `$` is no mathtext
        with matplotlib.rc_context({"text.parse_math": False}):
            legend = fig.legend([handles[label] for label in labels], labels, loc="outside lower center",
                                ncols=ncols, title=title, frameon=False)
            if ncols == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
                return
        legend.remove()
