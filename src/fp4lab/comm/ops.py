"""The communication ops fp4lab measures, and what their sizes and bandwidths mean.

Shape legend: `n` ranks in the group, `T` tokens, `k` top-k, `H` hidden, `b` bytes per element.

The four ops of a decode step spread over GPUs:
- `all_reduce`: tensor parallelism sums each layer's partial output `[T, H]` over the TP ranks.
- `all_to_all_dispatch`: expert parallelism sends each token's hidden state to the rank holding
  each of its k experts, `[T, k, H]` rows per rank in all, split unevenly by the routing.
- `all_to_all_combine`: the expert outputs travel back the same way (the dispatch, transposed).
- `send_recv`: pipeline parallelism hands a stage's activations `[T, H]` to the next stage; every
  rank sends to the next and receives from the previous one (a ring, as nccl-tests' sendrecv).

Bandwidths follow nccl-tests (its PERFORMANCE.md): algbw = bytes / time, in GB/s of 1e9 bytes;
busbw = algbw * factor, the factor making busbw comparable to the link's peak whatever n is:
all_reduce 2(n-1)/n, all-to-all (n-1)/n, sendrecv 1. `bytes` is, as there, the per-rank buffer:
the all-reduced tensor, the all-to-all send buffer, the message sent. With uneven all-to-all
splits it is the busiest rank's larger buffer (what it sends or receives), since the busiest
rank sets the time; with even splits that is nccl-tests' size exactly.
"""

from __future__ import annotations

from fp4lab.dtypes import BYTES_PER_VALUE

ALL_REDUCE = "all_reduce"
DISPATCH = "all_to_all_dispatch"
COMBINE = "all_to_all_combine"
SEND_RECV = "send_recv"
OPS = (ALL_REDUCE, DISPATCH, COMBINE, SEND_RECV)
ALL_TO_ALL_OPS = (DISPATCH, COMBINE)

# what each op is for, in one line (tables and the CLI help)
PURPOSE = {
    ALL_REDUCE: "TP: sum of the layer output [T, H] over the TP ranks",
    DISPATCH: "EP: tokens to their experts' ranks, [T, k, H] per rank, uneven splits",
    COMBINE: "EP: expert outputs back to their tokens' ranks (dispatch transposed)",
    SEND_RECV: "PP: stage activations [T, H] to the next stage (ring)",
}

DTYPES = ("bf16", "fp8")          # fp8 = e4m3, moved as its bytes (all-to-all is data movement)
ELEMENT_BYTES = {dtype: int(BYTES_PER_VALUE[dtype]) for dtype in DTYPES}


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw ratio for `op` over `ranks` ranks."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if op == ALL_REDUCE:
        return 2 * (ranks - 1) / ranks
    if op in ALL_TO_ALL_OPS:
        return (ranks - 1) / ranks
    return 1.0


def algbw_gbps(nbytes: int, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes per second): bytes / time."""
    if not time_us > 0:
        raise ValueError(f"time_us must be > 0, got {time_us!r}")
    return nbytes / time_us / 1e3


def busbw_gbps(op: str, nbytes: int, time_us: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: algbw times nccl-tests' factor for the op."""
    return algbw_gbps(nbytes, time_us) * bus_factor(op, ranks)


def activation_bytes(tokens: int, hidden: int, dtype: str = "bf16") -> int:
    """Bytes of `[T, H]` activations: what all_reduce reduces and send_recv sends."""
    return tokens * hidden * ELEMENT_BYTES[dtype]
