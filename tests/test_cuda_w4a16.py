"""cuda-w4a16: the layout and the kernel's arithmetic on the CPU (a bit-exact model), its rules,
and on a GPU the kernel itself behind the correctness gate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fp4lab import correctness, formats
from fp4lab.backends import get
from fp4lab.backends import cuda_w4a16 as cuda
from fp4lab.backends.triton_w4a16 import kernel_scale_bytes
from fp4lab.sweep import gemm as sweep_gemm
from fp4lab.sweep.plan import GemmPoint


def kernel_bytes(w):
    return cuda.mma_layout(formats.unpack_nibbles(w.packed), kernel_scale_bytes(w), w.fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_the_kernels_arithmetic_on_the_laid_out_bytes_gives_the_weights(fmt):
    # every code value and both nibbles of every byte position occur at this size
    gen = torch.Generator().manual_seed(3)
    w = formats.quantize(torch.randn(48, 192, generator=gen) * 0.4, fmt)
    weights, scales = kernel_bytes(w)
    assert weights.shape == (3, 3, 32, 16) and weights.dtype == torch.uint8
    assert scales.shape == (3, 3, 8, cuda.SCALE_BYTES[fmt])
    model = cuda.emulate(weights, scales, fmt)                               # [N, K]
    expected = formats.dequantize(w).float()
    if w.global_scale is None:
        assert torch.equal(model, expected)
    else:   # the kernel multiplies by 2^26 / global scale: one float rounding away
        torch.testing.assert_close(model / w.global_scale.float(), expected, rtol=2**-22, atol=0)


@pytest.mark.parametrize("register, half", [(r, h) for r in range(4) for h in range(2)])
def test_layout_puts_each_lanes_fragment_in_its_word(register, half):
    # one negative code (sign and magnitude bit 0 set) at the (row, k) of lane 13's register
    # `register`, half `half` (PTX: a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8), +1 in
    # the high half): only that lane's step-0 word holds it, at MAGNITUDE_AT and SIGN_AT
    g, t = 3, 1
    codes = torch.zeros(16, 64, dtype=torch.uint8)
    codes[g + 8 * (register % 2), 2 * t + half + 8 * (register // 2)] = 0b1001
    weights, _ = cuda.mma_layout(codes, torch.zeros(16, 4, dtype=torch.uint8), "nvfp4")
    words = cuda._words(weights)                                            # [1, 1, 32, 4q]
    expected = torch.zeros_like(words)
    expected[0, 0, 4 * g + t, 0] = ((1 << cuda.MAGNITUDE_AT[register] + 16 * half)
                                     | (1 << cuda.SIGN_AT[register] + 16 * half))
    assert torch.equal(words, expected)
    bits = cuda.fragment_bits(words)[register][0, 0, 4 * g + t, 0]
    assert bits == 0x8040 << 16 * half                          # -0.5 (e2m1 001, negative)


def test_layout_refuses_scales_of_the_other_format():
    w = formats.quantize(torch.randn(16, 128), "mxfp4")
    with pytest.raises(ValueError, match="nvfp4 scale bytes"):
        cuda.mma_layout(formats.unpack_nibbles(w.packed), w.scales.view(torch.uint8), "nvfp4")


def test_configs_are_validated_and_say_what_a_point_needs():
    with pytest.raises(ValueError, match="groups must be one of"):
        cuda.CudaTileConfig(groups=3)
    with pytest.raises(ValueError, match="warps must be one of"):
        cuda.CudaTileConfig(warps=32)
    with pytest.raises(ValueError, match="depth .16. cannot exceed groups .8."):
        cuda.CudaTileConfig(groups=8, depth=16)
    config = cuda.CudaTileConfig(groups=8, warps=4)
    assert config.label() == "cuda g8 d8 w4 k1" and config.depth == 8   # every load up front
    assert cuda.CudaTileConfig(groups=32, depth=4).label() == "cuda g32 d4 w4 k1"
    assert cuda.CudaTileConfig(groups=16, depth=4, overlap="all").label() == "cuda g16 d4 w4 k1 pdl-all"
    assert config.launch == "plain" and cuda.CudaTileConfig(overlap="tail").launch == "pdl-tail"
    with pytest.raises(ValueError, match="reduce must be one of .'scalar', 'vector'., got 'v4'"):
        cuda.CudaTileConfig(reduce="v4")
    assert cuda.CudaTileConfig(groups=8, warps=16, min_ctas=2, overlap="all",
                               reduce="vector").label() == "cuda g8 d8 w16 k1 b2 v4 pdl-all"
    with pytest.raises(ValueError, match="overlap must be one of .'off', 'tail', 'all'."):
        cuda.CudaTileConfig(overlap="yes")
    with pytest.raises(ValueError, match="kwarps .4. must divide warps .2."):
        cuda.CudaTileConfig(warps=2, kwarps=4)
    # min_ctas caps registers so that many CTAs fit an SM's 64 K registers and 2048 threads
    assert config.register_cap is None
    capped = cuda.CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=3, overlap="all")
    assert capped.register_cap == 40 and capped.label() == "cuda g16 d4 w16 k1 b3 pdl-all"
    assert cuda.CudaTileConfig(warps=8, min_ctas=8).register_cap == 32
    assert cuda.CudaTileConfig(warps=4, min_ctas=1).register_cap == 255       # more than ptxas takes
    assert cuda.CudaTileConfig(warps=4, min_ctas=1).label() == "cuda g8 d8 w4 k1 b1"
    with pytest.raises(ValueError, match="min_ctas must be None or 1 to 4 for 16-warp CTAs"):
        cuda.CudaTileConfig(warps=16, min_ctas=5)
    with pytest.raises(ValueError, match="min_ctas must be None or 1 to"):
        cuda.CudaTileConfig(min_ctas=0)
    # a team of 8 warps on one row tile covers 8 x 16 groups: all of K=8192, no split-K
    team = cuda.CudaTileConfig(groups=16, depth=4, warps=8, kwarps=8)
    assert team.tiles == 1 and team.split_k == 8192 and team.grid(8192, 8192) == (512, 1, 1)
    assert config.split_k == 512 and config.splits(8192) == 16
    assert config.grid(8192, 8192) == (128, 16, 1)
    assert config.reason(16, 8192, 8192) is None
    assert "multiple of 64 (16 rows x 4 tiles)" in config.reason(1, 8208, 8192)
    assert "multiple of 512 (64 x 8 groups x 1 warps)" in config.reason(1, 8192, 8448)
    # staged activations: M rows of the CTA's k, 16 padding bytes a row, and the teams' partial
    # tiles, under what a CTA may opt in to (over 48 KB the backend sets the attribute)
    wide = cuda.CudaTileConfig(groups=32, depth=4)
    assert wide.shared_bytes(16) == 16 * (2 * 2048 + 16) > cuda.SHARED_DEFAULT
    assert wide.reason(16, 8192, 8192) is None
    assert team.static_shared_bytes(16) == 4 * (7 * 2 * 4 * 32 + 1) + 4
    assert "need 269576 bytes of shared memory, over the 232448 a CTA may have" in \
        team.reason(16, 8192, 8192)
    assert team.reason(1, 8192, 8192) is None


def test_up_to_eight_activation_tiles_and_static_shared_memory():
    # n8 tiles of activation rows: the fewest that cover M
    assert [cuda.n_tiles(m) for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    # the teams' partial tiles are static shared memory: at most 48 KB (4 teams of 4 warps at M=64
    # hold 3 x 4 x 8 n8 tiles x 512 bytes)
    teams = cuda.CudaTileConfig(groups=8, depth=4, warps=16, kwarps=4, min_ctas=1)
    assert teams.static_shared_bytes(64) == 4 * (4 * 3 * 8 * 4 * 32 + 1) + 4
    assert "static shared memory, over the 49152 a kernel may declare" in teams.reason(64, 6144, 2048)
    assert teams.reason(32, 6144, 2048) is None
    # staged activations grow with M: 64 rows of 512 k and the padding
    assert cuda.CudaTileConfig(groups=8, warps=8).shared_bytes(64) == 64 * (2 * 512 + 16)


def test_the_split_k_workspace_holds_every_lanes_sums_in_fragment_order_over_m_8():
    """A "vector" build at M > 8 adds a lane's four sums of an n8 tile with one 16-byte reduction
    at ((row tile * NTILES + n8 tile) * 32 + lane) * 4: the workspace holds every tile's 8 rows,
    those past M too; at M <= 8, and in a "scalar" build, it is the output's M x N."""
    vector, scalar = cuda.CudaTileConfig(reduce="vector"), cuda.CudaTileConfig()
    assert [cuda.workspace_floats(vector, m, 4096) for m in (1, 8)] == [4096, 8 * 4096]
    for m in (9, 16, 17, 33, 64):
        tiles = cuda.n_tiles(m)
        last_lane_of_last_tile = ((4096 // 16 - 1) * tiles + tiles - 1) * 32 + 31
        assert cuda.workspace_floats(vector, m, 4096) == (last_lane_of_last_tile + 1) * 4 >= m * 4096
        assert cuda.workspace_floats(scalar, m, 4096) == m * 4096


def test_cluster_configs_are_validated_and_size_their_shared_partials():
    clustered = cuda.CudaTileConfig(groups=16, depth=4, warps=16, min_ctas=2, overlap="tail", cluster=8)
    assert clustered.label() == "cuda g16 d4 w16 k1 b2 c8 pdl-tail"
    assert clustered.reason(16, 8192, 8192) is None              # 8 splits: one cluster a column
    assert "gives 6 splits of 1024, which clusters of 8 CTAs cannot divide" in \
        clustered.reason(16, 4096, 6144)
    # the partial tiles (16 tiles x 32 lanes x 4 floats x n8 tiles) reuse the activations' space
    assert clustered.shared_bytes(16) == 16 * (2 * 1024 + 16)    # activations are larger
    assert clustered.shared_bytes(1) == 4 * 16 * 1 * 4 * 32      # the partials are larger
    assert cuda.CudaTileConfig(groups=16, depth=4, warps=16).shared_bytes(1) == 2 * 1024 + 16
    for bad in (0, 17, 2.0, True):
        with pytest.raises(ValueError, match="cluster must be an int from 1 to 16"):
            cuda.CudaTileConfig(cluster=bad)


def test_the_preset_rule_is_the_probes_winners_and_fits_any_point():
    # calls 57, 60, 64 and 73's fastest builds on the issue's three shapes (benchmarks/NOTES.md)
    team, short_m16, full_early, small_team, full_tail, narrow = (
        cuda.PRESETS[i].config for i in (0, 2, 3, 4, 6, 7))
    short_clustered, small_clustered = cuda.PRESETS[1], cuda.PRESETS[5]
    # call 73: teams of 4 warps, 4 tiles a CTA, all of K=2048 (no split-K), at every M; "all"
    for m in (1, 4, 16):
        assert cuda.choose_config(m, 6144, 2048) == team
    assert team.overlap == "all" and team.tiles == 4
    assert team.grid(6144, 2048) == (96, 1, 1) and team.min_ctas == 1     # no split-K, more registers
    assert team.shared_bytes(16) > cuda.SHARED_DEFAULT                    # M = 16: the opt-in
    # call 64: below K = 2048, 16 tiles a CTA, the splits of a column in one cluster (K = 1024: 2)
    assert short_clustered.clustered and cuda.choose_config(16, 6144, 1024) == \
        dataclasses.replace(short_m16, cluster=2)
    assert cuda.choose_config(1, 8192, 8192) == cuda.choose_config(4, 8192, 8192)
    assert cuda.choose_config(1, 8192, 8192) == full_early
    assert full_early.overlap == "all" and full_early.grid(8192, 8192) == (32, 8, 1)
    assert full_early.register_cap == 64                      # two 16-warp CTAs an SM
    assert cuda.choose_config(16, 8192, 8192) == full_tail and full_tail.overlap == "tail"
    # 16 k-groups a warp give 4096x6144 only 96 CTAs, under the H200's 132 SMs: at M <= 8 a
    # 8-warp CTAs of two 4-warp teams at M = 1 (384 CTAs of 2048 k), at M <= 8 a cluster of its 6
    # splits (call 64), at M = 16 8 k-groups (192 CTAs)
    assert full_early.grid(4096, 6144) == (16, 6, 1)
    assert cuda.choose_config(1, 4096, 6144) == small_team
    assert small_team.label() == "cuda g8 d4 w8 k4 b1 pdl-all"
    assert small_team.grid(4096, 6144) == (128, 3, 1)
    assert cuda.choose_config(4, 4096, 6144) == cuda.choose_config(8, 4096, 6144) == \
        dataclasses.replace(small_clustered.config, cluster=6)
    # over M = 8 with at most 16 CTA columns, the split-K's vector reduction (call 132): 4096x6144
    # (16 columns), not 8192x4096 (32) nor the g16 build's 8192x8192; at M <= 8 it is one code
    assert narrow.reduce == "scalar" and cuda.PRESETS[7].vector_columns == 16
    assert cuda.choose_config(16, 4096, 6144) == cuda.choose_config(12, 4096, 6144) == \
        dataclasses.replace(narrow, reduce="vector")
    assert cuda.choose_config(16, 8192, 4096) == narrow and narrow.grid(8192, 4096)[0] == 32
    assert cuda.choose_config(16, 8192, 8192).reduce == "scalar"
    assert cuda.PRESETS[7].build(6144, 4096, m=8) == narrow
    assert narrow.grid(4096, 6144) == (16, 12, 1)
    # on a GPU with fewer SMs the same grid counts as full: no cluster
    assert cuda.choose_config(1, 4096, 6144, sms=78) == full_early
    # a cluster needs 2 to 16 splits: K = 512 has 1, so short K falls back to the plain build
    assert cuda.choose_config(16, 8192, 512) == short_m16
    assert cuda.choose_config(16, 256, 1024).cluster == 2
    # over M = 16 (calls 75-78, measured at M = 64): 8-warp CTAs of 8 k-groups, two an SM; at
    # K = 2048 teams of 2 warps with both splits in one cluster (6144x2048: 96 CTAs)
    wide, capped, wide_short = cuda.PRESETS[-1], cuda.PRESETS[-2], cuda.PRESETS[-3]
    for m in (17, 24, 25, 32, 33, 64):
        # the vector reduction up to 64 CTA columns (8192x8192's) where a lane holds four n8 tiles
        # or more: at M = 25-32 in the build capped for three CTAs an SM (calls 138-139; M = 17-24
        # take the cap with the scalar reduction), over M = 32 two an SM (call 133)
        preset = capped if m <= 32 else wide
        assert cuda.choose_config(m, 8192, 8192) == cuda.choose_config(m, 4096, 6144) == \
            dataclasses.replace(preset.config, reduce="vector" if m > 24 else "scalar")
        assert cuda.choose_config(m, 16384, 8192) == preset.config                # 128 columns
        assert cuda.choose_config(m, 6144, 2048) == dataclasses.replace(wide_short.config, cluster=2)
    assert wide.config.label() == "cuda g8 d4 w8 k1 b2 pdl-all" and wide_short.clustered
    assert capped.config.label() == "cuda g8 d4 w8 k1 b3 pdl-all" and capped.config.register_cap == 80
    assert wide_short.config.label() == "cuda g8 d4 w16 k2 b1 pdl-tail"
    for m, n, k in ((1, 48, 128), (4, 112, 64 * 7), (16, 16, 64), (1, 256, 64 * 17 * 16),
                    (64, 16, 64), (40, 128, 2048), (64, 8192, 512)):
        config = cuda.choose_config(m, n, k)
        assert config.reason(m, n, k) is None, (m, n, k, config)


def test_backend_refuses_points_it_does_not_take_before_any_work():
    backend = get("cuda-w4a16")
    assert backend.point_reason(65, 8192, 8192) == "a decode kernel: M <= 64, got M=65"
    assert backend.point_reason(64, 8192, 8192) is None
    assert "multiple of 16" in backend.point_reason(1, 8200, 8192)
    assert backend.point_reason(16, 4096, 6144) is None
    w = formats.quantize(torch.randn(64, 256), "nvfp4")
    with pytest.raises(ValueError, match="M <= 64"):
        backend.prepare(torch.randn(65, 256).bfloat16(), w, "cpu")
    with pytest.raises(ValueError, match="CUDA GPU"):
        backend.prepare(torch.randn(1, 256).bfloat16(), w, "cpu")


def test_sweep_records_a_shape_a_backend_does_not_take_as_unavailable(monkeypatch):
    backend = get("cuda-w4a16")
    monkeypatch.setattr(type(backend), "availability",
                        lambda self, device, import_check=True: (True, self.what))
    reason = sweep_gemm._static_reason(backend, GemmPoint("cuda-w4a16", "nvfp4", 8192, 8192, 256),
                                       "cuda")
    assert reason == "a decode kernel: M <= 64, got M=256"
    assert sweep_gemm._static_reason(backend, GemmPoint("cuda-w4a16", "nvfp4", 8192, 8192, 16),
                                     "cuda") is None


def test_the_kernel_source_declares_what_the_layout_writes():
    source = cuda.KERNEL_SOURCE.read_text()
    assert f"fp4_decode_gemm(" in source and cuda.KERNEL_NAME == "fp4_decode_gemm"
    assert "decode_scaled(x, scales[j], q, a0, a1, a2, a3);" in source
    # the decode the model applies (fragment_bits) is the kernel's, in the code the kernels share
    common = cuda.COMMON_SOURCE.read_text()
    assert cuda.kernel_source(cuda.KERNEL_SOURCE).startswith(common)
    for decode in ("a0 = ((x & 0x40074007u) * 0x42u) & 0x81C081C0u", "a1 = (x << 3) & 0x81C081C0u",
                   "a2 = x & 0x81C081C0u", "a3 = (((x >> 3) & 0x05C005C0u) * 0x21u) & 0x81C081C0u"):
        assert decode in common


def test_the_kernel_reads_only_weights_before_it_waits_for_the_previous_kernel():
    # PDL: what another kernel may have written (activations, workspace, counters, output) is
    # read after griddepcontrol.wait; only the first DEPTH groups' codes and scales come before
    source = cuda.KERNEL_SOURCE.read_text()
    body = source[source.index("fp4_decode_gemm("):]
    before_wait = body[:body.index("    wait_for_previous_kernel();")]
    assert "ISSUE(j)" in before_wait
    for later in ("copy_async(act_base", "atomicAdd", "arrive(", "*unbias", "out_tile["):
        assert later not in before_wait, later
    assert body.count("let_next_kernel_launch();") == 2     # at the start (all) or after the math


def test_the_kernel_source_ships_with_the_package():
    import fnmatch
    import tomllib
    from pathlib import Path

    import fp4lab

    pyproject = Path(fp4lab.__file__).parents[2] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["fp4lab"]
    for path in (cuda.KERNEL_SOURCE, cuda.COMMON_SOURCE):
        source = path.relative_to(Path(fp4lab.__file__).parent).as_posix()
        assert any(fnmatch.fnmatch(source, pattern) for pattern in patterns), (source, patterns)


# --- on a GPU: the kernel itself, gated ----------------------------------------------------------

def assert_same_within_atomics_order(out, expected):
    """Equal but for the order of split-K's float atomic adds: one bf16 rounding apart."""
    torch.testing.assert_close(out.float(), expected.float(), rtol=2 ** -7, atol=2 ** -14)


GPU_CONFIGS = [cuda.CudaTileConfig(groups=2, warps=2), cuda.CudaTileConfig(groups=4, warps=4),
               cuda.CudaTileConfig(groups=16, warps=8, depth=4), cuda.CudaTileConfig(groups=1, warps=1),
               cuda.CudaTileConfig(groups=8, warps=4, depth=2),
               cuda.CudaTileConfig(groups=2, warps=8, depth=1, kwarps=8),      # one CTA: all of K
               cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2),      # teams and split-K
               cuda.CudaTileConfig(groups=4, warps=16, depth=2, kwarps=2),
               cuda.CudaTileConfig(groups=4, warps=4, overlap="tail"),
               cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2, overlap="all"),
               cuda.CudaTileConfig(groups=8, warps=8, depth=4, min_ctas=8, overlap="all"),   # 32 registers
               # split-K in a thread-block cluster: the cluster covers K (8 splits); clusters and
               # the workspace (8 splits, 2 a cluster); with teams; 16 CTAs (non-portable) and PDL
               cuda.CudaTileConfig(groups=2, warps=2, cluster=8),
               cuda.CudaTileConfig(groups=2, warps=4, depth=1, cluster=2),
               cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2, cluster=4, overlap="tail"),
               cuda.CudaTileConfig(groups=1, warps=1, cluster=16, overlap="all"),
               # the vector reduction: across CTAs (with teams), from clusters into the workspace
               cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2, reduce="vector"),
               cuda.CudaTileConfig(groups=4, warps=4, overlap="tail", reduce="vector"),
               cuda.CudaTileConfig(groups=2, warps=4, depth=1, cluster=2, reduce="vector")]


def seeded_operands(fmt: str, m: int, n: int, k: int):
    """Activations [M, K] bf16 and FP4 weights [N, K] of unit-scale products, seeded by M."""
    gen = torch.Generator().manual_seed(m)
    w = formats.quantize(torch.randn(n, k, generator=gen) * k ** -0.5, fmt)
    return torch.randn(m, k, generator=gen).bfloat16(), w


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.label())
def test_kernel_passes_the_gate(fmt, m, config):
    assert_gate_and_repeat(fmt, m, config)


def assert_gate_and_repeat(fmt: str, m: int, config) -> None:
    """The build passes the gate at M x 128 x 1024 within its register cap, and a second call
    gives the same out: the split-K workspace and counters were reset by the first (else a repeat
    adds to them); float atomics add in any order, so it may round differently by one bf16 ulp."""
    a, w = seeded_operands(fmt, m, 128, 1024)
    prepared = get("cuda-w4a16").prepare(a, w, "cuda", config=config)
    gate = correctness.check_backend(prepared, correctness.TOLERANCE[fmt])
    assert gate.ok, gate.message
    assert 0 < prepared.info["registers"] <= (config.register_cap or cuda.MAX_REGISTERS)
    first = prepared.out.clone()
    assert_same_within_atomics_order(prepared.call(), first)


# builds over M = 16: split-K, PDL, teams (one over 48 KB of static and dynamic shared memory at
# M = 17, the opt-in's case: call 75), one CTA covering K, a cluster
WIDE_CONFIGS = [cuda.CudaTileConfig(groups=4, warps=4),
                cuda.CudaTileConfig(groups=4, warps=4, depth=2, overlap="tail"),
                cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2),
                cuda.CudaTileConfig(groups=2, warps=8, depth=1, kwarps=8),
                cuda.CudaTileConfig(groups=2, warps=4, depth=1, cluster=2),
                cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2, cluster=4, overlap="all"),
                cuda.CudaTileConfig(groups=4, warps=4, depth=2, overlap="tail", reduce="vector"),
                cuda.CudaTileConfig(groups=2, warps=4, depth=1, cluster=2, reduce="vector"),
                # the M = 17-32 preset's shape: 8 warps under the register cap of three CTAs an SM
                cuda.CudaTileConfig(groups=2, warps=8, depth=2, min_ctas=3, reduce="vector")]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [17, 24, 33, 64])
@pytest.mark.parametrize("config", WIDE_CONFIGS, ids=lambda c: c.label())
def test_up_to_64_rows_pass_the_gate(fmt, m, config):
    assert_gate_and_repeat(fmt, m, config)


@pytest.mark.cuda
@pytest.mark.parametrize("overlap", ["off", "tail"])
def test_a_build_over_48_kb_of_shared_memory_opts_in_and_passes_the_gate(overlap):
    # 16 rows of 2048 k staged (a team of 2 warps a tile): 65.8 KB, the opt-in attribute's case
    a, w = seeded_operands("nvfp4", 16, 128, 4096)
    config = cuda.CudaTileConfig(groups=16, warps=16, depth=4, kwarps=2, overlap=overlap)
    assert config.shared_bytes(16) > cuda.SHARED_DEFAULT
    prepared = get("cuda-w4a16").prepare(a, w, "cuda", config=config)
    gate = correctness.check_backend(prepared, correctness.TOLERANCE["nvfp4"])
    assert gate.ok, gate.message
    assert prepared.info["shared_bytes"] == config.shared_bytes(16)
    assert 1 <= prepared.info["ctas_per_sm"] <= 3     # 3 x 66 KB of the H200's 228 KB an SM


@pytest.mark.cuda
def test_kernel_replays_in_a_cuda_graph():
    w = formats.quantize(torch.randn(256, 2048) * 2048 ** -0.5, "nvfp4")
    a = torch.randn(4, 2048).bfloat16()
    prepared = get("cuda-w4a16").prepare(a, w, "cuda", config=cuda.CudaTileConfig(groups=4, warps=4))
    eager = prepared.call().clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        prepared.call()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            prepared.call()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert_same_within_atomics_order(prepared.out, eager)


@pytest.mark.cuda
@pytest.mark.parametrize("overlap", ["tail", "all"])
def test_dependent_launches_read_what_the_kernel_before_them_wrote(overlap):
    # a chain x0 -> x1 -> ... where each call's activations are the previous call's output and all
    # share one split-K workspace: launched back to back with PDL, eagerly and from a graph, a
    # call that read before the previous one finished would see NaN (the outputs start as NaN)
    # or the previous call's half-added sums. Each link is checked against one call alone on the
    # chain's own input (a whole chain run one call at a time drifts from it by the atomics' order,
    # amplified over the links: 18 of 4096 elements past the tolerance once, call 56)
    n = k = 1024
    steps = 6
    w = formats.quantize(torch.randn(n, k) * k ** -0.5, "nvfp4")
    a = torch.randn(4, k).bfloat16()
    config = cuda.CudaTileConfig(groups=4, warps=4, overlap=overlap)       # 4 splits: split-K
    prepared = get("cuda-w4a16").prepare(a, w, "cuda", config=config)
    x0, weights, scales, unbias = prepared.args

    def check_links(xs):
        for x, got in zip(xs, xs[1:]):
            alone = prepared.make_call((x, weights, scales, unbias), torch.empty_like(x))().clone()
            torch.cuda.synchronize()                 # one call at a time: nothing to overlap
            assert not got.isnan().any()
            assert_same_within_atomics_order(got, alone)

    xs = [x0] + [torch.full_like(x0, float("nan")) for _ in range(steps)]
    calls = [prepared.make_call((xs[i], weights, scales, unbias), xs[i + 1]) for i in range(steps)]
    for call in calls:                           # back to back, eagerly
        call()
    torch.cuda.synchronize()
    check_links(xs)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for call in calls:
                call()
    for x in xs[1:]:
        x.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_links(xs)


ANATOMY_CONFIGS = [cuda.CudaTileConfig(groups=2, warps=4, depth=1),                  # split-K
                   cuda.CudaTileConfig(groups=2, warps=8, depth=2, kwarps=2),        # teams
                   cuda.CudaTileConfig(groups=16, warps=8, depth=4, min_ctas=2, overlap="all"),
                   cuda.CudaTileConfig(groups=2, warps=4, depth=2, cluster=4),       # a cluster
                   cuda.CudaTileConfig(groups=2, warps=8, depth=2, min_ctas=2)]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("config", ANATOMY_CONFIGS, ids=lambda c: c.label())
def test_every_anatomy_stage_passes_its_own_check(fmt, m, config):
    a, w = seeded_operands(fmt, m, 256, 2048)
    variants = cuda.anatomy_variants(a, w, "cuda", config=config)
    assert [v.stage for v in variants] == ["load", "decode", "mma", "full"]
    for variant in variants:
        gate = variant.check()
        assert gate.ok, (variant.stage, gate.message)
        assert variant.prepared.info["stage"] == variant.stage


@pytest.mark.cuda
def test_the_sweep_times_every_stage_of_the_kernel_on_a_gpu(tmp_path):
    """The GEMM sweep's anatomy points of cuda-w4a16 (its worker, the preset config): every stage
    passes its check and is timed, beside the Triton kernel's; chapter 01's table reads both."""
    from fp4lab.analysis import gemm as analysis
    from fp4lab.results import RunDir
    from fp4lab.sweep import GemmSweep

    config = GemmSweep.from_profile("smoke", "cuda", backends=["cuda-w4a16", "triton-w4a16"], fmts=["nvfp4"],
                                    m_values=[1], shapes=[[512, 2048]], anatomy_m=[1, 16],
                                    timer={"repeats": 3, "warmup_s": 0.0, "cold_l2": False, "use_graph": True})
    run = RunDir.create(tmp_path, run_id="anatomy")
    sweep_gemm.run_sweep(config, run, progress=False)
    rows = run.read_table("anatomy")
    cuda_rows = rows[rows["backend"] == "cuda-w4a16"]
    assert sorted(cuda_rows["stage"]) == sorted(2 * ["load", "decode", "mma", "full"])
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["backend", "stage", "error"]]
    assert (cuda_rows["median_us"] > 0).all() and cuda_rows["config"].str.startswith("cuda ").all()
    table = analysis.anatomy(analysis.gemm_results(run))
    assert set(table["backend"]) == {"cuda-w4a16", "triton-w4a16"} and table["stream"].notna().all()


def test_the_anatomy_sums_are_per_warp_in_the_kernels_order():
    # two row tiles, four k-groups; warps of 1 group, teams of 2 warps: 2 splits x 2 tiles x 2
    # slices. A code word of 1 in one (tile, group) shows which warp's sum holds it
    config = cuda.CudaTileConfig(groups=1, warps=4, kwarps=2)        # 2 tiles a CTA, 2 slices
    weights = torch.zeros(2, 4, 32, 16, dtype=torch.uint8)
    scales = torch.zeros(2, 4, 8, 8, dtype=torch.uint8)
    weights[1, 3, 5, 0] = 1                                           # tile 1, group 3, lane 5
    scales[0, 2, 0, 4] = 2                                            # tile 0, group 2: word 1
    sums = cuda.expected_sums(weights, scales, "nvfp4", "load", config)
    # group 3 = split 1, slice 1; tile 1 = team 1 of column 0 -> warp (1 * 1 + 0) * 4 + 1 * 2 + 1
    # group 2 = split 1, slice 0; tile 0 = team 0 -> warp 4; the 4 lanes t read the scale: 4 x 2
    expected = torch.zeros(8, dtype=torch.int32)
    expected[7], expected[4] = 1, 8
    assert torch.equal(sums, expected)
    decoded = cuda.expected_sums(weights, scales, "nvfp4", "decode", config)
    assert decoded.shape == (8,) and decoded.dtype == torch.int32

