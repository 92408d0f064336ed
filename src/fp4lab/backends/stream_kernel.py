"""A one-launch read of a tensor's bytes: the "stream" stage of `triton-w4a16`'s anatomy.

The copy bandwidth is measured on a large buffer; a 10-40 MB weight tensor read in one launch also
pays the launch, the ramp-up and the last wave, so at those sizes no kernel that reads the bytes
once can beat what this one measures. It reads the bytes as int32 words with 16-byte vector loads,
each program a contiguous run of ITERS x BLOCK words, and XORs them into one word per program, so
no load can be optimized away and the result checks exactly (`expected_xor`).

Imported only when the stage is prepared (triton). `LAUNCH` is the shape that the H200's five-way
comparison put within 1% of the best on all three shapes of the grid (benchmarks/read_floor.py,
benchmarks/NOTES.md, call 20).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LAUNCH = (1024, 4, 4)     # BLOCK words, ITERS, warps


@triton.jit
def read_words(words_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """out[program] = XOR of its ITERS x BLOCK words (zero past n_words)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.static_range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(words_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def as_words(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors' bytes, concatenated and zero-padded to whole int32 words: [W] int32."""
    flat = torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])
    return torch.nn.functional.pad(flat, (0, -flat.numel() % 4)).view(torch.int32)


def programs(words: torch.Tensor, launch=LAUNCH) -> int:
    block, iters, _ = launch
    return triton.cdiv(words.numel(), block * iters)


def launch_read(words: torch.Tensor, out: torch.Tensor, launch=LAUNCH) -> torch.Tensor:
    """out [programs] int32 = each program's XOR; returns out."""
    block, iters, warps = launch
    read_words[(out.numel(),)](words, out, words.numel(), BLOCK=block, ITERS=iters,
                               num_warps=warps)
    return out


def expected_xor(words: torch.Tensor, count: int, launch=LAUNCH) -> torch.Tensor:
    """What `launch_read` returns, by torch: [count] int32."""
    block, iters, _ = launch
    run = torch.nn.functional.pad(words, (0, count * block * iters - words.numel()))
    run = run.view(count, block * iters)                   # a power of two wide: fold in halves
    while run.shape[1] > 1:
        half = run.shape[1] // 2
        run = run[:, :half] ^ run[:, half:]
    return run[:, 0]
