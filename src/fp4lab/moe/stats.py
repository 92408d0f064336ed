"""Per-expert load statistics: the mean expert, the busiest expert, and the busiest EP rank.

Shape legend: `S` steps, `E` routed experts, `P` expert-parallel degree. Input is the per-step
loads `[S, E]` from `fp4lab.moe.routing`. The busiest expert (or, with EP, the busiest rank)
sets a decode step's MoE time, so its mean over steps matters more than the mean expert.
"""

from __future__ import annotations

import numpy as np


def expert_load_stats(loads: np.ndarray) -> dict[str, float]:
    """Statistics over steps of the per-expert token counts `loads: [S, E]`."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim != 2 or loads.size == 0:
        raise ValueError(f"loads: expected a non-empty [steps, experts] array, got shape {loads.shape}")
    step_mean = loads.mean(axis=1)                                          # [S]
    step_std = loads.std(axis=1)                                            # [S]
    step_max = loads.max(axis=1)                                            # [S]
    return {
        "mean_tokens_per_expert": float(step_mean.mean()),
        "p50_tokens_per_expert": float(np.percentile(loads, 50)),
        "p99_tokens_per_expert": float(np.percentile(loads, 99)),
        "mean_max_tokens_per_expert": float(step_max.mean()),
        "max_tokens_per_expert": float(step_max.max()),
        # coefficient of variation across experts within a step, averaged over steps
        "cv": float(np.mean(np.divide(step_std, step_mean, out=np.zeros_like(step_std),
                                      where=step_mean > 0))),
        "mean_idle_experts": float((loads == 0).sum(axis=1).mean()),
        "busiest_over_mean": float(np.mean(np.divide(step_max, step_mean, out=np.zeros_like(step_max),
                                                     where=step_mean > 0))),
    }


def rank_loads(loads: np.ndarray, ep: int) -> np.ndarray:
    """Tokens per EP rank `[S, P]`: experts split contiguously, E/P per rank."""
    steps, experts = loads.shape
    if isinstance(ep, bool) or not isinstance(ep, (int, np.integer)) or ep <= 0:
        raise ValueError(f"ep={ep!r}: must be a positive integer")
    if experts % ep:
        raise ValueError(f"ep={ep}: {experts} experts do not split evenly over {ep} ranks")
    return loads.reshape(steps, ep, experts // ep).sum(axis=-1)


def busiest_rank_experts(loads_step: np.ndarray, ep: int) -> np.ndarray:
    """One step's loads `[E]` -> the loads `[E/P]` of the rank receiving the most tokens."""
    per_rank = np.asarray(loads_step).reshape(ep, -1)                        # [P, E/P]
    return per_rank[per_rank.sum(axis=1).argmax()]


def ep_stats(loads: np.ndarray, ep: int) -> dict[str, float]:
    """Per-rank statistics for EP degree `ep` (the busiest rank sets the step time)."""
    ranks = rank_loads(loads, ep).astype(np.float64)                       # [S, P]
    experts_per_rank = loads.reshape(loads.shape[0], ep, -1)                # [S, P, E/P]
    busiest = ranks.argmax(axis=1)                                          # [S]
    busiest_experts = experts_per_rank[np.arange(len(busiest)), busiest]    # [S, E/P]
    step_mean = ranks.mean(axis=1)
    step_max = ranks.max(axis=1)
    return {
        "ep": int(ep),
        "experts_per_rank": int(loads.shape[1] // ep),
        "mean_tokens_per_rank": float(step_mean.mean()),
        "mean_max_tokens_per_rank": float(step_max.mean()),
        "rank_max_over_mean": float(np.mean(np.divide(step_max, step_mean, out=np.zeros_like(step_max),
                                                      where=step_mean > 0))),
        "mean_active_experts_busiest_rank": float((busiest_experts > 0).sum(axis=1).mean()),
        "mean_max_tokens_per_expert_busiest_rank": float(busiest_experts.max(axis=1).mean()),
    }


def summarize(loads: np.ndarray, ep_degrees=(1,)) -> dict:
    """Expert statistics plus, per EP degree, the rank statistics (what `moe-stats` prints)."""
    summary = expert_load_stats(loads)
    summary["steps"] = int(loads.shape[0])
    summary["experts"] = int(loads.shape[1])
    summary["ep"] = {str(p): ep_stats(loads, p) for p in ep_degrees}
    return summary


def representative_step(loads: np.ndarray) -> int:
    """The step whose busiest expert is closest to the mean busiest: the one worth timing."""
    step_max = loads.max(axis=1)
    return int(np.abs(step_max - step_max.mean()).argmin())
