// fp4lab's CUDA decode GEMM for FP4 weights at decode-sized M (<= 64): out[M, N] = a[M, K] . W^T.
//
// Compiled at prepare with NVRTC after cuda_fp4_common.cu (the loads, decode and MMA it shares with
// the fused MoE; no headers: plain integer types and inline PTX), one build per
// (GROUPS, DEPTH, WARPS, KWARPS, NTILES, NVFP4, OVERLAP_ALL, MIN_CTAS, CLUSTER), given as -D defines
// (MIN_CTAS: CTAs an SM must fit, which caps the registers a thread; 0 leaves them to ptxas;
// NTILES: n8 tiles of activation rows, 1, 2, 4 or 8).
// Shape legend: M activation rows, N weight rows, K reduction; a "row tile" is 16 weight rows (one
// mma.sync M side), a "k-group" 64 k (four m16n8k16 MMAs); g = lane / 4 and t = lane % 4 as in the
// PTX fragment tables.
//
// Why it looks like this (benchmarks/NOTES.md, sessions 8 and 9): the Triton kernel spends ~4
// instructions per weight, a third of them outside the decode (2-byte shared loads of codes,
// register moves for the MMA operands, one extract and one multiply-add per block scale). Here
// prepare lays the codes out in the MMA's register order (`mma_layout` in cuda_w4a16.py), so:
//   - each lane reads its codes for a whole k-group as ONE 16-byte load, straight into registers
//     (no shared memory); a warp keeps DEPTH k-groups (DEPTH * 512 bytes) in flight: it issues
//     DEPTH loads, then before each k-group's math the load DEPTH groups ahead, so its next bytes
//     arrive while it computes (DEPTH == GROUPS: every load up front, session 8's code; 4 beat 8
//     in every build measured);
//   - a 4-byte word is one MMA's A fragment: 10 integer instructions decode its 8 codes into the
//     four bf16x2 registers (prepare places each code's bits so that one register is a mask, one
//     a shift and a mask, two a mask, a multiply that moves sign and magnitude at once and a
//     mask; 13 before, 2-10% slower: call 60), then one bf16x2 multiply per register applies
//     the block scale, the pair of scales (rows g and g+8) decoded in one multiply-add;
//   - activations (tiny at decode M) are staged once per CTA in dynamic shared memory by cp.async
//     (every copy in flight at once, no registers), only the M real rows, padded so each 8x8
//     matrix of an ldmatrix hits 8 distinct 16-byte bank groups; one ldmatrix.x4 gives the B
//     fragments of two MMAs. Activation columns past M read row M-1: their products land in
//     output columns that are never stored, so no zero rows are staged;
//   - the KWARPS warps of a CTA that share a row tile (a team) split the CTA's k range and add
//     their partial tiles in shared memory at the end (at short K, where a CTA can cover it all);
//     more row tiles a CTA (WARPS / KWARPS) stage the activations once for more of N, which at
//     M = 16 is as many L2 bytes as the weights with 4 tiles a CTA.
// Decoded weights are e2m1 * scale * 2^-26 (the Triton kernel's bit trick: code bits placed at bf16
// bits 15 and 8..6 read as e2m1 * 2^-126, scale bytes carry 2^100); the epilogue multiplies by
// `unbias`, 2^26 over the nvfp4 global scale (computed at prepare: no division in the kernel).
// Split-K across CTAs (blockIdx.y): each adds its partial tiles into the float32 workspace (zero
// between calls) and thread 0 bumps the CTA column's counter with one acq_rel atomic after a
// barrier (two sequentially consistent fences cost 4-11%, session 9); the CTA that arrives last
// writes bf16 and zeroes the workspace and counter behind it (a CUDA graph replays it with no
// memset node).
// Split-K inside a thread-block cluster (CLUSTER > 1, sm_90; launched with a cluster of CLUSTER CTAs
// along blockIdx.y): the CTAs of a cluster hold consecutive splits of one CTA column. Each puts its
// partial tiles in its own shared memory, and after one cluster barrier each adds up its share of the
// tile's elements over all CLUSTER shared memories (distributed shared memory: ld.shared::cluster,
// no L2 round trip) and stores them as bf16 when the cluster covers all of K, else adds them into the
// workspace as above, with CLUSTER times fewer atomics. It pays only where every cluster is resident
// at once: the presets use it where a grid has fewer CTAs than SMs (4096x6144 M = 4: 6.87 us against
// 7.23); the H200 holds 30 clusters of 8 two-a-SM CTAs, not the 32 of a 256-CTA grid (call 64).
// Programmatic dependent launch (PDL; the backend's `overlap`): launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda_launch.py), a kernel may start while
// the previous one in the stream finishes. Only the weights and scales (never written by a kernel)
// are read before `griddepcontrol.wait`, which returns once the previous kernel completed; the
// activations, workspace, counters and output wait. Each CTA lets the next kernel launch as it
// starts (OVERLAP_ALL: the next kernel's first loads run in CTA slots this one frees) or after its
// math (its epilogue overlaps the next launch). Launched without the attribute, both are no-ops.
// The code and scale loads are plain (coherent) loads, not ld.global.nc: ptxas sinks read-only
// loads to their first use (two in flight, measured in the offline SASS), but does not move a
// coherent load past the barrier that follows them, nor, in the loop, past the ldmatrix reads.

#define KS (64 * GROUPS)             // k a warp covers
#define TILES (WARPS / KWARPS)       // row tiles (teams) a CTA
#define PAIRS (NTILES / 2)           // ldmatrix.x4 reads a k16 step (NTILES >= 2)
#define ROW_WORDS (KWARPS * KS / 2 + 4)  // bf16x2 words a staged row (the CTA's k), +4 (16 B):
                                     // conflict-free ldmatrix
#ifndef CLUSTER
#define CLUSTER 1
#endif

// STAGE (cuda_fp4_common.cu; the anatomy's variants in the order of cuda_w4a16.ANATOMY_STAGES): the
// GEMM; loads only (codes, scales, activations staged and read by ldmatrix; the codes and scales
// summed); loads and decode without MMA (the decoded, scaled A fragments summed); the GEMM without
// the split-K reduction (each split's partial tile stored to its own slice of the workspace). The
// sums are wrapping 32-bit, one per warp, stored to the workspace: the host checks them exactly.

// the CTA's arrival at its column's counter: a release of every add the CTA made before the
// barrier in front of it, and an acquire of the other CTAs' (the last one reads their sums)
__device__ __forceinline__ int arrive(int* counter) {
    int before;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    return before;
}

// every thread of every CTA in the cluster: a release of this CTA's shared-memory writes and an
// acquire of the others' (what the second barrier of the reduction needs as well: no CTA exits while
// another still reads its shared memory)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// the float at the same shared-memory address (a 32-bit shared::cta address) in CTA `rank` of the
// cluster; volatile: it must stay below the barrier that published it
__device__ __forceinline__ float load_cluster(u32 address, unsigned rank) {
    u32 remote;
    float v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

__device__ __forceinline__ float load_l2(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ void store_l2(float* p, float v) {
    asm volatile("st.global.cg.f32 [%0], %1;" :: "l"(p), "f"(v));
}

// The split-K workspace. In a VECTOR_REDUCE build with 2 or more n8 tiles (M > 8) it is in fragment
// order, [N/16 row tiles, NTILES, 32 lanes, 4 c] floats (rows past M included: their sums are never
// stored), so a lane adds its four sums of a tile with one 16-byte vector reduction (sm_90) instead
// of four atomics, and the last split reads and zeroes them 16 bytes at a time; else (and with one
// tile, M <= 8, where only the lanes of rows below M add, two floats each) it is the output's
// [M, N]. Which pays depends on the grid (H100, calls 128 and 131, M = 16: 5-8% faster at
// 4096x6144, 12 splits of 8 k-groups; 7-9% slower at 8192x8192, 8 splits of 16): in fragment
// order a CTA's reductions land in one contiguous stretch of the workspace, on fewer L2 slices.
#ifndef VECTOR_REDUCE
#define VECTOR_REDUCE 0
#endif
#define FRAGMENT_WS (NTILES >= 2 && VECTOR_REDUCE)

__device__ __forceinline__ void add_l2x4(float* p, const float* v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
}

// the four sums at p, read where the other splits' reductions landed (L2), and zeroed behind
__device__ __forceinline__ void take_l2x4(float* p, float* v) {
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p));
    asm volatile("st.global.cg.v4.f32 [%0], {%1, %1, %1, %1};" :: "l"(p), "f"(0.f));
}

extern "C" __global__ void BOUNDS
fp4_decode_gemm(const u32x4* __restrict__ w,            // [N/16, K/64, 32 lanes, 16 B]
                const Scales* __restrict__ s,           // [N/16, K/64, 8 g, SCALE_BYTES]
                const u32x4* __restrict__ a,            // [M, K] bf16, rows 16-byte aligned
                const float* __restrict__ unbias,       // [1] 2^26 (/ the nvfp4 encode scale)
                unsigned short* __restrict__ out,       // [M, N] bf16
                float* __restrict__ ws,                 // [M, N] float32, zero between calls
                int* __restrict__ counts,               // [N / (16 * TILES)], zero between calls
                int M, int N, int K, int splits) {
    extern __shared__ __align__(16) u32 act[];          // [M, KWARPS * KS] bf16, padded rows
    // the partial tiles of warps 1.. of each team: [TILES, KWARPS - 1, NTILES * 4, 32 lanes]
    __shared__ float partial[TILES * (KWARPS - 1) * NTILES * 4 * 32 + 1];
    __shared__ int last_split;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned split = blockIdx.y;
    const unsigned team = warp / KWARPS, slice = warp % KWARPS;   // row tile in the CTA, k slice
    const unsigned tile = blockIdx.x * TILES + team;              // this warp's 16-row tile
    const long group0 = (long)tile * (unsigned)(K / 64) + (split * KWARPS + slice) * GROUPS;

    // codes (16 B a lane a k-group) and block scales; the compiler keeps only the DEPTH + 1
    // groups alive at once in registers (every index below is a constant after unrolling)
    u32x4 codes[GROUPS];
    Scales scales[GROUPS];
    const u32x4* wp = w + group0 * 32 + lane;
    const Scales* sp = s + group0 * 8 + g;
#define ISSUE(j) (codes[j] = load_stream(wp + (j) * 32), scales[j] = load_scales(sp + (j) * 8))
#if OVERLAP_ALL
    let_next_kernel_launch();
#endif
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) ISSUE(j);
    wait_for_previous_kernel();      // everything below may read what the previous kernel wrote

    // the CTA's k range of the M activation rows into shared memory, 16 bytes a copy
    const unsigned chunks = KWARPS * KS / 8;             // 16-byte chunks a row
    const u32x4* a_split = a + (long)split * chunks;
    const unsigned row_vectors = K / 8;
    const u32 act_base = shared_address(act);
    for (unsigned i = threadIdx.x; i < (unsigned)M * chunks; i += WARPS * 32) {
        const unsigned row = i / chunks, chunk = i % chunks;
        copy_async(act_base + (row * ROW_WORDS + chunk * 4) * 4, a_split + row * row_vectors + chunk);
    }
    wait_copies();
    __syncthreads();

    // this lane's ldmatrix rows: matrices (k 0-7, 8-15) of one MMA and of the next (NTILES 1),
    // or, for each pair p of activation tiles (NTILES >= 2), k 0-7 and 8-15 of tiles 2p and
    // 2p + 1; rows past M read row M - 1
#if NTILES == 1
    const unsigned b_row = lane % 8, b_k = 8 * (lane / 8);
    const u32 b_base[1] = {act_base + ((b_row < (unsigned)M ? b_row : M - 1) * ROW_WORDS
                                       + slice * KS / 2 + b_k / 2) * 4};
#else
    const unsigned b_row = 8 * (lane / 16) + lane % 8, b_k = 8 * ((lane / 8) % 2);
    u32 b_base[PAIRS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
        const unsigned row = 16 * p + b_row;
        b_base[p] = act_base + ((row < (unsigned)M ? row : M - 1) * ROW_WORDS
                                + slice * KS / 2 + b_k / 2) * 4;
    }
#endif

    Accumulators acc;                                   // [chain][n8 tile][fragment]
    zero_accumulators(acc);

    u32 sink = 0;                                        // STAGE_LOAD, STAGE_DECODE: the sum
#pragma unroll
    for (int j = 0; j < GROUPS; ++j) {
        if (j + DEPTH < GROUPS) ISSUE(j + DEPTH);        // keeps DEPTH groups in flight
#if STAGE == STAGE_LOAD
#pragma unroll
        for (int i = 0; i < SCALE_BYTES / 4; ++i) sink += scales[j].word[i];
#endif
        const u32 words[4] = {codes[j].x, codes[j].y, codes[j].z, codes[j].w};
        u32 b[NTILES == 1 ? 1 : PAIRS][4];               // the B fragments ldmatrix gave
#pragma unroll
        for (int q = 0; q < 4; ++q) {                    // one k16 MMA step
            const u32 x = words[q];
            const unsigned k_bytes = (j * 64 + q * 16) * 2;  // the step's k within the split
            [[maybe_unused]] const int chain = CHAINS == 2 ? (q & 1) : 0;
#if NTILES == 1
            if (q % 2 == 0) ldmatrix4(b_base[0] + k_bytes, b[0]);
#else
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) ldmatrix4(b_base[p] + k_bytes, b[p]);
#endif
#if STAGE == STAGE_LOAD
            sink += x;
            continue;
#endif
            u32 a0, a1, a2, a3;                          // the A fragment (decode_scaled)
            decode_scaled(x, scales[j], q, a0, a1, a2, a3);
#if STAGE == STAGE_DECODE
            sink += a0 + a1 + a2 + a3;
#elif NTILES == 1
            mma(acc[chain][0], a0, a1, a2, a3, b[0][2 * (q % 2)], b[0][2 * (q % 2) + 1]);
#else
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) {
                mma(acc[chain][2 * p], a0, a1, a2, a3, b[p][0], b[p][1]);
                mma(acc[chain][2 * p + 1], a0, a1, a2, a3, b[p][2], b[p][3]);
            }
#endif
        }
    }
#undef ISSUE
#if !OVERLAP_ALL
    let_next_kernel_launch();
#endif
#if STAGE == STAGE_LOAD || STAGE == STAGE_DECODE
    u32 warp_sum;
    asm volatile("redux.sync.add.u32 %0, %1, 0xffffffff;" : "=r"(warp_sum) : "r"(sink));
    if (lane == 0)
        reinterpret_cast<u32*>(ws)[(blockIdx.y * gridDim.x + blockIdx.x) * WARPS + warp] = warp_sum;
    return;
#endif

    add_chains(acc);

    // the k slices of a team add up in shared memory; slice 0 holds the team's tile after it
    if (KWARPS > 1) {
        float* team_partial = partial + team * (KWARPS - 1) * NTILES * 4 * 32 + lane;
        if (slice > 0)
#pragma unroll
            for (int i = 0; i < NTILES * 4; ++i)
                team_partial[((slice - 1) * NTILES * 4 + i) * 32] = acc[0][i / 4][i % 4];
        __syncthreads();
        if (slice == 0)
#pragma unroll
            for (int other = 0; other < KWARPS - 1; ++other)
#pragma unroll
                for (int i = 0; i < NTILES * 4; ++i)
                    acc[0][i / 4][i % 4] += team_partial[(other * NTILES * 4 + i) * 32];
    }

    // c0, c1: (weight row g, activation rows 2t, 2t+1); c2, c3: row g+8. Offsets from
    // (row 0, weight row n0) of the [M, N] output and workspace: 32-bit (M * N < 2^31)
    const float factor = *unbias;
    const unsigned n0 = tile * 16 + g;
    unsigned short* out_tile = out + n0;
#if FRAGMENT_WS
    float* ws_tile = ws + (tile * NTILES * 32 + lane) * 4;    // + nt * 128: tile nt's four sums
#else
    float* ws_tile = ws + n0;
#endif
#define OFFSET(nt, e) ((nt * 8 + 2 * t + (e & 1)) * (unsigned)N + 8 * (e >> 1))
#define IN_M(nt, e) (nt * 8 + 2 * t + (e & 1) < (unsigned)M)
#if STAGE == STAGE_MMA                                   // the split's own [M, N] slice
    if (slice == 0)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (IN_M(nt, e)) ws[n0 + split * (unsigned)(M * N) + OFFSET(nt, e)] = acc[0][nt][e] * factor;
    return;
#endif
    if (splits == 1) {
        if (slice == 0)
#pragma unroll
            for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (IN_M(nt, e)) out_tile[OFFSET(nt, e)] = to_bf16(acc[0][nt][e] * factor);
        return;
    }
#if CLUSTER > 1
    // the CTA's partial tiles, in fragment order [TILES, NTILES, 4 e, 32 lanes], where the
    // activations were (every warp's last ldmatrix is behind the first barrier)
    __syncthreads();
    float* tiles_partial = reinterpret_cast<float*>(act);
    if (slice == 0)
#pragma unroll
        for (int i = 0; i < NTILES * 4; ++i)
            tiles_partial[(team * NTILES * 4 + i) * 32 + lane] = acc[0][i / 4][i % 4] * factor;
    cluster_sync();
    // this CTA's share of the M x (16 TILES) outputs, in output order (consecutive threads,
    // consecutive n: coalesced stores), each the sum of its element in every CTA of the cluster
    const unsigned columns = TILES * 16, outputs = (unsigned)M * columns;
    const unsigned share = (outputs + CLUSTER - 1) / CLUSTER, first = cluster_rank() * share;
    const unsigned end = first + share < outputs ? first + share : outputs;
    for (unsigned i = first + threadIdx.x; i < end; i += WARPS * 32) {
        const unsigned row = i / columns, column = i % columns;            // m, n within the CTA
        const unsigned row_in_tile = column % 16, e = 2 * (row_in_tile / 8) + row % 2;
        const unsigned element = (((column / 16) * NTILES + row / 8) * 4 + e) * 32
                                 + 4 * (row_in_tile % 8) + (row % 8) / 2;   // lane 4 g + t
        const u32 address = shared_address(tiles_partial + element);
        float sum = 0.f;
#pragma unroll
        for (unsigned r = 0; r < CLUSTER; ++r) sum += load_cluster(address, r);
        const unsigned at = row * (unsigned)N + blockIdx.x * columns + column;
        if (splits == CLUSTER) out[at] = to_bf16(sum);
#if FRAGMENT_WS
        else atomicAdd(&ws[blockIdx.x * TILES * NTILES * 128 + element / 128 * 128
                          + element % 32 * 4 + element / 32 % 4], sum);
#else
        else atomicAdd(&ws[at], sum);
#endif
    }
    cluster_sync();
    if (splits == CLUSTER) return;
#elif FRAGMENT_WS
    if (slice == 0)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
            const float sums[4] = {acc[0][nt][0] * factor, acc[0][nt][1] * factor,
                                   acc[0][nt][2] * factor, acc[0][nt][3] * factor};
            add_l2x4(ws_tile + nt * 128, sums);
        }
#else
    if (slice == 0)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (IN_M(nt, e)) atomicAdd(&ws_tile[OFFSET(nt, e)], acc[0][nt][e] * factor);
#endif
    // every thread's adds before thread 0's arrival (the barrier), then thread 0 releases them
    // and, if last, acquires the others'; the barrier after hands that to every thread
    __syncthreads();
    if (threadIdx.x == 0) last_split = arrive(&counts[blockIdx.x]) == splits - 1;
    __syncthreads();
    if (!last_split || slice > 0) return;
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
#if FRAGMENT_WS
        float sums[4];
        take_l2x4(ws_tile + nt * 128, sums);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (IN_M(nt, e)) out_tile[OFFSET(nt, e)] = to_bf16(sums[e]);
#else
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (IN_M(nt, e)) {
                float* sum = &ws_tile[OFFSET(nt, e)];
                out_tile[OFFSET(nt, e)] = to_bf16(load_l2(sum));
                store_l2(sum, 0.f);
            }
#endif
    }
#undef OFFSET
#undef IN_M
    if (threadIdx.x == 0) counts[blockIdx.x] = 0;
}
