// What fp4lab's CUDA FP4 kernels share (cuda_w4a16_kernel.cu, the dense decode GEMM, and
// cuda_moe_kernel.cu, the fused MoE): the loads, the block-scale and code decode, cp.async and
// ldmatrix staging of activations, the bf16 MMA, programmatic dependent launch. NVRTC has no
// include path: the backends compile this text followed by the kernel's own (`kernel_source`).
// The codes and scales are those `cuda_w4a16.mma_layout` writes (see its docstring and the dense
// kernel's header for why they are laid out so); NVFP4 (1 or 0) is a -D define of every build.

#define SCALE_BYTES (NVFP4 ? 8 : 4)  // scale bytes per (row pair g, g+8) per k-group

// STAGE, a -D define of both kernels (0 when not given): the whole kernel or one of its anatomy's
// variants, each of which leaves later stages out (each kernel's header says what it keeps)
#define STAGE_FULL 0
#define STAGE_LOAD 1
#define STAGE_DECODE 2
#define STAGE_MMA 3
#ifndef STAGE
#define STAGE STAGE_FULL
#endif

typedef unsigned int u32;
struct __align__(16) u32x4 { u32 x, y, z, w; };   // NVRTC has no headers: our own vector type

__device__ __forceinline__ u32x4 load_stream(const u32x4* p) {
    u32x4 v;
    asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// a row pair's block scales for one k-group: 8 bytes (nvfp4, one 8-byte load) or 4 (mxfp4)
struct Scales { u32 word[SCALE_BYTES / 4]; };

__device__ __forceinline__ Scales load_scales(const Scales* p) {
    Scales v;
#if NVFP4
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.word[0]), "=r"(v.word[1]) : "l"(p));
#else
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(v.word[0]) : "l"(p));
#endif
    return v;
}

// bytes `pair` (0: bytes 0,1; 1: bytes 2,3) of `word`, the block scales of rows g and g+8 ->
// bf16x2 (scale_g, scale_g8) * 2^100, exact (e5m3 for nvfp4: bits = byte*16 + 217<<7; e8m0 for
// mxfp4: bits = byte*128 + 100<<7)
__device__ __forceinline__ u32 scale_pair(u32 word, int pair) {
    u32 spread;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(spread) : "r"(word), "r"(pair ? 0x4342 : 0x4140));
#if NVFP4
    return spread * 16u + 0x6C806C80u;
#else
    return spread * 128u + 0x32003200u;
#endif
}

// a (bf16x2) times the low bf16 of s (rows g) or its high one (rows g+8), broadcast
__device__ __forceinline__ u32 scaled_lo(u32 a, u32 s) {
    u32 d;
    asm("{\n\t.reg .b16 l, h;\n\t.reg .b32 b;\n\tmov.b32 {l, h}, %2;\n\t"
        "mov.b32 b, {l, l};\n\tmul.rn.bf16x2 %0, %1, b;\n\t}" : "=r"(d) : "r"(a), "r"(s));
    return d;
}

__device__ __forceinline__ u32 scaled_hi(u32 a, u32 s) {
    u32 d;
    asm("{\n\t.reg .b16 l, h;\n\t.reg .b32 b;\n\tmov.b32 {l, h}, %2;\n\t"
        "mov.b32 b, {h, h};\n\tmul.rn.bf16x2 %0, %1, b;\n\t}" : "=r"(d) : "r"(a), "r"(s));
    return d;
}

// 16 bytes global -> shared, asynchronously (no register holds them on the way); the wait makes
// every copy of this thread visible to it. Both clobber memory: no shared access moves across.
__device__ __forceinline__ void copy_async(u32 shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(shared), "l"(global) : "memory");
}

__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// the 32-bit shared-memory address cp.async and ldmatrix take
__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 address;
    asm("{\n\t.reg .u64 a;\n\tcvta.to.shared.u64 a, %1;\n\tcvt.u32.u64 %0, a;\n\t}"
        : "=r"(address) : "l"(p));
    return address;
}

// four 8x8 bf16 matrices; lane l gave the address of row l % 8 of matrix l / 8, and receives in
// register i (row l / 4, columns 2 (l % 4), +1) of matrix i: an mma B fragment's half. Volatile
// with a memory clobber: it reads what the barrier published and must not move above it.
__device__ __forceinline__ void ldmatrix4(u32 address, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address) : "memory");
}

__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// the step-q scales of a k-group's row pair: nvfp4 a 16-k block per MMA, mxfp4 a 32-k block per two
__device__ __forceinline__ u32 step_scales(const Scales& s, int q) {
#if NVFP4
    return scale_pair(s.word[q >> 1], q & 1);
#else
    return scale_pair(s.word[0], q >> 1);
#endif
}

// k16 step q's A fragment from its 4-byte word x (8 codes) and the k-group's scales s:
// a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..), each bf16 half's code bits
// placed by the layout where these ops take them from (mma_layout's MAGNITUDE_AT, SIGN_AT):
// 10 integer instructions for the 8 codes, then one bf16x2 multiply a register by its block scale
__device__ __forceinline__ void decode_scaled(u32 x, const Scales& s, int q,
                                              u32& a0, u32& a1, u32& a2, u32& a3) {
    a0 = ((x & 0x40074007u) * 0x42u) & 0x81C081C0u;   // sign << 1, magnitude << 6
    a1 = (x << 3) & 0x81C081C0u;
    a2 = x & 0x81C081C0u;
    a3 = (((x >> 3) & 0x05C005C0u) * 0x21u) & 0x81C081C0u;  // sign << 5, magnitude
    const u32 sc = step_scales(s, q);
    a0 = scaled_lo(a0, sc);
    a2 = scaled_lo(a2, sc);
    a1 = scaled_hi(a1, sc);
    a3 = scaled_hi(a3, sc);
}

// The accumulators of a warp's tiles, acc[chain][n8 tile][fragment] (NTILES, a -D define of both
// kernels, n8 tiles of activation rows): two independent chains that alternate k16 steps where a
// warp has one or two MMAs a step (a chain's MMAs wait on each other), else one (its n8 tiles' MMAs
// are independent); chain 0 holds the sum after `add_chains`.
#define CHAINS (NTILES <= 2 ? 2 : 1)
typedef float Accumulators[CHAINS][NTILES][4];

__device__ __forceinline__ void zero_accumulators(Accumulators& acc) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
            acc[c][nt][0] = acc[c][nt][1] = acc[c][nt][2] = acc[c][nt][3] = 0.f;
}

__device__ __forceinline__ void add_chains(Accumulators& acc) {
#pragma unroll
    for (int c = 1; c < CHAINS; ++c)
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][nt][e] += acc[c][nt][e];
}

// a kernel's bounds: WARPS warps a CTA (a -D define of both kernels); MIN_CTAS 0: the one-argument
// form, ptxas' own register choice; an explicit minimum, even 1, lets it use up to
// 64 K / (MIN_CTAS x threads), more than it takes by itself (77 against 52 for the dense g16 d4
// w16 NVFP4 at MIN_CTAS 1: one 16-warp CTA an SM instead of two; the H200 probe, call 56)
#if MIN_CTAS > 0
#define BOUNDS __launch_bounds__(WARPS * 32, MIN_CTAS)
#else
#define BOUNDS __launch_bounds__(WARPS * 32)
#endif

// cp.async in groups: close the group of copies issued so far; wait until at most `n` groups of
// this thread are in flight (then its earlier copies are visible to it)
__device__ __forceinline__ void commit_copies() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int n>
__device__ __forceinline__ void wait_copy_groups() {
    asm volatile("cp.async.wait_group %0;" :: "n"(n) : "memory");
}

// PDL's two halves (sm_90): wait for the previous kernel's completion and writes; let the next
// kernel launch once every CTA of this one has said so (or exited)
__device__ __forceinline__ void wait_for_previous_kernel() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void let_next_kernel_launch() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ unsigned short to_bf16(float v) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}
