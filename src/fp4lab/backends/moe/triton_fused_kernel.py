"""The Triton kernels behind `triton-w4a16-moe`: the routing tables, then one launch per expert
GEMM over all experts.

Imported only when the method is prepared (triton). They reuse the dense kernel's decode and dot
(`fp4lab.backends.triton_w4a16_kernel`): FP4 weights [E, N, Kp/2] in its halves layout (byte j of
a BK block holds k = j and j + BK/2), decoded in registers, bf16
tensor cores with the weight tile as the MMA's M side (out^T = W a^T, `SWAP_AB`) since an expert
sees few tokens at decode.

Shape legend: `E` experts, `T` tokens, `k` top-k, `P` = T*k (token, slot) pairs, `H` hidden,
`I` moe_intermediate, `W` work items; tiles `BM` pairs, `BN` weight rows, `BK` reduction.

A work item is (expert, tile of up to BM of its pairs); `route_kernel` lists them busiest expert
first (`work_expert`, `work_start`, `work_rows`, padded with expert -1), and a CTA is (N tile,
work item) with the N tiles fastest, so the busiest expert's tiles are dispatched first and do
not become the tail. Pairs are grouped by expert (`sorted_pairs`: pair ids p = t*k + j), so an
expert's rows are contiguous in the intermediate activations.
  - gate_up: act[s] = silu(x[t] . gate_e) * (x[t] . up_e) for the pair at sorted position s
    (token t = p // k): two weight tiles (rows n of the gate half, I + n of the up half), two
    accumulators, the SiLU-and-multiply in the epilogue; bf16 out.
  - down: y[p] = topk_weight[p] * (act[s] . down_e), written at the pair's own row of y [P, H]
    (bf16); the top-k sum over each token's k rows is left to the caller.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fp4lab.backends.triton_w4a16_kernel import (
    TMA_MIN_BOX_BYTES, load_halves, load_weight_tile, load_weight_tile_tma, scaled_halves,
    tile_dot, tma_descriptor,
)


@triton.jit
def expert_factor(gs_ptr, e, IS_NVFP4: tl.constexpr):
    """2^WEIGHT_SHIFT (the decoded weights' bias), over expert e's nvfp4 global scale."""
    factor = 2.0**26
    if IS_NVFP4:
        factor = factor / tl.load(gs_ptr + e)
    return factor


@triton.jit
def weight_tile(w_ptr, s_ptr, e, w_rows, expert_w, expert_s, row0, rows, n_mask, k0, k_blocks,
                stride_wn, stride_sn, IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr,
                TMA: tl.constexpr, SCALES_TMA: tl.constexpr, TILED: tl.constexpr):
    """Decoded rows `rows` [BN] (the first is row0) of expert e's weights over k0..k0+BK: (first
    half of the block's k, second half) bf16 [BN, BK/2] each. With TMA the weights are
    descriptors over all experts' rows ([E * w_rows, ..]): a tile that runs past the expert's
    last row reads the next expert's first rows, which only feed output columns past N (never
    stored). TILED: all experts' rows in `tiled_layout` (w_rows a multiple of BN, row0 too):
    the tile is one contiguous run, rows ((e * w_rows/BN + row0/BN) * k_blocks + k0/BK) * BN
    of the tiled matrix, from column 0, whichever load path."""
    if TILED:
        band = e * (w_rows // BLOCK_N) + row0 // BLOCK_N
        t_row0 = (band * k_blocks + k0 // BLOCK_K) * BLOCK_N
        t_rows = t_row0.to(tl.int64) + tl.arange(0, BLOCK_N)               # past 2^31 bytes
        if TMA:
            packed, scales_lo, scales_hi = load_weight_tile_tma(
                w_ptr, s_ptr, t_row0, t_rows, n_mask, 0, stride_sn, SCALE_BLOCK, BLOCK_N,
                BLOCK_K, SCALES_TMA)
        else:
            packed, scales_lo, scales_hi = load_weight_tile(w_ptr, s_ptr, t_rows, n_mask, 0,
                                                            stride_wn, stride_sn, SCALE_BLOCK,
                                                            BLOCK_N, BLOCK_K)
    elif TMA and SCALES_TMA:
        packed, scales_lo, scales_hi = load_weight_tile_tma(
            w_ptr, s_ptr, e * w_rows + row0, rows, n_mask, k0, stride_sn, SCALE_BLOCK, BLOCK_N,
            BLOCK_K, True)
    elif TMA:
        packed, scales_lo, scales_hi = load_weight_tile_tma(
            w_ptr, s_ptr + expert_s, e * w_rows + row0, rows, n_mask, k0, stride_sn,
            SCALE_BLOCK, BLOCK_N, BLOCK_K, False)
    else:
        packed, scales_lo, scales_hi = load_weight_tile(w_ptr + expert_w, s_ptr + expert_s, rows,
                                                        n_mask, k0, stride_wn, stride_sn,
                                                        SCALE_BLOCK, BLOCK_N, BLOCK_K)
    return scaled_halves(packed, scales_lo, scales_hi, 0, IS_NVFP4, SCALE_BLOCK, BLOCK_N,
                         BLOCK_K // 2, False, DECODE)


@triton.jit
def moe_gemm_kernel(
    a_ptr, w_ptr, s_ptr, gs_ptr, out_ptr, sorted_ptr, route_w_ptr,
    work_expert_ptr, work_start_ptr, work_rows_ptr,
    N, K, TOP_K, OUT_N, W_ROWS,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    GATE_UP: tl.constexpr, IS_NVFP4: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, DECODE: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    TMA: tl.constexpr, SCALES_TMA: tl.constexpr, TILED: tl.constexpr,
):
    """One (N tile, work item); see the module doc. GATE_UP: N is I (the gate half; the up half
    is rows N..2N of each expert), `a` is x [T, H] gathered by token, out is act [P, I] by sorted
    position. Else: `a` is act [P, I] by sorted position, out is y [P, H] by pair id, times the
    pair's routing weight. OUT_N: columns of the output (I or H); W_ROWS: rows of one expert's
    weights (2I or H). TMA: `w_ptr` (and `s_ptr` when SCALES_TMA) are tensor descriptors over
    all experts' rows, [E * W_ROWS, Kp/2] and [E * W_ROWS, Kp/S], boxes [BN, BK/2] and
    [BN, BK/S]; the activations stay pointer loads (gate_up gathers them by token). TILED: the
    weights in `tiled_layout` over all experts' rows (see `weight_tile`; the strides are then
    the tiled matrices' rows)."""
    pid_n = tl.program_id(0)
    work = tl.program_id(1)
    e = tl.load(work_expert_ptr + work)
    if e >= 0:
        start = tl.load(work_start_ptr + work)
        rows = tl.load(work_rows_ptr + work)
        offs_m = tl.arange(0, BLOCK_M)                                     # [BM]
        m_mask = offs_m < rows
        pairs = tl.load(sorted_ptr + start + offs_m, mask=m_mask, other=0)  # [BM] pair ids
        if GATE_UP:
            a_rows = pairs // TOP_K                                        # tokens
        else:
            a_rows = start + offs_m                                        # sorted positions
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                   # [BN]
        n_mask = offs_n < N
        expert_w = e.to(tl.int64) * stride_we                              # past 2^31 bytes
        expert_s = e.to(tl.int64) * stride_se
        KH: tl.constexpr = BLOCK_K // 2
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)               # out^T tile
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        k_blocks = tl.cdiv(K, BLOCK_K)
        for k0 in tl.range(0, K, BLOCK_K):
            a_lo, a_hi = load_halves(a_ptr, a_rows.to(tl.int64), m_mask, stride_am, k0, K, KH,
                                     EVEN_K)                               # [BM, KH] each
            w_lo, w_hi = weight_tile(w_ptr, s_ptr, e, W_ROWS, expert_w, expert_s,
                                     pid_n * BLOCK_N, offs_n, n_mask, k0, k_blocks, stride_wn,
                                     stride_sn, IS_NVFP4, SCALE_BLOCK, BLOCK_N, BLOCK_K, DECODE,
                                     TMA, SCALES_TMA, TILED)
            acc = tile_dot(acc, w_lo, a_lo, True, DOT_IN_FP32)
            acc = tile_dot(acc, w_hi, a_hi, True, DOT_IN_FP32)
            if GATE_UP:
                u_lo, u_hi = weight_tile(w_ptr, s_ptr, e, W_ROWS, expert_w, expert_s,
                                         N + pid_n * BLOCK_N, N + offs_n, n_mask, k0, k_blocks,
                                         stride_wn, stride_sn, IS_NVFP4, SCALE_BLOCK, BLOCK_N,
                                         BLOCK_K, DECODE, TMA, SCALES_TMA, TILED)
                acc_up = tile_dot(acc_up, u_lo, a_lo, True, DOT_IN_FP32)
                acc_up = tile_dot(acc_up, u_hi, a_hi, True, DOT_IN_FP32)
        factor = expert_factor(gs_ptr, e, IS_NVFP4)
        out_mask = m_mask[:, None] & n_mask[None, :]
        if GATE_UP:
            gate = tl.trans(acc) * factor                                  # [BM, BN]
            up = tl.trans(acc_up) * factor
            act = gate / (1.0 + tl.exp(-gate)) * up                        # silu(gate) * up
            out_rows = start + offs_m                                      # sorted positions
            tl.store(out_ptr + out_rows[:, None].to(tl.int64) * stride_om + offs_n[None, :],
                     act.to(tl.bfloat16), mask=out_mask)
        else:
            route_w = tl.load(route_w_ptr + pairs, mask=m_mask, other=0.0)  # [BM] fp32
            y = tl.trans(acc) * factor * route_w[:, None]                  # [BM, BN]
            tl.store(out_ptr + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :],
                     y.to(tl.bfloat16), mask=out_mask)


@triton.jit
def route_kernel(ids_ptr, P, W, cursor_ptr, scratch_ptr, sorted_ptr,
                 work_expert_ptr, work_start_ptr, work_rows_ptr,
                 E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_W: tl.constexpr):
    """The routing tables in one CTA, one launch: per-expert counts (histogram), where each
    expert's pairs start (cumsum), the experts busiest first (sort), the work list, and every pair
    placed at its expert's next free position (atomics on `cursor`, [E] int32, zero between
    calls: reset here at the end). E: the expert count rounded up to a power of two. Within an
    expert the pairs' order is the atomics' order, which changes no result: gate_up rows go to
    sorted positions, down writes each pair's own row."""
    experts = tl.arange(0, E)                                              # [E]
    counts = tl.zeros((E,), dtype=tl.int32)
    for p0 in range(0, P, BLOCK):
        offs = p0 + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < P, other=0)              # padding counts as 0
        counts += tl.histogram(ids, E)
        counts -= tl.where(experts == 0, tl.sum((offs >= P).to(tl.int32), axis=0), 0)
    starts = tl.cumsum(counts, 0) - counts                                 # [E] by expert id
    key = tl.sort((counts << 16) | (E - 1 - experts), descending=True)     # busiest, then low id
    order = E - 1 - (key & 0xFFFF)                                         # [E] expert ids
    tile_end = tl.cumsum(((key >> 16) + BLOCK_M - 1) // BLOCK_M, 0)       # [E] in that order
    # [4, E] scratch: order, tile_end (busiest first), starts, counts (by expert id)
    tl.store(scratch_ptr + experts, order)
    tl.store(scratch_ptr + E + experts, tile_end)
    tl.store(scratch_ptr + 2 * E + experts, starts)
    tl.store(scratch_ptr + 3 * E + experts, counts)
    tl.debug_barrier()
    for w0 in range(0, W, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)                                     # [BW] work items
        slot = tl.sum((tile_end[None, :] <= w[:, None]).to(tl.int32), axis=1)
        valid = slot < E
        slot = tl.minimum(slot, E - 1)
        e = tl.load(scratch_ptr + slot)
        count = tl.load(scratch_ptr + 3 * E + e)
        tile = w - (tl.load(scratch_ptr + E + slot) - (count + BLOCK_M - 1) // BLOCK_M)
        in_range = w < W
        tl.store(work_expert_ptr + w, tl.where(valid, e, -1), mask=in_range)
        tl.store(work_start_ptr + w, tl.load(scratch_ptr + 2 * E + e) + tile * BLOCK_M,
                 mask=in_range)
        tl.store(work_rows_ptr + w, tl.minimum(count - tile * BLOCK_M, BLOCK_M), mask=in_range)
    for p0 in range(0, P, BLOCK):
        offs = p0 + tl.arange(0, BLOCK)
        mask = offs < P
        ids = tl.load(ids_ptr + offs, mask=mask, other=0)
        slot = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)               # old values: ranks
        tl.store(sorted_ptr + tl.load(scratch_ptr + 2 * E + ids, mask=mask) + slot, offs,
                 mask=mask)
    tl.debug_barrier()                                                     # every rank taken
    tl.store(cursor_ptr + experts, tl.zeros((E,), dtype=tl.int32))


ROUTE_BLOCK = 1024
ROUTE_BLOCK_W = 64


def launch_route(topk_ids, experts: int, block_m: int, tables) -> None:
    """Fill `tables` (a RouteTables: cursor, scratch, sorted_pairs, work_*) from topk_ids."""
    padded = triton.next_power_of_2(experts)
    route_kernel[(1,)](
        topk_ids, topk_ids.numel(), tables.work_expert.shape[0], tables.cursor, tables.scratch,
        tables.sorted_pairs, tables.work_expert, tables.work_start, tables.work_rows,
        E=padded, BLOCK_M=block_m, BLOCK=ROUTE_BLOCK, BLOCK_W=ROUTE_BLOCK_W, num_warps=8)


def launch(a, w_packed, w_scales, global_scales, out, sorted_pairs, route_w, work, *, n: int,
           k: int, top_k: int, gate_up: bool, fmt: str, config, interpreted: bool) -> None:
    """One MoE GEMM over every work item. `work` = (expert, start, rows) int32 [W] each;
    w_packed [E, rows, K/2] uint8, w_scales [E, rows, K/S] uint8 (config.layout "tiles": the
    `tiled_moe_weights` matrices), global_scales [E] fp32."""
    from fp4lab.backends.triton_w4a16_kernel import MXFP4_SCALE_BLOCK, NVFP4_SCALE_BLOCK

    work_expert, work_start, work_rows = work
    is_nvfp4 = fmt == "nvfp4"
    scale_block = NVFP4_SCALE_BLOCK if is_nvfp4 else MXFP4_SCALE_BLOCK
    block_n = config.block_n_gate_up if gate_up else config.block_n_down
    grid = (triton.cdiv(n, block_n), work_expert.shape[0])
    tma = config.loads == "tma"
    tiled = config.layout == "tiles"
    scales_tma = tma and config.block_k // scale_block >= TMA_MIN_BOX_BYTES
    boxes = ([block_n, config.block_k // 2], [block_n, config.block_k // scale_block])
    if tiled:   # 2-D already; an expert's rows: both halves (gate_up) or H (down)
        expert_rows = 2 * n if gate_up else n
        strides = (a.stride(0), 0, w_packed.stride(0), 0, w_scales.stride(0), out.stride(0))
    else:
        expert_rows = w_packed.shape[1]
        strides = (a.stride(0), w_packed.stride(0), w_packed.stride(1), w_scales.stride(0),
                   w_scales.stride(1), out.stride(0))
    w_arg, s_arg = w_packed, w_scales
    if tma:
        w_arg = expert_rows_descriptor(w_packed, boxes[0])
        if scales_tma:
            s_arg = expert_rows_descriptor(w_scales, boxes[1])
    moe_gemm_kernel[grid](
        a, w_arg, s_arg, global_scales, out, sorted_pairs, route_w,
        work_expert, work_start, work_rows,
        n, k, top_k, out.shape[1], expert_rows, *strides,
        GATE_UP=gate_up, IS_NVFP4=is_nvfp4, SCALE_BLOCK=scale_block,
        BLOCK_M=config.block_m, BLOCK_N=block_n, BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0, DECODE="bits" if interpreted else config.decode,
        DOT_IN_FP32=interpreted, TMA=tma, SCALES_TMA=scales_tma, TILED=tiled,
        num_warps=config.num_warps, num_stages=config.num_stages)


def expert_rows_descriptor(weights, box: list[int]):
    """A tensor descriptor over every expert's rows of `weights` [E, R, C] as one [E * R, C]
    matrix (or over a 2-D tiled matrix as it is), box [BN, BC] (`tma_descriptor`'s checks; the
    experts must lie back to back)."""
    if weights.dim() == 2:
        return tma_descriptor(weights, "expert weights", box)
    if not weights.is_contiguous():
        raise ValueError("loads='tma' reads expert weights as one matrix of all experts' rows: "
                         f"they must be contiguous, got shape {tuple(weights.shape)}, strides "
                         f"{weights.stride()}")
    return tma_descriptor(weights.view(-1, weights.shape[2]), "expert weights", box)  # [E*R, C]
