"""One point's buffers, its data check and the call the timer times, through `torch.distributed`.

Shape legend: `n` ranks in the group, `T` tokens, `H` hidden, `R` all-to-all rows received,
`S` rows sent, `B` bytes per row (H times the dtype's bytes).

Correct before fast: every point first runs its op once on patterned data and checks what
arrived (an all-reduce of ones sums to n everywhere; each all-to-all block and each ring message
carries its sender's pattern), then the timed call repeats the op on the same buffers.
All-to-all buffers travel as their bytes (`uint8 [rows, B]`): the op only moves data, so a bf16 or
an e4m3 row is its bytes, and gloo (which has no float8) moves them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from fp4lab.comm import ops, splits
from fp4lab.comm.plan import CommPlan, CommPoint


class Unavailable(Exception):
    """The op cannot run here (the message is the reason in its row)."""


@dataclass
class PreparedOp:
    """A point ready to time: `make_call(args, None)` runs the op `calls` times back to back."""

    nbytes: int                                  # nccl-tests' size (comm.ops)
    calls: int                                   # ops per timed sample
    args: tuple
    make_call: Callable[[tuple, Any], Callable[[], None]]
    check: Callable[[], str]                     # "" when the data arrived right, else what did not
    imbalance: float | None = None               # all-to-all: busiest rank's rows / mean


def prepare(point: CommPoint, plan: CommPlan, group, members: list[int], rank: int,
            device: torch.device) -> PreparedOp:
    """The buffers and call of `point` for `rank`, one of `members` (global ranks, in order)."""
    if point.op == ops.ALL_REDUCE:
        return _all_reduce(point, plan, group, len(members), device)
    if point.op in ops.ALL_TO_ALL_OPS:
        return _all_to_all(point, plan, group, members.index(rank), device)
    if point.op == ops.SEND_RECV:
        return _send_recv(point, plan, group, members, rank, device)
    raise ValueError(f"op {point.op!r}: not one of {', '.join(ops.OPS)}")


def _repeat(calls: int, op: Callable[[], None]) -> Callable[[], None]:
    def run():
        for _ in range(calls):
            op()
    return run


# -- all-reduce ---------------------------------------------------------------------------------

def _all_reduce(point, plan, group, ranks, device) -> PreparedOp:
    buffer = torch.ones(point.tokens, plan.hidden, dtype=torch.bfloat16, device=device)  # [T, H]
    nbytes = ops.activation_bytes(point.tokens, plan.hidden)

    def check() -> str:
        dist.all_reduce(buffer, group=group)
        wrong = int((buffer != ranks).sum())
        buffer.zero_()  # timed calls reduce zeros: values stay finite however often they repeat
        return f"{wrong} of {buffer.numel()} sums differ from {ranks}" if wrong else ""

    def make_call(args, _out):
        (tensor,) = args
        return _repeat(calls, lambda: dist.all_reduce(tensor, group=group))

    calls = plan.calls_per_sample(nbytes)
    return PreparedOp(nbytes, calls, (buffer,), make_call, check)


# -- all-to-all ---------------------------------------------------------------------------------

def block_pattern(source: int, destination: int) -> int:
    """The byte every row sent from `source` to `destination` carries (a data check)."""
    return (source * 37 + destination * 11 + 1) % 251


def _rows_filled(counts: np.ndarray, values: list[int], row_bytes: int,
                 device: torch.device) -> torch.Tensor:
    """uint8 [sum(counts), row_bytes]: counts[i] rows of byte values[i], block after block
    (built on `device`: at 2048 tokens per rank a buffer is hundreds of MB)."""
    per_row = torch.repeat_interleave(torch.tensor(values, dtype=torch.uint8, device=device),
                                      torch.as_tensor(counts, dtype=torch.int64, device=device),
                                      output_size=int(np.sum(counts)))
    return per_row[:, None].expand(-1, row_bytes).contiguous()


def _all_to_all(point, plan, group, index, device) -> PreparedOp:
    matrix = splits.dispatch_splits(point.routing, plan.experts, plan.top_k, point.tokens,
                                    point.world_size, plan.seed)           # [n, n] rows
    if point.op == ops.COMBINE:
        matrix = splits.combine_splits(matrix)
    row_bytes = plan.hidden * ops.ELEMENT_BYTES[point.dtype]               # B
    send_rows, recv_rows = matrix[index], matrix[:, index]                 # [n], [n]
    ranks = range(point.world_size)
    send = _rows_filled(send_rows, [block_pattern(index, d) for d in ranks], row_bytes, device)
    expected = _rows_filled(recv_rows, [block_pattern(s, index) for s in ranks], row_bytes, device)
    received = torch.empty_like(expected)                                   # [R, B]
    send_splits, recv_splits = send_rows.tolist(), recv_rows.tolist()
    nbytes = splits.busiest_rows(matrix) * row_bytes

    def exchange(out, inp):
        dist.all_to_all_single(out, inp, recv_splits, send_splits, group=group)

    def check() -> str:
        received.fill_(255)
        exchange(received, send)
        wrong = int((received != expected).any(dim=1).sum()) if received.numel() else 0
        return f"{wrong} of {len(received)} received rows hold another rank's data" if wrong else ""

    def make_call(args, _out):
        out, inp = args
        return _repeat(calls, lambda: exchange(out, inp))

    calls = plan.calls_per_sample(nbytes)
    return PreparedOp(nbytes, calls, (received, send), make_call, check,
                      imbalance=splits.imbalance(matrix))


# -- send / recv ring ---------------------------------------------------------------------------

def _send_recv(point, plan, group, members, rank, device) -> PreparedOp:
    if len(members) == 1 and dist.get_backend(group) == "gloo":
        raise Unavailable("gloo cannot send a message to its own rank (a one-rank ring); "
                          "NCCL can")
    index = members.index(rank)
    following, preceding = members[(index + 1) % len(members)], members[index - 1]
    message = torch.full((point.tokens, plan.hidden), float(index % 200 + 1),
                         dtype=torch.bfloat16, device=device)               # [T, H]
    arrived = torch.zeros_like(message)
    nbytes = ops.activation_bytes(point.tokens, plan.hidden)

    def exchange(out, inp):
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, following, group),
                                           dist.P2POp(dist.irecv, out, preceding, group)])
        for request in requests:
            request.wait()

    def check() -> str:
        exchange(arrived, message)
        sender = members.index(preceding) % 200 + 1
        wrong = int((arrived != sender).sum())
        return f"{wrong} of {arrived.numel()} values differ from rank {preceding}'s" if wrong else ""

    def make_call(args, _out):
        out, inp = args
        return _repeat(calls, lambda: exchange(out, inp))

    calls = plan.calls_per_sample(nbytes)
    return PreparedOp(nbytes, calls, (arrived, message), make_call, check)
