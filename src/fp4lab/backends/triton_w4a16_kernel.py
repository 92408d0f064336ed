"""The Triton kernels behind `triton-w4a16`: FP4 weights decoded in registers, bf16 tensor-core math.

Imported only when the backend is prepared (importing triton costs seconds and needs a GPU or
TRITON_INTERPRET=1). Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension;
packed weights are [N, K/2] uint8 (element 2i in the low nibble, 2i+1 in the high one), block
scales [N, K/B] as raw bytes (B = 16 e4m3 for nvfp4, 32 e8m0 for mxfp4).

Instead of interleaving the two nibbles of a byte into one [N, K] tile, the kernel splits the
activations into even and odd columns and runs two dots: a[:, 0::2] @ low^T + a[:, 1::2] @ high^T.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


@triton.jit
def decode_e2m1(code):
    """4-bit codes (int32) -> float32: s.ee.m with values 0, .5, 1, 1.5, 2, 3, 4, 6."""
    magnitude = code & 7
    exponent = magnitude >> 1
    mantissa = (magnitude & 1).to(tl.float32)
    power = (1 << tl.maximum(exponent - 1, 0)).to(tl.float32)
    value = tl.where(exponent == 0, mantissa * 0.5, (1.0 + mantissa * 0.5) * power)
    return tl.where((code & 8) != 0, -value, value)


@triton.jit
def decode_e4m3(bits):
    """float8_e4m3fn bytes (int32, positive scales) -> float32."""
    exponent = (bits >> 3) & 15
    mantissa = (bits & 7).to(tl.float32)
    normal = (8.0 + mantissa) * tl.exp2((exponent - 10).to(tl.float32))
    return tl.where(exponent == 0, mantissa * 0.001953125, normal)  # subnormal: m * 2^-9


@triton.jit
def decode_e8m0(bits):
    """e8m0 bytes (int32) -> float32 powers of two 2^(e-127)."""
    return tl.exp2((bits - 127).to(tl.float32))


@triton.jit
def w4a16_gemm_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, c_ptr,
    M, N, K, k_per_split,
    stride_am, stride_ak, stride_wn, stride_sn, stride_cs, stride_cm, stride_cn,
    IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, WRITE_PARTIAL: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile over one K split.

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
    offs_j = tl.arange(0, BLOCK_K // 2)                     # [BK/2] byte within the tile
    m_mask = offs_m < M
    n_mask = offs_n < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in tl.range(k_start, k_end, BLOCK_K):
        k_even = k0 + 2 * offs_j                             # [BK/2]; K is even, so k_even+1 < K
        k_mask = k_even < K
        a_rows = a_ptr + offs_m[:, None] * stride_am
        a_mask = m_mask[:, None] & k_mask[None, :]
        a_even = tl.load(a_rows + k_even[None, :] * stride_ak, mask=a_mask, other=0.0)
        a_odd = tl.load(a_rows + (k_even + 1)[None, :] * stride_ak, mask=a_mask, other=0.0)

        w_mask = n_mask[:, None] & k_mask[None, :]
        packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k_even // 2)[None, :],
                         mask=w_mask, other=0).to(tl.int32)  # [BN, BK/2]
        scale_bits = tl.load(s_ptr + offs_n[:, None] * stride_sn
                             + (k_even // SCALE_BLOCK)[None, :], mask=w_mask, other=0).to(tl.int32)
        if IS_NVFP4:
            scale = decode_e4m3(scale_bits)
        else:
            scale = decode_e8m0(scale_bits)
        # code * block scale is exact in bf16 (<= 6 significant bits, fp32 exponent range)
        w_low = (decode_e2m1(packed & 15) * scale).to(tl.bfloat16)   # [BN, BK/2]
        w_high = (decode_e2m1(packed >> 4) * scale).to(tl.bfloat16)  # [BN, BK/2]
        if DOT_IN_FP32:
            # same bf16 values, exact fp32 products: what the tensor cores compute
            acc += tl.dot(a_even.to(tl.float32), tl.trans(w_low.to(tl.float32)),
                          input_precision="ieee")
            acc += tl.dot(a_odd.to(tl.float32), tl.trans(w_high.to(tl.float32)),
                          input_precision="ieee")
        else:
            acc += tl.dot(a_even, tl.trans(w_low))
            acc += tl.dot(a_odd, tl.trans(w_high))

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

    `workspace` is float32 [split_k, M, N] when config.split_k > 1 (else unused, may be None).
    """
    m, k = a.shape
    n = packed.shape[0]
    is_nvfp4 = fmt == "nvfp4"
    k_per_split = config.k_per_split(k)
    split_k = triton.cdiv(k, k_per_split)
    partial = split_k > 1
    target = workspace if partial else out
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), split_k)
    w4a16_gemm_kernel[grid](
        a, packed, scale_bytes, global_scale, target,
        m, n, k, k_per_split,
        a.stride(0), a.stride(1), packed.stride(0), scale_bytes.stride(0),
        target.stride(0) if partial else 0, target.stride(-2), target.stride(-1),
        IS_NVFP4=is_nvfp4, SCALE_BLOCK=16 if is_nvfp4 else 32,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, WRITE_PARTIAL=partial, DOT_IN_FP32=INTERPRETED,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if partial:
        split_k_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            workspace, global_scale, out, m * n, SPLIT_K=split_k, IS_NVFP4=is_nvfp4,
            BLOCK=REDUCE_BLOCK,
        )
    return out
