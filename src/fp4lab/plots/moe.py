"""Chapter 03 figures: tokens per expert, mean vs busiest, achieved TFLOPS, model vs measurement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from fp4lab.plots.common import caption, new_axes


def tokens_histogram(loads_by_batch: dict[int, np.ndarray], note: str):
    """Distribution of tokens per expert per step, one curve per batch size."""
    fig, ax = new_axes()
    for batch, loads in loads_by_batch.items():
        values = loads.ravel()
        ax.hist(values, bins=np.arange(values.max() + 2) - 0.5, histtype="step", density=True,
                label=f"B={batch}: mean {values.mean():.1f}, busiest {loads.max(axis=1).mean():.1f}")
    ax.set(xlabel="tokens routed to one expert in one decode step", ylabel="fraction of (expert, step)")
    ax.legend(fontsize=8)
    caption(fig, note)
    return fig


def mean_vs_busiest(table: pd.DataFrame, note: str):
    """Mean expert, p99 and busiest expert (mean over steps) against concurrency."""
    fig, ax = new_axes()
    per_batch = table.drop_duplicates("batch")
    for column, label in (("mean_tokens_per_expert", "mean expert"),
                          ("p99_tokens_per_expert", "p99 expert"),
                          ("mean_max_tokens_per_expert", "busiest expert (mean over steps)")):
        ax.plot(per_batch["batch"], per_batch[column], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="concurrency B (tokens per decode step)",
           ylabel="tokens per expert")
    ax.legend()
    caption(fig, note)
    return fig


def tflops_vs_batch(rows: pd.DataFrame, peak_tflops: float | None, note: str):
    """Achieved TFLOPS (useful FLOPs) per method against concurrency, one panel per GEMM."""
    ok = rows[(rows["status"] == "ok") & rows["batch"].notna()]
    gemms = list(dict.fromkeys(ok["gemm"]))
    fig, axes = new_axes(ncols=max(1, len(gemms)))
    axes = np.atleast_1d(axes)
    for ax, gemm in zip(axes, gemms):
        sns.lineplot(data=ok[(ok["gemm"] == gemm) & (ok["ep"] == ok["ep"].min())], x="batch", y="tflops",
                     hue="method", marker="o", ax=ax)
        ax.set(xscale="log", title=gemm, xlabel="concurrency B", ylabel="achieved TFLOPS")
        if peak_tflops:
            secondary = ax.secondary_yaxis("right", functions=(lambda t: 100 * t / peak_tflops,
                                                                lambda p: p * peak_tflops / 100))
            secondary.set_ylabel("% of bf16 peak")
    caption(fig, note)
    return fig


def model_vs_measured(compared: pd.DataFrame, note: str):
    """Layer-model error against the measured rows, per method and batch."""
    fig, ax = new_axes()
    sns.barplot(data=compared.astype({"batch": int}), x="batch", y="error_pct", hue="method", ax=ax)
    ax.axhspan(-15, 15, color="0.9", zorder=0)
    ax.set(xlabel="concurrency B", ylabel="(predicted - measured) / measured, %")
    caption(fig, note)
    return fig


def utilization_vs_batch(table: pd.DataFrame, target: float, note: str):
    """Predicted utilization of the busiest rank, per EP degree, against concurrency."""
    fig, ax = new_axes()
    sns.lineplot(data=table, x="batch", y="grouped_utilization", hue="ep", marker="o", ax=ax,
                 palette="viridis")
    ax.axhline(target, color="0.3", linestyle="--", label=f"target {target:.0%}")
    ax.set(xscale="log", xlabel="concurrency B", ylabel="predicted utilization (grouped, bf16)")
    ax.legend(title="EP degree")
    caption(fig, note)
    return fig
