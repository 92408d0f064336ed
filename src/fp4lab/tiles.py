"""Which CUTLASS FP4 tiles fit one thread block's shared memory on each GPU: a model from the spec
sheet (`hardware.SPECS[...].smem_per_block_kb`) and CUTLASS's stage-count rule. No run tables.

FlashInfer's CUTLASS NVFP4 GEMM (`mm_fp4`) and fused MoE autotune over tile shapes ("tactics").
Each kernel is built with `StageCountAutoCarveout<sizeof(epilogue shared storage)>`: as many
mainloop stages as fit in the block's shared memory once the epilogue's share is carved out
(CUTLASS `sm100_compute_stage_count_or_override_blockscaled`, which the sm_120 builder calls too):

    stages     = (limit - kernel - epilogue) // stage                        (rounded down)
    stage      = M*K/2 + N*K/2                 A and B tiles, 4-bit e2m1
               + (M + N rounded up to 128 rows) * K/16    e4m3 block scales, one per 16 values,
                                                          stored in 128-row blocks
               + 128                           the stage's full/empty barrier pair, rounded to 128
    epilogue   = epilogue stages * sub-tile M x N * 2 bytes (bf16) + 16 bytes of barriers a stage
    kernel     = the other barriers and TMA descriptors of the kernel (scheduler, tensor maps)
    fits       = stages >= 2               the mainloops static_assert(Stages >= 2)
    smem       = max(stages, 2) * stage + epilogue + kernel

Where each term comes from (CUTLASS 4.x as vendored in flashinfer-python 0.7.2.post1):
- limit: `cutlass/arch/arch.h` sm100_smem_capacity_bytes = 232448 (227 KB), sm120 = 101376
  (99 KB), the same figures as the CUDA programming guide's per-block limits in SPECS.
- stage: `gemm/collective/builders/sm100_blockscaled_umma_builder.inl`; the 128-row scale blocks:
  `Sm1xxBlockScaledConfig` (Blk_MN = 128); sm_120 pads SFB to 128 rows
  (`sm120_blockscaled_mma_builder.inl`, sSFBTileShape_N = max(N, 128)).
- at least 2 stages: `gemm/collective/sm120_blockscaled_mma_array_tma.hpp` and the sm_100 mainloops.
- epilogue: sm_120 `epilogue/collective/builders/sm120_builder.inl` (sub-tile 64x32; 2 stages
  of D, or 3 stages of C reused as D when C is bf16, as in FlashInfer's MoE, whose ElementC is
  its output type); sm_100 `sm100_builder.inl` (EpilogueTileAuto with no source: M = min(CTA_M,
  128), N = 4096 / M; 2 stages of D) and FlashInfer's 128x64 sub-tile for N = 256 tiles.
- kernel: sm_120 `sm120_blockscaled_mma_builder.inl` (scheduler pipeline, two tensor maps for
  grouped GEMMs); sm_100 `sm100_pipeline_carveout.inl` (Sm100DenseGemmTmaUmmaCarveout). The byte
  counts below add up those barriers at 8 bytes each and 128-byte TMA descriptors.
Tile names are FlashInfer's tactic names (`CtaShape{M}x{N}x{K}B`): K there is in bytes of FP4 for
the MoE GEMMs and the sm_120 GEMM (their SHAPE_CASE turns bytes into elements: 128B = 256 values),
but in elements for the sm_100 dense GEMM (`fp4_gemm_cutlass_template.h` passes it as is); each
row carries the K that is built. sm_100 tiles of M = 256 run as a 2-SM pair (each SM holds half);
they are counted here as one block holding the whole tile: an upper bound.

Shape legend: `M`, `N`, `K` the CTA tile (rows of A, rows of B, the reduction), in values.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp4lab.hardware import SPECS, GpuSpec

FP4_BITS = 4
SF_VECTOR = 16            # NVFP4: one e4m3 block scale per 16 values (the kernels' SfVectorSize)
SF_ROW_BLOCK = 128        # scale factors are stored in blocks of 128 rows
STAGE_BARRIER_BYTES = 128  # PipelineTmaUmmaAsync<1>::SharedStorage (2 x 8 B) rounded up to 128
MIN_STAGES = 2
BARRIER_BYTES = 8         # one cutlass::arch::ClusterBarrier (a uint64)
TMA_DESCRIPTOR_BYTES = 128
OUTPUT_BYTES = 2          # bf16 output (and bf16 C where the epilogue reads one)
KINDS = ("gemm", "moe")
FLASHINFER = "flashinfer-python 0.7.2.post1"


@dataclass(frozen=True)
class Tactic:
    """One tile as FlashInfer names it: CtaShape{m}x{n}x{k}B."""

    m: int
    n: int
    k: int                 # as in the tactic name (bytes or values: see Family.k_values_per_unit)

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class Epilogue:
    tile_m: int
    tile_n: int
    stages: int            # sub-tiles held in shared memory at once
    why: str

    @property
    def bytes(self) -> int:
        return self.stages * (self.tile_m * self.tile_n * OUTPUT_BYTES + 2 * BARRIER_BYTES)


@dataclass(frozen=True)
class Family:
    """The kernels of one Blackwell architecture: their tile lists and fixed carve-outs."""

    key: str                                    # "sm_100" | "sm_120"
    majors: tuple[int, ...]                     # compute capability majors it covers
    listed: dict[str, tuple[Tactic, ...]]       # kind -> FlashInfer's candidate tiles
    k_values_per_unit: dict[str, int]           # kind -> values per tactic-K unit (2: K in bytes)
    kernel_bytes: dict[str, int]                # kind -> barriers and tensor maps of the kernel
    sfb_rows_min: int                           # SFB rows are padded to at least this many
    source: str

    def k_values(self, tactic: Tactic, kind: str) -> int:
        return tactic.k * self.k_values_per_unit[kind]


def _tactics(*shapes: tuple[int, int, int]) -> tuple[Tactic, ...]:
    return tuple(Tactic(*shape) for shape in shapes)


# sm_120 kernel carve-out: grouped (MoE) = PipelineAsync<8> scheduler (16 barriers) + 2 tensor maps
# + PipelineAsync<3> tensor-map-ready (6 barriers) = 128 + 256 + 48; dense = CLC fetch pipeline
# <3> (6 barriers) + 3 CLC responses of 16 B = 48 + 48.
# sm_100 dense: accumulator pipeline <2> 32 + CLC pipeline <2> 32 + load-order barrier 16 + TMEM
# dealloc 8 + CLC throttle <2> 32 + 2 CLC responses 32 + 2 TMEM pointers 8 = 160; grouped: 8
# scheduler stages and 2 CLC responses (32 + 256 + 16 + 8 + 128 + 256 + 32), 4 x 5 tensor maps
# (2560) and a tensor-map-ready pipeline <8> (128) = 3416.
FAMILIES: dict[str, Family] = {family.key: family for family in (
    Family(
        key="sm_120", majors=(12,),
        listed={
            # fp4_gemm_cutlass_template_sm120.h dispatchNVFP4xNVFP4GemmCTAShapeSm120
            "gemm": _tactics((128, 32, 64), (128, 32, 128), (128, 64, 64), (128, 64, 128),
                             (128, 128, 64), (128, 128, 128), (256, 128, 64), (128, 256, 64)),
            # moe_gemm_template_dispatch_tma_ws.h SHAPE_CASE(120, ...)
            "moe": _tactics((128, 32, 64), (128, 32, 128), (128, 64, 64), (128, 64, 128),
                            (128, 128, 64), (128, 128, 128), (128, 256, 64), (256, 128, 64)),
        },
        k_values_per_unit={"gemm": 2, "moe": 2},
        kernel_bytes={"gemm": 96, "moe": 432},
        sfb_rows_min=128,
        source=f"{FLASHINFER}: csrc/nv_internal .../cutlass_heuristic.cpp get_candidate_configs_sm120",
    ),
    Family(
        key="sm_100", majors=(10,),
        listed={
            # fp4_gemm_cutlass_template.h dispatchNVFP4xNVFP4GemmCTAShapeSm100
            "gemm": _tactics((128, 64, 128), (128, 256, 128), (128, 128, 256), (128, 256, 256)),
            # moe_gemm_template_dispatch_tma_ws.h SHAPE_CASE(100, ...), M = 256 via 2-SM clusters
            "moe": _tactics((64, 32, 128), (64, 64, 128), (64, 128, 128), (64, 256, 128),
                            (128, 16, 128), (128, 32, 128), (128, 64, 128), (128, 128, 128),
                            (128, 256, 128), (256, 128, 128)),
        },
        k_values_per_unit={"gemm": 1, "moe": 2},
        kernel_bytes={"gemm": 160, "moe": 3416},
        sfb_rows_min=0,
        source=f"{FLASHINFER}: csrc/nv_internal .../cutlass_heuristic.cpp get_candidate_configs_sm100",
    ),
)}

# Shown for every GPU: the four largest square-ish tiles, among them the seed's two MoE tiles
# (FlashInfer's SM120 MoE autotune failed on them; 0.7 lists their K = 64B halves instead).
ALWAYS_SHOWN = _tactics((128, 128, 128), (128, 256, 128), (256, 128, 128), (64, 128, 128))
SEED_TACTICS = _tactics((128, 256, 128), (256, 128, 128))


def family_of(spec: GpuSpec) -> Family | None:
    """The FP4 kernel family a GPU runs, or None where it has no FP4 tensor cores (sm_90, sm_89)."""
    for family in FAMILIES.values():
        if spec.compute_capability[0] in family.majors:
            return family
    return None


def epilogue_for(family: Family, kind: str, m: int, n: int, k: int) -> Epilogue:
    """The epilogue's shared-memory sub-tiles for a CTA tile M x N x K (module docstring)."""
    if family.key == "sm_120":
        if kind == "moe":
            return Epilogue(64, 32, 3, "64x32 sub-tiles, 3 stages of bf16 C reused as D")
        return Epilogue(64, 32, 2, "64x32 sub-tiles, 2 stages of bf16 D (no C)")
    tile_m = min(m, 128)
    # FlashInfer fixes a 128x64 sub-tile for its N = 256 MoE tiles and its 128x256x256 GEMM
    fixed = n == 256 if kind == "moe" else (m, n, k) == (128, 256, 256)
    tile_n = 64 if fixed else min(n, 4096 // tile_m)
    return Epilogue(tile_m, tile_n, 2, f"{tile_m}x{tile_n} sub-tiles, 2 stages of bf16 D (no C)")


def stage_bytes(family: Family, m: int, n: int, k: int) -> int:
    """Shared memory of one mainloop stage: FP4 A and B tiles, their e4m3 scales, barriers."""
    def scale_rows(rows: int) -> int:
        return -(-rows // SF_ROW_BLOCK) * SF_ROW_BLOCK

    operands = (m + n) * k * FP4_BITS // 8
    scales = (scale_rows(m) + scale_rows(max(n, family.sfb_rows_min))) * k // SF_VECTOR
    return operands + scales + STAGE_BARRIER_BYTES


def fit(spec: GpuSpec, tactic: Tactic, kind: str) -> dict:
    """One row: the tile's stages and shared memory on `spec`, whether it fits, why in numbers."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {KINDS}")
    limit = int(spec.smem_per_block_kb * 1024)
    row = {"gpu": spec.key, "arch": spec.sm, "kind": kind, "tile": tactic.label,
           "flashinfer_tactic": f"CtaShape{tactic.m}x{tactic.n}x{tactic.k}B", "m": tactic.m,
           "n": tactic.n, "limit_kb": round(limit / 1024, 2),
           "seed": kind == "moe" and tactic in SEED_TACTICS}
    family = family_of(spec)
    if family is None:
        return {**row, "k_values": None, "listed": False, "stages": None, "smem_kb": None,
                "fits": None, "reason": f"{spec.sm} has no FP4 tensor cores: FlashInfer builds no "
                                        f"CUTLASS FP4 kernels for it"}
    k = family.k_values(tactic, kind)
    stage = stage_bytes(family, tactic.m, tactic.n, k)
    epilogue = epilogue_for(family, kind, tactic.m, tactic.n, k)
    fixed = epilogue.bytes + family.kernel_bytes[kind]
    stages = max(0, (limit - fixed) // stage)
    built = max(stages, MIN_STAGES)
    smem = built * stage + fixed
    fits = stages >= MIN_STAGES
    terms = (f"{built} stages x {stage} B + epilogue {epilogue.bytes} B ({epilogue.why}) + kernel "
             f"{family.kernel_bytes[kind]} B = {smem} B {'<=' if fits else '>'} {limit} B")
    reason = terms if fits else (f"{terms}: only {stages} stage{'s' if stages != 1 else ''} "
                                 f"fit{'s' if stages == 1 else ''}, the mainloop needs {MIN_STAGES}")
    return {**row, "k_values": k, "listed": tactic in family.listed[kind], "stages": stages,
            "stage_bytes": stage, "epilogue_bytes": epilogue.bytes,
            "kernel_bytes": family.kernel_bytes[kind], "smem_bytes": smem,
            "smem_kb": round(smem / 1024, 2), "fits": fits, "reason": reason}


def tactics_for(spec: GpuSpec, kind: str) -> tuple[Tactic, ...]:
    """FlashInfer's candidates for the GPU's family and kind, plus the tiles always shown."""
    family = family_of(spec)
    listed = family.listed[kind] if family else ()
    shown = list(listed) + [tactic for tactic in ALWAYS_SHOWN if tactic not in listed]
    return tuple(sorted(shown, key=lambda t: (t.m * t.n * t.k, t.m, t.n)))


def spec_of(name: str) -> GpuSpec:
    """A sheet entry by key ("rtx-pro-6000", "B200"); unknown names list the valid ones."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in SPECS:
        raise ValueError(f"unknown GPU {name!r}; valid: {', '.join(SPECS)}")
    return SPECS[key]


def fit_rows(gpus) -> list[dict]:
    """Every shown tile of both kinds on each GPU (keys or GpuSpecs), in table order."""
    specs = [gpu if isinstance(gpu, GpuSpec) else spec_of(gpu) for gpu in gpus]
    return [fit(spec, tactic, kind) for spec in specs for kind in KINDS
            for tactic in tactics_for(spec, kind)]


def fit_table(gpus=("b200", "rtx-pro-6000", "h200")):
    """The rows as a DataFrame, for the book."""
    import pandas as pd

    return pd.DataFrame(fit_rows(gpus))


def format_rows(rows: list[dict]) -> str:
    """Fixed-width: one line per (GPU, kind, tile)."""
    header = (f"{'gpu':<13} {'kind':<5} {'tile':<12} {'K':>4} {'listed':<6} {'stages':>6} "
              f"{'smem KB':>8} {'limit KB':>8} {'fits':<4}  reason")
    lines = [header, "-" * len(header)]
    for row in rows:
        def shown(value, fmt=""):
            return "-" if value is None else format(value, fmt)
        fits = "-" if row["fits"] is None else ("yes" if row["fits"] else "NO")
        tile = row["tile"] + ("*" if row["seed"] else "")
        lines.append(f"{row['gpu']:<13} {row['kind']:<5} {tile:<12} "
                     f"{shown(row['k_values']):>4} {'yes' if row['listed'] else 'no':<6} "
                     f"{shown(row['stages']):>6} {shown(row['smem_kb'], '.1f'):>8} "
                     f"{row['limit_kb']:>8.1f} {fits:<4}  {row['reason']}")
    lines.append("* the seed's MoE tiles (FlashInfer's SM120 MoE autotune failed on them); tile = "
                 "FlashInfer's CtaShape name, K = values per stage as built")
    return "\n".join(lines)
