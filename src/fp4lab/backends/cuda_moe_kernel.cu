// fp4lab's fused FP4 MoE in CUDA: one expert GEMM (gate_up or down) over every routed expert in
// one launch, the dense decode GEMM's warp (cuda_w4a16_kernel.cu) walking one expert's weights.
//
// Compiled at prepare with NVRTC after cuda_fp4_common.cu, one build per (GATE_UP, WARPS,
// ROW_TILES, NTILES, CHUNK, DEPTH, NVFP4, MIN_CTAS, OVERLAP_ALL, STAGE), given as -D defines.
// Shape legend: E experts, P = T*k (token, slot) pairs, N an expert's weight rows (2I gate_up, H
// down), K the reduction (H gate_up, I down); a "row tile" is 16 weight rows, a "k-group" 64 k;
// g = lane / 4, t = lane % 4 as in the PTX fragment tables; a work item (the route kernel's, see
// moe/triton_fused_kernel.py) is up to ROWS pairs of one expert, busiest expert first.
//
// A CTA is (WARPS * ROW_TILES row tiles of one expert, one work item): grid (N / (16 WARPS
// ROW_TILES), work items). Each warp reads its ROW_TILES row tiles' codes over all of K, 16 bytes a
// lane a tile a k-group straight into registers, DEPTH k-groups ahead of its math (a ring of DEPTH
// register sets), decodes them as the dense kernel does and multiplies them with the item's
// activation rows by mma.sync (the weights the A side, as the MMA's 16 rows, the pairs its n8
// tiles, exactly the item's: the k loop is compiled once a width, `with_width`; each B fragment
// read serves ROW_TILES tiles).
// No split-K: an expert's many row tiles fill the GPU, so no reduction and no workspace.
// The activation rows (gathered by token for gate_up, the item's own rows of the intermediate for
// down) are staged in shared memory by cp.async, CHUNK k-groups at a time, in BUFFERS buffers: the
// next chunk is copied while the warps multiply this one, and every warp of the CTA reads them
// (ldmatrix), so each weight row tile costs 1/WARPS of a staging. A thread's copies of a chunk
// are unrolled for the item's width, each at a constant offset from the thread's own base (the
// item's rows found by 32-bit byte offsets: cuda_fused.activation_bytes_reason). Two buffers
// take two CTA barriers a chunk (its copies visible; its buffer free again); with three the
// first alone does both, since a thread that passed chunk c's barrier refills chunk c - 2's
// buffer, which every warp left before arriving there (CudaMoeConfig.buffers: one wait for the
// slowest warp a chunk).
//   - gate_up: prepare interleaves each expert's rows so that row tile r holds gate rows 8r..8r+7
//     (the MMA's rows g) over up rows 8r..8r+7 (rows g+8): a lane's c0/c1 and c2/c3 are gate and
//     up of one intermediate column, so the SiLU-and-multiply is done in registers and act [P, I]
//     (by sorted position) is written in bf16;
//   - down: y[p] = route_w[p] * (act[s] . down_e), bf16 at the pair's own row of y [P, H]; the
//     top-k sum is the caller's.
// Weights and block scales are never written by a kernel, so with programmatic dependent launch
// (OVERLAP_ALL or not, as in the dense kernel) down issues its first DEPTH weight loads before
// `griddepcontrol.wait`; gate_up waits first (its work list is the route kernel's output), then
// lets down launch at once (OVERLAP_ALL) or after its math.
// STAGE (the anatomy, cuda_fused.MOE_STAGES): the launch; STAGE_LOAD: codes, scales and staged
// activations loaded and read by ldmatrix, no decode or MMA; STAGE_DECODE: and decoded, no MMA;
// STAGE_MMA: and multiplied, no epilogue (no SiLU, routing weight or store); STAGE_COMPUTE (this
// kernel's own): STAGE_MMA without the weights' reads: the ring's slots (or the registers) are
// never filled, so what they hold is decoded and multiplied instead: the call as if its weights
// cost nothing to read (the activations still staged), so that any GPU of the same SMs and clock
// times the part of the call that the weight stream has to hide.
// The stages write nothing (their sum only keeps the compiler from dropping the work): timed, not
// checked, as parts of a launch whose whole is gated.
// MMA_ASYNC (sm_90a; CudaMoeConfig.mma "async"): each warpgroup's four warps multiply their four
// row tiles as one 64-row A by wgmma (A the decoded fragments in registers, the same layout as
// mma.sync's; B the item's staged rows read from shared memory by the tensor cores, N its
// 8 * active_n8 pairs: one instruction a k16 step instead of an ldmatrix and an MMA per n8 tile),
// issued asynchronously: the warp decodes the next step while the tensor cores multiply this one
// (MMA_DEPTH steps' wgmma in flight: MMA_DEPTH + 1 fragment sets, wgmma.wait_group MMA_DEPTH).
// The activations are staged in wgmma's K-major core matrices (8 rows x 16 bytes; a k-slice of
// 8 k every ROWS x 16 bytes) and the copies published to the async proxy before the barrier;
// every wgmma of a buffer is waited for before the barrier that frees it. `wgmma_step` (one
// overload a width, N = 8 x its n8 tiles) and `with_width` (the k loop compiled once a width,
// chosen once a CTA) are generated: cuda_fused.wgmma_source.
// WEIGHT_RING (CudaMoeConfig.weights "shared"): a warp's weights travel by cp.async into its own
// ring of DEPTH slots in shared memory instead of registers (a slot: the 32 lanes' 16 code bytes,
// then the 8 row pairs' scales, copied by the first SCALE_BYTES / 2 lanes): DEPTH k-groups in
// flight cost no register, so depth is bound by shared memory, not by the register cap (NVFP4's
// 8-byte scales spill at DEPTH 4 in registers). The copies are cp.async groups, one a k-group, in
// the same count as the activations' (`wait_for_group`); empty groups keep the count uniform.
// Within an unrolled chunk every ring copy's source is one base plus a constant, and a k-group
// past K is zero-filled rather than branched around: with the activations' unrolled copies, the
// 32-pair preset's k loop went from 843 to 709 instructions a chunk at 16 pairs (NVRTC 13.0), and
// on an H100 GLM-5 B = 512 from 2.03 to 1.96 ms NVFP4, 1.91 to 1.86 MXFP4 (call 128: the math
// without the weights' reads only 4% shorter, 1.46 to 1.41 ms NVFP4, for 14-17% fewer instructions).

#ifndef ROW_TILES
#define ROW_TILES 1                  // row tiles (16 weight rows) a warp
#endif
#define ROWS (8 * NTILES)            // pairs a work item at most (NTILES 2, 4 or 8)
#define PAIRS (NTILES / 2)           // ldmatrix.x4 reads a k16 step, 16 pairs each
#define CHUNK_K (64 * CHUNK)         // k a staged chunk
#define ROW_BYTES (2 * CHUNK_K + 16) // a staged row, +16 B: conflict-free ldmatrix
#define VECTORS (CHUNK_K / 8)        // 16-byte copies a staged row of a chunk
#define THREADS (WARPS * 32)
#define BUFFER_BYTES (ROWS * ROW_BYTES)
#ifndef BUFFERS
#define BUFFERS 2                    // staged chunks' buffers: 2, or 3 (one barrier a chunk)
#endif
#ifndef MMA_ASYNC
#define MMA_ASYNC 0
#endif
#define STAGE_COMPUTE 4
#define MULTIPLIES (STAGE == STAGE_FULL || STAGE == STAGE_MMA || STAGE == STAGE_COMPUTE)
#define STREAMS_WEIGHTS (STAGE != STAGE_COMPUTE)
#ifndef WEIGHT_RING
#define WEIGHT_RING 0
#endif
#define RING_SLOT_BYTES (512 + 64)   // a warp's codes of one row tile and k-group, then its scales
                                     // (NVFP4's 64 bytes; MXFP4 fills 32)

#if !WEIGHT_RING && !STREAMS_WEIGHTS
// STAGE_COMPUTE's registers: their value unknown to the compiler at each step, as a load's would be
__device__ __forceinline__ void opaque(u32x4& v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w));
}
__device__ __forceinline__ void opaque(Scales& v) {
#pragma unroll
    for (int i = 0; i < SCALE_BYTES / 4; ++i) asm volatile("" : "+r"(v.word[i]));
}
#endif

#if WEIGHT_RING
#define SCALE_LANES (8 * SCALE_BYTES / 16)   // lanes that copy a slot's scales, 16 bytes each

// cp.async of 16 bytes that reads its source only if `copy`, else zero-fills them (src-size 0):
// a k-group past K costs the ring no branch
__device__ __forceinline__ void copy_async_if(u32 shared, const void* global, bool copy) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(shared), "l"(global), "r"(copy ? 16 : 0) : "memory");
}

// a lane's 16 code bytes of a slot, at `at` (the slot plus the lane's offset)
__device__ __forceinline__ u32x4 read_codes(u32 at) {
    u32x4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(at) : "memory");
    return v;
}

// row pair g's scales of a slot, at `at` (the slot plus 512 + g * SCALE_BYTES)
__device__ __forceinline__ Scales read_scales(u32 at) {
    Scales v;
#if NVFP4
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.word[0]), "=r"(v.word[1]) : "r"(at)
        : "memory");
#else
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v.word[0]) : "r"(at) : "memory");
#endif
    return v;
}

// this thread's copies of k-group j landed, at step jj of a chunk (a constant in the unrolled
// chunk: no branch). Its cp.async groups in commit order: the ring's first DEPTH k-groups, chunk
// 0's activations, CHUNK empty groups, then at each chunk c the next chunk's activations (empty
// after the last) followed by one k-group a step (group j + DEPTH, zero-filled past K).
// Committed after k-group j: the DEPTH - 1 k-groups behind it and, in a chunk's first DEPTH
// steps, the next chunk's activations; at chunk 0 also empty groups and chunk 0's activations,
// older than the DEPTH newest and seen landed by the chunk's wait (the empties make that wait
// CHUNK + 1 at every chunk)
__device__ __forceinline__ void wait_for_group(int jj) {
    if (jj >= DEPTH) wait_copy_groups<DEPTH - 1>();
    else wait_copy_groups<DEPTH>();
}
#endif

#if MMA_ASYNC
#ifndef MMA_DEPTH
#define MMA_DEPTH 1                  // k16 steps whose wgmma may run while the next is decoded
#endif
#define SLICE_BYTES (ROWS * 16)      // 8 k of every staged row: one k-slice of core matrices

// a wgmma shared-memory descriptor without swizzle: start `address`, `lbo` bytes between core
// matrices along K, `sbo` along N (each field in 16-byte units)
__device__ __forceinline__ unsigned long long shared_descriptor(u32 address, u32 lbo, u32 sbo) {
    return (unsigned long long)((address & 0x3FFFF) >> 4)
         | ((unsigned long long)(lbo >> 4) << 16)
         | ((unsigned long long)(sbo >> 4) << 32);
}

// B's descriptor (K-major) for the 16 k from byte `address` of a buffer: core matrices 8 pairs x
// 16 bytes; the next 8 k one slice on (LBO), the next 8 pairs 128 B on (SBO)
__device__ __forceinline__ unsigned long long staged_descriptor(u32 address) {
    return shared_descriptor(address, SLICE_BYTES, 128);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int n>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(n) : "memory");
}

// keeps a register's value where it is across this point: no read of an accumulator moves above
// the wait that lands it, no fragment register is reused before the wait that frees it
__device__ __forceinline__ void hold(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
__device__ __forceinline__ void hold(u32& r) { asm volatile("" : "+r"(r) :: "memory"); }

__device__ __forceinline__ void hold_fragments(u32 (&f)[ROW_TILES][4]) {
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) hold(f[r][e]);
}

__device__ __forceinline__ void hold_accumulators(Accumulators (&acc)[ROW_TILES]) {
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) hold(acc[r][0][nt][e]);
}

// the cp.async copies (generic proxy) made visible to wgmma's reads (async proxy)
__device__ __forceinline__ void publish_to_async_proxy() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// one k16 step: each row tile's fragments, as the warpgroup's 64-row A, times the item's
// `width` (Width<n8>) n8 tiles of staged pairs at descriptor `b`, into chain 0; one commit group
template <typename W>
__device__ __forceinline__ void multiply_async(Accumulators (&acc)[ROW_TILES],
                                               u32 (&f)[ROW_TILES][4], W width,
                                               unsigned long long b) {
    hold_accumulators(acc);
    wgmma_fence();                                            // the fragments were just written
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r)
        wgmma_step(width, acc[r][0], f[r][0], f[r][1], f[r][2], f[r][3], b);
    wgmma_commit();
    hold_accumulators(acc);
}
#endif

extern "C" __global__ void BOUNDS
fp4_moe_gemm(const u32x4* __restrict__ w,              // [E, N/16, K/64, 32 lanes, 16 B]
             const Scales* __restrict__ s,             // [E, N/16, K/64, 8 g, SCALE_BYTES]
             const unsigned short* __restrict__ a,     // gate_up: x [T, K]; down: act [P, K] bf16
             const float* __restrict__ factors,        // [E] 2^26 / the expert's nvfp4 scale
             const int* __restrict__ sorted_pairs,     // [P] pair ids grouped by expert
             const float* __restrict__ route_w,        // [P] routing weight of pair p
             const int* __restrict__ work_expert,      // [W] -1: no work
             const int* __restrict__ work_start,       // [W] first sorted position
             const int* __restrict__ work_rows,        // [W] pairs (<= ROWS)
             unsigned short* __restrict__ out,         // gate_up: act [P, N/2]; down: y [P, N]
             int N, int K, int top_k) {
    extern __shared__ __align__(16) unsigned char staged[];   // [BUFFERS][ROWS][ROW_BYTES], the rings
    __shared__ unsigned source_offset[ROWS];                  // the item's rows' bytes into `a`
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const int item = blockIdx.y;
#if GATE_UP
    wait_for_previous_kernel();
#if OVERLAP_ALL
    let_next_kernel_launch();
#endif
#endif
    const int e = work_expert[item];
    if (e < 0) return;
    const int start = work_start[item], rows = work_rows[item];
    const int groups = K / 64;
    const unsigned tile0 = (blockIdx.x * WARPS + warp) * ROW_TILES;   // the warp's first row tile
    const long group0 = ((long)e * (N / 16) + tile0) * groups;
    const u32x4* wp = w + group0 * 32 + lane;                 // row tile r: + r * groups * 32
    [[maybe_unused]] const Scales* sp = s + group0 * 8 + g;   // row tile r: + r * groups * 8

    const u32 stage_base = shared_address(staged);
#if WEIGHT_RING
    // the warp's ring [DEPTH][ROW_TILES] slots, after the activation buffers: group j in
    // slot j % DEPTH. A lane copies and reads its own 16 code bytes of a slot (ring_lane); a
    // scale lane copies 16 bytes of the scales, and every lane reads its row pair g's (ring_g)
    const u32 ring = stage_base + BUFFERS * BUFFER_BYTES + warp * DEPTH * ROW_TILES * RING_SLOT_BYTES;
    const u32 ring_lane = ring + lane * 16, ring_g = ring + 512 + g * SCALE_BYTES;
    const bool scale_lane = lane < SCALE_LANES;
    // this lane's sources for k-group j of the warp's row tile r: lane_codes + (r groups + j) 512
    // bytes, lane_scales + (r groups + j) 8 SCALE_BYTES
    const unsigned char* lane_codes = (const unsigned char*)(w + group0 * 32) + lane * 16;
    const unsigned char* lane_scales = (const unsigned char*)(s + group0 * 8) + lane * 16;
    const long codes_a_tile = (long)groups * 512, scales_a_tile = (long)groups * 8 * SCALE_BYTES;
    // k-group first + jj's copies into ring slot `slot`, one group, zero-filled past K (in_k
    // false): `first` is the chunk's first k-group to fetch, so that within an unrolled chunk
    // every copy's source is one base plus a constant and no copy is behind a branch
    auto fill = [&](int first, int jj, int slot, bool in_k) {
        if (STREAMS_WEIGHTS) {
            const unsigned char* codes = lane_codes + (long)first * 512;
            const unsigned char* scales = lane_scales + (long)first * 8 * SCALE_BYTES;
#pragma unroll
            for (int r = 0; r < ROW_TILES; ++r) {
                const u32 slot_at = (slot * ROW_TILES + r) * RING_SLOT_BYTES;
                copy_async_if(ring_lane + slot_at, codes + r * codes_a_tile + jj * 512, in_k);
                if (scale_lane)
                    copy_async_if(ring_lane + slot_at + 512,
                                  scales + r * scales_a_tile + jj * 8 * SCALE_BYTES, in_k);
            }
        }
        commit_copies();
    };
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) fill(0, j, j, true);  // DEPTH <= CHUNK <= groups
#else
    u32x4 codes[DEPTH][ROW_TILES];                            // a ring: group j in slot j % DEPTH
    Scales scales[DEPTH][ROW_TILES];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j)
#pragma unroll
        for (int r = 0; r < ROW_TILES; ++r) {
#if STREAMS_WEIGHTS
            codes[j][r] = load_stream(wp + (r * groups + j) * 32);
            scales[j][r] = load_scales(sp + (r * groups + j) * 8);
#else
            codes[j][r] = {lane, lane, lane, lane};
            scales[j][r] = {};
#endif
        }
#endif
#if !GATE_UP
    wait_for_previous_kernel();                               // act is gate_up's output
#if OVERLAP_ALL
    let_next_kernel_launch();
#endif
#endif

    for (int i = threadIdx.x; i < ROWS; i += THREADS) {
        const int r = i < rows ? i : rows - 1;                // rows past the item repeat its last
#if GATE_UP
        source_offset[i] = (unsigned)(sorted_pairs[start + r] / top_k) * K * 2;   // its token
#else
        source_offset[i] = (unsigned)(start + r) * K * 2;     // the pair's sorted position
#endif
    }
    __syncthreads();

    const int active_n8 = (rows + 7) / 8;                     // n8 tiles with real rows
#if !MMA_ASYNC
    // this thread's copies of a chunk (its rows' VECTORS 16-byte pieces, THREADS at a time: copy
    // n is piece threadIdx.x + n THREADS): row first_row + n THREADS / VECTORS, piece
    // first_vector + n THREADS % VECTORS (both powers of two), so that every copy's addresses are
    // a base plus a constant
    const unsigned first_row = threadIdx.x / VECTORS, first_vector = threadIdx.x % VECTORS;
    const u32 staged_at = stage_base + first_row * ROW_BYTES + first_vector * 16;
    const unsigned char* a_at = (const unsigned char*)a + first_vector * 16;
#endif
    // chunk c of the item's rows (the k loop's `width` n8 tiles of pairs) into buffer c % BUFFERS,
    // one cp.async group
    auto stage = [&](int c, [[maybe_unused]] auto width) {
#if MMA_ASYNC
        const u32 buffer = stage_base + (c % BUFFERS) * BUFFER_BYTES;
        const unsigned vectors = VECTORS;
        // the item's rows, k-slice by k-slice; a warp's copy is 8 rows x 4 consecutive vectors:
        // whole 32-byte sectors of each row read (a sector a thread, as a row apart, read twice
        // as many), each quarter-warp's 8 rows one slice's 128 contiguous bytes (no bank
        // conflict). Rows of the last n8 tile past the item are not copied: what they hold
        // reaches only the output columns of pairs the epilogue drops.
        const unsigned quads = vectors / 4;
        for (unsigned i = threadIdx.x; i < 32 * active_n8 * quads; i += THREADS) {
            const unsigned block = i / 32;                    // (n8 tile, 4 vectors) of the chunk
            const unsigned row = 8 * (block % active_n8) + (i & 7);
            const unsigned v = 4 * (block / active_n8) + ((i >> 3) & 3);
            if (row < (unsigned)rows)
                copy_async(buffer + v * SLICE_BYTES + row * 16,
                           (const unsigned char*)(a + c * CHUNK_K + v * 8) + source_offset[row]);
        }
#else
        const u32 buffer = staged_at + (c % BUFFERS) * BUFFER_BYTES;
        const unsigned char* chunk_at = a_at + c * CHUNK_K * 2;
        constexpr int copies = (8 * decltype(width)::value * VECTORS + THREADS - 1) / THREADS;
#pragma unroll
        for (int n = 0; n < copies; ++n) {
            const unsigned row = first_row + n * THREADS / VECTORS, v = n * THREADS % VECTORS;
            if (row < (unsigned)rows)                         // rows past the item: not copied
                copy_async(buffer + (n * THREADS / VECTORS) * ROW_BYTES + v * 16,
                           chunk_at + source_offset[row] + v * 16);
        }
#endif
        commit_copies();
    };

#if !MMA_ASYNC
    // this lane's ldmatrix rows (as the dense kernel's NTILES >= 2): for pair tile p, k 0-7 and
    // 8-15 of its rows 16p..16p+7 and 16p+8..16p+15; rows past the item read row `rows - 1`. In
    // the buffer of the chunk being multiplied: moved to the other one after each chunk, so that
    // every ldmatrix is its base plus a constant (not the buffer's offset recomputed each time)
    const unsigned b_row = 8 * (lane / 16) + lane % 8, b_k = 8 * ((lane / 8) % 2);
    u32 b_base[PAIRS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
        const unsigned row = 16 * p + b_row;
        b_base[p] = stage_base + (row < (unsigned)rows ? row : rows - 1) * ROW_BYTES + b_k * 2;
    }
#endif

    Accumulators acc[ROW_TILES];
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r) zero_accumulators(acc[r]);
    [[maybe_unused]] u32 sink = 0;                            // the anatomy stages' sum
#if MMA_ASYNC
    u32 fragments[MMA_DEPTH + 1][ROW_TILES][4] = {};          // step i of a chunk: set i % (D + 1)
#endif

    const int chunks = groups / CHUNK;
    // the k loop, compiled once a width of the item (n8 tiles of pairs; `with_width`): the async
    // build's wgmma names its N, the sync build's MMAs, ldmatrix reads and staging copies are the
    // item's and no more
    auto k_loop = [&](auto width) {
        stage(0, width);
#if WEIGHT_RING
#pragma unroll
        for (int i = 0; i < CHUNK; ++i) commit_copies();          // empty: see wait_for_group
#endif
        for (int c = 0; c < chunks; ++c) {
#if WEIGHT_RING
            // chunk c's copies landed: after them, chunk c - 1's CHUNK k-groups and chunk c + 1
            if (c + 1 < chunks) stage(c + 1, width);              // its buffer is free (BUFFERS)
            else commit_copies();                                 // an empty group: same count
            wait_copy_groups<CHUNK + 1>();                        // (CHUNK empties at chunk 0)
#else
            if (c + 1 < chunks) {
                stage(c + 1, width);                              // its buffer is free (BUFFERS)
                wait_copy_groups<1>();                            // chunk c's copies landed
            } else {
                wait_copy_groups<0>();
            }
#endif
#if MMA_ASYNC
            publish_to_async_proxy();
#endif
            __syncthreads();                                      // every thread's copies visible
#if MMA_ASYNC
            [[maybe_unused]] const u32 buffer = (c % BUFFERS) * BUFFER_BYTES;   // wgmma's B descriptors
#endif
#pragma unroll
            for (int jj = 0; jj < CHUNK; ++jj) {
                const int slot = jj % DEPTH;                      // CHUNK % DEPTH == 0: a constant
                u32 words[ROW_TILES][4];
                Scales group_scales[ROW_TILES];
                [[maybe_unused]] const int next = c * CHUNK + jj + DEPTH;  // DEPTH groups in flight
                // next < groups, a constant in a chunk's first CHUNK - DEPTH steps: their loads are
                // not predicated, so no register of the ring is copied to keep its old value
                const bool next_in_k = jj + DEPTH < CHUNK || c + 1 < chunks;
#if WEIGHT_RING
                wait_for_group(jj);
                __syncwarp();                                     // the scale lanes' copies too
#pragma unroll
                for (int r = 0; r < ROW_TILES; ++r) {
                    const u32 slot_at = (slot * ROW_TILES + r) * RING_SLOT_BYTES;
                    const u32x4 v = read_codes(ring_lane + slot_at);
                    words[r][0] = v.x; words[r][1] = v.y; words[r][2] = v.z; words[r][3] = v.w;
                    group_scales[r] = read_scales(ring_g + slot_at);
                }
                __syncwarp();                                     // every lane read the slot
                fill(c * CHUNK + DEPTH, jj, slot, next_in_k);
#else
#pragma unroll
                for (int r = 0; r < ROW_TILES; ++r) {
                    words[r][0] = codes[slot][r].x; words[r][1] = codes[slot][r].y;
                    words[r][2] = codes[slot][r].z; words[r][3] = codes[slot][r].w;
                    group_scales[r] = scales[slot][r];
                }
                if (next_in_k) {
#pragma unroll
                    for (int r = 0; r < ROW_TILES; ++r) {
#if STREAMS_WEIGHTS
                        codes[slot][r] = load_stream(wp + (r * groups + next) * 32);
                        scales[slot][r] = load_scales(sp + (r * groups + next) * 8);
#else
                        opaque(codes[slot][r]);                   // not loop-invariant: decoded
                        opaque(scales[slot][r]);                  // each step as if just loaded
#endif
                    }
                }
#endif
#if STAGE == STAGE_LOAD
#pragma unroll
                for (int r = 0; r < ROW_TILES; ++r)
#pragma unroll
                    for (int i = 0; i < SCALE_BYTES / 4; ++i) sink += group_scales[r].word[i];
#endif
#pragma unroll
                for (int q = 0; q < 4; ++q) {                     // one k16 MMA step
                    [[maybe_unused]] const int chain = CHAINS == 2 ? (q & 1) : 0;
                    [[maybe_unused]] const u32 k_bytes = (jj * 64 + q * 16) * 2;
#if MMA_ASYNC
                    u32 (&fragment)[ROW_TILES][4] = fragments[(4 * jj + q) % (MMA_DEPTH + 1)];
#if MULTIPLIES
                    wgmma_wait<MMA_DEPTH>();                      // the step that read it is done
                    hold_fragments(fragment);
#endif
#else
                    u32 fragment[ROW_TILES][4];                   // the A fragments (decode_scaled)
#endif
#pragma unroll
                    for (int r = 0; r < ROW_TILES; ++r) {
#if STAGE == STAGE_LOAD
                        sink += words[r][q];
#else
                        decode_scaled(words[r][q], group_scales[r], q, fragment[r][0],
                                      fragment[r][1], fragment[r][2], fragment[r][3]);
#endif
#if STAGE == STAGE_DECODE
                        sink += fragment[r][0] + fragment[r][1] + fragment[r][2] + fragment[r][3];
#endif
                    }
#if MMA_ASYNC
#if MULTIPLIES
                    multiply_async(acc, fragment, width, staged_descriptor(
                        stage_base + buffer + (jj * 8 + q * 2) * SLICE_BYTES));
#endif
#else
                    constexpr int n8 = decltype(width)::value;    // the item's n8 tiles
#pragma unroll
                    for (int p = 0; p < (n8 + 1) / 2; ++p) {
                        u32 b[4];
                        ldmatrix4(b_base[p] + k_bytes, b);
#if MULTIPLIES
#pragma unroll
                        for (int r = 0; r < ROW_TILES; ++r) {
                            const u32* f = fragment[r];
                            mma(acc[r][chain][2 * p], f[0], f[1], f[2], f[3], b[0], b[1]);
                            if (2 * p + 1 < n8)                   // its second n8 tile holds pairs
                                mma(acc[r][chain][2 * p + 1], f[0], f[1], f[2], f[3], b[2], b[3]);
                        }
#else
                        sink += b[0] ^ b[1] ^ b[2] ^ b[3];
#endif
                    }
#endif
                }
            }
#if MMA_ASYNC && MULTIPLIES
            wgmma_wait<0>();                                      // no wgmma reads the buffer now
#endif
#if !MMA_ASYNC
#pragma unroll
            for (int p = 0; p < PAIRS; ++p)                       // chunk c + 1's buffer
                b_base[p] += c % BUFFERS == BUFFERS - 1 ? -(BUFFERS - 1) * BUFFER_BYTES : BUFFER_BYTES;
#endif
#if BUFFERS == 2
            __syncthreads();                                      // buffer c % 2 free: chunk c + 2
#endif
        }
    };
    with_width(active_n8, k_loop);
#if WEIGHT_RING
    wait_copy_groups<0>();      // the ring's zero-filled copies past K land before the CTA may exit
#endif
#if MMA_ASYNC && MULTIPLIES
    hold_accumulators(acc);
#endif
#if !OVERLAP_ALL && GATE_UP
    let_next_kernel_launch();
#endif

#if MULTIPLIES
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r) add_chains(acc[r]);
#endif
#if STAGE == STAGE_MMA || STAGE == STAGE_COMPUTE
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sink += __float_as_uint(acc[r][0][nt][e]);
#endif
#if STAGE != STAGE_FULL
    if (sink == 0x9E3779B9u) out[0] = 1;                      // keeps the stage's work (no output)
    return;
#endif

    // c0, c1: (weight row g, pair rows 2t, 2t+1 of the n8 tile); c2, c3: weight row g+8
    const float factor = factors[e];
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; ++rt) {
        const unsigned tile = tile0 + rt;
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = nt * 8 + 2 * t + h;             // the pair row in the item
                if (r >= rows) continue;
#if GATE_UP
                const float gate = acc[rt][0][nt][h] * factor, up = acc[rt][0][nt][2 + h] * factor;
                out[(long)(start + r) * (N / 2) + tile * 8 + g] =
                    to_bf16(gate / (1.f + __expf(-gate)) * up);
#else
                const int pair = sorted_pairs[start + r];
                const float weight = route_w[pair] * factor;
                unsigned short* y = out + (long)pair * N + tile * 16 + g;
                y[0] = to_bf16(acc[rt][0][nt][h] * weight);
                y[8] = to_bf16(acc[rt][0][nt][2 + h] * weight);
#endif
            }
    }
}
