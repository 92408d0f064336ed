"""`cuda-w4a16-moe`: the routed MLP of a decode step in two CUDA FP4 weight-only launches.

The Triton fused MoE (`triton-w4a16-moe`) issues ~4.5 instructions per weight (Nsight Compute,
benchmarks/NOTES.md call 37) and streams its weights at the M = 16 rate of the dense Triton kernel
(call 79); fp4lab's CUDA decode GEMM (`cuda-w4a16`) decodes in ~2.5. This method runs that
kernel's warp over every routed expert: `cuda_moe_kernel.cu` (the file's header says how), built
by NVRTC, codes in mma.sync's register order (`cuda_w4a16.mma_layout`, one expert at a time),
gate_up's rows interleaved so that the SiLU-and-multiply is done in registers, the routing
weights applied in down's epilogue. Routing tables and the top-k sum are those of the Triton
method (`triton_fused.routed_layer_call`): four launches, graph-capturable.

Shape legend: see `fp4lab.backends.moe.base` (`P` = T*k pairs, `W` work items); `T_n` = N/16
row tiles of an expert, `G` = K/64 k-groups, lanes as in `cuda_w4a16`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4lab.backends.base import Requirements
from fp4lab.backends.cuda_w4a16 import (
    K_GROUP, LANES, OVERLAP_CHOICES, ROW_TILE, SHARED_LIMIT, WEIGHT_BIAS,
    check_min_ctas, kernel_source, mma_layout, register_cap,
)
from fp4lab.backends.moe.base import LayerProblem, MethodUnavailable, MoeMethod
from fp4lab.backends.moe.triton_fused import check_layer_request, routed_layer_call

KERNEL_SOURCE = Path(__file__).parents[1] / "cuda_moe_kernel.cu"
KERNEL_NAME = "fp4_moe_gemm"
WARP_CHOICES = (2, 4, 8, 16)         # at least 2: a CTA's first ROWS threads list the item's rows
ROW_TILE_CHOICES = (1, 2)            # row tiles a warp: 2 read each B fragment once for both
N_TILE_CHOICES = (2, 4, 8)           # n8 tiles of pairs a work item: 16, 32 or 64 pairs
CHUNK_CHOICES = (1, 2, 4, 8, 16)     # k-groups of activations staged at a time
# buffers of staged chunks: 2 (a CTA barrier when a chunk's copies land and one when its buffer
# is free), or 3 (the first barrier alone: the kernel's BUFFERS)
BUFFER_CHOICES = (2, 3)
DEPTH_CHOICES = (1, 2, 4, 8)
# the kernel's anatomy (its STAGE define): the launch, or what it does before the decode, the MMA
# or the epilogue; or all but the epilogue without reading the weights ("compute": the part of the
# call the weight stream must hide, the same on any GPU of the same SMs and clock)
MOE_STAGES = {"full": 0, "load": 1, "decode": 2, "mma": 3, "compute": 4}
# how a warp multiplies: mma.sync per n8 tile (B by ldmatrix), or a warpgroup's wgmma a k16 step
# (B read from shared memory by the tensor cores, asynchronously; sm_90a only)
MMA_CHOICES = ("sync", "async")
# the async build's k16 steps whose wgmma may still run while the warp decodes the next (each one
# more set of four A registers)
MMA_DEPTH_CHOICES = (1, 2, 3)
# where a warp's k-groups in flight wait: straight in registers (8-9 registers a thread each), or
# in the warp's ring in shared memory by cp.async (none; RING_SLOT_BYTES a row tile and k-group)
WEIGHT_CHOICES = ("registers", "shared")
RING_SLOT_BYTES = 512 + 64           # the kernel's: 32 lanes x 16 code bytes, NVFP4's 64 of scales
ASYNC_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class CudaMoeConfig:
    """One build of both launches: `warps` warps a CTA of `row_tiles` row tiles (16 weight rows)
    each, `ntiles` n8 tiles of pairs a work item (8 * ntiles pairs: an expert with more is several
    items, its weights read once per item), `chunk` k-groups of the item's activations staged in
    shared memory at a time, in `buffers` buffers (BUFFER_CHOICES), `depth` k-groups of weights in
    flight a warp,
    `min_ctas` the CTAs an SM must fit (the register cap, as `cuda_w4a16.CudaTileConfig.min_ctas`),
    `overlap` how down (and gate_up, after routing) overlap the launch before them
    (`cuda_w4a16.OVERLAP_CHOICES`), `mma` how the warps multiply (MMA_CHOICES; "async" needs
    whole warpgroups: warps a multiple of 4), `mma_depth` the async build's wgmma steps in flight,
    `weights` where the k-groups in flight wait (WEIGHT_CHOICES)."""

    warps: int = 16
    row_tiles: int = 1
    ntiles: int = 4
    chunk: int = 8
    depth: int = 4
    min_ctas: int | None = 2
    overlap: str = "all"
    mma: str = "sync"
    mma_depth: int = 1
    weights: str = "registers"
    buffers: int = 2

    def __post_init__(self):
        for name, choices in (("warps", WARP_CHOICES), ("row_tiles", ROW_TILE_CHOICES),
                              ("ntiles", N_TILE_CHOICES), ("chunk", CHUNK_CHOICES),
                              ("depth", DEPTH_CHOICES), ("buffers", BUFFER_CHOICES)):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in choices:
                raise ValueError(f"CudaMoeConfig.{name} must be one of {choices}, got {value!r}")
        if self.chunk % self.depth:
            raise ValueError(f"CudaMoeConfig.depth ({self.depth}) must divide chunk "
                             f"({self.chunk}): the ring of loads restarts with every chunk")
        if isinstance(self.min_ctas, bool):
            raise ValueError(f"CudaMoeConfig.min_ctas must be None or a CTA count, "
                             f"got {self.min_ctas!r}")
        check_min_ctas("CudaMoeConfig", self.min_ctas, self.warps)
        if self.overlap not in OVERLAP_CHOICES:
            raise ValueError(f"CudaMoeConfig.overlap must be one of {OVERLAP_CHOICES}, "
                             f"got {self.overlap!r}")
        if self.mma not in MMA_CHOICES:
            raise ValueError(f"CudaMoeConfig.mma must be one of {MMA_CHOICES}, got {self.mma!r}")
        if self.mma == "async" and self.warps % 4:
            raise ValueError(f"CudaMoeConfig.mma 'async' multiplies by warpgroups of 4 warps; "
                             f"warps={self.warps} is not whole warpgroups")
        if isinstance(self.mma_depth, bool) or self.mma_depth not in MMA_DEPTH_CHOICES:
            raise ValueError(f"CudaMoeConfig.mma_depth must be one of {MMA_DEPTH_CHOICES}, "
                             f"got {self.mma_depth!r}")
        if self.weights not in WEIGHT_CHOICES:
            raise ValueError(f"CudaMoeConfig.weights must be one of {WEIGHT_CHOICES}, "
                             f"got {self.weights!r}")
        if self.mma_depth > 1 and self.mma != "async":
            raise ValueError(f"CudaMoeConfig.mma_depth {self.mma_depth}: only the async build "
                             f"keeps MMAs in flight (mma.sync waits for its own)")

    @property
    def rows(self) -> int:
        """Pairs a work item holds at most (the route kernel's block_m)."""
        return 8 * self.ntiles

    @property
    def cta_rows(self) -> int:
        """Weight rows a CTA covers."""
        return ROW_TILE * self.warps * self.row_tiles

    @property
    def threads(self) -> int:
        return LANES * self.warps

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: `buffers` buffers of `rows` staged rows of `chunk` k-groups in
        bf16, each row padded by 16 bytes (the kernel's ROW_BYTES); with weights "shared", each
        warp's ring of `depth` k-groups of its row tiles after them."""
        staged = self.buffers * self.rows * (2 * K_GROUP * self.chunk + 16)
        if self.weights == "registers":
            return staged
        return staged + self.warps * self.depth * self.row_tiles * RING_SLOT_BYTES

    @property
    def register_cap(self) -> int | None:
        return register_cap(self.min_ctas, self.threads)

    def stage_reason(self, stage: str) -> str | None:
        """Why this build has no anatomy `stage` (one of MOE_STAGES); None when it has. The
        compute stage of an async build with its weights in registers: ptxas serializes its wgmma
        there (C7512 at the 64-register cap, NVRTC 13.0), so its time would not be its math's."""
        if stage == "compute" and self.mma == "async" and self.weights == "registers":
            return ("its compute stage serializes its wgmma (ptxas C7512: too few registers with "
                    "the weights' registers kept live), so it would not time the math: use the ring")
        return None

    def label(self) -> str:
        tiles = f" r{self.row_tiles}" if self.row_tiles > 1 else ""
        wgmma = "" if self.mma != "async" else " wg" if self.mma_depth == 1 else f" wg{self.mma_depth}"
        ring = " smem" if self.weights == "shared" else ""
        buffers = f"x{self.buffers}" if self.buffers != 2 else ""
        label = f"cuda w{self.warps}{tiles}{wgmma} m{self.rows} c{self.chunk}{buffers} d{self.depth}{ring}"
        if self.min_ctas is not None:
            label += f" b{self.min_ctas}"
        return label if self.overlap == "off" else f"{label} pdl-{self.overlap}"

    def reason(self, n: int, k: int, what: str) -> str | None:
        """Why one launch (`what`: "gate_up" or "down") of an expert's [n, k] weights cannot run
        in this build; None when it can."""
        if n % self.cta_rows:
            return (f"{what}: an expert's {n} weight rows are not whole CTAs of "
                    f"{self.warps * self.row_tiles} row tiles ({self.cta_rows} rows)")
        if k % (K_GROUP * self.chunk):
            return f"{what}: K={k} is not whole chunks of {K_GROUP * self.chunk} k"
        if self.shared_bytes > SHARED_LIMIT:
            return (f"{self.rows} staged rows of {K_GROUP * self.chunk} k need {self.shared_bytes} "
                    f"bytes of shared memory, over the {SHARED_LIMIT} a CTA may have")
        return None


# By format, then by the mean pairs per expert (T*k/E) each covers (None = any more): a work item
# holds about the busiest expert's load, so each weight is read once. The dense kernel's M <= 16
# shape for few pairs (16-warp CTAs, two an SM, down launched early by PDL), measured against 9
# other builds on the H100 and the H200 (benchmarks/NOTES.md calls 94-98): m16 fastest at B = 64
# (GLM-5 1.42 ms NVFP4 on the H200). Without PDL the probes ranked it 2-4% either way, and the
# reference points re-measured without it (call 98) were 2-9% slower than with it (call 95): PDL
# stays. 64-pair items of 16 warps in registers were 1.5x slower (113 registers, one CTA an SM).
# K-groups in flight a warp: 2 in registers, the most the 64-register cap holds without a spill
# in the k loop since it is compiled once a width (session 28, nvcc -Xptxas -v and SASS: at 4,
# 8-33 spill loads a chunk of the k loop in both formats; not yet measured at few pairs in
# MXFP4, which had 4). 32-pair items: two row tiles a warp, 8 warps (each B fragment
# that ldmatrix reads from shared memory serves both tiles: half the bytes, which at 32 pairs
# approach the copy time on the H200) with 4 k-groups in each warp's ring in shared memory
# (cp.async, no register a k-group in flight, no spill at up to 128 registers): the fastest of 8
# builds in both formats on the H100 (call 105, GLM-5 B = 512: 2.06 / 1.99 ms against 2.10 / 2.03
# for 16 warps of one row tile, humming 2.37 / 2.27; results/measurements/
# 20261206T0237Z-h100-cuda-moe-widths; on the H200, call 108: 1.88 / 1.75 ms, humming 2.28 /
# 2.19). Then three CTAs an SM of those warps (4 k-groups staged, 2 in the ring: 52 KB of shared
# memory and 80 registers a thread; NVFP4 gate_up spills 4 B), since Nsight Compute read the
# two-CTA build's math as latency-bound (H100, call 111: its 4 warps a scheduler issue 55% of
# cycles, no pipe over 45% busy; on the H200 its math adds 0.57 ms to its loads' 1.31). On the
# H100, at its DRAM's rate with both, level or faster: GLM-5 B = 512 1.95 / 1.91 ms against 2.03 /
# 1.93, DeepSeek-V3 2.28 / 2.17 against 2.30 / 2.17 (call 112), GLM-5 2.03 / 1.91 against 2.03 /
# 1.97 (call 113; results/measurements/20261206T0651Z-h100-cuda-moe-three-ctas, …T0702Z-…);
# not yet timed on the H200.
# Over 32 pairs an expert (GLM-5 at B >= 2048, the busiest EP 8 rank there) a 32-pair item
# reads and decodes each expert's weights once for every 32 pairs: 64-pair items (the same warps,
# 4 k-groups staged so that two CTAs fit an SM, 2 in the ring: 126-128 registers) halve both;
# GLM-5 B = 2048 NVFP4 on the H100 (call 109): 4.66 ms against 5.52 for 32-pair items (humming
# 4.21; results/measurements/
# 20261206T0515Z-h100-cuda-moe-clocks/call109).
# Two staged buffers everywhere: three (one CTA barrier a chunk instead of two) ran the 32-pair
# preset 0.8-1.2% faster on the H100 with its math alone unchanged (call 124, results/measurements/
# 20261206T1630Z-h100-cuda-moe-buffers), within one run's spread. No CTA barrier at all (a chunk's
# rows by one warp's bulk copies on the buffer's mbarrier, refilled by the warp that leaves it
# last) was 2-3% slower, its loads alone and its math alone slower too (H100, call 126,
# results/measurements/20261206T2158Z-h100-cuda-moe-staging; the code stays at a9cacff).
MOE_PRESETS: dict[str, tuple[tuple[float | None, CudaMoeConfig], ...]] = {
    fmt: ((2.0, CudaMoeConfig(ntiles=2, depth=2)),
          (32.0, CudaMoeConfig(warps=8, row_tiles=2, ntiles=4, chunk=4, depth=2, weights="shared",
                               min_ctas=3)),
          (None, CudaMoeConfig(warps=8, row_tiles=2, ntiles=8, chunk=4, depth=2, weights="shared")))
    for fmt in ("nvfp4", "mxfp4")
}


# the kernel finds an item's activation rows by 32-bit byte offsets into x (gate_up) and into the
# intermediate (down)
ACTIVATION_BYTES_LIMIT = 2 ** 32


def activation_bytes_reason(tokens: int, top_k: int, hidden: int, inter: int) -> str | None:
    """Why a layer's activations are too large for the kernel's 32-bit row offsets; None when
    they fit."""
    for what, rows, width in (("x", tokens, hidden), ("the intermediate", tokens * top_k, inter)):
        if rows * width * 2 >= ACTIVATION_BYTES_LIMIT:
            return (f"{what} [{rows}, {width}] in bf16 is {rows * width * 2} bytes; the kernel "
                    f"addresses its rows by 32-bit byte offsets (under {ACTIVATION_BYTES_LIMIT})")
    return None


def choose_moe_config(pairs: int, experts: int, fmt: str) -> CudaMoeConfig:
    if fmt not in MOE_PRESETS:
        raise ValueError(f"cuda-w4a16-moe has presets for {sorted(MOE_PRESETS)}, not {fmt!r}")
    mean = pairs / experts
    return next(config for bound, config in MOE_PRESETS[fmt] if bound is None or mean <= bound)


# --- the weights ---------------------------------------------------------------------------------

@dataclass
class ExpertOperands:
    """One expert GEMM's weights as the kernel reads them (every expert's, back to back)."""

    codes: torch.Tensor          # [E, T_n, G, 32, 16] uint8 (mma_layout per expert)
    scales: torch.Tensor         # [E, T_n, G, 8, SCALE_BYTES] uint8
    factors: torch.Tensor        # [E] float32: 2^26 / the expert's nvfp4 global scale


def interleave_gate_up(rows: torch.Tensor) -> torch.Tensor:
    """An expert's [2I, C] rows (gate over up) -> row tile r = gate rows 8r..8r+7 over up rows
    8r..8r+7: what the kernel's gate_up epilogue pairs in one lane (rows g and g+8)."""
    two_i, cols = rows.shape
    return rows.reshape(2, two_i // 16, 8, cols).transpose(0, 1).reshape(two_i, cols)


# the last LAID_OUT_KEPT layouts made, with the weights they came from (kept alive, so that an
# identity check cannot meet a new tensor at a freed one's address): a sweep prepares one layer's
# weights at every batch and config, and GLM-5's two layouts take ~5 s to make on the H200
LAID_OUT_KEPT = 2
_laid_out: list[tuple[tuple, ExpertOperands]] = []


def expert_operands(q, device, interleave: bool) -> ExpertOperands:
    """A stacked [E, N, K] QuantizedTensor in the kernel's layout (the last LAID_OUT_KEPT made
    are reused while their weights are the very same tensors)."""
    key = (q.packed, q.scales, q.global_scale, str(device), interleave)
    for kept, ops in _laid_out:
        if all(a is b if isinstance(a, torch.Tensor) else a == b for a, b in zip(kept, key)):
            return ops
    ops = lay_out_experts(q, device, interleave)
    _laid_out.insert(0, (key, ops))
    del _laid_out[LAID_OUT_KEPT:]
    return ops


def lay_out_experts(q, device, interleave: bool) -> ExpertOperands:
    """A stacked [E, N, K] QuantizedTensor in the kernel's layout, one expert at a time (the
    layout's int64 temporaries of all of GLM-5's gate_up at once would be ~50 GB)."""
    from fp4lab.backends.moe.base import _expert
    from fp4lab.backends.triton_w4a16 import check_scale_range, kernel_scale_bytes
    from fp4lab.formats import unpack_nibbles

    check_scale_range(q)
    experts, n, k = q.shape
    codes = scales = None
    for e in range(experts):
        expert = _expert(q, e).to(device)
        nibbles, scale_bytes = unpack_nibbles(expert.packed), kernel_scale_bytes(expert)
        if interleave:
            nibbles, scale_bytes = interleave_gate_up(nibbles), interleave_gate_up(scale_bytes)
        expert_codes, expert_scales = mma_layout(nibbles, scale_bytes, q.fmt)
        if codes is None:
            codes = torch.empty((experts, *expert_codes.shape), dtype=torch.uint8, device=device)
            scales = torch.empty((experts, *expert_scales.shape), dtype=torch.uint8, device=device)
        codes[e], scales[e] = expert_codes, expert_scales
    factors = torch.full((experts,), WEIGHT_BIAS, dtype=torch.float32, device=device)
    if q.global_scale is not None:
        factors /= q.global_scale.float().reshape(-1).to(device).expand(experts)
    return ExpertOperands(codes, scales, factors)


# --- the kernel ----------------------------------------------------------------------------------

def width_source(ntiles: int) -> str:
    """Every build's width dispatch: `Width<n8>` and `with_width(n8, f)`, which calls
    f(Width<n8>{}) for an item's active n8 tiles (1..`ntiles`), so that the k loop is compiled once
    a width and its MMAs are straight-line code: the async build's wgmma names its N (a width
    chosen inside the loop closed a wait group at every step and serialized the MMAs, call 100);
    the sync build issues exactly the item's MMAs and ldmatrix reads without a compare, a branch
    and a NOP around each pair of n8 tiles (a quarter of its k loop's instructions, offline SASS)."""
    cases = "".join(f"    case {n8}: f(Width<{n8}>{{}}); break;\n" for n8 in range(1, ntiles + 1))
    return ("template <int n8> struct Width { static constexpr int value = n8; };\n\n"
            "template <typename F>\n__device__ __forceinline__ void with_width(int n8, F&& f) {\n"
            "    switch (n8) {\n" + cases + "    }\n}\n")


def wgmma_source(ntiles: int) -> str:
    """The async build's `wgmma_step(Width<n8>, d, a0..a3, b)`, one overload a width n8 =
    1..`ntiles` (one wgmma m64nNk16, N = 8 * n8: bf16 in, f32 accumulate, A from registers, B by
    descriptor; the instruction names N), each straight-line code that the wait for it can trail."""
    steps = []
    for n8 in range(1, ntiles + 1):
        regs = 4 * n8
        d = ", ".join(f"%{i}" for i in range(regs))
        a = ", ".join(f"%{regs + i}" for i in range(4))
        outputs = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))
        steps.append(
            f"__device__ __forceinline__ void wgmma_step(Width<{n8}>, float (&d)[NTILES][4], "
            f"u32 a0, u32 a1, u32 a2,\n"
            f"                                           u32 a3, unsigned long long b) {{\n"
            f'    asm volatile("{{\\n\\t.reg .pred p;\\n\\tsetp.ne.b32 p, %{regs + 5}, 0;\\n\\t"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{8 * n8}k16.f32.bf16.bf16 {{{d}}}, "\n'
            f'        "{{{a}}}, %{regs + 4}, p, 1, 1, 0;\\n\\t}}"\n'
            f"        : {outputs}\n"
            f'        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));\n'
            f"}}\n")
    return "\n".join(steps)


def generated_source(ntiles: int, asynchronous: bool) -> str:
    """What a build compiles between the shared code and the kernel: the width dispatch, and the
    wgmma steps in the async build."""
    return width_source(ntiles) + ("\n" + wgmma_source(ntiles) if asynchronous else "")


def build(config: CudaMoeConfig, fmt: str, gate_up: bool, stage: str = "full",
          kernel_file: Path | None = None):
    """(source, NVRTC options) of one launch's build from `kernel_file` (KERNEL_SOURCE when not
    given). `-default-device`: NVRTC 13.0 takes the k loop's generic lambda for a host function
    without it (call 101); 13.5 does not."""
    asynchronous = config.mma == "async"
    options = [f"-DGATE_UP={int(gate_up)}", f"-DWARPS={config.warps}",
               f"-DROW_TILES={config.row_tiles}", f"-DSTAGE={MOE_STAGES[stage]}",
               f"-DNTILES={config.ntiles}", f"-DCHUNK={config.chunk}", f"-DDEPTH={config.depth}",
               f"-DNVFP4={int(fmt == 'nvfp4')}", f"-DMIN_CTAS={config.min_ctas or 0}",
               f"-DOVERLAP_ALL={int(config.overlap == 'all')}",
               f"-DWEIGHT_RING={int(config.weights == 'shared')}", f"-DBUFFERS={config.buffers}",
               "-std=c++17", "-default-device"]
    if asynchronous:
        options += ["-DMMA_ASYNC=1", f"-DMMA_DEPTH={config.mma_depth}"]
    return (kernel_source(kernel_file or KERNEL_SOURCE, generated_source(config.ntiles, asynchronous)),
            options)


def compiled(config: CudaMoeConfig, fmt: str, gate_up: bool, capability: tuple[int, int],
             stage: str = "full"):
    """One launch's build from KERNEL_SOURCE (NVRTC, once per process and kernel file: a probe's
    baseline file swapped in and out compiles each once); the async build for sm_90a."""
    return _compiled(KERNEL_SOURCE, config, fmt, gate_up, capability, stage)


@functools.lru_cache(maxsize=None)
def _compiled(kernel_file: Path, config: CudaMoeConfig, fmt: str, gate_up: bool,
              capability: tuple[int, int], stage: str):
    source, options = build(config, fmt, gate_up, stage, kernel_file)
    return torch.cuda._compile_kernel(source, KERNEL_NAME,
                                      compute_capability=f"{capability[0]}{capability[1]}"
                                      + ("a" if config.mma == "async" else ""),
                                      nvcc_options=options)


def expert_launch(config: CudaMoeConfig, fmt: str, gate_up: bool, n: int, k: int, top_k: int,
                  device, stage: str = "full"):
    """(launch(a, ops, out, tables, route_w), what the build is) for one expert GEMM over every
    work item: grid (n / the CTA's rows, W), the kernel's shared memory opted in, launched
    dependently unless `config.overlap` is "off"; `stage` one of MOE_STAGES."""
    from fp4lab.backends.cuda_launch import (allow_shared, function_attributes, launch_ex,
                                             resident_ctas)

    capability = torch.cuda.get_device_capability(device)
    if config.mma == "async" and capability != ASYNC_CAPABILITY:
        raise ValueError(f"{config.label()}: wgmma runs on sm_90 only, this GPU is "
                         f"sm_{capability[0]}{capability[1]}")
    kernel = compiled(config, fmt, gate_up, capability, stage)
    allow_shared(kernel, config.shared_bytes)
    block = (config.threads, 1, 1)
    built = function_attributes(kernel)
    what = (f"{built['registers']} registers, {built['local_bytes']} B local, "
            f"{resident_ctas(kernel, config.threads, config.shared_bytes)} CTAs an SM")

    def launch(a, ops: ExpertOperands, out, tables, route_w):
        grid = (n // config.cta_rows, tables.work_expert.shape[0], 1)
        launch_ex(kernel, grid=grid, block=block, shared_mem=config.shared_bytes,
                  dependent=config.overlap != "off", cluster=(1, 1, 1),
                  args=[ops.codes, ops.scales, a, ops.factors, tables.sorted_pairs, route_w,
                        tables.work_expert, tables.work_start, tables.work_rows, out, n, k,
                        top_k])
    return launch, what


class CudaW4A16Moe(MoeMethod):
    name, library, kind = "cuda-w4a16-moe", "cuda", "layer"
    formats = ("nvfp4", "mxfp4")
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = Requirements(min_capability=(9, 0), unit="bf16x2 multiply (sm_90)",
                            module="triton")
    what = ("fp4lab's CUDA fused FP4 weight-only MoE: gate_up (+SiLU*up) and down (+routing "
            "weights) in one NVRTC-built launch each over all experts, codes in mma.sync's "
            "register order, busiest expert first")
    note = ("routing (group pairs by expert, work list: the Triton method's launch) is inside the "
            "timed call; top-k sum by torch.sum")

    def runtime_reason(self) -> str | None:
        from fp4lab.backends.cuda_w4a16 import CudaW4A16

        return CudaW4A16().runtime_reason()

    def prepare(self, problem: LayerProblem, fmt: str | None = None,
                config: CudaMoeConfig | None = None, until: str = "sum", stage: str = "full"):
        """`until` (one of CALL_PARTS) ends the call after that launch, as the Triton method's;
        `stage` (one of MOE_STAGES) other than "full" builds both launches as that anatomy
        stage: a call to time, whose output is not the layer's."""
        check_layer_request(self, problem, fmt, until)
        if stage not in MOE_STAGES:
            raise ValueError(f"stage must be one of {list(MOE_STAGES)}, got {stage!r}")
        tokens, top_k = problem.topk_ids.shape
        # the problem's format: `fmt` may be None (call 104: the presets' lookup by `fmt` failed
        # every default prepare on the GPU, after the CPU's early return had hidden it)
        config = config or choose_moe_config(tokens * top_k, problem.experts, problem.fmt)
        hidden, inter = problem.hidden, problem.intermediate
        for n, k, what in ((2 * inter, hidden, "gate_up"), (hidden, inter, "down")):
            reason = config.reason(n, k, what)
            if reason:
                raise ValueError(f"{self.name} {config.label()}: {reason}")
        if config.stage_reason(stage):
            raise ValueError(f"{self.name} {config.label()}: {config.stage_reason(stage)}")
        too_large = activation_bytes_reason(tokens, top_k, hidden, inter)
        if too_large:
            raise ValueError(f"{self.name}: {too_large}")
        if problem.device == "cpu":
            raise MethodUnavailable(f"{self.name}: runs only on a CUDA GPU; the CPU was asked for")
        device = problem.x.device
        w13 = expert_operands(problem.w13, device, interleave=True)
        w2 = expert_operands(problem.w2, device, interleave=False)
        gate_up, gate_up_built = expert_launch(config, problem.fmt, True, 2 * inter, hidden, top_k,
                                               device, stage)
        down, down_built = expert_launch(config, problem.fmt, False, hidden, inter, top_k, device,
                                         stage)
        what = config.label() if stage == "full" else f"{config.label()}, anatomy stage {stage}"
        return routed_layer_call(self, problem, until, config.rows, w13, w2, gate_up, down,
                                 f"2 CUDA launches ({what}; gate_up {gate_up_built}, "
                                 f"down {down_built})")
