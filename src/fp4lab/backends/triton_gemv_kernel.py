"""The CUDA-core decode path of `triton-w4a16` (TileConfig math "gemv"): one activation row per
program, the FP4 weights streamed from HBM straight into registers.

Why a second kernel: at M = 1 the tensor-core kernel (`triton_w4a16_kernel`) issues ~4.9
instructions per weight, over half of them around the decode (the codes' 2-byte shared-memory
reads for the MMA operand layout, the software pipeline's addresses and barriers), and the H200
issues ~2 a cycle per SM there, so it takes ~2x the read floor (benchmarks/NOTES.md, call 20).
Here each thread loads 16 code bytes at a time (16-byte loads, no shared memory, no barrier),
decodes them with the same bit trick, and multiplies on CUDA cores:

  - an "element" is 16 consecutive code bytes of one weight row in the halves layout (two int64
    words): their low nibbles are 16 consecutive k of the tile's first half, the high nibbles the
    same 16 k of its second half. For nvfp4 that is one scale block per half (mxfp4: half of one);
  - `element_ptx` decodes the 32 codes to bf16 pairs (9 integer instructions per 4 weights, no
    scale multiply), multiplies each half's 8 pairs by the activations in one chain of bf16x2
    multiply-adds, widens the two chain sums to float32 and adds them, each times its block
    scale, to a float32 accumulator: ~2.5 instructions per weight;
  - the decoded codes are e2m1 * 2^-126 (bf16 bits, see `triton_w4a16_kernel`), so the
    activations enter multiplied by 2^SCALE_EXP (exact) to keep the products normal; a product
    is e2m1 * x * 2^-WEIGHT_SHIFT and the epilogue's `weight_factor` removes the bias, as in the
    tensor-core kernel;
  - precision: the products and a chain's sum of 8 of them are rounded to bf16 (8 bits), every
    chain sum then accumulates in float32 (the tensor cores round only the final sum), about
    2^-9 relative error per chain (the H200 gate: rel_err 3.8e-3 at 8192x8192, the tensor-core
    kernel 1.6e-3); the gate checks every configuration before it is timed;
  - mxfp4: the two elements of a 32-weight block each read its scale byte (1/32 B per weight
    read twice; the L1 serves the second);
  - what bounds it on the H200 (calls 24-25): the memory latency of each K step, not the
    instructions: with each load issued at its use it took 37 us at 8192x8192 (the tensor-core
    kernel 20 us), and more K splits made it slower. So the kernel keeps DEPTH tiles in flight in
    registers (TileConfig.num_stages): a tile's loads are issued DEPTH - 1 K steps before its
    decode.

K splits and their one-launch reduction are the tensor-core kernel's (`finish_tile`). Shape
legend: `N` weight rows, `K` reduction dimension, `BN` x `BK` the tile, `KH` = BK/2 bytes of a
tile row, `KE` = KH/16 elements of a tile row, `S` the scale block.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4lab.backends.triton_w4a16_kernel import (
    E5M3_BIAS, SCALE_EXP, WEIGHT_SHIFT, e2m1_times_2_pow_14, finish_tile, weight_factor,
)

# Globals a @triton.jit function reads are tl.constexpr. The activations are read as int64
# words of 4 bf16 (the literal 4 below; ACTIVATIONS_PER_WORD in `triton_w4a16_kernel`).
BIAS = tl.constexpr(2.0**-WEIGHT_SHIFT)          # the decoded codes' bias (module doc)
SCALE_EXPONENT_BIAS = tl.constexpr(127 - E5M3_BIAS)
# bf16 2^SCALE_EXP twice (bf16x2): exponent field SCALE_EXP + 127, no mantissa
BIAS_BF16X2 = ((SCALE_EXP + 127) << 7) * 0x10001
BIAS_ASM = tl.constexpr(f"""
{{
.reg .b32 a, b, k;
mov.b64 {{a, b}}, $1;
mov.b32 k, {hex(BIAS_BF16X2)};
mul.rn.bf16x2 a, a, k;
mul.rn.bf16x2 b, b, k;
mov.b64 $0, {{a, b}};
}}
""")


def _element_asm() -> str:
    """The PTX of `element_ptx`, written out per code byte pair (operands: $0 the new
    accumulator; $1 $2 the element's two code words; $3..$6 the activations of the low nibbles,
    $7..$10 of the high ones, 4 bf16 a word; $11 $12 the two halves' float32 scales; $13 the
    accumulator)."""
    lines = ["{", ".reg .b32 c<4>, xl<8>, xh<8>, t, wl, wh, cl, ch, fa, fb, z;", "mov.b32 z, 0;",
             "mov.b64 {c0, c1}, $1;", "mov.b64 {c2, c3}, $2;"]
    lines += [f"mov.b64 {{xl{2 * q}, xl{2 * q + 1}}}, ${3 + q};" for q in range(4)]
    lines += [f"mov.b64 {{xh{2 * q}, xh{2 * q + 1}}}, ${7 + q};" for q in range(4)]
    for pair in range(8):   # code bytes 2*pair and 2*pair+1: k and k+1 of each half
        word, selector = divmod(pair, 2)
        lines += [f"prmt.b32 t, c{word}, z, {'0x4342' if selector else '0x4140'};",
                  "and.b32 wl, t, 0x000F000F;", "and.b32 wh, t, 0x00F000F0;",
                  "mul.lo.u32 wl, wl, 0x1040;", "mul.lo.u32 wh, wh, 0x104;",
                  "and.b32 wl, wl, 0x81C081C0;", "and.b32 wh, wh, 0x81C081C0;"]
        if pair == 0:
            lines += ["mul.rn.bf16x2 cl, wl, xl0;", "mul.rn.bf16x2 ch, wh, xh0;"]
        else:
            lines += [f"fma.rn.bf16x2 cl, wl, xl{pair}, cl;",
                      f"fma.rn.bf16x2 ch, wh, xh{pair}, ch;"]
    lines.append("mov.f32 $0, $13;")
    for chain, scale in (("cl", "$11"), ("ch", "$12")):   # bf16x2 sum -> float32, scaled
        lines += [f"shl.b32 fa, {chain}, 16;", f"and.b32 fb, {chain}, 0xFFFF0000;",
                  "add.f32 fa, fa, fb;", f"fma.rn.f32 $0, fa, {scale}, $0;"]
    return "\n".join(lines + ["}"])


ELEMENT_ASM = tl.constexpr(_element_asm())


@triton.jit
def element_ptx(w_a, w_b, xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3, s_lo, s_hi, acc):
    """acc + (sum of the element's 16 low-nibble weights times their activations) * s_lo + (the
    same for the high nibbles) * s_hi, in the scaling described in the module doc. The
    activation words must carry the 2^SCALE_EXP bias (`bias_activations`)."""
    return tl.inline_asm_elementwise(
        asm=ELEMENT_ASM, constraints="=f,l,l,l,l,l,l,l,l,l,l,f,f,f",
        args=[w_a, w_b, xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3, s_lo, s_hi, acc],
        dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def bias_activations(words):
    """int64 words of 4 bf16 activations -> the same times 2^SCALE_EXP (exact)."""
    return tl.inline_asm_elementwise(asm=BIAS_ASM, constraints="=l,l", args=[words],
                                     dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def bf16_at(words, slot: tl.constexpr):
    """float32 value of bf16 number `slot` (0..3) of int64 words."""
    bits = ((words >> (16 * slot)) & 0xFFFF).to(tl.int32) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e2m1_at(word, nibble: tl.constexpr):
    """float32 e2m1 value of 4-bit code `nibble` (0..15) of int64 words."""
    return e2m1_times_2_pow_14(((word >> (4 * nibble)) & 0xF).to(tl.int32)) * 16384.0


@triton.jit
def element_bits(w_a, w_b, xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3, s_lo, s_hi, acc):
    """`element_ptx` in plain Triton and float32 (unbiased activations; the interpreter's path):
    the same sums, rounded only in float32."""
    code_words = (w_a, w_b)
    xs_lo = (xl0, xl1, xl2, xl3)
    xs_hi = (xh0, xh1, xh2, xh3)
    sum_lo = tl.zeros_like(acc)
    sum_hi = tl.zeros_like(acc)
    for byte in tl.static_range(16):   # byte b: k = b of the low half and of the high half
        word = code_words[byte // 8]
        sum_lo += (e2m1_at(word, 2 * (byte % 8))
                   * bf16_at(xs_lo[byte // 4], byte % 4))
        sum_hi += (e2m1_at(word, 2 * (byte % 8) + 1)
                   * bf16_at(xs_hi[byte // 4], byte % 4))
    return acc + (sum_lo * s_lo + sum_hi * s_hi) * BIAS


@triton.jit
def scale_f32(scale_bytes, IS_NVFP4: tl.constexpr):
    """Block-scale bytes -> their float32 value in one integer multiply-add: e5m3 (nvfp4, see
    `triton_w4a16_kernel`) EEEEEmmm -> exponent E - E5M3_BIAS; e8m0 (mxfp4) -> 2^(e - 127)."""
    if IS_NVFP4:
        bits = scale_bytes.to(tl.int32) * (1 << 20) + (SCALE_EXPONENT_BIAS << 23)
    else:
        bits = scale_bytes.to(tl.int32) * (1 << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def load_activation_words(acts, row_word, k0, K, e, EVEN_K: tl.constexpr):
    """The activation words under the low nibbles of elements `e` (k0 + 16e ..): [KE, 4] int64,
    4 k each (K is a multiple of 4: a word is all in or all out)."""
    q = tl.arange(0, 4)
    idx = row_word + k0 // 4 + (4 * e)[:, None] + q[None, :]                # [KE, 4]
    if EVEN_K:
        return tl.load(acts + idx)
    k_first = k0 + (16 * e)[:, None] + (4 * q)[None, :]
    return tl.load(acts + idx, mask=k_first < K, other=0)


@triton.jit
def split_words(words, KE: tl.constexpr):
    """[KE, 4] activation words -> their four columns, [1, KE] each (register moves only)."""
    even, odd = tl.split(tl.reshape(words, (KE, 2, 2)))                     # q = 2i, 2i + 1
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0[None, :], x1[None, :], x2[None, :], x3[None, :]


@triton.jit
def load_tile(code_rows, scale_rows, acts, row_word, k0, K, e, SCALE_BLOCK: tl.constexpr,
              KH: tl.constexpr, EVEN_K: tl.constexpr):
    """What one K step reads for the tile at k0, as loaded: the elements' code words [BN, KE, 2]
    int64, the activation words of their low and high nibbles [KE, 4] int64 each, and the scale
    bytes of the two halves [BN, KE] each."""
    words = tl.load(code_rows + (k0 // 16 + 2 * e)[None, :, None]
                    + tl.arange(0, 2)[None, None, :])
    x_lo = load_activation_words(acts, row_word, k0, K, e, EVEN_K)
    x_hi = load_activation_words(acts, row_word, k0 + KH, K, e, EVEN_K)
    s_lo = tl.load(scale_rows + ((k0 + 16 * e) // SCALE_BLOCK)[None, :])
    s_hi = tl.load(scale_rows + ((k0 + KH + 16 * e) // SCALE_BLOCK)[None, :])
    return words, x_lo, x_hi, s_lo, s_hi


@triton.jit
def consume_tile(acc, words, x_lo, x_hi, s_lo, s_hi, IS_NVFP4: tl.constexpr, KE: tl.constexpr,
                 DECODE: tl.constexpr):
    """acc [BN, KE] plus one tile's products (what `load_tile` returned)."""
    w_a, w_b = tl.split(words)                                              # [BN, KE] each
    xl0, xl1, xl2, xl3 = split_words(x_lo, KE)
    xh0, xh1, xh2, xh3 = split_words(x_hi, KE)
    scale_lo = scale_f32(s_lo, IS_NVFP4)
    scale_hi = scale_f32(s_hi, IS_NVFP4)
    if DECODE == "ptx":   # the activations [1, KE] broadcast over the rows by the asm
        return element_ptx(w_a, w_b, bias_activations(xl0), bias_activations(xl1),
                           bias_activations(xl2), bias_activations(xl3), bias_activations(xh0),
                           bias_activations(xh1), bias_activations(xh2), bias_activations(xh3),
                           scale_lo, scale_hi, acc)
    return element_bits(w_a, w_b, xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3, scale_lo, scale_hi,
                        acc)


# M, the split length and the split count vary per call: one compiled kernel serves them all
@triton.jit(do_not_specialize=["M", "blocks_per_split", "splits"])
def gemv_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, c_ptr, ws_ptr, count_ptr,
    M, N, K, blocks_per_split, splits,
    stride_am, stride_wn, stride_sn, stride_cm,
    IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, DECODE: tl.constexpr, DEPTH: tl.constexpr,
):
    """out[m, n-tile] over one K split (program_id(1)) for activation row m = program_id(0) % M.
    a: bf16 [M, K] with K and its row stride multiples of 4 and 8-byte aligned rows; w: the
    halves layout [N, Kp/2] (8-byte aligned rows); the rest as in `w4a16_kernel`."""
    KH: tl.constexpr = BLOCK_K // 2
    KE: tl.constexpr = KH // 16
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = pid % M                # the rows of one weight tile run side by side: W read once
    pid_n = pid // M
    offs_m = pid_m + tl.arange(0, 1)                                        # [1]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                        # [BN]
    m_mask = offs_m < M
    n_mask = offs_n < N
    codes = w_ptr.to(tl.pointer_type(tl.int64))
    acts = a_ptr.to(tl.pointer_type(tl.int64))
    row_word = pid_m * (stride_am // 4)
    e = tl.arange(0, KE)                                                    # [KE]
    rows = tl.minimum(offs_n, N - 1)   # rows past N read row N-1 (no load predicates), unstored
    code_rows = codes + rows[:, None, None] * (stride_wn // 8)              # [BN, 1, 1]
    scale_rows = s_ptr + rows[:, None] * stride_sn                          # [BN, 1]
    acc = tl.zeros((BLOCK_N, KE), dtype=tl.float32)

    # DEPTH tiles in flight in registers: a tile's loads are issued DEPTH - 1 K steps before
    # it is decoded, so they overlap the decode of the tiles before it. ptxas places the loads
    # in the last part of the step that issues them (the offline sm_90 SASS), so one step ahead
    # hid little (call 25); two steps ahead leave a whole step's decode between a load and its
    # use. Past the split's last tile the loads repeat it (no predicates).
    k_start = pid_k * blocks_per_split * BLOCK_K
    k_end = tl.minimum(k_start + blocks_per_split * BLOCK_K, K)
    k_last = k_start + (k_end - k_start - 1) // BLOCK_K * BLOCK_K
    if DEPTH >= 2:
        words1, x_lo1, x_hi1, s_lo1, s_hi1 = load_tile(code_rows, scale_rows, acts, row_word,
                                                       k_start, K, e, SCALE_BLOCK, KH, EVEN_K)
    if DEPTH >= 3:
        words2, x_lo2, x_hi2, s_lo2, s_hi2 = load_tile(
            code_rows, scale_rows, acts, row_word, tl.minimum(k_start + BLOCK_K, k_last), K, e,
            SCALE_BLOCK, KH, EVEN_K)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=1):
        k_ahead = tl.minimum(k0 + (DEPTH - 1) * BLOCK_K, k_last)
        words, x_lo, x_hi, s_lo, s_hi = load_tile(code_rows, scale_rows, acts, row_word,
                                                  k_ahead, K, e, SCALE_BLOCK, KH, EVEN_K)
        if DEPTH == 1:
            acc = consume_tile(acc, words, x_lo, x_hi, s_lo, s_hi, IS_NVFP4, KE, DECODE)
        else:
            acc = consume_tile(acc, words1, x_lo1, x_hi1, s_lo1, s_hi1, IS_NVFP4, KE, DECODE)
            if DEPTH == 2:
                words1, x_lo1, x_hi1, s_lo1, s_hi1 = words, x_lo, x_hi, s_lo, s_hi
            else:
                words1, x_lo1, x_hi1, s_lo1, s_hi1 = words2, x_lo2, x_hi2, s_lo2, s_hi2
                words2, x_lo2, x_hi2, s_lo2, s_hi2 = words, x_lo, x_hi, s_lo, s_hi

    tile = (tl.sum(acc, axis=1) * weight_factor(gs_ptr, IS_NVFP4))[None, :]  # [1, BN]
    finish_tile(tile, c_ptr, ws_ptr, count_ptr, pid, pid_k, splits, offs_m, offs_n, m_mask,
                n_mask, M, N, stride_cm, SPLIT)
