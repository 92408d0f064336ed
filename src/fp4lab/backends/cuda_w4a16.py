"""`cuda-w4a16`: fp4lab's CUDA decode GEMM, FP4 weights in the MMA's register order (M <= 16).

The Triton kernel (`triton-w4a16`) is instruction-bound at decode M on Hopper (benchmarks/NOTES.md,
calls 37-39: ~4 instructions per weight, a third of them Triton's code around the decode). This
backend is the hand-written answer: `cuda_w4a16_kernel.cu`, compiled at prepare with NVRTC
(`torch.cuda._compile_kernel`: no nvcc, no build system), reads codes that prepare laid out once in
the order of mma.sync's A fragments (`mma_layout`), 16 bytes a lane a k-group straight into
registers, and decodes each 4-byte word (one MMA's operand) in 13 integer instructions plus 4 bf16x2
scale multiplies. See the kernel file's header for the rest.

Shape legend: `M` activation rows (<= 16), `N` weight rows (a multiple of 16), `K` reduction (a
multiple of 64), `T` = N/16 row tiles, `G` = K/64 k-groups, `S` the scale block (16 nvfp4, 32
mxfp4), lane = 4 g + t (g = lane / 4, t = lane % 4, the PTX fragment tables' names).

The CPU cannot run it; `emulate` is a bit-exact model of what the kernel computes from the laid
out bytes (the same integer operations on the same words), so the tests prove the layout and the
decode on the CPU, and the correctness gate proves the kernel on the GPU before it is timed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4lab.backends.base import Backend, Requirements, prepared_from, resolve_device
from fp4lab.backends.cuda_launch import function_attributes, launch_dependent
from fp4lab.backends.triton_w4a16 import SCALE_EXP, check_scale_range, kernel_scale_bytes, sm_count

MAX_M = 16                   # two n8 MMA tiles of activation rows
ROW_TILE = 16                # weight rows an MMA covers
K_GROUP = 64                 # k a lane's 16-byte load covers (four k16 MMAs)
LANES = 32
GROUP_CHOICES = (1, 2, 4, 8, 16, 32)
WARP_CHOICES = (1, 2, 4, 8, 16)
# how a launch overlaps the previous kernel in its stream (programmatic dependent launch, PDL):
# "off" a plain launch; "tail" the next kernel may launch once this one's math is done (its
# epilogue overlaps that launch); "all" as soon as every CTA has started (the next kernel's weight
# loads run in the CTA slots this one frees)
OVERLAP_CHOICES = ("off", "tail", "all")
REGISTERS_PER_SM = 64 * 1024  # sm_90 (and sm_80-sm_89): what `min_ctas` divides
MAX_THREADS_PER_SM = 2048
MAX_REGISTERS = 255           # a thread's
SHARED_LIMIT = 48 * 1024     # dynamic shared memory a launch gets without an opt-in attribute
SCALE_BYTES = {"nvfp4": 8, "mxfp4": 4}     # per (rows g, g+8) per k-group
WEIGHT_BIAS = 2.0 ** (126 - SCALE_EXP)     # decoded weights are e2m1 * scale * 2^-26
KERNEL_SOURCE = Path(__file__).with_name("cuda_w4a16_kernel.cu")
KERNEL_NAME = "fp4_decode_gemm"
MIN_CAPABILITY = (9, 0)      # mul.rn.bf16x2 (the scale multiply) is sm_90's


@dataclass(frozen=True)
class CudaTileConfig:
    """One build of the kernel: `groups` k-groups (64 k each) a warp reads, `depth` of them in
    flight at once (its loads, straight into registers, run `depth` groups ahead of its math;
    depth = groups, the default, issues every load before any math), `warps` a CTA, of which
    `kwarps` share a row tile and split its k (adding up in shared memory): a CTA covers
    warps/kwarps row tiles and 64 * groups * kwarps k, and K over that is the split-K across
    CTAs. `overlap` is how a launch overlaps the kernel before it (OVERLAP_CHOICES). `min_ctas`
    is how many CTAs an SM must fit at once (`__launch_bounds__`' second argument), which caps
    ptxas' registers a thread at 64 K / (min_ctas x threads) (255 at most): None leaves ptxas its
    own choice, which is fewer registers than even `min_ctas=1` allows (52 against 77 for g16 d4
    w16 NVFP4, the H200 probe of call 56), so the cap can buy registers as well as warps."""

    groups: int = 8
    warps: int = 4
    depth: int | None = None
    kwarps: int = 1
    overlap: str = "off"
    min_ctas: int | None = None

    def __post_init__(self):
        if self.depth is None:
            object.__setattr__(self, "depth", self.groups)
        for name, choices in (("groups", GROUP_CHOICES), ("warps", WARP_CHOICES),
                              ("depth", GROUP_CHOICES), ("kwarps", WARP_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"CudaTileConfig.{name} must be one of {choices}, "
                                 f"got {getattr(self, name)!r}")
        if self.overlap not in OVERLAP_CHOICES:
            raise ValueError(f"CudaTileConfig.overlap must be one of {OVERLAP_CHOICES}, "
                             f"got {self.overlap!r}")
        if self.depth > self.groups:
            raise ValueError(f"CudaTileConfig.depth ({self.depth}) cannot exceed groups "
                             f"({self.groups}): a warp has only {self.groups} k-groups to load")
        most_ctas = MAX_THREADS_PER_SM // self.threads
        if self.min_ctas is not None and not 1 <= self.min_ctas <= most_ctas:
            raise ValueError(f"CudaTileConfig.min_ctas must be None or 1 to {most_ctas} for "
                             f"{self.warps}-warp CTAs "
                             f"({MAX_THREADS_PER_SM} threads an SM), got {self.min_ctas!r}")
        if self.warps % self.kwarps:
            raise ValueError(f"CudaTileConfig.kwarps ({self.kwarps}) must divide warps "
                             f"({self.warps}): a CTA's warps form teams of kwarps")

    @property
    def tiles(self) -> int:
        """Row tiles (16 rows each) a CTA covers."""
        return self.warps // self.kwarps

    @property
    def split_k(self) -> int:
        """k a CTA covers (a split of K)."""
        return K_GROUP * self.groups * self.kwarps

    def splits(self, k: int) -> int:
        return k // self.split_k

    def grid(self, n: int, k: int) -> tuple[int, int, int]:
        return (n // (ROW_TILE * self.tiles), self.splits(k), 1)

    def shared_bytes(self, m: int) -> int:
        """Dynamic shared memory: the CTA's staged activations, M rows of its k in bf16, each
        row padded by 16 bytes (the kernel's ROW_WORDS)."""
        return m * (2 * self.split_k + 16)

    def static_shared_bytes(self, m: int) -> int:
        """The kernel's static shared memory: the teams' partial tiles (float, 32 lanes x 4 a
        tile of 8 activation rows) and the split-K flag."""
        return 4 * (self.tiles * (self.kwarps - 1) * n_tiles(m) * 4 * LANES + 1) + 4

    @property
    def threads(self) -> int:
        """Threads a CTA."""
        return LANES * self.warps

    @property
    def register_cap(self) -> int | None:
        """The registers a thread ptxas may use under `min_ctas` (None: ptxas' own choice)."""
        if self.min_ctas is None:
            return None
        return min(MAX_REGISTERS, REGISTERS_PER_SM // (self.min_ctas * self.threads) // 8 * 8)

    @property
    def launch(self) -> str:
        """How its calls are launched, as a gemm row's `launch` says it: plain, pdl-tail, pdl-all."""
        return "plain" if self.overlap == "off" else f"pdl-{self.overlap}"

    def label(self) -> str:
        label = f"cuda g{self.groups} d{self.depth} w{self.warps} k{self.kwarps}"
        if self.min_ctas is not None:
            label += f" b{self.min_ctas}"
        return label if self.overlap == "off" else f"{label} {self.launch}"

    def reason(self, m: int, n: int, k: int) -> str | None:
        """Why this build cannot run an M x N x K point (None when it can)."""
        if n % (ROW_TILE * self.tiles):
            return f"N={n} is not a multiple of {ROW_TILE * self.tiles} (16 rows x {self.tiles} tiles)"
        if k % self.split_k:
            return (f"K={k} is not a multiple of {self.split_k} "
                    f"(64 x {self.groups} groups x {self.kwarps} warps)")
        shared = self.shared_bytes(m) + self.static_shared_bytes(m)
        if shared > SHARED_LIMIT:
            return (f"M={m} rows of {self.split_k} k need {shared} bytes of shared memory, over "
                    f"the {SHARED_LIMIT} a launch gets")
        return None


def n_tiles(m: int) -> int:
    """n8 MMA tiles of activation rows: 1 up to M = 8, 2 up to 16."""
    return 1 if m <= 8 else 2


def point_reason(m: int, n: int, k: int) -> str | None:
    """Why the kernel cannot run an M x N x K point at all, or None."""
    if m > MAX_M:
        return f"a decode kernel: M <= {MAX_M}, got M={m}"
    if n % ROW_TILE or k % K_GROUP:
        return f"needs N a multiple of {ROW_TILE} and K of {K_GROUP}, got N={n}, K={k}"
    return None


@dataclass(frozen=True)
class Preset:
    """A build for the points with M <= max_m and K <= max_k (None: any K) in format `fmt` (None:
    either), and, with `one_cta_per_sm`, only where its grid has at least as many CTAs as the GPU
    has SMs."""

    max_m: int
    max_k: int | None
    config: CudaTileConfig
    one_cta_per_sm: bool = False
    fmt: str | None = None

    def holds(self, m: int, n: int, k: int, fmt: str, sms: int) -> bool:
        columns, splits, _ = self.config.grid(n, k)
        return (m <= self.max_m and (self.max_k is None or k <= self.max_k)
                and self.fmt in (None, fmt) and self.config.reason(m, n, k) is None
                and (not self.one_cta_per_sm or columns * splits >= sms))


# The first preset that holds wins: the H200 probe of 2026-12-02 (benchmarks/NOTES.md, call 57;
# results/measurements/20261202T1843Z-h200-cuda-probe), the fastest of 9 builds x 2 launch
# overlaps at M = 1, 4, 16 on 8192x8192, 4096x6144 and 6144x2048, both formats:
#   - short K (2048): a team of 4 warps splits each tile's k, a CTA covers all of K (no split-K),
#     with the registers `min_ctas=1` allows (85 NVFP4, 64 MXFP4, against ~52 by ptxas' choice:
#     3-9% faster); the next call may launch as the CTAs start ("all") in NVFP4 (4.14 us at M=1,
#     against 4.67 after the math), only after the math ("tail") in MXFP4 ("all" 28% slower there,
#     not understood); at M = 16 the team's staged activations do not fit: 16 tiles a CTA;
#   - otherwise 16 tiles a CTA (the activations staged once for all 16), 16 k-groups a warp where
#     that still gives a CTA per SM (8192x8192: 256 CTAs), else 8 (4096x6144: 192 CTAs);
#   - `min_ctas=2` (61-64 registers, still two 16-warp CTAs an SM) 1-5% faster than ptxas' ~52
#     (8192x8192 NVFP4 M=1 12.08 us against 12.67);
#   - programmatic dependent launch everywhere: "all" where 16-warp CTAs fill the GPU at M <= 8,
#     "tail" at M = 16 and for short K (call 53: "all" up to 48% slower on small grids or CTAs).
PRESETS = (Preset(8, 2048, CudaTileConfig(groups=8, depth=4, warps=8, kwarps=4, min_ctas=1,
                                          overlap="all"), fmt="nvfp4"),
           Preset(8, 2048, CudaTileConfig(groups=8, depth=4, warps=8, kwarps=4, min_ctas=1,
                                          overlap="tail")),
           Preset(16, 2048, CudaTileConfig(groups=8, depth=4, warps=16, min_ctas=2, overlap="tail")),
           Preset(8, None, CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="all"),
                  one_cta_per_sm=True),
           Preset(16, None, CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="tail"),
                  one_cta_per_sm=True),
           Preset(16, None, CudaTileConfig(groups=8, depth=4, warps=16, min_ctas=2, overlap="all")))


def choose_config(m: int, n: int, k: int, fmt: str, sms: int = 132) -> CudaTileConfig:
    """The preset build of an M x N x K point in `fmt` on a GPU of `sms` SMs (the H200's 132 by
    default): the first of PRESETS that holds; else one warp a tile and the most k-groups (up to
    4) that divide K/64, launched plainly, which runs any point point_reason admits."""
    for preset in PRESETS:
        if preset.holds(m, n, k, fmt, sms):
            return preset.config
    groups = max(g for g in GROUP_CHOICES if g <= 4 and (k // K_GROUP) % g == 0)
    return CudaTileConfig(groups=groups, warps=1)


# --- the layout ----------------------------------------------------------------------------------

def _fragment_index(device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(row, k) within a 16 x 16 MMA tile of the low nibble of byte b of each lane's 4-byte word,
    [32, 4] each; the high nibble holds k + 8. Bytes 0 and 2 are row g (k 2t, 2t+1), 1 and 3 row
    g+8: the kernel's masks pick bytes 0/2 as one bf16x2 pair and (after >> 8) bytes 1/3."""
    lane = torch.arange(LANES, device=device)[:, None]
    byte = torch.arange(4, device=device)[None, :]
    row = lane // 4 + 8 * (byte % 2)
    k = 2 * (lane % 4) + byte // 2
    return row, k


def mma_layout(codes: torch.Tensor, scale_bytes: torch.Tensor, fmt: str):
    """FP4 codes [N, K] (one per uint8) and block-scale bytes [N, K/S] (e5m3 nvfp4, e8m0 mxfp4)
    -> the kernel's operands: codes [T, G, 32, 16] uint8 (lane's 16 bytes = four words, word q
    the A fragment of k16 step q) and scales [T, G, 8, SCALE_BYTES] uint8 (for row pair g, g+8:
    byte 2j the scale of row g's block j, 2j+1 row g+8's)."""
    n, k = codes.shape
    tiles, groups = n // ROW_TILE, k // K_GROUP
    row, col = _fragment_index(codes.device)                                  # [32, 4]
    steps = codes.reshape(tiles, ROW_TILE, groups, 4, 16).permute(0, 2, 3, 1, 4)  # [T, G, 4q, 16r, 16k]
    low = steps[:, :, :, row, col]                                            # [T, G, 4q, 32, 4b]
    high = steps[:, :, :, row, col + 8]
    words = (low | (high << 4)).permute(0, 1, 3, 2, 4)                        # [T, G, 32, 4q, 4b]
    blocks = scale_bytes.shape[1] // groups                                    # 4 nvfp4, 2 mxfp4
    pairs = scale_bytes.reshape(tiles, 2, 8, groups, blocks).permute(0, 3, 2, 4, 1)  # [T, G, 8g, j, 2]
    if pairs[0, 0, 0].numel() != SCALE_BYTES[fmt]:
        raise ValueError(f"{fmt} scale bytes [N, K/S] give {pairs[0, 0, 0].numel()} bytes a row "
                         f"pair a k-group, the kernel reads {SCALE_BYTES[fmt]}")
    return (words.reshape(tiles, groups, LANES, 16).contiguous(),
            pairs.reshape(tiles, groups, 8, SCALE_BYTES[fmt]).contiguous())


# --- a bit-exact model of the kernel's arithmetic (the tests' CPU check) --------------------------

def _bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """uint16 patterns (in int64) -> float32 values of those bf16 numbers."""
    return (bits.to(torch.int32) << 16).view(torch.float32)


def emulate(weights: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 [N, K]: the weights the kernel multiplies (decoded from the laid-out bytes with the
    kernel's integer operations, times its scales, times 2^26: `unbias` without the nvfp4
    global scale), back in [N, K] order."""
    tiles, groups = weights.shape[:2]
    x = weights.to(torch.int64).reshape(tiles, groups, LANES, 4, 4)
    x = x[..., 0] | x[..., 1] << 8 | x[..., 2] << 16 | x[..., 3] << 24       # [T, G, 32, 4q] words
    y = x >> 8
    fragments = [((x & 0x000F000F) * 0x1040) & 0x81C081C0,                   # a0 (g, 2t..)
                 ((y & 0x000F000F) * 0x1040) & 0x81C081C0,                   # a1 (g+8, 2t..)
                 ((x & 0x00F000F0) * 0x104) & 0x81C081C0,                    # a2 (g, 2t+8..)
                 ((y & 0x00F000F0) * 0x104) & 0x81C081C0]                    # a3 (g+8, 2t+8..)
    s = scales.to(torch.int64).reshape(tiles, groups, 8, -1, 2)               # [T, G, 8g, j, 2]
    multiplier, offset = (16, 217 << 7) if fmt == "nvfp4" else (128, 100 << 7)
    scale = _bf16_bits(s * multiplier + offset)                               # [T, G, 8, j, 2]
    per_step = scale.repeat_interleave(4 // scale.shape[3], dim=3)            # [T, G, 8, 4q, 2]
    per_lane = per_step.repeat_interleave(4, dim=2)                           # [T, G, 32, 4q, 2]
    out = torch.zeros(tiles, groups, 4, ROW_TILE, 16)                         # [T, G, 4q, 16r, 16k]
    row, col = _fragment_index()
    for register, bits in enumerate(fragments):
        rows_half = register % 2                                              # a1, a3: row g+8
        for lane_half in range(2):                                            # bf16 lane 0, 1
            value = _bf16_bits((bits >> (16 * lane_half)) & 0xFFFF)           # [T, G, 32, 4q]
            value = value * per_lane[..., rows_half]                          # exact: <= 6 bits
            byte = 2 * lane_half + rows_half                                  # which byte it came from
            k = col[:, byte] + 8 * (register // 2)
            out[:, :, :, row[:, byte], k] = value.permute(0, 1, 3, 2)
    n, k_total = tiles * ROW_TILE, groups * K_GROUP
    return out.permute(0, 3, 1, 2, 4).reshape(n, k_total) * WEIGHT_BIAS


# --- the backend ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def compiled(config: CudaTileConfig, fmt: str, tiles: int, capability: tuple[int, int]):
    """The kernel built for one configuration (NVRTC, once per process)."""
    options = [f"-DGROUPS={config.groups}", f"-DDEPTH={config.depth}", f"-DWARPS={config.warps}",
               f"-DKWARPS={config.kwarps}", f"-DNTILES={tiles}",
               f"-DNVFP4={int(fmt == 'nvfp4')}", f"-DOVERLAP_ALL={int(config.overlap == 'all')}",
               f"-DMIN_CTAS={config.min_ctas or 0}",
               "-std=c++17"]
    return torch.cuda._compile_kernel(KERNEL_SOURCE.read_text(), KERNEL_NAME,
                                      compute_capability=f"{capability[0]}{capability[1]}",
                                      nvcc_options=options)


class CudaW4A16(Backend):
    name = "cuda-w4a16"
    formats = ("nvfp4", "mxfp4")
    library = "cuda"
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = Requirements(min_capability=MIN_CAPABILITY, unit="bf16x2 multiply (sm_90)")
    what = ("fp4lab's CUDA decode GEMM (M <= 16): codes pre-laid in mma.sync's register order, "
            "16-byte loads straight to registers, split-K in one launch, programmatic dependent "
            "launch (weight-only, NVRTC)")
    note = "decode-sized M only (M <= 16)"

    def runtime_reason(self) -> str | None:
        if not hasattr(torch.cuda, "_compile_kernel"):
            return (f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC), "
                    "which builds the kernel (torch >= 2.8)")
        return None

    def point_reason(self, m: int, n: int, k: int) -> str | None:
        return point_reason(m, n, k)

    def prepare(self, a, w, device, config: CudaTileConfig | None = None):
        self.check_inputs(a, w)
        device = resolve_device(device)
        (m, k), n = a.shape, w.shape[0]
        reason = point_reason(m, n, k)
        if reason is None and device == "cpu":
            reason = "runs only on a CUDA GPU; the CPU was asked for"
        if reason:
            raise ValueError(f"{self.name}: {reason}")
        from fp4lab import formats

        config = config or choose_config(m, n, k, w.fmt, sm_count(device))
        if config.reason(m, n, k):
            raise ValueError(f"{self.name} {config.label()}: {config.reason(m, n, k)}")
        check_scale_range(w)
        w = w.to(device)
        weights, scales = mma_layout(formats.unpack_nibbles(w.packed), kernel_scale_bytes(w), w.fmt)
        unbias = torch.full((1,), WEIGHT_BIAS, dtype=torch.float32, device=device)
        if w.global_scale is not None:
            unbias /= w.global_scale.float().reshape(-1)[0]
        kernel = compiled(config, w.fmt, n_tiles(m), torch.cuda.get_device_capability(device))
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()            # [M, K]
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)               # [M, N]
        workspace = torch.zeros(m, n, dtype=torch.float32, device=device)          # [M, N]
        counts = torch.zeros(config.grid(n, k)[0], dtype=torch.int32, device=device)
        grid, block = config.grid(n, k), (config.threads, 1, 1)
        shared = config.shared_bytes(m)

        launch = kernel if config.overlap == "off" else functools.partial(launch_dependent, kernel)

        def gemm(a_arg, weights_arg, scales_arg, unbias_arg, out_arg):
            launch(grid=grid, block=block, shared_mem=shared,
                   args=[weights_arg, scales_arg, a_arg, unbias_arg, out_arg, workspace, counts,
                         m, n, k, grid[1]])
            return out_arg

        return prepared_from(gemm, (a_bf16, weights, scales, unbias), out,
                             ref_a=a_bf16.float(), ref_w=formats.dequantize(w).float(),
                             info={"config": config.label(), "launch": config.launch,
                                   **function_attributes(kernel)})
