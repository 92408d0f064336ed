"""How an expert-parallel all-to-all splits: rows each rank sends each rank, from a routing model.

Shape legend: `n` EP ranks, `T` tokens per rank, `k` top-k, `E` routed experts.

Each rank holds `T` tokens of the decode batch (attention data-parallel, as in DeepEP's and
pplx-kernels' "tokens per GPU") and a contiguous block of about E/n experts. A dispatch sends one
row `[H]` per (token, chosen expert) pair to the expert's rank, itself included, so every rank
sends T*k rows; what a rank receives follows its experts' popularity. (Kernels that send a token
once per destination rank rather than once per expert, as DeepEP does, move fewer rows at small n:
these splits are the per-expert upper bound.) The routing models are `fp4lab.moe.routing`'s, drawn
for one decode step of n*T tokens, the same on every rank from the same seed.
"""

from __future__ import annotations

import numpy as np

from fp4lab.moe import routing


def expert_owner(experts: int, ranks: int) -> np.ndarray:
    """The EP rank of each expert `[E]`: contiguous blocks of E/n (sizes differ by at most one)."""
    if ranks < 1 or ranks > experts:
        raise ValueError(f"ranks={ranks}: an EP group needs 1 <= ranks <= experts={experts}")
    return np.arange(experts) * ranks // experts


def dispatch_splits(spec: str, experts: int, top_k: int, tokens_per_rank: int, ranks: int,
                    seed: int = 0) -> np.ndarray:
    """Rows `[n, n]` int64: [src, dst] = (token, expert) pairs of src's tokens whose expert is on dst."""
    ids = routing.sample_expert_ids(spec, experts, top_k, batch=ranks * tokens_per_rank,
                                    steps=1, seed=seed)[0]                 # [n*T, k]
    destination = expert_owner(experts, ranks)[ids].reshape(ranks, -1)     # [n, T*k]
    flat = (destination + ranks * np.arange(ranks)[:, None]).ravel()
    return np.bincount(flat, minlength=ranks * ranks).reshape(ranks, ranks)


def combine_splits(dispatch: np.ndarray) -> np.ndarray:
    """The combine sends every dispatched row back: the dispatch matrix transposed."""
    return dispatch.T.copy()


def busiest_rows(splits: np.ndarray) -> int:
    """The busiest rank's larger side: max over ranks of max(rows sent, rows received)."""
    return int(max(splits.sum(axis=1).max(), splits.sum(axis=0).max()))


def imbalance(splits: np.ndarray) -> float:
    """The busiest rank's rows (`busiest_rows`) over the mean rows per rank (1.0 = even)."""
    mean = splits.sum() / len(splits)
    return float(busiest_rows(splits) / mean) if mean else 1.0
