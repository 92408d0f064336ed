"""`triton-w4a16`: FP4 weights read packed, decoded in registers, multiplied in bf16.

This is the weight-only path that makes FP4 pay on Hopper, which has no FP4 tensor cores: at small
M a GEMM is bound by reading the weights, and FP4 moves ~0.56 B per weight (0.5 B of codes plus a
scale byte per 16) instead of bf16's 2. One kernel (`triton_w4a16_kernel`), one launch per call,
configured by a `TileConfig` chosen per (N, K, M) from presets the tuner measured
(`benchmarks/tune_w4a16.py`, `benchmarks/h200_kernels.py`); split-K sums its partials inside the
same launch, so every call is one graph node.

`anatomy_variants` prepares the same kernel with stages left out or doubled (loads only, decode
without math, math on pre-decoded bf16, decode twice) and, beside them, a one-launch stream of the
same weight bytes (`stream_kernel`: the floor at this size), each with the check that says what it
computed, so a sweep can show where the time of an FP4 weight-only GEMM goes. The weights reach
the kernel in the halves layout (`halves_layout`), written once at prepare.
Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension, `S` scale block.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

from fp4lab import correctness, formats
from fp4lab.backends.base import (
    BF16_MIN_CAPABILITY, OUTPUT_DTYPE, Backend, Prepared, Requirements, prepared_from,
    resolve_device,
)

MIN_BLOCK_K = 64                   # >= 32 bytes per row of a tile: one 16-byte load pair, one
                                   # whole mxfp4 scale block per half tile
DOT_MIN_BLOCK = 16                 # tl.dot needs every tile dimension >= 16
NUM_WARPS = (1, 2, 4, 8)
MATHS = ("dot", "gemv")
GEMV_DEPTHS = (1, 2, 3)           # the gemv kernel's tiles in flight (its num_stages)
DECODES = ("ptx", "bits")
LOADS = ("pointer", "tma")
LAYOUTS = ("rows", "tiles")
MAX_SPLIT_K = 32
MAX_STREAM_K = 8                   # CTAs an SM of a stream-K grid (an SM holds at most 32 CTAs,
                                   # and these tiles' registers allow a few)
# Must match triton_w4a16_kernel (kept here so choosing a config and checking weights needs no
# triton import): scales enter the kernel as bf16 * 2^SCALE_EXP.
SCALE_EXP = 100
E5M3_BIAS = 10
MXFP4_MIN_SCALE_BYTE = 128 - SCALE_EXP
MXFP4_MAX_SCALE_BYTE = 254 - SCALE_EXP


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration.

    `math` "dot" runs bf16 tensor cores (`swap_ab` computes out^T = W a^T, so the weight tile is
    the MMA's M side: wgmma needs >= 64 rows there, which a decode-sized M cannot give); "gemv"
    runs the CUDA-core kernel (`triton_gemv_kernel`: one activation row a program, so block_m is
    1, and num_stages counts the tiles in flight in registers, 1 to 3). `split_k` splits K over
    that many CTAs per output tile, summed in the same launch. `decode` "ptx" decodes with
    inline PTX, "bits" with plain Triton (the same values; the interpreter always runs "bits").
    `loads` "pointer" moves tiles into shared memory with per-thread cp.async loads, "tma" with
    one TMA copy a tile through tensor descriptors (Hopper's bulk copy engine; "dot" only).
    `layout` "rows" stores the packed weights row by row ([N, Kp/2]: a tile is BN runs of BK/2
    bytes, one per row, a row apart), "tiles" each [BN, BK] tile's codes and scales contiguous
    (`tiled_layout`: a K step reads one run of BN*BK/2 bytes, as a stream does; "dot" only).
    `stream_k` > 0 launches a persistent grid of that many CTAs an SM instead of one CTA a tile and
    split, each taking an equal share of every tile's K blocks (stream-K; "dot" only, split_k 1,
    cp.async loads). Measured on an H100 (calls 152-156): with TMA it tied the presets at their own
    CTA counts but raced, so it refuses TMA; with cp.async it is right and 30-86% slower than the
    M = 64 preset. No preset uses it: it stays for probes (`benchmarks/configs/*probe*.json`).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    math: str = "dot"
    swap_ab: bool = False
    decode: str = "ptx"
    loads: str = "pointer"
    layout: str = "rows"
    stream_k: int = 0

    def __post_init__(self):
        least_m = DOT_MIN_BLOCK if self.math == "dot" else 1
        if self.math == "gemv" and (self.block_m != 1 or self.swap_ab):
            raise ValueError("TileConfig with math='gemv' runs one activation row a program: "
                             f"block_m must be 1 and swap_ab False, got block_m={self.block_m!r}, "
                             f"swap_ab={self.swap_ab!r}")
        if self.math == "gemv" and self.num_stages not in GEMV_DEPTHS:
            raise ValueError(f"TileConfig.num_stages (tiles in flight) must be one of "
                             f"{GEMV_DEPTHS} with math='gemv', got {self.num_stages!r}")
        for name, least in (("block_m", least_m), ("block_n", DOT_MIN_BLOCK),
                            ("block_k", MIN_BLOCK_K)):
            value = getattr(self, name)
            if not _is_int(value) or value < least or value & (value - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= {least}, "
                                 f"got {value!r}")
        for name, top in (("split_k", MAX_SPLIT_K), ("num_stages", 8)):
            value = getattr(self, name)
            if not _is_int(value) or not 1 <= value <= top:
                raise ValueError(f"TileConfig.{name} must be an integer in 1..{top}, "
                                 f"got {value!r}")
        if self.num_warps not in NUM_WARPS:
            raise ValueError(f"TileConfig.num_warps must be one of {NUM_WARPS}, "
                             f"got {self.num_warps!r}")
        if self.math not in MATHS:
            raise ValueError(f"TileConfig.math must be one of {MATHS}, got {self.math!r}")
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"TileConfig.swap_ab must be True or False, got {self.swap_ab!r}")
        if self.decode not in DECODES:
            raise ValueError(f"TileConfig.decode must be one of {DECODES}, got {self.decode!r}")
        if self.loads not in LOADS:
            raise ValueError(f"TileConfig.loads must be one of {LOADS}, got {self.loads!r}")
        if self.loads == "tma" and self.math != "dot":
            raise ValueError("TileConfig.loads='tma' feeds the tensor-core kernel's shared "
                             f"memory: it needs math='dot', got math={self.math!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"TileConfig.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == "tiles" and self.math != "dot":
            raise ValueError("TileConfig.layout='tiles' is the tensor-core kernel's tile order: "
                             f"it needs math='dot', got math={self.math!r}")
        if not _is_int(self.stream_k) or not 0 <= self.stream_k <= MAX_STREAM_K:
            raise ValueError(f"TileConfig.stream_k (CTAs an SM) must be an integer in "
                             f"0..{MAX_STREAM_K}, got {self.stream_k!r}")
        if self.stream_k and (self.math != "dot" or self.split_k != 1):
            raise ValueError("TileConfig.stream_k shares K among a persistent grid of the tensor-core "
                             f"kernel: it needs math='dot' and split_k=1, got math={self.math!r}, "
                             f"split_k={self.split_k!r}")
        if self.stream_k and self.loads == "tma":
            # calls 152-155 (H100, Triton 3.6): where a CTA's runs span two tiles, TMA loads returned
            # NaNs and values like 1e36 on some calls (a barrier between tiles did not help);
            # cp.async loads gave the right result every time
            raise ValueError("TileConfig.stream_k with loads='tma' returned wrong results on the GPU "
                             "(benchmarks/NOTES.md, calls 152-155): use loads='pointer'")

    def blocks_per_split(self, k: int) -> int:
        """BLOCK_K blocks of K each split covers (the last may cover fewer)."""
        return -(-(-(-k // self.block_k)) // self.split_k)

    def splits(self, k: int) -> int:
        """How many splits really run at this K (no split is left empty)."""
        k_blocks = -(-k // self.block_k)
        return -(-k_blocks // self.blocks_per_split(k))

    def stream_plan(self, m: int, n: int, k: int, sm_count: int = 132) -> tuple[int, int, int]:
        """The stream-K grid at (M, N, K) on `sm_count` SMs: (steps a program takes, programs that
        have steps, workspace slots: the most programs one tile's K blocks meet), a step being one
        output tile's BK block."""
        tiles, k_blocks = -(-m // self.block_m) * -(-n // self.block_n), -(-k // self.block_k)
        steps = tiles * k_blocks
        per_program = -(-steps // max(1, min(self.stream_k * sm_count, steps)))
        slots = max(((t + 1) * k_blocks - 1) // per_program - (t * k_blocks) // per_program + 1
                    for t in range(tiles))
        return per_program, -(-steps // per_program), slots

    def ctas(self, m: int, n: int, k: int, sm_count: int = 132) -> int:
        if self.stream_k:
            return self.stream_plan(m, n, k, sm_count)[1]
        return -(-m // self.block_m) * -(-n // self.block_n) * self.splits(k)

    def label(self) -> str:
        """Compact, e.g. "dot m16n128k256 s4 w4 st3 swap ptx" (" tma" when loads is, " tiles"
        when layout is, " sk3" for stream-K over 3 CTAs an SM)."""
        return (f"{self.math} m{self.block_m}n{self.block_n}k{self.block_k} s{self.split_k} "
                f"w{self.num_warps} st{self.num_stages}{' swap' if self.swap_ab else ''} "
                f"{self.decode}{' tma' if self.loads == 'tma' else ''}"
                f"{' tiles' if self.layout == 'tiles' else ''}"
                f"{f' sk{self.stream_k}' if self.stream_k else ''}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- presets: configuration as data --------------------------------------------------------------
# Generic presets by the largest M each covers (None = any larger M), used for shapes the tuner
# has not measured; `auto_split_k` adds split-K when the output tiles alone leave SMs idle.
# Decode-sized M: the weight tile is the wgmma M side (swap_ab) and K is split over the SMs;
# 8 warps hold a 128 x 256 decoded tile in ~160 registers a thread (4 warps need 255 and spill).
# From M = 64 to 256 the tuned winners on all three tuned shapes load through TMA with swap_ab
# (call 31), so the generic presets there do too; prefill M keeps the measured cp.async tile.
TILE_PRESETS = (
    (16, TileConfig(block_m=16, block_n=128, block_k=256, num_warps=8, swap_ab=True)),
    (32, TileConfig(block_m=32, block_n=128, block_k=256, num_warps=8, swap_ab=True)),
    (64, TileConfig(block_m=64, block_n=128, block_k=128, num_stages=3, swap_ab=True,
                    loads="tma")),
    (128, TileConfig(block_m=64, block_n=128, block_k=128, num_stages=3, swap_ab=True,
                     loads="tma")),
    (256, TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3,
                     swap_ab=True, loads="tma")),
    (None, TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3)),
)

# Tuned winners per weight shape (N, K): (largest M covered, config), used exactly as written
# (split_k included) for M up to the largest measured one; beyond it the generic presets. From the
# `presets.json` that benchmarks/h200_kernels.py writes (nvfp4, cold L2, CUDA graph, the fastest
# gated config per measured M; `presets_from_json` loads it): the H200 tuning run of 2026-12-01
# with both load paths (benchmarks/NOTES.md, call 31; results/measurements/20261201T2300Z-h200-
# kernels-tma). TMA loads win from M = 64 (1.03-1.38x over cp.async) and tie at decode M. At
# M = 64 on the two smaller shapes two warpgroups a 128-row tile at half the split (calls 82-83,
# results/measurements/20261204T1310Z-h200-m64-probe): 17.8 against 21.4 us at 4096x6144, 13.2
# against 15.0 at 6144x2048; at 8192x8192 they lose (31.2 against 29.0). At M = 256, fewer
# splits than call 31's winners (not re-tuned at M = 256 since 2026-12-01; call 88, results/
# measurements/20261204T1830Z-h200-m256-probe, the fastest for both formats): 8192x8192 one split
# of 64-row weight tiles (72.5 / 72.2 us nvfp4 / mxfp4 against 80.0 / 75.8), 4096x6144 two splits
# and four stages (32.8 / 32.8 against 42.3), 6144x2048 one split of 64-row tiles (21.7 / 20.2
# against 30.2 / 29.1).
SHAPE_PRESETS: dict[tuple[int, int], tuple[tuple[int | None, TileConfig], ...]] = {
    (4096, 6144): (
        (1, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)),
        (4, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)),
        (16, TileConfig(block_m=16, block_n=64, block_k=256, split_k=4, swap_ab=True)),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=4, num_warps=8,
                      swap_ab=True, loads="tma")),
        (256, TileConfig(block_m=128, block_n=128, block_k=128, split_k=2, num_warps=8,
                      num_stages=4, swap_ab=True, loads="tma")),
    ),
    (6144, 2048): (
        (1, TileConfig(block_m=16, block_n=64, block_k=512, split_k=2, num_stages=2,
                      swap_ab=True)),
        (4, TileConfig(block_m=16, block_n=64, block_k=512, split_k=2, num_stages=2,
                      swap_ab=True)),
        (16, TileConfig(block_m=16, block_n=32, block_k=256, num_warps=2, swap_ab=True)),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=2, num_warps=8,
                      swap_ab=True, loads="tma")),
        (256, TileConfig(block_m=128, block_n=64, block_k=128, swap_ab=True, loads="tma")),
    ),
    (8192, 8192): (
        (1, TileConfig(block_m=16, block_n=128, block_k=256, split_k=4, swap_ab=True,
                      loads="tma")),
        (4, TileConfig(block_m=16, block_n=64, block_k=256, split_k=2, swap_ab=True)),
        (16, TileConfig(block_m=16, block_n=64, block_k=256, split_k=2, swap_ab=True)),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=4, swap_ab=True,
                      loads="tma")),
        (256, TileConfig(block_m=128, block_n=64, block_k=128, swap_ab=True, loads="tma")),
    ),
}

CTAS_PER_SM_TARGET = 2             # memory-bound tiles: two in flight per SM hide load latency
MIN_K_BLOCKS_PER_SPLIT = 2         # below this a split costs more in partial traffic than it saves


def preset_for(m: int, presets) -> TileConfig | None:
    """The first preset whose M bound covers `m` (None when every bound is below m)."""
    for m_max, preset in presets:
        if m_max is None or m <= m_max:
            return preset
    return None


def auto_split_k(config: TileConfig, m: int, n: int, k: int, sm_count: int) -> TileConfig:
    """`config` with split-K raised until about CTAS_PER_SM_TARGET CTAs per SM have work."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    if tiles >= CTAS_PER_SM_TARGET * sm_count:
        return dataclasses.replace(config, split_k=1)
    k_blocks = -(-k // config.block_k)
    wanted = CTAS_PER_SM_TARGET * sm_count // tiles    # rounded down: no mostly idle last wave
    split = max(1, min(wanted, k_blocks // MIN_K_BLOCKS_PER_SPLIT, MAX_SPLIT_K))
    return dataclasses.replace(config, split_k=split)


def choose_config(m: int, n: int, k: int, sm_count: int = 132) -> TileConfig:
    """The tuned config for (N, K) at M when SHAPE_PRESETS covers it (the smallest measured M at
    or above m), else the generic preset for M with split-K when the tiles leave SMs idle."""
    tuned = preset_for(m, SHAPE_PRESETS.get((n, k), ()))
    return tuned if tuned is not None else generic_config(m, n, k, sm_count)


def generic_config(m: int, n: int, k: int, sm_count: int = 132) -> TileConfig:
    """The generic (tensor-core) preset for M, split-K added when the tiles leave SMs idle."""
    return auto_split_k(preset_for(m, TILE_PRESETS), m, n, k, sm_count)


def tensor_core_config(m: int, n: int, k: int, sm_count: int = 132) -> TileConfig:
    """`choose_config`'s pick when it runs the tensor-core kernel, else (a gemv preset) the
    generic preset: the kernel whose stages the anatomy switches."""
    pick = choose_config(m, n, k, sm_count)
    return pick if pick.math == "dot" else generic_config(m, n, k, sm_count)


def presets_from_json(entries: list[dict]) -> dict[tuple[int, int], tuple]:
    """SHAPE_PRESETS from the `presets.json` rows the device script writes: [{"n", "k", "m_max",
    "config": {TileConfig fields}}, ...] (m_max null = any larger M)."""
    by_shape: dict[tuple[int, int], list] = {}
    for entry in entries:
        by_shape.setdefault((int(entry["n"]), int(entry["k"])), []).append(
            (entry["m_max"], TileConfig(**entry["config"])))
    return {shape: tuple(sorted(rows, key=lambda r: math.inf if r[0] is None else r[0]))
            for shape, rows in by_shape.items()}


# --- the backend ---------------------------------------------------------------------------------

class TritonW4A16(Backend):
    name = "triton-w4a16"
    formats = ("nvfp4", "mxfp4")
    library = "triton"
    weight_dtype, act_dtype = "fp4", "bf16"   # FP4 weights read, bf16 math
    requires = Requirements(min_capability=BF16_MIN_CAPABILITY, unit="bf16 tensor cores",
                            module="triton", pip_name="triton")
    what = ("FP4 weights decoded in registers (inline PTX), bf16 tensor-core or CUDA-core math, "
            "split-K in one launch (weight-only)")

    def capability_reason(self, capability):
        reason = super().capability_reason(capability)
        if capability is None and reason:
            reason += " (the kernel is tested on the CPU with TRITON_INTERPRET=1)"
        return reason

    def prepare(self, a, w, device, config: TileConfig | None = None) -> Prepared:
        """`device` may be "cpu" only under TRITON_INTERPRET=1 (the interpreter runs there)."""
        return _prepare(self, a, w, device, config, stage="full")


@dataclass
class KernelOperands:
    """What the kernel reads for one weight tensor, laid out once at prepare time."""

    packed: torch.Tensor         # [.., N, Kp/2] uint8 in the halves layout (`halves_layout`),
                                 # or [Np/BN * Kp/BK * BN, BK/2] in tiles (`tiled_layout`)
    scale_bytes: torch.Tensor    # [.., N, Kp/S] uint8: e5m3 (nvfp4, re-encoded) or e8m0 (mxfp4);
                                 # [Np/BN * Kp/BK * BN, BK/S] in tiles
    global_scale: torch.Tensor   # [1] float32 encode scale (ones for mxfp4: never read)


def kernel_operands(w, device: str, block_k: int, tile_rows: int | None = None) -> KernelOperands:
    """The kernel's operands for `w` [.., N, K] read in BK = `block_k` blocks (checked: mxfp4
    scales in the exact range); with `tile_rows` = BN (a 2-D `w`), in `tiled_layout`."""
    check_scale_range(w)
    w = w.to(device)
    scales = kernel_scale_bytes(w)
    global_scale = (w.global_scale.float().reshape(-1) if w.global_scale is not None
                    else torch.ones(1, dtype=torch.float32, device=device))
    packed, scales = halves_layout(w.packed, scales, block_k, w.block_size)
    if tile_rows is not None:
        packed, scales = (tiled_layout(packed, tile_rows, block_k // 2),
                          tiled_layout(scales, tile_rows, block_k // w.block_size))
    return KernelOperands(packed, scales, global_scale)


def tiled_layout(rows: torch.Tensor, tile_rows: int, tile_cols: int) -> torch.Tensor:
    """[N, C] (C a multiple of `tile_cols`) -> [Np/BN * C/tc * BN, tc]: the [BN, tc] tiles one
    after another, K fastest (tile (n, j) starts at row (n * C/tc + j) * BN), so the K steps of
    one weight tile walk contiguous memory. N is padded to whole tiles with zero bytes (zero codes
    and scales: nothing added)."""
    n, cols = rows.shape
    bands, steps = -(-n // tile_rows), cols // tile_cols
    padded = torch.nn.functional.pad(rows, (0, 0, 0, bands * tile_rows - n))       # [Np, C]
    tiles = padded.reshape(bands, tile_rows, steps, tile_cols).permute(0, 2, 1, 3)  # [B, J, BN, tc]
    return tiles.contiguous().reshape(bands * steps * tile_rows, tile_cols)


def untiled(tiles: torch.Tensor, n: int, tile_rows: int) -> torch.Tensor:
    """`tiled_layout`'s inverse: [Np/BN * J * BN, tc] -> [N, J * tc]."""
    tile_cols = tiles.shape[1]
    bands = -(-n // tile_rows)
    steps = tiles.shape[0] // (bands * tile_rows)
    rows = tiles.reshape(bands, steps, tile_rows, tile_cols).permute(0, 2, 1, 3)   # [B, BN, J, tc]
    return rows.reshape(bands * tile_rows, steps * tile_cols)[:n]


def halves_layout(packed: torch.Tensor, scale_bytes: torch.Tensor, block_k: int,
                  scale_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 codes as formats stores them ([.., N, K/2]: k = 2j in the low nibble of byte j, 2j+1
    in the high one) -> the kernel's halves layout [.., N, Kp/2], Kp = K rounded up to whole
    `block_k` blocks: within each block, byte j holds k = j in its low nibble and k = j +
    block_k/2 in its high one, so a tile's low nibbles are the first half of its K and the high
    nibbles the second (each half multiplies a contiguous half of the activations). The padding
    is zero codes, and the scale bytes [.., N, K/S] get zero bytes to [.., N, Kp/S] (the order
    of the scales is already by k). One slice of the leading dims at a time (bounded memory)."""
    if packed.dim() > 2:
        pairs = [halves_layout(p, s, block_k, scale_block) for p, s in zip(packed, scale_bytes)]
        return (torch.stack([p for p, _ in pairs]), torch.stack([s for _, s in pairs]))
    rows, k = packed.shape[0], 2 * packed.shape[1]
    padded = -(-k // block_k) * block_k
    codes = formats.unpack_nibbles(packed)                                         # [N, K]
    codes = torch.nn.functional.pad(codes, (0, padded - k))                        # [N, Kp]
    halves = codes.reshape(rows, padded // block_k, 2, block_k // 2)               # [N, B, 2, BK/2]
    relaid = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(rows, padded // 2)
    scales = torch.nn.functional.pad(scale_bytes, (0, (padded - k) // scale_block))
    return relaid.contiguous(), scales.contiguous()


def _prepare(backend: TritonW4A16, a, w, device, config: TileConfig | None, stage: str) -> Prepared:
    from fp4lab.backends import triton_w4a16_kernel as kernel

    backend.check_inputs(a, w)
    device = resolve_device(device)
    m, k = a.shape
    n = w.shape[0]
    config = config or choose_config(m, n, k, sm_count(device))
    operands = kernel_operands(w, device, config.block_k,
                               config.block_n if config.layout == "tiles" else None)
    a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()                # [M, K]
    ref_w = formats.dequantize(w).to(device)                                        # [N, K]
    out_dtype = {"load": torch.int32, "decode": torch.float32}.get(stage, OUTPUT_DTYPE)
    out = torch.empty(m, n, dtype=out_dtype, device=device)                        # [M, N]
    launch = kernel.Launch(m=m, n=n, k=k, fmt=w.fmt, config=config, stage=stage,
                           device=device, acc_dtype=torch.int32 if stage == "load"
                           else torch.float32, sm_count=sm_count(device))
    if stage == "math":   # the same skeleton on pre-decoded bf16 weights [N, K]
        weights = ref_w.to(torch.bfloat16).contiguous()
        args = (a_bf16, weights, operands.scale_bytes, operands.global_scale)
        ref_w = weights.float()
    else:
        args = (a_bf16, operands.packed, operands.scale_bytes, operands.global_scale)
    return prepared_from(launch, args, out, ref_a=a_bf16.float(), ref_w=ref_w,
                         info={"config": config.label(), "stage": stage})


def kernel_scale_bytes(w) -> torch.Tensor:
    """The block-scale bytes fp4lab's kernels decode (triton-w4a16's and cuda-w4a16's), [.., N,
    K/S] uint8: e5m3 for nvfp4 (`e4m3_to_e5m3`), the e8m0 bytes as stored for mxfp4."""
    return e4m3_to_e5m3(w.scales) if w.fmt == "nvfp4" else w.scales.contiguous().view(torch.uint8)


def e4m3_to_e5m3(scales: torch.Tensor) -> torch.Tensor:
    """e4m3 block scales (positive) -> the kernel's unsigned e5m3 bytes EEEEEmmm, value
    2^(E - E5M3_BIAS) (1 + m/8), zero -> 0: the same values, one byte each, but every e4m3
    subnormal is a normal e5m3 number, so the kernel decodes a scale in one multiply-add."""
    value = scales.float()                                                # exact
    mantissa, exponent = torch.frexp(value)                               # value = m * 2^e
    e5 = exponent + (E5M3_BIAS - 1)                                       # floor(log2) + bias
    m3 = (mantissa * 16 - 8).round().to(torch.int32)                      # 3 stored bits
    encoded = (e5.to(torch.int32) << 3) | m3
    return torch.where(value > 0, encoded, torch.zeros_like(encoded)).to(torch.uint8)


def check_scale_range(w) -> None:
    """Raise a ValueError when an mxfp4 block with non-zero codes has a scale outside what the
    kernel decodes exactly (2^-99 .. 2^27); all-zero blocks may have any scale."""
    if w.fmt != "mxfp4":
        return
    codes = w.packed.reshape(*w.scales.shape, -1)                         # [.., K/32, 16]
    used = w.scales[codes.ne(0).any(dim=-1)]
    if used.numel() == 0:
        return
    low, high = int(used.min()), int(used.max())
    if low < MXFP4_MIN_SCALE_BYTE or high > MXFP4_MAX_SCALE_BYTE:
        raise ValueError(f"weights w hold mxfp4 block scales 2^{low - 127}..2^{high - 127}; "
                         f"triton-w4a16 decodes 2^{MXFP4_MIN_SCALE_BYTE - 127}.."
                         f"2^{MXFP4_MAX_SCALE_BYTE - 127}")


def sm_count(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter on a CPU: plan as for the H200


# --- kernel anatomy ------------------------------------------------------------------------------

ANATOMY_STAGES = {
    "stream": "the weight bytes read once in one launch, 16-byte loads, no tiles: what any kernel "
              "that reads them could take at this size",
    "load": "loads only: codes, scales and activations read, summed as integers (a checksum)",
    "decode": "loads and decode, no math: row sums of the decoded weights and activations",
    "math": "the GEMM on pre-decoded bf16 weights (reads 2 B per weight instead of 0.5625)",
    "full": "the GEMM",
    "decode_x2": "the GEMM with the weight decode done twice (same values)",
}


@dataclass
class AnatomyVariant:
    """One stage variant of the dense kernel at one point, ready to time, with its own check."""

    stage: str
    what: str
    prepared: Prepared
    weight_bytes: int                           # weight bytes one call reads
    check: Callable[[], correctness.GateResult]


def anatomy_variants(a, w, device, config: TileConfig | None = None,
                     stages=tuple(ANATOMY_STAGES)) -> list[AnatomyVariant]:
    """The dense kernel at a [M, K] x w [N, K] with `config` (default: `tensor_core_config`),
    once per stage. "full", "decode_x2" and "math" pass the GEMM gate (float64 reference on the operands
    they multiply); "load" must return the exact integer checksum of the bytes it read and
    "decode" the row sums of the dequantized weights plus those of the activations; "stream"
    (not this kernel: `stream_kernel`, the floor beside it) the exact XOR of the bytes."""
    backend = TritonW4A16()
    device = resolve_device(device)
    config = config or tensor_core_config(a.shape[0], w.shape[0], a.shape[1], sm_count(device))
    variants = []
    for stage in stages:
        if stage not in ANATOMY_STAGES:
            raise ValueError(f"anatomy stage {stage!r}: use one of {list(ANATOMY_STAGES)}")
        prepared = (_prepare_stream(w, device) if stage == "stream"
                    else _prepare(backend, a, w, device, config, stage))
        weight_bytes = (2 * w.shape[0] * w.shape[1] if stage == "math" else w.nbytes)
        variants.append(AnatomyVariant(stage, ANATOMY_STAGES[stage], prepared, weight_bytes,
                                       _stage_check(stage, prepared, w.fmt, config)))
    return variants


def _prepare_stream(w, device: str) -> Prepared:
    """The "stream" stage: `w`'s code and scale bytes as int32 words, read by one launch."""
    from fp4lab.backends import stream_kernel

    w = w.to(device)
    words = stream_kernel.as_words(w.packed, w.scales)                         # [W] int32
    out = torch.empty(stream_kernel.programs(words), dtype=torch.int32, device=device)
    block, iters, warps = stream_kernel.LAUNCH
    return prepared_from(stream_kernel.launch_read, (words,), out, ref_a=torch.empty(0),
                         ref_w=torch.empty(0), info={
                             "config": f"stream {block}x{iters} words a program, {warps} warps",
                             "stage": "stream"})


def _stage_check(stage: str, prepared: Prepared, fmt: str,
                 config: TileConfig) -> Callable[[], correctness.GateResult]:
    if stage in ("full", "decode_x2", "math"):
        return lambda: correctness.check_backend(prepared, correctness.TOLERANCE[fmt])
    if stage == "load":
        return lambda: _check_checksum(prepared, config)
    if stage == "stream":
        return lambda: _check_stream(prepared)
    return lambda: _check_row_sums(prepared)


def _check_stream(prepared: Prepared) -> correctness.GateResult:
    from fp4lab.backends import stream_kernel

    (words,) = prepared.args
    result = correctness.run_poisoned(prepared).cpu()
    return correctness.exact(result, stream_kernel.expected_xor(words.cpu(), result.numel()),
                             "stream XOR", "words", "every word read")


def expected_checksum(a_bf16: torch.Tensor, packed: torch.Tensor,
                      scale_bytes: torch.Tensor) -> torch.Tensor:
    """int32 [M, N]: what STAGE "load" returns, the wrapping int32 sum of row n's code and scale
    bytes plus row m's bf16 bit patterns (read as unsigned 16-bit)."""
    w_sum = packed.long().sum(dim=1) + scale_bytes.long().sum(dim=1)                    # [N]
    a_sum = (a_bf16.view(torch.int16).long() & 0xFFFF).sum(dim=1)                       # [M]
    total = (a_sum[:, None] + w_sum[None, :]) & 0xFFFFFFFF
    return torch.where(total >= 2**31, total - 2**32, total).to(torch.int32)


def _check_checksum(prepared: Prepared, config: TileConfig) -> correctness.GateResult:
    a_bf16, packed, scale_bytes, _ = prepared.args
    if config.layout == "tiles":   # the sums are per weight row
        n = prepared.out.shape[1]
        packed, scale_bytes = (untiled(packed, n, config.block_n),
                               untiled(scale_bytes, n, config.block_n))
    result = correctness.run_poisoned(prepared).cpu()
    return correctness.exact(result, expected_checksum(a_bf16.cpu(), packed.cpu(), scale_bytes.cpu()),
                             "load checksum", "sums", "int32 sums of every byte read")


def _check_row_sums(prepared: Prepared) -> correctness.GateResult:
    result = correctness.run_poisoned(prepared)
    reference = (prepared.ref_a.double().sum(dim=1)[:, None]
                 + prepared.ref_w.double().sum(dim=1)[None, :])                          # [M, N]
    return correctness.compare(result, reference, torch.linalg.vector_norm(reference).item(),
                               ROW_SUM_TOLERANCE)


ROW_SUM_TOLERANCE = 1e-4   # float32 sums of exact decoded values: ~K * 2^-24 at worst
