"""Does `cuda-w4a16-moe`'s async build hand wgmma the operands it thinks it does? One warpgroup,
one k16 step, its own device code: A [64, 16] in the mma.sync fragment layout `decode_scaled`
writes, B [N pairs, 16 k] staged as the kernel stages it (K-major core matrices, a k-slice every
ROWS x 16 bytes), the descriptor the kernel builds (`staged_descriptor`), the generated
`wgmma_step` (through `with_width`, as the k loop calls it), D read back in the layout the
epilogue reads. Each check against A @ B^T in float64:

  kernel      the package's descriptor (what the async build runs)
  swapped     its two strides exchanged (LBO = 128 B, SBO = a k-slice): run only where "kernel"
              failed, as the diagnosis (wrong strides read past the staged rows, and at N >= 24
              past the shared memory: an illegal address, which ends the probe)

for N = 8, 16, 24, 32 (an item's active n8 tiles). If "kernel" fails and "swapped" passes, the
descriptor's strides are the wrong way round; if both fail, the fragment layouts are (the error
map says which rows or columns). Runs in seconds; prints one line per case, exits 1 on a failure.
On the H100 (2026-12-05, call 99) "kernel" passed at every N (rel_err ~2e-8).

    PYTHONPATH=src python3 benchmarks/wgmma_probe.py
Needs an sm_90 GPU (wgmma is sm_90a only).
"""

from __future__ import annotations

import argparse
import sys

import torch

from fp4lab.backends.cuda_w4a16 import kernel_source
from fp4lab.backends.moe.cuda_fused import ASYNC_CAPABILITY, KERNEL_SOURCE, generated_source

NTILES = 4                  # the probe's widest item: 32 pairs (the B = 512 preset's items)
ROWS = 8 * NTILES
DESCRIPTORS = {"kernel": 0, "swapped": 1}
TOLERANCE = 1e-2            # bf16 products summed in f32 over 16 k: ~1e-3 when right

# one k16 step of one warpgroup over the staged rows, with the kernel's own helpers (compiled
# after cuda_moe_kernel.cu with MMA_ASYNC, so its descriptor and wgmma_step are the async build's)
PROBE_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(128)
wgmma_probe(const unsigned short* __restrict__ a,    // [64, 16] bf16, row-major
            const unsigned short* __restrict__ b,    // [ROWS, 16] bf16: pair rows, k contiguous
            float* __restrict__ d,                   // [64, ROWS] f32
            int n8, int swapped) {
    __shared__ __align__(128) unsigned char staged[2 * SLICE_BYTES];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const u32 base = shared_address(staged);
    for (unsigned i = threadIdx.x; i < 2u * ROWS; i += 128) {     // the kernel's stage layout
        const unsigned row = i % ROWS, v = i / ROWS;
        copy_async(base + v * SLICE_BYTES + row * 16, b + row * 16 + v * 8);
    }
    commit_copies();
    wait_copy_groups<0>();
    publish_to_async_proxy();
    __syncthreads();
    // the A fragment as decode_scaled leaves it: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..),
    // a3 (g+8, 2t+8..), rows of this warp's 16
    const unsigned r0 = 16 * warp + g, r1 = r0 + 8;
    const u32* a32 = reinterpret_cast<const u32*>(a);
    u32 f[ROW_TILES][4];
    f[0][0] = a32[(r0 * 16 + 2 * t) / 2];
    f[0][1] = a32[(r1 * 16 + 2 * t) / 2];
    f[0][2] = a32[(r0 * 16 + 2 * t + 8) / 2];
    f[0][3] = a32[(r1 * 16 + 2 * t + 8) / 2];
    const unsigned long long desc = swapped ? shared_descriptor(base, 128, SLICE_BYTES)
                                            : staged_descriptor(base);
    Accumulators acc[ROW_TILES];
    zero_accumulators(acc[0]);
    with_width(n8, [&](auto width) { multiply_async(acc, f, width, desc); });
    wgmma_wait<0>();
    hold_accumulators(acc);
    for (int nt = 0; nt < NTILES; ++nt)                            // as the epilogue reads them
        for (int h = 0; h < 2; ++h) {
            const int col = nt * 8 + 2 * t + h;
            d[r0 * ROWS + col] = acc[0][0][nt][h];
            d[r1 * ROWS + col] = acc[0][0][nt][2 + h];
        }
}
"""
DEFINES = [f"-DNTILES={NTILES}", "-DMMA_ASYNC=1", "-DGATE_UP=1", "-DWARPS=4", "-DROW_TILES=1",
           "-DCHUNK=1", "-DDEPTH=1", "-DNVFP4=1", "-DMIN_CTAS=0", "-DOVERLAP_ALL=0", "-DSTAGE=0",
           "-std=c++17", "-default-device"]


def probe_source() -> str:
    """The async build's text (common code, generated width dispatch and wgmma_step, the MoE
    kernel) and the probe."""
    return kernel_source(KERNEL_SOURCE, generated_source(NTILES, asynchronous=True)) + PROBE_SOURCE


def error_map(out: torch.Tensor, ref: torch.Tensor, n: int) -> str:
    """Which of the 64 rows (by warp) and n columns (by n8 tile) are wrong."""
    bad = (out[:, :n] - ref[:, :n]).abs() > TOLERANCE * ref.abs().max()
    warps = [w for w in range(4) if bad[16 * w:16 * w + 16].any()]
    tiles = [j for j in range(n // 8) if bad[:, 8 * j:8 * j + 8].any()]
    return f"wrong in warps {warps}, n8 tiles {tiles} ({int(bad.sum())} of {64 * n})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("wgmma_probe: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    capability = torch.cuda.get_device_capability()
    if capability != ASYNC_CAPABILITY:
        print(f"wgmma_probe: wgmma runs on sm_90 only; this GPU is sm_{capability[0]}{capability[1]}",
              file=sys.stderr)
        return 2
    kernel = torch.cuda._compile_kernel(probe_source(), "wgmma_probe", compute_capability="90a",
                                        nvcc_options=DEFINES)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    a = torch.randn(64, 16, generator=generator, device="cuda").to(torch.bfloat16)
    b = torch.randn(ROWS, 16, generator=generator, device="cuda").to(torch.bfloat16)
    ref = a.double() @ b.double().T                                                  # [64, ROWS]
    failed = 0
    for name, flag in DESCRIPTORS.items():
        if name != "kernel" and not failed:
            break                                   # the diagnosis is only for a failed kernel
        for n8 in range(1, NTILES + 1):
            out = torch.full((64, ROWS), float("nan"), device="cuda")
            kernel(grid=(1, 1, 1), block=(128, 1, 1),
                   args=[a, b, out, n8, flag])
            torch.cuda.synchronize()
            n = 8 * n8
            err = (torch.linalg.vector_norm(out[:, :n].double() - ref[:, :n])
                   / torch.linalg.vector_norm(ref[:, :n])).item()
            ok = err < TOLERANCE
            failed += name == "kernel" and not ok
            print(f"{name:<8} N={n:<3} rel_err {err:9.2e}  {'ok' if ok else error_map(out.double(), ref, n)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
