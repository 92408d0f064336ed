"""`cuda-w4a16`: fp4lab's CUDA decode GEMM, FP4 weights in the MMA's register order (M <= 64).

The Triton kernel (`triton-w4a16`) is instruction-bound at decode M on Hopper (benchmarks/NOTES.md,
calls 37-39: ~4 instructions per weight, a third of them Triton's code around the decode). This
backend is the hand-written answer: `cuda_w4a16_kernel.cu`, compiled at prepare with NVRTC
(`torch.cuda._compile_kernel`: no nvcc, no build system), reads codes that prepare laid out once in
the order of mma.sync's A fragments (`mma_layout`), 16 bytes a lane a k-group straight into
registers, and decodes each 4-byte word (one MMA's operand) in 10 integer instructions plus 4 bf16x2
scale multiplies. See the kernel file's header for the rest. `anatomy_variants` builds it with
stages left out (loads only, decode without MMA, no split-K reduction), each with its own check.

Shape legend: `M` activation rows (<= 64), `N` weight rows (a multiple of 16), `K` reduction (a
multiple of 64), `T` = N/16 row tiles, `G` = K/64 k-groups, `S` the scale block (16 nvfp4, 32
mxfp4), lane = 4 g + t (g = lane / 4, t = lane % 4, the PTX fragment tables' names).

The CPU cannot run it; `emulate` is a bit-exact model of what the kernel computes from the laid
out bytes (the same integer operations on the same words), so the tests prove the layout and the
decode on the CPU, and the correctness gate proves the kernel on the GPU before it is timed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4lab import correctness
from fp4lab.backends.base import Backend, Prepared, Requirements, prepared_from, resolve_device
from fp4lab.backends.cuda_launch import (active_clusters, allow_cluster, allow_shared,
                                         function_attributes, launch_ex, resident_ctas)
from fp4lab.backends.triton_w4a16 import (SCALE_EXP, AnatomyVariant, check_scale_range,
                                          kernel_scale_bytes, sm_count)

MAX_M = 64                   # eight n8 MMA tiles of activation rows
N_TILE_CHOICES = (1, 2, 4, 8)  # n8 tiles of activation rows a build holds (-DNTILES)
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
# how a split adds its partial tiles into the split-K workspace at M > 8: one atomic a sum
# ("scalar"), or one 16-byte vector reduction a lane's four sums of an n8 tile ("vector", sm_90)
REDUCE_CHOICES = ("scalar", "vector")
MAX_CLUSTER = 16              # CTAs a cluster on sm_90 (over 8: the non-portable attribute)
REGISTERS_PER_SM = 64 * 1024  # sm_90 (and sm_80-sm_89): what `min_ctas` divides
MAX_THREADS_PER_SM = 2048
MAX_REGISTERS = 255           # a thread's
SHARED_DEFAULT = 48 * 1024   # dynamic shared memory a launch gets without the opt-in attribute
SHARED_LIMIT = 227 * 1024    # what sm_90 lets one CTA opt in to (228 KB an SM, 1 KB reserved a CTA)
SCALE_BYTES = {"nvfp4": 8, "mxfp4": 4}     # per (rows g, g+8) per k-group
WEIGHT_BIAS = 2.0 ** (126 - SCALE_EXP)     # decoded weights are e2m1 * scale * 2^-26
KERNEL_SOURCE = Path(__file__).with_name("cuda_w4a16_kernel.cu")
COMMON_SOURCE = Path(__file__).with_name("cuda_fp4_common.cu")   # what the CUDA kernels share
KERNEL_NAME = "fp4_decode_gemm"
MIN_CAPABILITY = (9, 0)      # mul.rn.bf16x2 (the scale multiply) is sm_90's


def check_min_ctas(owner: str, min_ctas: int | None, warps: int) -> None:
    """Raise a ValueError naming `owner`'s field unless `min_ctas` is None or a CTA count of
    `warps`-warp CTAs an SM can hold."""
    most_ctas = MAX_THREADS_PER_SM // (LANES * warps)
    if min_ctas is not None and not 1 <= min_ctas <= most_ctas:
        raise ValueError(f"{owner}.min_ctas must be None or 1 to {most_ctas} for {warps}-warp CTAs "
                         f"({MAX_THREADS_PER_SM} threads an SM), got {min_ctas!r}")


def register_cap(min_ctas: int | None, threads: int) -> int | None:
    """The registers a thread ptxas may use when an SM must fit `min_ctas` CTAs of `threads`
    (`__launch_bounds__`' second argument; None: ptxas' own choice)."""
    if min_ctas is None:
        return None
    return min(MAX_REGISTERS, REGISTERS_PER_SM // (min_ctas * threads) // 8 * 8)


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
    w16 NVFP4, the H200 probe of call 56), so the cap can buy registers as well as warps.
    `cluster` CTAs of consecutive splits form a thread-block cluster and add their partial tiles
    in distributed shared memory (1: every split adds into the float32 workspace). `reduce` is how
    a split adds into the workspace at M > 8: "scalar", one atomic a sum, into the output's
    layout; "vector", a lane's four sums of an n8 tile with one 16-byte reduction, into the
    fragments' order (REDUCE_CHOICES; at M <= 8 both are the scalar code)."""

    groups: int = 8
    warps: int = 4
    depth: int | None = None
    kwarps: int = 1
    overlap: str = "off"
    min_ctas: int | None = None
    cluster: int = 1
    reduce: str = "scalar"

    def __post_init__(self):
        if self.depth is None:
            object.__setattr__(self, "depth", self.groups)
        for name, choices in (("groups", GROUP_CHOICES), ("warps", WARP_CHOICES),
                              ("depth", GROUP_CHOICES), ("kwarps", WARP_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"CudaTileConfig.{name} must be one of {choices}, "
                                 f"got {getattr(self, name)!r}")
        if self.reduce not in REDUCE_CHOICES:
            raise ValueError(f"CudaTileConfig.reduce must be one of {REDUCE_CHOICES}, got {self.reduce!r}")
        if self.overlap not in OVERLAP_CHOICES:
            raise ValueError(f"CudaTileConfig.overlap must be one of {OVERLAP_CHOICES}, "
                             f"got {self.overlap!r}")
        if self.depth > self.groups:
            raise ValueError(f"CudaTileConfig.depth ({self.depth}) cannot exceed groups "
                             f"({self.groups}): a warp has only {self.groups} k-groups to load")
        check_min_ctas("CudaTileConfig", self.min_ctas, self.warps)
        if isinstance(self.cluster, bool) or not isinstance(self.cluster, int) \
                or not 1 <= self.cluster <= MAX_CLUSTER:
            raise ValueError(f"CudaTileConfig.cluster must be an int from 1 to {MAX_CLUSTER} (CTAs "
                             f"a thread-block cluster on sm_90), got {self.cluster!r}")
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
        row padded by 16 bytes (the kernel's ROW_WORDS); in a cluster, at least the CTA's
        partial tiles (float, 32 lanes x 4 a tile of 8 activation rows), which reuse it. Over
        SHARED_DEFAULT, the backend opts the build in (up to SHARED_LIMIT)."""
        activations = m * (2 * self.split_k + 16)
        if self.cluster == 1:
            return activations
        return max(activations, 4 * self.tiles * n_tiles(m) * 4 * LANES)

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
        return register_cap(self.min_ctas, self.threads)

    @property
    def launch(self) -> str:
        """How its calls are launched, as a gemm row's `launch` says it: plain, pdl-tail, pdl-all."""
        return "plain" if self.overlap == "off" else f"pdl-{self.overlap}"

    def label(self) -> str:
        label = f"cuda g{self.groups} d{self.depth} w{self.warps} k{self.kwarps}"
        if self.min_ctas is not None:
            label += f" b{self.min_ctas}"
        if self.cluster > 1:
            label += f" c{self.cluster}"
        if self.reduce == "vector":
            label += " v4"
        return label if self.overlap == "off" else f"{label} {self.launch}"

    def reduce_matters(self, m: int, k: int) -> bool:
        """Whether `reduce` changes this build's code at an M x K point: over M = 8 (two or more n8
        tiles; with one both are the scalar code) where its splits add into the workspace (more
        splits than a cluster adds in shared memory)."""
        return n_tiles(m) >= 2 and self.splits(k) > self.cluster

    def reason(self, m: int, n: int, k: int) -> str | None:
        """Why this build cannot run an M x N x K point (None when it can)."""
        if n % (ROW_TILE * self.tiles):
            return f"N={n} is not a multiple of {ROW_TILE * self.tiles} (16 rows x {self.tiles} tiles)"
        if k % self.split_k:
            return (f"K={k} is not a multiple of {self.split_k} "
                    f"(64 x {self.groups} groups x {self.kwarps} warps)")
        if self.splits(k) % self.cluster:
            return (f"K={k} gives {self.splits(k)} splits of {self.split_k}, which clusters of "
                    f"{self.cluster} CTAs cannot divide")
        static = self.static_shared_bytes(m)
        if static > SHARED_DEFAULT:
            return (f"M={m}: the partial tiles of {self.kwarps}-warp teams need {static} bytes of "
                    f"static shared memory, over the {SHARED_DEFAULT} a kernel may declare")
        shared = self.shared_bytes(m) + static
        if shared > SHARED_LIMIT:
            return (f"M={m} rows of {self.split_k} k need {shared} bytes of shared memory, over "
                    f"the {SHARED_LIMIT} a CTA may have")
        return None


def n_tiles(m: int) -> int:
    """n8 MMA tiles of activation rows a build holds: the fewest of N_TILE_CHOICES covering M
    (1 up to M = 8, 2 up to 16, 4 up to 32, 8 up to 64)."""
    return next(tiles for tiles in N_TILE_CHOICES if 8 * tiles >= m)


def workspace_floats(config: "CudaTileConfig", m: int, n: int) -> int:
    """Floats of the split-K workspace at M x N: the output's M x N, or in a "vector" build at
    M > 8, where the kernel adds a lane's four sums of a tile with one vector reduction, every n8
    tile's 8 rows of it."""
    tiles = n_tiles(m)
    return m * n if tiles == 1 or config.reduce == "scalar" else 8 * tiles * n


def point_reason(m: int, n: int, k: int) -> str | None:
    """Why the kernel cannot run an M x N x K point at all, or None."""
    if m > MAX_M:
        return f"a decode kernel: M <= {MAX_M}, got M={m}"
    if n % ROW_TILE or k % K_GROUP:
        return f"needs N a multiple of {ROW_TILE} and K of {K_GROUP}, got N={n}, K={k}"
    return None


@dataclass(frozen=True)
class Preset:
    """A build for the points with M <= max_m and K <= max_k (None: any K), and, with
    `one_cta_per_sm`, only where its grid has at least as many CTAs as the GPU has SMs. A
    `clustered` preset reduces all of a column's splits in one thread-block cluster (2 to
    MAX_CLUSTER of them) and holds only where its grid has fewer CTAs than the GPU has SMs: every
    cluster then runs at once (on the H200, clusters of 8 two-a-SM CTAs fit 240 CTAs, not 256:
    a second wave, 8192x8192 M=1 15.5 us against 10.9, call 64). Over M = `vector_over_m`, where
    the reduction changes the build's code (`CudaTileConfig.reduce_matters`) and its grid has at
    most `vector_columns` CTA columns, the build adds its splits with the vector reduction
    (`CudaTileConfig.reduce`; 0 columns: never)."""

    max_m: int
    max_k: int | None
    config: CudaTileConfig
    one_cta_per_sm: bool = False
    clustered: bool = False
    vector_columns: int = 0
    vector_over_m: int = 8

    def build(self, n: int, k: int, m: int = 1) -> CudaTileConfig:
        """The config at an M x N x K point it holds: a clustered preset's cluster is the point's
        splits; the vector reduction where `vector_columns` and `vector_over_m` say."""
        if self.clustered:
            return dataclasses.replace(self.config, cluster=self.config.splits(k))
        columns = self.config.grid(n, k)[0]
        if m > self.vector_over_m and self.config.reduce_matters(m, k) and columns <= self.vector_columns:
            return dataclasses.replace(self.config, reduce="vector")
        return self.config

    def holds(self, m: int, n: int, k: int, sms: int) -> bool:
        columns, splits, _ = self.config.grid(n, k)
        if m > self.max_m or (self.max_k is not None and k > self.max_k) \
                or self.config.reason(m, n, k) is not None:
            return False
        if self.clustered:
            return (2 <= splits <= MAX_CLUSTER and columns * splits < sms
                    and self.build(n, k).reason(m, n, k) is None)
        return not self.one_cta_per_sm or columns * splits >= sms


# The first preset that holds wins: the H200 probe of 2026-12-02 (benchmarks/NOTES.md, call 57;
# results/measurements/20261202T1843Z-h200-cuda-probe), the fastest of 9 builds x 2 launch
# overlaps at M = 1, 4, 16 on 8192x8192, 4096x6144 and 6144x2048, both formats:
#   - short K (2048): teams of 4 warps split each tile's k, 4 tiles a 16-warp CTA, which covers all
#     of K (no split-K), with the registers `min_ctas=1` allows (72 NVFP4, 67 MXFP4, against ~52 by
#     ptxas' choice: 3-9% faster); the next call may launch as the CTAs start ("all": NVFP4 4.14 us
#     at M=1 against 4.67 after the math, call 60, results/measurements/20261203T0925Z-h200-cuda-probe).
#     At M = 16 its 66 KB of staged activations need the shared-memory opt-in (call 73,
#     results/measurements/20261203T1712Z-h200-cuda-team-probe: 6144x2048 M=16 6.24 us NVFP4 and
#     6.01 MXFP4 against 7.14 and 7.39 for 16 tiles a CTA in a cluster; M=4 4.61 against 4.98 for
#     2 tiles a CTA; M=1 3.86, the same); other short K (below 2048) take the 16-tile builds;
#   - otherwise 16 tiles a CTA (the activations staged once for all 16), 16 k-groups a warp where
#     that still gives a CTA per SM (8192x8192: 256 CTAs), else 8 (4096x6144: 192 CTAs);
#   - `min_ctas=2` (61-64 registers, still two 16-warp CTAs an SM) 1-5% faster than ptxas' ~52
#     (8192x8192 NVFP4 M=1 12.08 us against 12.67);
#   - programmatic dependent launch everywhere: "all" where 16-warp CTAs fill the GPU at M <= 8,
#     "tail" at M = 16 and for short K (call 53: "all" up to 48% slower on small grids or CTAs);
#   - at M = 1 where 16 tiles a CTA leave SMs idle (4096x6144: 96 CTAs), 8-warp CTAs of two tiles,
#     each tile's k split over a team of 4 warps (384 CTAs of 2048 k): in every probe of calls
#     57-73 that measured both (results/measurements/20261203T0925Z-h200-cuda-probe, ...1410Z-...,
#     ...1712Z-...) 6.31-6.45 us NVFP4 against 6.59-6.62 for the cluster below, 6.13-6.14 MXFP4
#     against 6.20-6.23; side by side in call 80 (results/measurements/20261204T0420Z-h200-cuda-
#     small-team-probe) 6.36 against 6.42 and 6.13 against 6.17: a 1% win, at this one shape;
#   - where a grid has fewer CTAs than SMs (96: 4096x6144 M <= 8 with 16 k-groups a warp; K below
#     2048 with 8), a thread-block cluster of all the splits adds them in distributed shared memory
#     (call 64, results/measurements/20261203T1410Z-h200-cuda-cluster-probe: 6144x2048 NVFP4 M=16
#     7.08 us against 7.60; 4096x6144 NVFP4 M=4 6.87 against 7.23, M=1 6.59 against 6.68; on the
#     full grids every cluster build was slower, 8192x8192 M=16 17.26 us with pairs against 16.33);
#   - over M = 8 with 8 k-groups a warp and at most 16 CTA columns (N <= 4096), the split-K's
#     vector reduction (H100, call 132, results/measurements/20261207T0556Z-h100-dense-reduce-twins,
#     M = 12 and 16, both formats: 2048x8192 3-9% faster, 4096x4096 2-5%, 4096x6144 0-5%; with 32
#     columns 8192x4096 level to 12% slower, and every g16 grid level to 19% slower: 8192x8192,
#     14336x4096, 4096x14336); and over M = 32 with the 8-warp build below (call 133,
#     results/measurements/20261207T0627Z-h100-dense-reduce-twins-wide, M = 64: 4096x6144,
#     2048x8192, 4096x4096 and 8192x8192 (64 columns) 10-20% faster in both formats; at M = 32
#     NVFP4 mixed, 4096x6144 and 8192x8192 3-6% slower, where the vector build's 82 registers fit
#     two CTAs an SM against three: with a register cap for three (`min_ctas=3`, 76-80 registers,
#     no spill) the vector build at M = 32 is 5-20% faster than the preset in both formats at all
#     four shapes (call 138, results/measurements/20261207T0844Z-h100-dense-m32-vector-cap:
#     8192x8192 NVFP4 30.61 -> 28.03 us, 2048x8192 14.60 -> 11.67), so M = 17-32 takes the cap,
#     and the vector reduction where a lane holds four n8 tiles (M = 25-32: 3-20% faster than the
#     scalar twin at M = 32, call 139, results/measurements/20261207T0852Z-h100-dense-m17-32-preset;
#     at M = 24, three tiles, 6% slower to 7% faster, so scalar). Not yet probed on the H200;
#   - over M = 16 (measured at M = 64 only, calls 75-78, results/measurements/20261203T1913Z-h200-
#     cuda-wide-probe): 8-warp CTAs of 8 k-groups, two an SM (~102 registers), launched "all"
#     (8192x8192 55.3 us, 4096x6144 31.3; humming 28.2 and 15.7: these points stay slower than the
#     peers, the split-K atomics and the activations' staging and ldmatrix reads growing with M);
#     at K = 2048 teams of 2 warps in 16-warp CTAs with both splits in one cluster (6144x2048 14.7
#     us against 21.9 without it; cuBLAS bf16 9.8). Two row tiles a warp (half the ldmatrix reads)
#     and one wgmma a warpgroup were slower or no faster at M = 16 and 64 (calls 75 and 77; the code
#     stays at 8213dcd).
_SHORT_K_TAIL = CudaTileConfig(groups=8, depth=4, warps=16, min_ctas=2, overlap="tail")
PRESETS = (Preset(16, 2048, CudaTileConfig(groups=8, depth=4, warps=16, kwarps=4, min_ctas=1,
                                           overlap="all")),
           Preset(16, 2048, _SHORT_K_TAIL, clustered=True),
           Preset(16, 2048, _SHORT_K_TAIL),
           Preset(8, None, CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="all"),
                  one_cta_per_sm=True),
           Preset(1, None, CudaTileConfig(groups=8, depth=4, warps=8, kwarps=4, min_ctas=1,
                                          overlap="all")),
           Preset(8, None, CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="tail"),
                  clustered=True),
           Preset(16, None, CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="tail"),
                  one_cta_per_sm=True),
           Preset(16, None, CudaTileConfig(groups=8, depth=4, warps=16, min_ctas=2, overlap="all"),
                  vector_columns=16),
           Preset(64, 2048, CudaTileConfig(groups=8, depth=4, warps=16, kwarps=2, min_ctas=1,
                                           overlap="tail"), clustered=True),
           Preset(32, None, CudaTileConfig(groups=8, depth=4, warps=8, min_ctas=3, overlap="all"),
                  vector_columns=64, vector_over_m=24),
           Preset(64, None, CudaTileConfig(groups=8, depth=4, warps=8, min_ctas=2, overlap="all"),
                  vector_columns=64, vector_over_m=32))


def choose_config(m: int, n: int, k: int, sms: int = 132) -> CudaTileConfig:
    """The preset build of an M x N x K point (either format) on a GPU of `sms` SMs (the H200's 132 by
    default): the first of PRESETS that holds; else one warp a tile and the most k-groups (up to
    4) that divide K/64, launched plainly, which runs any point point_reason admits."""
    for preset in PRESETS:
        if preset.holds(m, n, k, sms):
            return preset.build(n, k, m)
    groups = max(g for g in GROUP_CHOICES if g <= 4 and (k // K_GROUP) % g == 0)
    return CudaTileConfig(groups=groups, warps=1)


# --- the layout ----------------------------------------------------------------------------------

# Where the layout puts each code's bits in a 4-byte word, per A register (a0..a3) and bf16 half:
# the magnitude's 3 bits from bit MAGNITUDE_AT[r] (+16 for the high half), the sign at SIGN_AT[r],
# so that the kernel's four decodes (`fragment_bits`) land them at bf16 bits 8..6 and 15 with
# 10 integer instructions (an exhaustive search over shift-and-mask layouts: no placement lets
# every register be one shift and one mask; this one needs one multiply-add trick for two of them)
MAGNITUDE_AT = (0, 3, 6, 9)
SIGN_AT = (14, 12, 15, 13)
BF16_CODE_MASK = 0x81C081C0          # bf16 bits 15 and 8..6 of both halves: the decoded code


def _fragment_index(device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(row, k) within a 16 x 16 MMA tile of A register r's half h in each lane, [32, 4r, 2h]:
    a0 (g, 2t + h), a1 (g+8, 2t + h), a2 (g, 2t+8 + h), a3 (g+8, 2t+8 + h) as in PTX's table."""
    lane = torch.arange(LANES, device=device)[:, None, None]
    register = torch.arange(4, device=device)[None, :, None]
    half = torch.arange(2, device=device)[None, None, :]
    row = lane // 4 + 8 * (register % 2)
    k = 2 * (lane % 4) + half + 8 * (register // 2)
    return row.expand(LANES, 4, 2), k.expand(LANES, 4, 2)


def fragment_bits(x: torch.Tensor) -> list[torch.Tensor]:
    """The kernel's decode of 4-byte words x (int64): the bf16x2 bit patterns of a0..a3, the
    codes at bf16 bits 15 and 8..6 (e2m1 * 2^-126 read as bf16)."""
    return [((x & 0x40074007) * 0x42) & BF16_CODE_MASK,       # sign << 1, magnitude << 6
            (x << 3) & BF16_CODE_MASK,
            x & BF16_CODE_MASK,
            (((x >> 3) & 0x05C005C0) * 0x21) & BF16_CODE_MASK]  # sign << 5, magnitude


def mma_layout(codes: torch.Tensor, scale_bytes: torch.Tensor, fmt: str):
    """FP4 codes [N, K] (one per uint8) and block-scale bytes [N, K/S] (e5m3 nvfp4, e8m0 mxfp4)
    -> the kernel's operands: codes [T, G, 32, 16] uint8 (lane's 16 bytes = four little-endian
    words, word q the A fragment of k16 step q, bits placed by MAGNITUDE_AT and SIGN_AT) and
    scales [T, G, 8, SCALE_BYTES] uint8 (for row pair g, g+8: byte 2j the scale of row g's block
    j, 2j+1 row g+8's)."""
    n, k = codes.shape
    tiles, groups = n // ROW_TILE, k // K_GROUP
    row, col = _fragment_index(codes.device)                                  # [32, 4r, 2h]
    steps = codes.reshape(tiles, ROW_TILE, groups, 4, 16).permute(0, 2, 3, 1, 4)  # [T, G, 4q, 16r, 16k]
    fragment = steps[:, :, :, row, col].to(torch.int64)                      # [T, G, 4q, 32, 4r, 2h]
    half = 16 * torch.arange(2, device=codes.device)
    magnitude_at = torch.tensor(MAGNITUDE_AT, device=codes.device)[:, None] + half  # [4r, 2h]
    sign_at = torch.tensor(SIGN_AT, device=codes.device)[:, None] + half
    words = ((fragment & 7) << magnitude_at) | ((fragment >> 3) << sign_at)
    words = words.sum(dim=(-2, -1)).permute(0, 1, 3, 2)                       # [T, G, 32, 4q] (disjoint bits)
    word_bytes = torch.stack([(words >> (8 * b)) & 0xFF for b in range(4)], dim=-1)  # [T, G, 32, 4q, 4]
    blocks = scale_bytes.shape[1] // groups                                    # 4 nvfp4, 2 mxfp4
    pairs = scale_bytes.reshape(tiles, 2, 8, groups, blocks).permute(0, 3, 2, 4, 1)  # [T, G, 8g, j, 2]
    if pairs[0, 0, 0].numel() != SCALE_BYTES[fmt]:
        raise ValueError(f"{fmt} scale bytes [N, K/S] give {pairs[0, 0, 0].numel()} bytes a row "
                         f"pair a k-group, the kernel reads {SCALE_BYTES[fmt]}")
    return (word_bytes.to(torch.uint8).reshape(tiles, groups, LANES, 16).contiguous(),
            pairs.reshape(tiles, groups, 8, SCALE_BYTES[fmt]).contiguous())


# --- a bit-exact model of the kernel's arithmetic (the tests' CPU check) --------------------------

def _bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """uint16 patterns (in int64) -> float32 values of those bf16 numbers."""
    return (bits.to(torch.int32) << 16).view(torch.float32)


def _words(laid_out: torch.Tensor) -> torch.Tensor:
    """Laid-out bytes [..., B] uint8 as the kernel reads them: [..., B/4] little-endian words
    (int64); the codes [T, G, 32, 16] give [T, G, 32, 4q], one a k16 step."""
    x = laid_out.to(torch.int64).reshape(*laid_out.shape[:-1], -1, 4)
    return x[..., 0] | x[..., 1] << 8 | x[..., 2] << 16 | x[..., 3] << 24


def _lane_scales(scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 [T, G, 32, 4q, 2]: the block scales (times 2^100) a lane applies at each k16 step,
    to its row g (last index 0) and row g+8 (1) fragments, decoded as the kernel does."""
    tiles, groups = scales.shape[:2]
    s = scales.to(torch.int64).reshape(tiles, groups, 8, -1, 2)               # [T, G, 8g, j, 2]
    multiplier, offset = (16, 217 << 7) if fmt == "nvfp4" else (128, 100 << 7)
    scale = _bf16_bits(s * multiplier + offset)                               # [T, G, 8, j, 2]
    per_step = scale.repeat_interleave(4 // scale.shape[3], dim=3)            # [T, G, 8, 4q, 2]
    return per_step.repeat_interleave(4, dim=2)                               # [T, G, 32, 4q, 2]


def scaled_fragments(weights: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 [T, G, 32, 4q, 4r, 2h]: the value of each A register half the kernel multiplies
    (decoded, times its block scale: exact, <= 6 significant bits, so each is a bf16)."""
    bits = torch.stack(fragment_bits(_words(weights)), dim=-1)                # [T, G, 32, 4q, 4r]
    halves = torch.stack([bits & 0xFFFF, bits >> 16], dim=-1)                 # [T, G, 32, 4q, 4r, 2h]
    rows_half = torch.arange(4) % 2                                           # a1, a3: row g+8
    return _bf16_bits(halves) * _lane_scales(scales, fmt)[..., rows_half, None]


def emulate(weights: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """float32 [N, K]: the weights the kernel multiplies (decoded from the laid-out bytes with the
    kernel's integer operations, times its scales, times 2^26: `unbias` without the nvfp4
    global scale), back in [N, K] order."""
    tiles, groups = weights.shape[:2]
    values = scaled_fragments(weights, scales, fmt).permute(0, 1, 3, 2, 4, 5)  # [T, G, 4q, 32, 4r, 2h]
    out = torch.zeros(tiles, groups, 4, ROW_TILE, 16)                         # [T, G, 4q, 16r, 16k]
    row, col = _fragment_index()
    out[:, :, :, row, col] = values
    n, k_total = tiles * ROW_TILE, groups * K_GROUP
    return out.permute(0, 3, 1, 2, 4).reshape(n, k_total) * WEIGHT_BIAS


# --- the backend ---------------------------------------------------------------------------------

def kernel_source(path: Path, prelude: str = "") -> str:
    """A kernel file's text after the shared device code (NVRTC has no include path) and
    `prelude` (device code a build generates)."""
    return COMMON_SOURCE.read_text() + "\n" + (prelude + "\n" if prelude else "") + path.read_text()


def compiled(config: CudaTileConfig, fmt: str, tiles: int, capability: tuple[int, int],
             stage: str = "full"):
    """The kernel built for one configuration and anatomy stage from KERNEL_SOURCE (NVRTC, once
    per process and kernel file: a probe's baseline file swapped in and out compiles each once)."""
    return _compiled(KERNEL_SOURCE, config, fmt, tiles, capability, stage)


@functools.lru_cache(maxsize=None)
def _compiled(kernel_file: Path, config: CudaTileConfig, fmt: str, tiles: int,
              capability: tuple[int, int], stage: str):
    options = [f"-DGROUPS={config.groups}", f"-DDEPTH={config.depth}", f"-DWARPS={config.warps}",
               f"-DKWARPS={config.kwarps}", f"-DNTILES={tiles}",
               f"-DNVFP4={int(fmt == 'nvfp4')}", f"-DOVERLAP_ALL={int(config.overlap == 'all')}",
               f"-DMIN_CTAS={config.min_ctas or 0}", f"-DCLUSTER={config.cluster}",
               f"-DSTAGE={list(ANATOMY_STAGES).index(stage)}",
               f"-DVECTOR_REDUCE={int(config.reduce == 'vector')}",
               "-std=c++17"]
    return torch.cuda._compile_kernel(kernel_source(kernel_file), KERNEL_NAME,
                                      compute_capability=f"{capability[0]}{capability[1]}",
                                      nvcc_options=options)


class CudaW4A16(Backend):
    name = "cuda-w4a16"
    formats = ("nvfp4", "mxfp4")
    library = "cuda"
    weight_dtype, act_dtype = "fp4", "bf16"
    requires = Requirements(min_capability=MIN_CAPABILITY, unit="bf16x2 multiply (sm_90)")
    what = ("fp4lab's CUDA decode GEMM (M <= 64): codes pre-laid in mma.sync's register order, "
            "16-byte loads straight to registers, split-K in one launch, programmatic dependent "
            "launch (weight-only, NVRTC)")
    note = "decode-sized M only (M <= 64)"

    def runtime_reason(self) -> str | None:
        if not hasattr(torch.cuda, "_compile_kernel"):
            return (f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC), "
                    "which builds the kernel (torch >= 2.8)")
        return None

    def point_reason(self, m: int, n: int, k: int) -> str | None:
        return point_reason(m, n, k)

    def prepare(self, a, w, device, config: CudaTileConfig | None = None):
        return _prepare(self, a, w, device, config, "full")


def _prepare(backend: CudaW4A16, a, w, device, config: CudaTileConfig | None, stage: str) -> Prepared:
    """The kernel at a [M, K] x w [N, K] built for `stage`: "full" returns out [M, N] bf16;
    "load" and "decode" their sums, [warps of the grid] int32; "mma" each split's partial tile,
    [splits, M, N] float32."""
    from fp4lab import formats

    backend.check_inputs(a, w)
    device = resolve_device(device)
    (m, k), n = a.shape, w.shape[0]
    reason = point_reason(m, n, k)
    if reason is None and device == "cpu":
        reason = "runs only on a CUDA GPU; the CPU was asked for"
    if reason:
        raise ValueError(f"{backend.name}: {reason}")
    config = config or choose_config(m, n, k, sm_count(device))
    if config.reason(m, n, k):
        raise ValueError(f"{backend.name} {config.label()}: {config.reason(m, n, k)}")
    check_scale_range(w)
    w = w.to(device)
    weights, scales = mma_layout(formats.unpack_nibbles(w.packed), kernel_scale_bytes(w), w.fmt)
    unbias = torch.full((1,), WEIGHT_BIAS, dtype=torch.float32, device=device)
    if w.global_scale is not None:
        unbias /= w.global_scale.float().reshape(-1)[0]
    kernel = compiled(config, w.fmt, n_tiles(m), torch.cuda.get_device_capability(device), stage)
    a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()                # [M, K]
    grid, block = config.grid(n, k), (config.threads, 1, 1)
    if stage == "full":
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)                # [M, N]
    elif stage == "mma":
        out = torch.empty(grid[1], m, n, dtype=torch.float32, device=device)        # [splits, M, N]
    else:
        out = torch.empty(grid[0] * grid[1] * config.warps, dtype=torch.int32, device=device)
    # the full kernel's split-K sums (zero between calls; [M, N], or in a "vector" build at M > 8 the
    # fragment order's [N/16, n8 tiles, 32 lanes, 4] with the rows past M) and per column counters; the stages
    # write `out` where the full kernel adds into the workspace, and no output (`unused`)
    workspace = torch.zeros(workspace_floats(config, m, n), dtype=torch.float32, device=device)
    counts = torch.zeros(grid[0], dtype=torch.int32, device=device)
    unused = torch.empty(0, dtype=torch.bfloat16, device=device)
    shared = config.shared_bytes(m)
    cluster = (1, config.cluster, 1)                       # consecutive splits of one column
    # the 48 KB a launch gets without the attribute hold the static shared memory too
    opt_in = shared + config.static_shared_bytes(m) > SHARED_DEFAULT
    if opt_in:
        allow_shared(kernel, shared)
    info = {"config": config.label(), "launch": config.launch, "stage": stage,
            **function_attributes(kernel), "shared_bytes": shared,
            "ctas_per_sm": resident_ctas(kernel, config.threads, shared)}
    if config.overlap == "off" and config.cluster == 1 and not opt_in:
        launch = kernel
    else:                          # the driver's launch: no 48 KB check of torch's in the way
        allow_cluster(kernel, cluster)
        launch = functools.partial(launch_ex, kernel, dependent=config.overlap != "off",
                                   cluster=cluster)
        if config.cluster > 1:     # below grid / cluster, the launch runs in more than one wave
            info["active_clusters"] = active_clusters(kernel, grid, block, shared, cluster)

    def gemm(a_arg, weights_arg, scales_arg, unbias_arg, out_arg):
        result, sums = (out_arg, workspace) if stage == "full" else (unused, out_arg)
        launch(grid=grid, block=block, shared_mem=shared,
               args=[weights_arg, scales_arg, a_arg, unbias_arg, result, sums, counts,
                     m, n, k, grid[1]])
        return out_arg

    return prepared_from(gemm, (a_bf16, weights, scales, unbias), out,
                         ref_a=a_bf16.float(), ref_w=formats.dequantize(w).float(), info=info)


# --- kernel anatomy ------------------------------------------------------------------------------

ANATOMY_STAGES = {                 # in the kernel's STAGE order: -DSTAGE is a stage's index here
    "full": "the GEMM",
    "load": "loads only: codes and scales read (summed as integers, a checksum), activations "
            "staged and read by ldmatrix, no decode, no MMA",
    "decode": "loads and decode, no MMA: the decoded, scaled A fragments summed as integers",
    "mma": "the GEMM without its split-K reduction: each split's partial tile stored, not added",
}


def anatomy_variants(a, w, device, config: CudaTileConfig | None = None,
                     stages=("load", "decode", "mma", "full")) -> list[AnatomyVariant]:
    """The kernel at a [M, K] x w [N, K] with `config` (default: the preset), once per stage (the
    stages before the reduction without its cluster), each with its check: "full" the GEMM gate;
    "mma" the gate on its partial tiles added up; "load" and "decode" their integer sums exact
    (the model: the laid-out bytes, `scaled_fragments`)."""
    backend = CudaW4A16()
    (m, k), n = a.shape, w.shape[0]
    config = config or choose_config(m, n, k, sm_count(resolve_device(device)))
    variants = []
    for stage in stages:
        if stage not in ANATOMY_STAGES:
            raise ValueError(f"anatomy stage {stage!r} of cuda-w4a16: use one of "
                             f"{list(ANATOMY_STAGES)}")
        # a cluster is the split-K reduction's: the stages without it launch plain CTAs (launched
        # as clusters, the loads alone took 4.86 us at 4096x6144 M=1 against 3.82, call 66)
        built = config if stage == "full" else dataclasses.replace(config, cluster=1)
        prepared = _prepare(backend, a, w, device, built, stage)
        variants.append(AnatomyVariant(stage, ANATOMY_STAGES[stage], prepared, w.nbytes,
                                       _stage_check(stage, prepared, w.fmt, built)))
    return variants


def _stage_check(stage: str, prepared: Prepared, fmt: str,
                 config: CudaTileConfig) -> Callable[[], correctness.GateResult]:
    tolerance = correctness.TOLERANCE[fmt]
    if stage == "full":
        return lambda: correctness.check_backend(prepared, tolerance)
    if stage == "mma":
        return lambda: _check_partials(prepared, tolerance)
    return lambda: _check_sums(prepared, stage, fmt, config)


def _check_partials(prepared: Prepared, tolerance: float) -> correctness.GateResult:
    partials = correctness.run_poisoned(prepared)                            # [splits, M, N]
    reference = correctness.reference_gemm(prepared.ref_a, prepared.ref_w)
    return correctness.compare(partials.double().sum(dim=0).cpu(), reference,
                               torch.linalg.vector_norm(reference).item(), tolerance)


def expected_sums(weights: torch.Tensor, scales: torch.Tensor, fmt: str, stage: str,
                  config: CudaTileConfig) -> torch.Tensor:
    """int32 [warps of the grid]: what stage "load" or "decode" stores, one wrapping sum a warp,
    from the laid-out bytes; warps in the kernel's order (split, CTA column, team, slice), a
    warp's k-groups (split * kwarps + slice) * groups onwards of its team's row tile."""
    tiles, groups = weights.shape[:2]
    if stage == "load":                   # the codes' words; the 4 lanes t of g read one scale
        per = _words(weights).sum(dim=(2, 3)) + 4 * _words(scales).sum(dim=(2, 3))  # [T, G]
    else:                                 # the bf16x2 bit patterns of the scaled A registers
        values = scaled_fragments(weights, scales, fmt).to(torch.bfloat16)      # exact
        bits = values.view(torch.int16).to(torch.int64) & 0xFFFF                # [T, G, 32, 4q, 4r, 2h]
        per = (bits[..., 0] + (bits[..., 1] << 16)).sum(dim=(2, 3, 4))           # [T, G]
    splits = groups // (config.groups * config.kwarps)
    per = per.reshape(tiles // config.tiles, config.tiles, splits, config.kwarps, config.groups)
    total = per.sum(dim=-1).permute(2, 0, 1, 3).reshape(-1) & 0xFFFFFFFF        # [split, col, team, slice]
    return torch.where(total >= 2**31, total - 2**32, total).to(torch.int32)


def _check_sums(prepared: Prepared, stage: str, fmt: str, config: CudaTileConfig) -> correctness.GateResult:
    _, weights, scales, _ = prepared.args
    result = correctness.run_poisoned(prepared).cpu()
    expected = expected_sums(weights.cpu(), scales.cpu(), fmt, stage, config)
    return correctness.exact(result, expected, f"{stage} sums", "warps",
                             f"int32, one a warp, {expected.numel()} warps")
