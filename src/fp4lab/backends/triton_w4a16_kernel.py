"""The Triton kernels behind `triton-w4a16`: FP4 weights read packed, decoded in registers.

Imported only when the backend is prepared (importing triton costs seconds and needs a GPU or
TRITON_INTERPRET=1). Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension,
`S` the format's scale block (16 nvfp4, 32 mxfp4); `BM`, `BN`, `BK` the tile sizes, `KH` = BK/2
bytes of a tile row, `Kp` K rounded up to whole BK blocks. Packed weights are [N, Kp/2] uint8 in
the halves layout (below; `fp4lab.formats` stores element 2j in the low nibble of byte j, and
prepare re-lays them once); block scales [N, Kp/S] one byte each: e8m0 for mxfp4, and for nvfp4
the e4m3 scales re-encoded once at prepare as "e5m3" (see SCALE_EXP below).

One tensor-core kernel (`w4a16_kernel`, TileConfig math "dot": bf16 MMAs, one K loop). At
decode-sized M the weight tile is the MMA's M side (SWAP_AB: out^T = W a^T), since wgmma needs
>= 64 rows there and M gives only a few: the padding of M to 16 costs tensor-core cycles, which
are not what limits a weight read. The CUDA-core path (math "gemv") is its own kernel,
`triton_gemv_kernel`, which shares this module's decode conventions and split-K epilogue.
Where the time of a weight-only kernel goes, besides the bytes, is the per-weight decode and the
instructions around it, so:
  - the weights are read in the "halves" layout that prepare writes once (`halves_layout` in
    `fp4lab.backends.triton_w4a16`): within each BK block of K, byte j of a row holds k = j in
    its low nibble and k = j + BK/2 in its high one. The low nibbles of a [BN, KH] byte tile are
    then the first half of the block's weights and the high nibbles the second half, so each
    half multiplies a contiguous half of the activation tile, loaded as it lies in memory and
    handed to the MMA from shared memory as loaded (no register shuffle, no second trip through
    shared memory), and the byte tile reaches the MMA operand layout with no shuffle either;
  - a code becomes bf16 with no float work (`decode_ptx`: 9 instructions per 4 weights, the block
    scales included, as one bf16x2 multiply per 2 weights); a block scale is one integer
    multiply-add.

Split-K in one launch: each CTA of a split writes its float32 partial tile to a workspace and bumps
the tile's counter; the CTA that arrives last sums the partials, writes the bf16 output and resets
the counter to zero for the next call (so a CUDA graph replays it with no memset node).

Stream-K (`w4a16_stream_kernel`, TileConfig.stream_k): a persistent grid of a few CTAs an SM, each
taking an equal share of all (output tile, K block) steps in order, so every SM has the same work
whatever the tile and split counts (a split grid fills whole waves only where they divide). The
runs that share a tile meet as the splits do: partials in the workspace, the last to arrive sums.

`STAGE` (compile-time) leaves stages out, for the kernel anatomy (`anatomy_variants`):
  "full"      the GEMM;
  "decode_x2" the GEMM with the weight decode done twice (two decodes added: twice the weights,
              exact, halved in the epilogue): what decode costs when it is not hidden;
  "decode"    loads and decode, no math: out[m, n] = sum_k w[n, k] + sum_k a[m, k] (one fp32 add
              per weight and a row reduction are the cheapest consumer a check can read);
  "load"      loads only: out[m, n] = int32 sum of the code bytes and scale bytes of row n plus the
              bf16 bit patterns of activation row m (wrapping), so no load can be optimized away;
  "math"      the GEMM on pre-decoded bf16 weights [N, K] (4x the bytes: loads of bf16 + math).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

NVFP4_SCALE_BLOCK = 16
MXFP4_SCALE_BLOCK = 32
STAGES = ("full", "decode_x2", "decode", "load", "math")
ACTIVATIONS_PER_WORD = 4         # the gemv kernel reads bf16 activations as int64 words
TMA_MIN_BOX_BYTES = 16           # a TMA box row is at least 16 bytes: narrower scale tiles
                                 # (BK/S < 16) are read by pointer
# Triton's CPU interpreter multiplies bf16 dot operands as their raw uint16 bits (triton 3.9), so
# under TRITON_INTERPRET=1 the dot runs on the same bf16-rounded values widened to fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# Decoded weights carry a power-of-two bias: the kernel multiplies e2m1 * scale * 2^-WEIGHT_SHIFT
# (exact in bf16: <= 6 significant bits, always a normal number) and the epilogue multiplies the
# sum by 2^WEIGHT_SHIFT. The bias comes from the bit trick that makes a code a bf16 with no float
# work: code bits s.ee.m placed at bf16 bits 15 and 8..6 read as e2m1 * 2^-126 (code 1 is the
# bf16 subnormal 2^-127), so the scale enters as scale * 2^SCALE_EXP and 2^-126 * 2^SCALE_EXP =
# 2^-WEIGHT_SHIFT. SCALE_EXP = 100 keeps every e4m3 scale and e8m0 scales 2^-99..2^27 in range.
#
# Scale bytes become that bf16 in ONE integer multiply-add, bf16 bits = byte * 2^M + C:
#   - mxfp4 e8m0 byte e: 2^(e-127) * 2^100 has bf16 exponent e + 100: bits = e * 128 + 100 * 128;
#   - nvfp4: prepare re-encodes each e4m3 scale (exactly) as an unsigned "e5m3" byte EEEEEmmm,
#     value 2^(E-10) (1 + m/8): e4m3's normals and subnormals (2^-9 .. 448) are all normal there,
#     so bits = byte * 16 + (217 << 7) (exponent E - 10 + 100 + 127). The byte count is the same.
# A zero scale (E = 0 or e = 0) decodes to a tiny power of two instead of 0: harmless, since
# formats writes all-zero codes in such a block.
SCALE_EXP = 100
WEIGHT_SHIFT = 126 - SCALE_EXP
E5M3_BIAS = 10
MXFP4_MIN_SCALE_BYTE = 128 - SCALE_EXP     # 2^-99: smaller ones would make subnormal weights
MXFP4_MAX_SCALE_BYTE = 254 - SCALE_EXP     # 2^27: larger ones overflow bf16 times 2^SCALE_EXP


@triton.jit
def decode_scales_bf16(scale_bytes, IS_NVFP4: tl.constexpr):
    """Block-scale bytes (e5m3 for nvfp4, see above; e8m0 for mxfp4) -> bf16 scale * 2^SCALE_EXP,
    exact, in one integer multiply-add."""
    if IS_NVFP4:
        bits = scale_bytes.to(tl.int32) * 16 + (217 << 7)
    else:
        bits = scale_bytes.to(tl.int32) * 128 + (100 << 7)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_times_2_pow_14(code):
    """float32 e2m1 value of the 4-bit code in the low bits of integers `code` (higher bits
    ignored), times 2^-14: the code's bits placed as an fp16 (s at bit 15, e1 e0 m at 11..9)."""
    bits = ((code & 0x08) << 12) | ((code & 0x07) << 9)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def decode_bits(packed, scale_lo, scale_hi):
    """Bytes (uint8) and the bf16 scales * 2^SCALE_EXP of their low and high nibbles' blocks ->
    (low nibble, high nibble) as bf16 e2m1 * scale * 2^-WEIGHT_SHIFT, in plain Triton (what
    `decode_ptx` computes)."""
    p = packed.to(tl.uint32)
    # 2^-14 * 2^SCALE_EXP * 2^-112 = 2^-26
    lo = e2m1_times_2_pow_14(p) * (scale_lo.to(tl.float32) * 2.0**-112)
    hi = e2m1_times_2_pow_14(p >> 4) * (scale_hi.to(tl.float32) * 2.0**-112)
    return lo.to(tl.bfloat16), hi.to(tl.bfloat16)


@triton.jit
def decode_ptx(packed, scale_lo, scale_hi):
    """`decode_bits` in 9 instructions per 2 bytes (4 weights), two bytes per call (what the
    tensor-core operand layout holds per register pair): the bytes are spread into the two 16-bit
    lanes of a register (prmt), each nibble half is masked, one multiply moves sign and magnitude
    into bf16 position at once (x * (2^12 + 2^6): the two copies do not overlap), one mask keeps
    bits 15 and 8..6 of each lane, one bf16x2 multiply per nibble half applies its scales. The
    CPU interpreter cannot run inline PTX: there `decode_bits` runs instead."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 z, x, lo, hi;
        mov.b32 z, 0;
        prmt.b32 x, $2, z, 0x4140;
        and.b32 lo, x, 0x000F000F;
        and.b32 hi, x, 0x00F000F0;
        mul.lo.u32 lo, lo, 0x1040;
        mul.lo.u32 hi, hi, 0x104;
        and.b32 lo, lo, 0x81C081C0;
        and.b32 hi, hi, 0x81C081C0;
        mul.rn.bf16x2 $0, lo, $3;
        mul.rn.bf16x2 $1, hi, $4;
        }
        """,
        constraints="=r,=r,r,r,r",
        args=[packed, scale_lo, scale_hi], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
        pack=2)


@triton.jit
def expand_scales(scale_bytes, IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                  BLOCK_N: tl.constexpr, KH: tl.constexpr):
    """Scale bytes [BN, KH/S] of one half tile -> their bf16 scale per weight, [BN, KH]."""
    GROUPS: tl.constexpr = KH // SCALE_BLOCK
    scale = decode_scales_bf16(scale_bytes, IS_NVFP4)                      # [BN, GROUPS]
    return tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, GROUPS, SCALE_BLOCK)),
                      (BLOCK_N, KH))                                       # [BN, KH]


@triton.jit
def scaled_halves(packed, scales_lo, scales_hi, salt, IS_NVFP4: tl.constexpr,
                  SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, KH: tl.constexpr,
                  TWICE: tl.constexpr, DECODE: tl.constexpr):
    """Decoded weights of a byte tile [BN, KH] in the halves layout, with the scale bytes of its
    two halves [BN, KH/S] each: (first half of the block's k, second half) as bf16 [BN, KH]
    each, e2m1 * scale * 2^-WEIGHT_SHIFT.

    TWICE decodes a second time from `packed ^ salt` (salt = 0, unknown to the compiler) and
    returns the sum of both decodes: twice the weights (exact), twice the decode work.
    """
    scale_lo = expand_scales(scales_lo, IS_NVFP4, SCALE_BLOCK, BLOCK_N, KH)
    scale_hi = expand_scales(scales_hi, IS_NVFP4, SCALE_BLOCK, BLOCK_N, KH)
    if DECODE == "ptx":
        lo, hi = decode_ptx(packed, scale_lo, scale_hi)
    else:
        lo, hi = decode_bits(packed, scale_lo, scale_hi)
    if TWICE:
        # 2x the weights, exact; the epilogue halves the sum
        if DECODE == "ptx":
            lo2, hi2 = decode_ptx(packed ^ salt, scale_lo, scale_hi)
            lo = lo + lo2                        # bf16x2 adds
            hi = hi + hi2
        else:  # in float32: the interpreter's bf16 arithmetic adds raw bits
            lo2, hi2 = decode_bits(packed ^ salt, scale_lo, scale_hi)
            lo = (lo.to(tl.float32) + lo2.to(tl.float32)).to(tl.bfloat16)
            hi = (hi.to(tl.float32) + hi2.to(tl.float32)).to(tl.bfloat16)
    return lo, hi


@triton.jit
def load_weight_tile(w_ptr, s_ptr, rows, row_mask, k0, stride_wn, stride_sn,
                     SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The code bytes [BN, BK/2] of rows `rows` over k0..k0+BK in the halves layout and the scale
    bytes of the block's two halves ([BN, KS/2] each). The weights are padded to whole BK
    blocks: no K mask."""
    KH: tl.constexpr = BLOCK_K // 2
    packed = tl.load(w_ptr + rows[:, None] * stride_wn + (k0 // 2 + tl.arange(0, KH))[None, :],
                     mask=row_mask[:, None], other=0)                      # [BN, KH] uint8
    scales_lo, scales_hi = load_scale_halves(s_ptr, rows, row_mask, k0, stride_sn, SCALE_BLOCK,
                                             BLOCK_N, BLOCK_K)
    return packed, scales_lo, scales_hi


@triton.jit
def load_scale_halves(s_ptr, rows, row_mask, k0, stride_sn, SCALE_BLOCK: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The scale bytes of rows `rows` for the BK block at k0, as its two halves ([BN, KS/2]
    each): one [BN, KS] load split in registers (as two half-width loads they fall under
    cp.async's 4-byte minimum on wide tiles and lose the software pipeline)."""
    KS: tl.constexpr = BLOCK_K // SCALE_BLOCK
    blocks = k0 // SCALE_BLOCK + tl.arange(0, KS)                          # [KS]
    both = tl.load(s_ptr + rows[:, None] * stride_sn + blocks[None, :], mask=row_mask[:, None],
                   other=0)                                                # [BN, KS] uint8
    return split_scale_halves(both, BLOCK_N, KS)


@triton.jit
def split_scale_halves(both, BLOCK_N: tl.constexpr, KS: tl.constexpr):
    """Scale bytes [BN, KS] of one BK block -> those of its first and second half of K."""
    halves = tl.permute(tl.reshape(both, (BLOCK_N, 2, KS // 2)), (0, 2, 1))  # [BN, KS/2, 2]
    return tl.split(halves)


@triton.jit
def load_weight_tile_tma(w_desc, s_desc, row0, rows, row_mask, k0, stride_sn,
                         SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SCALES_TMA: tl.constexpr):
    """`load_weight_tile` through tensor descriptors: the code tile [BN, BK/2] from rows row0..
    as one TMA copy (rows past N read as zero), the scale tile too when SCALES_TMA (its rows
    are >= 16 bytes: TMA's least box width), else by pointer (`s_desc` is then a pointer)."""
    KH: tl.constexpr = BLOCK_K // 2
    KS: tl.constexpr = BLOCK_K // SCALE_BLOCK
    packed = w_desc.load([row0, k0 // 2])                                  # [BN, KH] uint8
    if SCALES_TMA:
        scales_lo, scales_hi = split_scale_halves(s_desc.load([row0, k0 // SCALE_BLOCK]),
                                                  BLOCK_N, KS)
    else:
        scales_lo, scales_hi = load_scale_halves(s_desc, rows, row_mask, k0, stride_sn,
                                                 SCALE_BLOCK, BLOCK_N, BLOCK_K)
    return packed, scales_lo, scales_hi


@triton.jit
def load_halves(ptr, rows, row_mask, stride, k0, K, KH: tl.constexpr, EVEN_K: tl.constexpr):
    """Columns k0..k0+KH and k0+KH..k0+2*KH of rows `rows` of a [rows, K] matrix, zero past K
    and in masked rows: ([R, KH], [R, KH]), each a plain contiguous load."""
    cols = k0 + tl.arange(0, KH)                                           # [KH]
    base = ptr + rows[:, None] * stride + cols[None, :]
    lo_mask = row_mask[:, None]
    hi_mask = row_mask[:, None]
    if not EVEN_K:
        lo_mask = lo_mask & (cols < K)[None, :]
        hi_mask = hi_mask & (cols + KH < K)[None, :]
    return (tl.load(base, mask=lo_mask, other=0.0),
            tl.load(base + KH, mask=hi_mask, other=0.0))


@triton.jit
def tile_dot(acc, w, a, SWAP_AB: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """acc += w [BN, KH] . a [BM, KH]^T ([BN, BM] when SWAP_AB, else [BM, BN])."""
    if DOT_IN_FP32:
        # same bf16 values, exact fp32 products: what the tensor cores compute
        w = w.to(tl.bfloat16).to(tl.float32)
        a = a.to(tl.float32)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(a), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        w = w.to(tl.bfloat16)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    return acc


# M, the split length and the split count vary per call: not specialized, so one compiled kernel
# serves every M and split of a tile shape (the tuner compiles tile shapes, not points)
@triton.jit(do_not_specialize=["M", "blocks_per_split", "splits"])
def w4a16_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, c_ptr, ws_ptr, count_ptr, salt_ptr,
    M, N, K, blocks_per_split, splits,
    stride_am, stride_wn, stride_sn, stride_cm,
    IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, SWAP_AB: tl.constexpr, STAGE: tl.constexpr,
    EVEN_K: tl.constexpr, DECODE: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    NUM_STAGES: tl.constexpr, TMA: tl.constexpr, SCALES_TMA: tl.constexpr,
    TILED: tl.constexpr,
):
    """One [BM, BN] output tile over one K split (program_id(1)); see the module doc.

    salt_ptr: an int32 0 (read only in STAGE "decode_x2"); count_ptr: int32 [tiles], zero between
    calls; ws_ptr: the partial tiles [splits, M, N] in the accumulator's type; SPLIT: splits > 1.

    EVEN_K: K is a multiple of BK, so no activation load needs a K mask (the weights are padded
    to whole BK blocks by `halves_layout`: they never need one). In STAGE "math" `w_ptr` holds bf16
    weights [N, K] (stride_wn elements per row) and `s_ptr` is unused. NUM_STAGES: the K loop's
    software-pipeline depth, given to the loop itself: without it Triton pipelines only loads that
    feed a dot, so the stages with no dot ("load", "decode") ran with one K step of loads in flight
    (no cp.async in their SASS) and measured latency, not the GEMM's load stage.

    TMA: `a_ptr`, `w_ptr` (and `s_ptr` when SCALES_TMA) are tensor descriptors whose boxes are
    the kernel's tiles ([BM, KH] activations, [BN, KH] codes or bf16 weights, [BN, KS] scales):
    one TMA copy moves a whole tile into shared memory, where pointer loads issue one cp.async
    per 16 bytes per thread with its address arithmetic. Out-of-range rows and columns read as
    zero, as the masked loads' `other=0` does.

    TILED: the codes and scales are in `tiled_layout` (each [BN, BK] tile's bytes contiguous,
    tile (n, j) at rows (n * Kp/BK + j) * BN of a matrix BK/2 (BK/S) bytes wide), so a K step
    reads one contiguous run instead of BN runs a row apart; stride_wn and stride_sn are then
    those matrices' row strides.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_pid_m        # row tiles of one weight tile run side by side: W read once
    pid_n = pid // num_pid_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # [BN]
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = pid_k * blocks_per_split * BLOCK_K
    k_end = tl.minimum(k_start + blocks_per_split * BLOCK_K, K)
    tile = tile_product(a_ptr, w_ptr, s_ptr, gs_ptr, salt_ptr, pid_m, pid_n, k_start, k_end, M, N, K,
                        stride_am, stride_wn, stride_sn, IS_NVFP4, SCALE_BLOCK, BLOCK_M, BLOCK_N,
                        BLOCK_K, SWAP_AB, STAGE, EVEN_K, DECODE, DOT_IN_FP32, NUM_STAGES, TMA,
                        SCALES_TMA, TILED)
    finish_tile(tile, c_ptr, ws_ptr, count_ptr, pid, pid_k, splits, offs_m, offs_n, m_mask,
                n_mask, M, N, stride_cm, SPLIT)


# One program a share of every (tile, K block) step, in order: see the module doc's stream-K
@triton.jit(do_not_specialize=["M", "steps_per_program"])
def w4a16_stream_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, c_ptr, ws_ptr, count_ptr, salt_ptr,
    M, N, K, steps_per_program,
    stride_am, stride_wn, stride_sn, stride_cm,
    IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr, STAGE: tl.constexpr,
    EVEN_K: tl.constexpr, DECODE: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    NUM_STAGES: tl.constexpr, TMA: tl.constexpr, SCALES_TMA: tl.constexpr,
    TILED: tl.constexpr,
):
    """`w4a16_kernel`'s GEMM on a persistent grid (stream-K): the output tiles' K blocks, tile
    after tile, are one list of steps, and program p takes steps [p * steps_per_program, (p + 1)
    * steps_per_program): the tail of one tile and the head of the next, or a run inside one.
    A run that covers a whole tile stores it; the others park their partial in the workspace slot
    of their rank among the tile's programs ([slots, M, N]) and add their K blocks to the tile's
    counter, and the run that brings the counter to the tile's K blocks sums the slots, stores
    and resets the counter (zero between calls, as the split kernel's)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    k_blocks = tl.cdiv(K, BLOCK_K)
    steps = num_pid_m * tl.cdiv(N, BLOCK_N) * k_blocks
    step = pid * steps_per_program
    end = tl.minimum(step + steps_per_program, steps)
    while step < end:
        tile_id = step // k_blocks
        first = step - tile_id * k_blocks                               # K blocks of this run
        last = tl.minimum(end - tile_id * k_blocks, k_blocks)
        pid_m = tile_id % num_pid_m
        pid_n = tile_id // num_pid_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                # [BM]
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                # [BN]
        tile = tile_product(a_ptr, w_ptr, s_ptr, gs_ptr, salt_ptr, pid_m, pid_n, first * BLOCK_K,
                            tl.minimum(last * BLOCK_K, K), M, N, K, stride_am, stride_wn,
                            stride_sn, IS_NVFP4, SCALE_BLOCK, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                            STAGE, EVEN_K, DECODE, DOT_IN_FP32, NUM_STAGES, TMA, SCALES_TMA, TILED)
        m_mask = offs_m < M
        n_mask = offs_n < N
        if last - first == k_blocks:
            store_tile(c_ptr, tile, offs_m, offs_n, m_mask, n_mask, stride_cm)
        else:
            # the tile's programs are those whose steps meet its K blocks; a run's slot is its rank
            first_program = (tile_id * k_blocks) // steps_per_program
            ranks = ((tile_id + 1) * k_blocks - 1) // steps_per_program - first_program + 1
            share_tile(tile, c_ptr, ws_ptr, count_ptr, tile_id, pid - first_program, ranks,
                       last - first, k_blocks, offs_m, offs_n, m_mask, n_mask, M, N, stride_cm)
        step = tile_id * k_blocks + last


@triton.jit
def tile_product(a_ptr, w_ptr, s_ptr, gs_ptr, salt_ptr, pid_m, pid_n, k_start, k_end, M, N, K,
                 stride_am, stride_wn, stride_sn,
                 IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                 STAGE: tl.constexpr, EVEN_K: tl.constexpr, DECODE: tl.constexpr,
                 DOT_IN_FP32: tl.constexpr, NUM_STAGES: tl.constexpr, TMA: tl.constexpr,
                 SCALES_TMA: tl.constexpr, TILED: tl.constexpr):
    """Output tile (pid_m, pid_n) over K columns k_start..k_end (whole BK blocks from k_start):
    the stage's [BM, BN] result in the accumulator's type, weight-derived sums unbiased."""
    KH: tl.constexpr = BLOCK_K // 2
    KS: tl.constexpr = BLOCK_K // SCALE_BLOCK
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # [BN]
    m_mask = offs_m < M
    n_mask = offs_n < N

    CHECKSUM: tl.constexpr = STAGE == "load"
    ROW_SUMS: tl.constexpr = STAGE == "decode"
    # the checks' consumers add elementwise in the loop and reduce once after it: a reduction
    # across threads in every K step would cost more than the loads they stand in for
    if CHECKSUM:
        acc_w = tl.zeros((BLOCK_N, KH), dtype=tl.int32)
        acc_s = tl.zeros((BLOCK_N, KS // 2), dtype=tl.int32)
        acc_a = tl.zeros((BLOCK_M, KH), dtype=tl.int32)
    elif ROW_SUMS:
        acc_w = tl.zeros((BLOCK_N, KH), dtype=tl.float32)
        acc_a = tl.zeros((BLOCK_M, KH), dtype=tl.float32)
    elif SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)   # out^T tile
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    if STAGE == "decode_x2":
        salt = tl.load(salt_ptr).to(tl.uint8)   # 0, but the compiler cannot know it
    else:
        salt = 0
    # in whole BK blocks, so the compiler sees every tile start aligned (16-byte loads)
    k_blocks = tl.cdiv(K, BLOCK_K)        # BK blocks a weight row holds (TILED's tile index)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        # the block's two halves of K, as the halves layout pairs them      # [BM, KH] each
        if TMA:
            a_lo = a_ptr.load([pid_m * BLOCK_M, k0])
            a_hi = a_ptr.load([pid_m * BLOCK_M, k0 + KH])
        else:
            a_lo, a_hi = load_halves(a_ptr, offs_m, m_mask, stride_am, k0, K, KH, EVEN_K)
        if STAGE == "math" and TMA:
            w_lo = w_ptr.load([pid_n * BLOCK_N, k0])
            w_hi = w_ptr.load([pid_n * BLOCK_N, k0 + KH])
        elif STAGE == "math":
            w_lo, w_hi = load_halves(w_ptr, offs_n, n_mask, stride_wn, k0, K, KH, EVEN_K)
        else:
            if TILED:   # this K step's tile: its own rows of the tiled matrix, from column 0
                w_row0 = (pid_n * k_blocks + k0 // BLOCK_K) * BLOCK_N
                w_k0 = 0
            else:
                w_row0 = pid_n * BLOCK_N
                w_k0 = k0
            w_rows = w_row0 + tl.arange(0, BLOCK_N)                         # [BN]
            if TMA:
                packed, scales_lo, scales_hi = load_weight_tile_tma(
                    w_ptr, s_ptr, w_row0, w_rows, n_mask, w_k0, stride_sn, SCALE_BLOCK,
                    BLOCK_N, BLOCK_K, SCALES_TMA)
            else:
                packed, scales_lo, scales_hi = load_weight_tile(
                    w_ptr, s_ptr, w_rows, n_mask, w_k0, stride_wn, stride_sn, SCALE_BLOCK,
                    BLOCK_N, BLOCK_K)
        if CHECKSUM:
            acc_w += packed.to(tl.int32)
            acc_s += scales_lo.to(tl.int32) + scales_hi.to(tl.int32)
            acc_a += ((a_lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
                      + (a_hi.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF))
        else:
            if STAGE != "math":
                w_lo, w_hi = scaled_halves(packed, scales_lo, scales_hi, salt, IS_NVFP4,
                                           SCALE_BLOCK, BLOCK_N, KH, STAGE == "decode_x2",
                                           DECODE)
            if ROW_SUMS:
                acc_w += w_lo.to(tl.float32) + w_hi.to(tl.float32)
                acc_a += a_lo.to(tl.float32) + a_hi.to(tl.float32)
            else:
                acc = tile_dot(acc, w_lo, a_lo, SWAP_AB, DOT_IN_FP32)
                acc = tile_dot(acc, w_hi, a_hi, SWAP_AB, DOT_IN_FP32)

    # the tile as [BM, BN] in the accumulator's type, weight-derived sums unbiased
    if CHECKSUM:   # int32 sums wrap: the order of the adds does not change them
        tile = (tl.sum(acc_a, axis=1)[:, None]
                + (tl.sum(acc_w, axis=1) + tl.sum(acc_s, axis=1))[None, :])
    elif ROW_SUMS:
        tile = (tl.sum(acc_a, axis=1)[:, None]
                + (tl.sum(acc_w, axis=1) * weight_factor(gs_ptr, IS_NVFP4))[None, :])
    else:
        if SWAP_AB:
            tile = tl.trans(acc)
        else:
            tile = acc
        if STAGE == "decode_x2":
            tile = tile * (weight_factor(gs_ptr, IS_NVFP4) * 0.5)
        elif STAGE != "math":
            tile = tile * weight_factor(gs_ptr, IS_NVFP4)
    return tile


@triton.jit
def finish_tile(tile, c_ptr, ws_ptr, count_ptr, pid, pid_k, splits, offs_m, offs_n, m_mask,
                n_mask, M, N, stride_cm, SPLIT: tl.constexpr):
    """Write output tile `pid`'s [BM, BN] `tile` of K split `pid_k`: directly, or with SPLIT
    parked in the workspace, where the split that arrives last sums all of them and stores."""
    if SPLIT:
        share_tile(tile, c_ptr, ws_ptr, count_ptr, pid, pid_k, splits, 1, splits, offs_m, offs_n,
                   m_mask, n_mask, M, N, stride_cm)
    else:
        store_tile(c_ptr, tile, offs_m, offs_n, m_mask, n_mask, stride_cm)


@triton.jit
def share_tile(tile, c_ptr, ws_ptr, count_ptr, tile_id, slot, slots, part, whole, offs_m, offs_n,
               m_mask, n_mask, M, N, stride_cm):
    """One part of output tile `tile_id`, which several programs compute: `tile` parked in
    workspace slot `slot` ([slots, M, N]), `part` added to the tile's counter; the program whose
    part brings it to `whole` sums every slot, stores the tile and resets the counter to zero."""
    partial = ws_ptr + offs_m[:, None] * N + offs_n[None, :]              # [BM, BN]
    c_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(partial + slot * M * N, tile, mask=c_mask)
    tl.debug_barrier()   # every thread's partial is written before the release below
    arrived = tl.atomic_add(count_ptr + tile_id, part, sem="acq_rel")
    if arrived == whole - part:
        tile = tl.zeros_like(tile)
        for other in tl.range(0, slots):
            tile += tl.load(partial + other * M * N, mask=c_mask, other=0,
                            cache_modifier=".cg")                          # L2: other SMs wrote it
        tl.atomic_xchg(count_ptr + tile_id, 0)   # ready for the next call (graph replay)
        store_tile(c_ptr, tile, offs_m, offs_n, m_mask, n_mask, stride_cm)


@triton.jit
def weight_factor(gs_ptr, IS_NVFP4: tl.constexpr):
    """What a sum over decoded weights is multiplied by: 2^WEIGHT_SHIFT (their bias), divided by
    the nvfp4 global scale (formats stores the encode scale: decode divides by it)."""
    factor = 2.0**26
    if IS_NVFP4:
        factor = factor / tl.load(gs_ptr)
    return factor


@triton.jit
def store_tile(c_ptr, tile, offs_m, offs_n, m_mask, n_mask, stride_cm):
    """c[offs_m, offs_n] = tile [BM, BN] in c's dtype."""
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
             tile.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def tma_descriptor(tensor: torch.Tensor, name: str, box: list[int]):
    """A tensor descriptor over the 2-D `tensor` whose box (a TMA copy) is `box`; a ValueError
    naming `name` when TMA cannot read it (rows not contiguous or not 16-byte aligned)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    row_bytes = tensor.stride(0) * tensor.element_size()
    if tensor.stride(1) != 1 or row_bytes % 16 or tensor.data_ptr() % 16:
        raise ValueError(f"loads='tma' reads {name} through a tensor descriptor: rows must be "
                         f"contiguous and start 16-byte aligned, got strides {tensor.stride()} "
                         f"({row_bytes} B a row) at address {tensor.data_ptr():#x}")
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), box)


class Launch:
    """One configured kernel launch at one (M, N, K): grid, constants, and the split-K workspace
    and tile counters it owns (the counters return to zero at the end of every call)."""

    def __init__(self, m: int, n: int, k: int, fmt: str, config, stage: str, device,
                 acc_dtype=torch.float32, sm_count: int = 132):
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        self.m, self.n, self.k = m, n, k
        self.config = config
        tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
        # each program's share of K: BK blocks a split covers, or (stream-K) steps a program takes
        if config.stream_k:
            self.k_share, programs, slots = config.stream_plan(m, n, k, sm_count)
            self.grid = (programs,)
        else:
            self.k_share = config.blocks_per_split(k)
            slots = config.splits(k)
            self.grid = (tiles, slots)
        shape = (slots, m, n) if slots > 1 else (1,)                      # [slots, M, N]
        self.workspace = torch.empty(shape, dtype=acc_dtype, device=device)
        self.counts = torch.zeros(tiles, dtype=torch.int32, device=device)  # [tiles]
        self.salt = torch.zeros(1, dtype=torch.int32, device=device)
        is_nvfp4 = fmt == "nvfp4"
        self.tma = config.loads == "tma"
        common = dict(
            IS_NVFP4=is_nvfp4, SCALE_BLOCK=NVFP4_SCALE_BLOCK if is_nvfp4 else MXFP4_SCALE_BLOCK,
            BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            **({} if config.stream_k else {"SPLIT": slots > 1}),   # stream-K: each run sees if it shares
            EVEN_K=k % config.block_k == 0, DECODE="bits" if INTERPRETED else config.decode,
            num_warps=config.num_warps)
        if config.math == "gemv":
            if stage != "full":
                raise ValueError(f"stage {stage!r} runs on the tensor-core kernel; math='gemv' "
                                 "has only 'full'")
            if k % ACTIVATIONS_PER_WORD:
                raise ValueError(f"math='gemv' reads activations 4 at a time: K must be a "
                                 f"multiple of {ACTIVATIONS_PER_WORD}, got {k}")
            # num_stages counts the tiles in flight in registers (the kernel's own prefetch)
            self.constants = dict(common, DEPTH=config.num_stages, num_stages=1)
        else:
            half_k, scale_row = config.block_k // 2, config.block_k // common["SCALE_BLOCK"]
            scales_tma = self.tma and scale_row >= TMA_MIN_BOX_BYTES
            # the TMA boxes are the kernel's tiles: activations, codes (or bf16 weights), scales
            self.boxes = ([config.block_m, half_k], [config.block_n, half_k],
                          [config.block_n, scale_row] if scales_tma else None)
            self.constants = dict(common, BLOCK_M=config.block_m, SWAP_AB=config.swap_ab,
                                  STAGE=stage, DOT_IN_FP32=INTERPRETED,
                                  NUM_STAGES=config.num_stages, num_stages=config.num_stages,
                                  TMA=self.tma, SCALES_TMA=scales_tma,
                                  TILED=config.layout == "tiles")

    def __call__(self, a, w, scale_bytes, global_scale, out):
        """out[M, N] = a[M, K] @ dequant(w)[N, K]^T (or the stage's result); returns out."""
        if a.stride(1) != 1:
            raise ValueError(f"activations a must be contiguous along K, got strides {a.stride()}")
        if self.config.math == "gemv":
            return self._gemv(a, w, scale_bytes, global_scale, out)
        strides = (a.stride(0), w.stride(0), scale_bytes.stride(0), out.stride(0))
        a_arg, w_arg, s_arg = a, w, scale_bytes
        if self.tma:
            a_box, w_box, s_box = self.boxes
            a_arg = tma_descriptor(a, "activations a", a_box)
            w_arg = tma_descriptor(w, "weights", w_box)
            s_arg = tma_descriptor(scale_bytes, "scale bytes", s_box) if s_box else scale_bytes
        if self.config.stream_k:
            w4a16_stream_kernel[self.grid](
                a_arg, w_arg, s_arg, global_scale, out, self.workspace, self.counts, self.salt,
                self.m, self.n, self.k, self.k_share, *strides, **self.constants)
        else:
            w4a16_kernel[self.grid](
                a_arg, w_arg, s_arg, global_scale, out, self.workspace, self.counts, self.salt,
                self.m, self.n, self.k, self.k_share, self.grid[1], *strides,
                **self.constants)
        return out

    def _gemv(self, a, w, scale_bytes, global_scale, out):
        from fp4lab.backends.triton_gemv_kernel import gemv_kernel

        if a.stride(0) % ACTIVATIONS_PER_WORD or a.data_ptr() % 8:
            raise ValueError("math='gemv' reads activations as 8-byte words: their rows must "
                             f"start 8-byte aligned, got row stride {a.stride(0)} at address "
                             f"{a.data_ptr():#x}")
        gemv_kernel[self.grid](
            a, w, scale_bytes, global_scale, out, self.workspace, self.counts,
            self.m, self.n, self.k, self.k_share, self.grid[1],
            a.stride(0), w.stride(0), scale_bytes.stride(0), out.stride(0), **self.constants)
        return out
