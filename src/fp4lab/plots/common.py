"""One look for every figure: seaborn's whitegrid, readable sizes, a caption line for provenance."""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

FIGSIZE = (8.0, 4.5)


def apply_style() -> None:
    sns.set_theme(style="whitegrid", context="notebook")


def new_axes(figsize: tuple[float, float] = FIGSIZE, ncols: int = 1):
    apply_style()
    fig, axes = plt.subplots(1, ncols, figsize=(figsize[0] * (1 if ncols == 1 else 0.6 * ncols), figsize[1]),
                             constrained_layout=True)
    return fig, axes


def caption(fig, text: str) -> None:
    """Provenance under the figure: which run, GPU, conditions."""
    fig.text(0.0, -0.02, text, ha="left", va="top", fontsize=8, color="0.35", wrap=True)
