"""The fastest one-launch read of a weight tensor's bytes fp4lab finds: what a decode GEMM that
reads those bytes once could take at best on this GPU, at this size (the copy bandwidth is
measured on a large buffer; a 10-40 MB tensor also pays the launch, the ramp and the last wave).

Used by `h200_kernels.py` beside the anatomy: the kernel reads the bytes as int32 words with
16-byte vector loads, each program a contiguous run of ITERS x BLOCK words, and XORs them into
one word per program (so no load can be optimized away). A few (BLOCK, ITERS, warps) shapes are
timed with the package's timer (cold L2, CUDA-graph replay); the fastest is the floor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4lab import bench

SHAPES = ((1024, 4, 4), (2048, 4, 8), (1024, 8, 4), (4096, 2, 8), (512, 8, 2))   # BLOCK, ITERS, warps


@triton.jit
def read_words(words_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """out[program] = XOR of its ITERS x BLOCK words (masked past n_words)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.static_range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(words_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def as_words(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors' bytes, concatenated and zero-padded to whole int32 words."""
    flat = torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])
    flat = torch.nn.functional.pad(flat, (0, -flat.numel() % 4))
    return flat.view(torch.int32)


def measure(words: torch.Tensor, timer: bench.TimerConfig, device: str) -> list[dict]:
    """One row per kernel shape: its median time, checked against torch's XOR of the words."""
    rows = []
    n = words.numel()
    for block, iters, warps in SHAPES:
        programs = triton.cdiv(n, block * iters)
        out = torch.empty(programs, dtype=torch.int32, device=words.device)

        def make_call(args, out, block=block, iters=iters, warps=warps, programs=programs):
            (w,) = args
            return lambda: read_words[(programs,)](w, out, n, BLOCK=block, ITERS=iters,
                                                   num_warps=warps)

        make_call((words,), out)()
        want = torch.nn.functional.pad(words, (0, programs * block * iters - n))
        want = want.view(programs, block * iters)                  # a power of two wide
        while want.shape[1] > 1:
            half = want.shape[1] // 2
            want = want[:, :half] ^ want[:, half:]
        want = want[:, 0]
        label = f"block {block} x {iters}, {warps} warps, {programs} programs"
        if not torch.equal(out, want):
            rows.append({"status": "wrong_result", "label": label,
                         "message": "XOR of the words differs from torch's"})
            continue
        timing = bench.time_call(make_call, (words,), out, timer, device)
        rows.append({"status": "ok", "label": label, "median_us": timing.median_us,
                     "p20_us": timing.p20_us, "p80_us": timing.p80_us,
                     "cold_l2": timing.cold_l2, "graph": timing.graph,
                     "bytes": 4 * n, "tbps": 4 * n / timing.median_us / 1e6})
    return rows
