"""`triton-w4a16-moe`: the routed MLP of a decode step in two fused FP4 weight-only launches.

gate_up and down each run over every active expert in ONE launch (`triton_fused_kernel`), the
SiLU-and-multiply fused into gate_up's epilogue, the routing weights into down's. Per call (timed,
as a server does it every step): one single-CTA Triton kernel groups the (token, slot) pairs by
expert and lists the work busiest expert first; after down, torch sums each token's k weighted
rows. Four launches in all, graph-capturable. FP4 weights are read once per (expert, pair tile):
a `MoeTileConfig.block_m` at least the busiest expert's load reads every expert's weights once.

Shape legend: see `fp4lab.backends.moe.base` (`P` = T*k pairs, `W` work items).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fp4lab.backends.moe.base import (
    LayerProblem, MoeCall, MoeMethod, bound_call, layer_weight_bytes,
)

DECODES = ("ptx", "bits")
LOADS = ("pointer", "tma")
LAYOUTS = ("rows", "tiles")
# the call's launches in order; a call prepared `until` one of them stops after it (timing the
# launches apart: each part's time is the difference of two prefixes; only "sum" is gated)
CALL_PARTS = ("route", "gate_up", "down", "sum")


@dataclass(frozen=True)
class MoeTileConfig:
    """Tiles of both launches: `block_m` pairs of one expert per tile, `block_n_*` weight rows,
    `block_k` the reduction step; "ptx" or "bits" decode, "pointer" or "tma" weight loads and
    "rows" or "tiles" weight layout as in `triton_w4a16.TileConfig` ("tiles" over all experts'
    rows: each launch's N tile must divide an expert's rows, I for gate_up, H for down)."""

    block_m: int = 16
    block_n_gate_up: int = 64
    block_n_down: int = 128
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    decode: str = "ptx"
    loads: str = "pointer"
    layout: str = "rows"

    def __post_init__(self):
        for name in ("block_m", "block_n_gate_up", "block_n_down", "block_k"):
            value = getattr(self, name)
            least = 64 if name == "block_k" else 16
            if not isinstance(value, int) or isinstance(value, bool) or value < least \
                    or value & (value - 1):
                raise ValueError(f"MoeTileConfig.{name} must be a power of two >= {least}, "
                                 f"got {value!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"MoeTileConfig.num_warps must be 1, 2, 4 or 8, "
                             f"got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"MoeTileConfig.num_stages must be in 1..8, got {self.num_stages!r}")
        if self.decode not in DECODES:
            raise ValueError(f"MoeTileConfig.decode must be one of {DECODES}, got {self.decode!r}")
        if self.loads not in LOADS:
            raise ValueError(f"MoeTileConfig.loads must be one of {LOADS}, got {self.loads!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"MoeTileConfig.layout must be one of {LAYOUTS}, "
                             f"got {self.layout!r}")

    def label(self) -> str:
        return (f"m{self.block_m} n{self.block_n_gate_up}/{self.block_n_down} k{self.block_k} "
                f"w{self.num_warps} st{self.num_stages} {self.decode}"
                f"{' tma' if self.loads == 'tma' else ''}"
                f"{' tiles' if self.layout == 'tiles' else ''}")


# By the mean pairs per expert (T*k/E) each covers (None = any more): a tile of pairs holds about
# the busiest expert's load (uniform routing: ~1.8x the mean at 16), so weights are read once.
# block_k 128 keeps both kernels under 255 registers at these tiles (offline sm_90 build). The
# H200 run of 2026-12-01 with both load paths (GLM-5 nvfp4, `moe_presets_from_json` rows,
# benchmarks/NOTES.md call 31): m16 at a mean of 2 pairs (B=64, 1.83 ms), m32 at 16 (B=512,
# 2.34 ms), TMA weight loads both (cp.async: 2.01 and 2.80 ms).
MOE_PRESETS: tuple[tuple[float | None, MoeTileConfig], ...] = (
    (2.0, MoeTileConfig(block_m=16, block_k=128, loads="tma")),
    (None, MoeTileConfig(block_m=32, block_k=128, loads="tma")),
)


def moe_presets_from_json(rows: list[dict], fmt: str = "nvfp4") -> tuple:
    """MOE_PRESETS from the `presets.json` "moe" rows the device script writes ({"fmt",
    "mean_pairs_per_expert", "config"}, one per measured point): each measured mean covers the
    means up to it, the largest any more (None); the first row wins at a repeated mean."""
    by_mean: dict[float, MoeTileConfig] = {}
    for row in rows:
        if row["fmt"] == fmt:
            by_mean.setdefault(float(row["mean_pairs_per_expert"]), config_from_dict(row["config"]))
    means = sorted(by_mean)
    return tuple((None if mean == means[-1] else mean, by_mean[mean]) for mean in means)


def choose_moe_config(pairs: int, experts: int) -> MoeTileConfig:
    mean = pairs / experts
    for bound, config in MOE_PRESETS:
        if bound is None or mean <= bound:
            return config
    return MOE_PRESETS[-1][1]


@dataclass
class RouteTables:
    """The per-call routing tables (int32, on the device), written by the route kernel."""

    sorted_pairs: torch.Tensor   # [P] pair ids p = t*k + j, grouped by expert
    work_expert: torch.Tensor    # [W] expert of each work item, busiest first; -1 = no work
    work_start: torch.Tensor     # [W] first sorted position of the item's pairs
    work_rows: torch.Tensor      # [W] pairs in the item (<= block_m)
    cursor: torch.Tensor         # [E'] next free position per expert: zero between calls
    scratch: torch.Tensor        # [4, E'] the kernel's per-expert arrays

    @classmethod
    def empty(cls, pairs: int, experts: int, block_m: int, device) -> "RouteTables":
        padded = 1 << max(experts - 1, 0).bit_length()                   # E' = next power of 2
        work = max_work_items(pairs, experts, block_m)

        def table(size):
            return torch.empty(size, dtype=torch.int32, device=device)

        return cls(sorted_pairs=table(pairs), work_expert=table(work), work_start=table(work),
                   work_rows=table(work),
                   cursor=torch.zeros(padded, dtype=torch.int32, device=device),
                   scratch=table(4 * padded))


def max_work_items(pairs: int, experts: int, block_m: int) -> int:
    """An upper bound on sum_e ceil(load_e / block_m) over any routing of `pairs` pairs."""
    return min(experts, pairs) + pairs // block_m


class TritonW4A16Moe(MoeMethod):
    name, library, kind = "triton-w4a16-moe", "triton", "layer"
    formats = ("nvfp4", "mxfp4")
    weight_dtype, act_dtype = "fp4", "bf16"
    what = ("fused FP4 weight-only MoE: gate_up (+SiLU*up) and down (+routing weights) in one "
            "Triton launch each over all experts, busiest expert first")
    note = ("routing (group pairs by expert, work list: one Triton launch) is inside the timed "
            "call; top-k sum by torch.sum")

    @property
    def requires(self):
        from fp4lab import backends

        return backends.get("triton-w4a16").requires

    def capability_reason(self, capability):
        from fp4lab import backends

        return backends.get("triton-w4a16").capability_reason(capability)

    def prepare(self, problem: LayerProblem, fmt: str | None = None,
                config: MoeTileConfig | None = None, until: str = "sum") -> MoeCall:
        """`problem` on "cpu" only under TRITON_INTERPRET=1. `until` (one of CALL_PARTS) ends
        the call after that launch: a prefix to time, whose output is not the layer's."""
        from fp4lab.backends.moe import triton_fused_kernel as kernel
        from fp4lab.backends.triton_w4a16 import kernel_operands
        from fp4lab.backends.triton_w4a16_kernel import INTERPRETED

        check_layer_request(self, problem, fmt, until)
        device = problem.x.device
        tokens, top_k = problem.topk_ids.shape
        experts, hidden, inter = problem.experts, problem.hidden, problem.intermediate
        config = config or choose_moe_config(tokens * top_k, experts)
        w13 = kernel_operands(problem.w13, str(device), config.block_k)     # [E, 2I, Hp/2] ...
        w2 = kernel_operands(problem.w2, str(device), config.block_k)       # [E, H, Ip/2] ...
        if config.layout == "tiles":
            scale_block = problem.w13.block_size
            w13 = tiled_moe_weights(w13, config.block_n_gate_up, config.block_k, scale_block,
                                    inter, "I (gate_up)")
            w2 = tiled_moe_weights(w2, config.block_n_down, config.block_k, scale_block,
                                   hidden, "H (down)")
        if problem.w13.global_scale is None:   # mxfp4: one (never read) scale per expert
            w13.global_scale = w2.global_scale = torch.ones(experts, device=device)
        common = dict(top_k=top_k, fmt=problem.fmt, config=config, interpreted=INTERPRETED)

        def gate_up(x, ops, act, tables, route_w):
            kernel.launch(x, ops.packed, ops.scale_bytes, ops.global_scale, act,
                          tables.sorted_pairs, route_w, route_work(tables), n=inter, k=hidden,
                          gate_up=True, **common)

        def down(act, ops, y, tables, route_w):
            kernel.launch(act, ops.packed, ops.scale_bytes, ops.global_scale, y,
                          tables.sorted_pairs, route_w, route_work(tables), n=hidden, k=inter,
                          gate_up=False, **common)

        return routed_layer_call(self, problem, until, config.block_m, w13, w2, gate_up, down,
                                 f"2 Triton launches ({config.label()})")


def check_layer_request(method: MoeMethod, problem: LayerProblem, fmt, until: str) -> None:
    """A fused method's prepare arguments, checked before any work: the problem's format is one
    the method takes, `fmt` (positional by mistake) a name or None, `until` one of CALL_PARTS."""
    if problem.fmt not in method.formats:
        raise ValueError(f"{method.name} takes formats {list(method.formats)}, not {problem.fmt!r}")
    if fmt is not None and not isinstance(fmt, str):   # prepare(problem, config) by mistake
        raise TypeError(f"{method.name}.prepare: fmt must be a format name or None, got "
                        f"{type(fmt).__name__}; pass a tile config as config=")
    if until not in CALL_PARTS:
        raise ValueError(f"until must be one of {CALL_PARTS}, got {until!r}")


def route_work(tables: "RouteTables") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tables.work_expert, tables.work_start, tables.work_rows


def routed_layer_call(method: MoeMethod, problem: LayerProblem, until: str, block_m: int, w13, w2,
                      gate_up, down, launches: str) -> MoeCall:
    """A fused method's call: the route kernel (work items of up to `block_m` pairs of one
    expert), `gate_up(x, w13, act, tables, route_w)` writing act [P, I] by sorted position,
    `down(act, w2, y, tables, route_w)` writing y [P, H] by pair id (times its routing weight),
    then torch's sum of each token's k rows; stopped after launch `until` (CALL_PARTS). The
    weights `w13`, `w2` are in the call's args, so the timer's copies rebind them."""
    from fp4lab.backends.moe.triton_fused_kernel import launch_route

    last = CALL_PARTS.index(until)
    device = problem.x.device
    tokens, top_k = problem.topk_ids.shape
    pairs, experts, hidden = tokens * top_k, problem.experts, problem.hidden
    tables = RouteTables.empty(pairs, experts, block_m, device)
    act = torch.empty(pairs, problem.intermediate, dtype=torch.bfloat16, device=device)  # [P, I]
    y = torch.empty(pairs, hidden, dtype=torch.bfloat16, device=device)                 # [P, H]

    def build(args, out):
        x, topk_ids, topk_weights, w13_ops, w2_ops = args

        def call():
            launch_route(topk_ids, experts, block_m, tables)
            if last == 0:
                return out
            route_w = topk_weights.reshape(-1)                                  # [P]
            gate_up(x, w13_ops, act, tables, route_w)
            if last == 1:
                return out
            down(act, w2_ops, y, tables, route_w)
            if last == 2:
                return out
            return torch.sum(y.view(tokens, top_k, hidden), dim=1, dtype=torch.float32, out=out)
        return call

    out = torch.empty(tokens, hidden, dtype=torch.float32, device=device)      # [T, H]
    args = (problem.x.contiguous(), problem.topk_ids.contiguous(),
            problem.topk_weights.float().contiguous(), w13, w2)
    active = int((problem.loads > 0).sum())
    return bound_call(build, args, out, tolerance_key=problem.fmt,
                      weight_bytes=layer_weight_bytes(problem),
                      note=f"{active} experts, {launches}; {method.note}")


def tiled_moe_weights(ops, block_n: int, block_k: int, scale_block: int, n: int, what: str):
    """`ops` (KernelOperands [E, R, C]) with all experts' rows [E * R, C] in `tiled_layout`
    (tiles of `block_n` rows by a BK block), which needs the launch's N (`n`: an expert's I or
    H) to be whole tiles, so that no tile spans two experts or the gate and up halves."""
    from fp4lab.backends.triton_w4a16 import tiled_layout

    if n % block_n:
        raise ValueError(f"MoeTileConfig.layout='tiles' needs {what} = {n} to be a multiple of "
                         f"its N tile, {block_n}")

    def tiled(rows, cols):                                   # [E, R, C] -> [E*R/BN * C/cols * BN, cols]
        return tiled_layout(rows.reshape(-1, rows.shape[-1]), block_n, cols)

    return dataclasses.replace(ops, packed=tiled(ops.packed, block_k // 2),
                               scale_bytes=tiled(ops.scale_bytes, block_k // scale_block))


def config_from_dict(fields: dict) -> MoeTileConfig:
    return MoeTileConfig(**{f.name: fields[f.name] for f in dataclasses.fields(MoeTileConfig)
                            if f.name in fields})
