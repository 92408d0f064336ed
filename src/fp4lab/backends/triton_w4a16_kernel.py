"""The Triton kernels behind `triton-w4a16`: FP4 weights decoded in registers, bf16 tensor cores.

Imported only when the backend is prepared (importing triton costs seconds and needs a GPU or
TRITON_INTERPRET=1). Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension,
`S` the format's scale block (16 nvfp4, 32 mxfp4); `BM`, `BN`, `BK` the tile sizes. Packed weights
are [N, K/2] uint8 (element 2i in the low nibble, 2i+1 in the high one), block scales [N, K/S] as
raw bytes (e4m3 for nvfp4, e8m0 for mxfp4).

Where the time goes in a weight-only kernel at small M is the decode, so it is kept to a handful
of integer ops per weight and nothing per weight that a whole block shares:
  - the two nibbles of a byte are interleaved into one [BN, BK] code tile, so ONE dot with
    K = BK runs over contiguous [BM, BK] activations;
  - each code becomes fp16 bits with two shifts and masks; read as fp16 the code is exactly its
    e2m1 value times 2^-14 (code 1 lands on the fp16 subnormal 2^-15 = 0.5 * 2^-14), so no select
    fixes the e = 0 case and no float chain runs per weight;
  - the block scales are decoded once per [BN, BK/S] tile (bit tricks, no exp2), already times
    2^14, and broadcast over their S weights: one fp16->fp32 convert, one multiply and one
    convert to bf16 per weight remain. code x scale has <= 6 significant bits, exact in bf16.
Not worth re-trying blindly: a conversion-free bf16 decode (codes and scales built as bf16 bits in
16-bit integer ops, one bf16 multiply per weight, same weights bit for bit) was measured slower on
the H200: 0.67x this decode's speed, geometric mean over 17 points (0.56x-0.82x), so it was
removed (benchmarks/NOTES.md).
SWAP_AB computes out^T = W @ a^T: the weight tile is the dot's left operand (M side, >= 64 rows
on Hopper's wgmma) and the few activation rows its N side, which suits decode-sized M.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

NVFP4_SCALE_BLOCK = 16
MXFP4_SCALE_BLOCK = 32


@triton.jit
def decode_e2m1_times_2pow_minus14(codes):
    """e2m1 codes (uint8, 0..15) -> float32 value * 2^-14, via fp16 bits s.00ee.m00000000."""
    codes16 = codes.to(tl.uint16)
    bits = ((codes16 & 8) << 12) | ((codes16 & 7) << 9)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def decode_scales_times_2pow14(scale_bytes, IS_NVFP4: tl.constexpr):
    """Block-scale bytes [BN, BK/S] (uint8) -> float32 scale * 2^14, built as float32 bits."""
    bits = scale_bytes.to(tl.int32)
    if IS_NVFP4:
        # e4m3 E.mmm normal: 2^(E-7) (1 + m/8) * 2^14 has fp32 exponent E + 134 and mantissa m
        normal = (((bits & 0x7F) << 20) + (134 << 23)).to(tl.float32, bitcast=True)
        subnormal = (bits & 7).to(tl.float32) * 32.0  # E = 0: m * 2^-9 * 2^14
        return tl.where((bits & 0x78) == 0, subnormal, normal)
    else:
        # e8m0: 2^(e-127) * 2^14 has fp32 exponent e + 14: exact up to 2^113 (e = 240);
        # prepare refuses larger scales (triton_w4a16.MAX_MXFP4_SCALE_BYTE)
        return ((bits + 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_weight_tile(w_ptr, s_ptr, offs_n, n_mask, k0, k_bytes, k_scales, stride_wn, stride_sn,
                     IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The dequantized weight tile w[offs_n, k0:k0+BK] as bf16 [BN, BK] (zeros past N and K).

    `k_bytes` = K/2 and `k_scales` = K/S come from the host so Triton sees their divisibility.
    """
    offs_byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)                    # [BK/2]
    offs_block = k0 // SCALE_BLOCK + tl.arange(0, BLOCK_K // SCALE_BLOCK)  # [BK/S]
    byte_mask = n_mask[:, None]
    scale_mask = n_mask[:, None]
    if not EVEN_K:
        byte_mask = byte_mask & (offs_byte < k_bytes)[None, :]
        scale_mask = scale_mask & (offs_block < k_scales)[None, :]
    packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_byte[None, :],
                     mask=byte_mask, other=0)                            # [BN, BK/2]
    codes = tl.interleave(packed & 15, packed >> 4)                      # [BN, BK] uint8
    scale_bytes = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_block[None, :],
                          mask=scale_mask, other=0)                      # [BN, BK/S]
    scale = decode_scales_times_2pow14(scale_bytes, IS_NVFP4)            # [BN, BK/S]
    values = decode_e2m1_times_2pow_minus14(codes)                       # [BN, BK]
    values = tl.reshape(values, (BLOCK_N, BLOCK_K // SCALE_BLOCK, SCALE_BLOCK))
    values = values * scale[:, :, None]                                  # [BN, BK/S, S]
    return tl.reshape(values, (BLOCK_N, BLOCK_K)).to(tl.bfloat16)


@triton.jit
def w4a16_gemm_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, c_ptr,
    M, N, K, k_bytes, k_scales, k_per_split,
    stride_am, stride_wn, stride_sn, stride_cs, stride_cm, stride_cn,
    IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr,
    WRITE_PARTIAL: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """One [BM, BN] output tile over one K split; activations are contiguous along K.

    EVEN_K: K is a multiple of BK, so no load needs a K mask.
    DOT_IN_FP32: under the interpreter (whose bf16 dot is wrong) the dot runs on the same bf16
    values widened to float32.
    WRITE_PARTIAL: store the float32 partial sum at c[pid_k] (split-K; a reduce kernel finishes);
    else scale by the nvfp4 global decode scale and store bf16.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    # grouped ordering: GROUP_M row tiles share each weight tile while it is in L2
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # [BN]
    offs_k = tl.arange(0, BLOCK_K)                          # [BK]
    m_mask = offs_m < M
    n_mask = offs_n < N

    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)   # out^T tile [BN, BM]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # [BM, BN]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in tl.range(k_start, k_end, BLOCK_K):
        k_cols = k0 + offs_k
        a_mask = m_mask[:, None]
        if not EVEN_K:
            a_mask = a_mask & (k_cols < K)[None, :]
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k_cols[None, :], mask=a_mask,
                    other=0.0)                                                  # [BM, BK]
        w = load_weight_tile(w_ptr, s_ptr, offs_n, n_mask, k0, k_bytes, k_scales, stride_wn,
                             stride_sn, IS_NVFP4, SCALE_BLOCK, BLOCK_N, BLOCK_K, EVEN_K)  # [BN, BK]
        if DOT_IN_FP32:
            # same bf16 values, exact fp32 products: what the tensor cores compute
            a = a.to(tl.float32)
            w = w.to(tl.float32)
            if SWAP_AB:
                acc += tl.dot(w, tl.trans(a), input_precision="ieee")
            else:
                acc += tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            if SWAP_AB:
                acc += tl.dot(w, tl.trans(a))
            else:
                acc += tl.dot(a, tl.trans(w))

    if SWAP_AB:
        c_mask = n_mask[:, None] & m_mask[None, :]
        c_offsets = offs_n[:, None] * stride_cn + offs_m[None, :] * stride_cm
    else:
        c_mask = m_mask[:, None] & n_mask[None, :]
        c_offsets = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if WRITE_PARTIAL:
        tl.store(c_ptr + pid_k * stride_cs + c_offsets, acc, mask=c_mask)
    else:
        if IS_NVFP4:
            acc = acc / tl.load(gs_ptr)  # formats stores the encode scale: decode divides by it
        tl.store(c_ptr + c_offsets, acc.to(tl.bfloat16), mask=c_mask)


@triton.jit
def split_k_reduce_kernel(p_ptr, gs_ptr, c_ptr, MN, SPLIT_K: tl.constexpr,
                          IS_NVFP4: tl.constexpr, BLOCK: tl.constexpr):
    """c[i] = sum_s p[s, i] (/ global scale) as bf16, over the flattened contiguous [M*N]."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        total += tl.load(p_ptr + split * MN + offs, mask=mask, other=0.0)
    if IS_NVFP4:
        total = total / tl.load(gs_ptr)
    tl.store(c_ptr + offs, total.to(tl.bfloat16), mask=mask)


REDUCE_BLOCK = 1024
# Triton's CPU interpreter multiplies bf16 dot operands as their raw uint16 bits (triton 3.9), so
# under TRITON_INTERPRET=1 the dot runs on the same bf16-rounded values widened to fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def w4a16_matmul(a, packed, scale_bytes, global_scale, out, workspace, config, fmt: str):
    """out[M, N] = a[M, K] @ dequant(packed, scales)[N, K]^T, launched with `config`.

    `a` must be contiguous along K (stride 1). `workspace` is float32 [split_k, M, N] when the
    config splits K (else unused, may be None).
    """
    m, k = a.shape
    n = packed.shape[0]
    if a.stride(1) != 1:
        raise ValueError(f"activations a must be contiguous along K, got strides {a.stride()}")
    is_nvfp4 = fmt == "nvfp4"
    scale_block = NVFP4_SCALE_BLOCK if is_nvfp4 else MXFP4_SCALE_BLOCK
    k_per_split = config.k_per_split(k)
    split_k = triton.cdiv(k, k_per_split)
    partial = split_k > 1
    target = workspace if partial else out
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), split_k)
    w4a16_gemm_kernel[grid](
        a, packed, scale_bytes, global_scale, target,
        m, n, k, k // 2, k // scale_block, k_per_split,
        a.stride(0), packed.stride(0), scale_bytes.stride(0),
        target.stride(0) if partial else 0, target.stride(-2), target.stride(-1),
        IS_NVFP4=is_nvfp4, SCALE_BLOCK=scale_block,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, SWAP_AB=config.swap_ab, EVEN_K=k % config.block_k == 0,
        WRITE_PARTIAL=partial,
        DOT_IN_FP32=INTERPRETED, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if partial:
        split_k_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            workspace, global_scale, out, m * n, SPLIT_K=split_k, IS_NVFP4=is_nvfp4,
            BLOCK=REDUCE_BLOCK,
        )
    return out
