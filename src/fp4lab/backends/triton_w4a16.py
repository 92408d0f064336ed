"""`triton-w4a16`: FP4 weights read packed, decoded in registers, multiplied in bf16.

This is the weight-only path that makes FP4 pay on Hopper, which has no FP4 tensor cores: at small
M a GEMM is bound by reading the weights, and FP4 moves ~0.56 B per weight (0.5 B of codes plus a
scale byte per 16) instead of bf16's 2. Tile shapes are configuration chosen from M, N, K and the
SM count (`choose_config`), so the decode shapes still spread over every SM (split-K when the
output tiles alone are too few). The kernels live in `triton_w4a16_kernel`.
Shape legend: `M` activation rows, `N` weight rows, `K` reduction dimension.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fp4lab.backends.base import (
    BF16_MIN_CAPABILITY, OUTPUT_DTYPE, Backend, Requirements, prepared_from, resolve_device,
)

MAX_SPLIT_K = 16
MIN_K_BLOCKS_PER_SPLIT = 4         # below this a split costs more in partial traffic than it saves
CTAS_PER_SM_TARGET = 2             # memory-bound tiles: two in flight per SM hide load latency
MIN_BLOCK = 16                     # tl.dot needs every tile dimension >= 16
MIN_BLOCK_K = 32                   # one whole mxfp4 scale block per K tile
NUM_WARPS = (1, 2, 4, 8, 16)
# The kernel decodes e8m0 scales as float32 2^(e-127) * 2^14 (see triton_w4a16_kernel), which
# holds every scale up to 2^113: blocks whose largest weight exceeds 6 * 2^113.
MAX_MXFP4_SCALE_BYTE = 240


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration. `swap_ab` computes out^T = W @ a^T so the weight tile is the
    dot's M side: wgmma needs >= 64 rows there, which a decode-sized M cannot give."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    swap_ab: bool = False

    def __post_init__(self):
        for name, least in (("block_m", MIN_BLOCK), ("block_n", MIN_BLOCK),
                            ("block_k", MIN_BLOCK_K)):
            value = getattr(self, name)
            if not _is_int(value) or value < least or value & (value - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= {least}, "
                                 f"got {value!r}")
        for name in ("split_k", "num_stages", "group_m"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"TileConfig.{name} must be an integer >= 1, got {value!r}")
        if self.num_warps not in NUM_WARPS:
            raise ValueError(f"TileConfig.num_warps must be one of {NUM_WARPS}, "
                             f"got {self.num_warps!r}")
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"TileConfig.swap_ab must be True or False, got {self.swap_ab!r}")

    def k_per_split(self, k: int) -> int:
        """K columns per split, a whole number of BLOCK_K."""
        k_blocks = -(-k // self.block_k)
        return -(-k_blocks // self.split_k) * self.block_k

    def label(self) -> str:
        """Compact, e.g. "m16n64k128 s3 w4 st4 swap"."""
        return (f"m{self.block_m}n{self.block_n}k{self.block_k} s{self.split_k} "
                f"w{self.num_warps} st{self.num_stages}{' swap' if self.swap_ab else ''}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Generic presets by the largest M each covers (None = any larger M); choose_config adds split-K
# when the output tiles alone leave SMs idle. Small M: the weight tile is the wgmma M side
# (swap_ab) and the K work is split; large M: big tiles so each decoded weight feeds many rows.
TILE_PRESETS = (
    (16, TileConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4,
                    swap_ab=True)),
    (32, TileConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4,
                    swap_ab=True)),
    (64, TileConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4,
                    swap_ab=True)),
    (256, TileConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)),
    (None, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)),
)

# Tuned winners per weight shape (N, K), same form as TILE_PRESETS, used exactly as written
# (split_k included). Measured on the H200 by `benchmarks/tune_w4a16.py` (nvfp4, cold L2, CUDA
# graph, the fastest gated config per M; its printed block pasted here). The decode-sized winners
# there: 6144x2048 M=1 13.45 us, 4096x6144 M=1 19.6 us, 8192x8192 M=1 42.9 us.
SHAPE_PRESETS: dict[tuple[int, int], tuple[tuple[int | None, TileConfig], ...]] = {
    (6144, 2048): (   # GLM-5 down
        (1, TileConfig(block_m=16, block_n=32, block_k=256, num_stages=4)),
        (16, TileConfig(block_m=16, block_n=32, block_k=256, num_stages=4)),
        (64, TileConfig(block_m=64, block_n=128, block_k=64, split_k=6)),
        (256, TileConfig(block_m=128, block_n=128, block_k=64, split_k=3, num_warps=8)),
        (1024, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (4096, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (None, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
    ),
    (4096, 6144): (   # GLM-5 gate_up
        (1, TileConfig(block_m=16, block_n=32, block_k=256, split_k=3, num_stages=4)),
        (16, TileConfig(block_m=16, block_n=32, block_k=256, split_k=3, num_stages=4)),
        (64, TileConfig(block_m=64, block_n=128, block_k=128, split_k=9, swap_ab=True)),
        (256, TileConfig(block_m=128, block_n=128, block_k=64, split_k=5, num_warps=8)),
        (1024, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (4096, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (None, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
    ),
    (8192, 8192): (
        (1, TileConfig(block_m=16, block_n=64, block_k=128, split_k=3, num_stages=4,
                       swap_ab=True)),
        (16, TileConfig(block_m=16, block_n=32, block_k=256, num_stages=4)),
        (64, TileConfig(block_m=64, block_n=128, block_k=64, split_k=5)),
        (256, TileConfig(block_m=128, block_n=128, block_k=64, split_k=3, num_warps=8)),
        (1024, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (4096, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
        (None, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8)),
    ),
}


def preset_for(m: int, presets) -> TileConfig:
    """The first preset whose M bound covers `m`."""
    for m_max, preset in presets:
        if m_max is None or m <= m_max:
            return preset
    return presets[-1][1]


def auto_split_k(config: TileConfig, m: int, n: int, k: int, sm_count: int) -> TileConfig:
    """`config` with split-K raised until about CTAS_PER_SM_TARGET CTAs per SM have work."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    if tiles >= sm_count:
        return config
    k_blocks = -(-k // config.block_k)
    wanted = -(-CTAS_PER_SM_TARGET * sm_count // tiles)
    split = max(1, min(wanted, k_blocks // MIN_K_BLOCKS_PER_SPLIT, MAX_SPLIT_K))
    return dataclasses.replace(config, split_k=split)


def choose_config(m: int, n: int, k: int, sm_count: int = 132) -> TileConfig:
    """The tuned config for (N, K) when SHAPE_PRESETS has one, else the generic preset for M
    with split-K when the [M, N] tiles leave SMs idle."""
    if (n, k) in SHAPE_PRESETS:
        return preset_for(m, SHAPE_PRESETS[(n, k)])
    return auto_split_k(preset_for(m, TILE_PRESETS), m, n, k, sm_count)


class TritonW4A16(Backend):
    name = "triton-w4a16"
    formats = ("nvfp4", "mxfp4")
    library = "triton"
    weight_dtype, act_dtype = "fp4", "bf16"   # FP4 weights read, bf16 math
    requires = Requirements(min_capability=BF16_MIN_CAPABILITY, unit="bf16 tensor cores",
                            module="triton", pip_name="triton")
    what = "FP4 weights decoded in registers, bf16 tensor-core math (weight-only)"

    def capability_reason(self, capability):
        reason = super().capability_reason(capability)
        if capability is None and reason:
            reason += " (the kernel is tested on the CPU with TRITON_INTERPRET=1)"
        return reason

    def prepare(self, a, w, device, config: TileConfig | None = None):
        """`device` may be "cpu" only under TRITON_INTERPRET=1 (the interpreter runs there)."""
        from fp4lab import formats
        from fp4lab.backends import triton_w4a16_kernel as kernel

        self.check_inputs(a, w)
        check_scale_range(w)
        device = resolve_device(device)
        w = w.to(device)
        m, k = a.shape
        n = w.shape[0]
        if config is None:
            config = choose_config(m, n, k, sm_count(device))
        a_bf16 = a.to(device=device, dtype=torch.bfloat16).contiguous()  # [M, K]
        scale_bytes = w.scales.contiguous().view(torch.uint8)            # [N, K/B] raw bytes
        # mxfp4 has no global scale; the kernel never reads this one then
        global_scale = (w.global_scale.float().reshape(1) if w.global_scale is not None
                        else torch.ones(1, dtype=torch.float32, device=device))
        out = torch.empty(m, n, dtype=OUTPUT_DTYPE, device=device)      # [M, N]
        split = -(-k // config.k_per_split(k))
        workspace = (torch.empty(split, m, n, dtype=torch.float32, device=device)
                     if split > 1 else None)                            # [split, M, N]

        def gemm(a_arg, packed, scales, gs, out_arg):
            return kernel.w4a16_matmul(a_arg, packed, scales, gs, out_arg, workspace, config,
                                       w.fmt)

        args = (a_bf16, w.packed.contiguous(), scale_bytes, global_scale)
        return prepared_from(gemm, args, out, ref_a=a_bf16.float(), ref_w=formats.dequantize(w))


def check_scale_range(w) -> None:
    """Raise a ValueError when an mxfp4 scale lies beyond what the kernel decodes exactly."""
    if w.fmt != "mxfp4":
        return
    largest = int(w.scales.max())
    if largest > MAX_MXFP4_SCALE_BYTE:
        raise ValueError(f"weights w hold an mxfp4 block scale 2^{largest - 127}; triton-w4a16 "
                         f"decodes scales up to 2^{MAX_MXFP4_SCALE_BYTE - 127}")


def sm_count(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter on a CPU: plan as for the H200
