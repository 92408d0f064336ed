"""cuda-w4a16-moe: the config, the presets against the models' shapes, and the weights' layout on
the CPU (decoded back with `cuda_w4a16.emulate`, the bit-exact model of the kernel's arithmetic);
on a GPU the kernel itself, gated against the float64 layer over every build knob, in a CUDA graph
and with dependent launches."""

import pytest
import torch

from fp4lab.backends import moe
from fp4lab.backends.cuda_w4a16 import WEIGHT_BIAS, emulate
from fp4lab.backends.moe import base
from fp4lab.backends.moe.cuda_fused import (
    ACTIVATION_BYTES_LIMIT, KERNEL_SOURCE, MOE_PRESETS, CudaMoeConfig, CudaW4A16Moe,
    activation_bytes_reason, build, choose_moe_config, expert_operands, interleave_gate_up, wgmma_source, width_source,
)
from fp4lab.formats import dequantize
from fp4lab.moe import presets as model_presets
from test_triton_moe import skewed_ids


def test_registered_as_a_layer_method_that_needs_a_gpu():
    method = moe.get("cuda-w4a16-moe")
    assert isinstance(method, CudaW4A16Moe) and "cuda-w4a16-moe" in moe.names("layer")
    assert method.formats == ("nvfp4", "mxfp4") and method.weight_dtype == "fp4"
    available, reason = method.availability("cpu")
    assert not available and "GPU" in reason


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_prepare_on_the_cpu_says_why_before_any_work(fmt):
    """The preset (the problem's format's), the shapes and the arguments are checked first, so a
    bad request is the same ValueError on the CPU as on a GPU."""
    problem = base.make_layer_problem(skewed_ids(8, 8, 2, busy=1), 8, 512, 512, fmt, "cpu")
    with pytest.raises(moe.MethodUnavailable, match="only on a CUDA GPU"):
        moe.get("cuda-w4a16-moe").prepare(problem)
    with pytest.raises(ValueError, match="K=512 is not whole chunks of 1024 k"):
        moe.get("cuda-w4a16-moe").prepare(problem, config=CudaMoeConfig(chunk=16))
    with pytest.raises(ValueError, match="until must be one of"):
        moe.get("cuda-w4a16-moe").prepare(problem, until="everything")
    with pytest.raises(ValueError, match="stage must be one of"):
        moe.get("cuda-w4a16-moe").prepare(problem, stage="epilogue")


def test_activations_past_32_bit_row_offsets_are_refused_by_name():
    """The kernel finds an item's rows by 32-bit byte offsets: GLM-5's largest batches fit, a
    layer whose x or intermediate would not is refused, naming which."""
    glm = model_presets.get("glm-5")
    assert activation_bytes_reason(16384, 8, glm.hidden, glm.moe_intermediate) is None
    tokens = ACTIVATION_BYTES_LIMIT // (2 * glm.hidden) + 1
    assert "x [" in activation_bytes_reason(tokens, 1, glm.hidden, 16)
    assert "the intermediate [" in activation_bytes_reason(tokens // 8, 16, 16, glm.hidden)


@pytest.mark.parametrize("field,value", [("warps", 1), ("warps", 32), ("ntiles", 1),
                                         ("chunk", 3), ("depth", 16), ("min_ctas", 0),
                                         ("row_tiles", 4), ("row_tiles", True),
                                         ("overlap", "both"), ("ntiles", True), ("mma", "wgmma"),
                                         ("weights", "smem")])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"CudaMoeConfig.{field}"):
        CudaMoeConfig(**{field: value})


def test_depth_must_divide_the_chunk():
    with pytest.raises(ValueError, match="must divide chunk"):
        CudaMoeConfig(chunk=2, depth=4)


def test_config_sizes_and_reasons():
    config = CudaMoeConfig(warps=16, ntiles=4, chunk=8, depth=4, min_ctas=2, overlap="all")
    assert config.rows == 32 and config.threads == 512 and config.register_cap == 64
    assert config.shared_bytes == 2 * 32 * (2 * 512 + 16)
    assert config.label() == "cuda w16 m32 c8 d4 b2 pdl-all"
    assert config.reason(4096, 6144, "gate_up") is None
    assert "not whole CTAs of 16 row tiles (256 rows)" in config.reason(4096 + 16, 6144, "gate_up")
    assert "K=2080 is not whole chunks of 512 k" in config.reason(6144, 2080, "down")
    assert "shared memory" in CudaMoeConfig(ntiles=8, chunk=16, depth=4).reason(4096, 8192, "x")
    paired = CudaMoeConfig(warps=8, row_tiles=2, depth=2)
    assert paired.label() == "cuda w8 r2 m32 c8 d2 b2 pdl-all" and paired.cta_rows == 256
    assert "not whole CTAs of 16 row tiles (256 rows)" in paired.reason(4096 + 128, 6144, "gate_up")


def test_the_async_build_multiplies_by_whole_warpgroups():
    config = CudaMoeConfig(warps=8, mma="async")
    assert config.label() == "cuda w8 wg m32 c8 d4 b2 pdl-all"
    assert config.shared_bytes == CudaMoeConfig(warps=8).shared_bytes    # its core matrices fit
    with pytest.raises(ValueError, match="warps=2 is not whole warpgroups"):
        CudaMoeConfig(warps=2, mma="async")
    assert CudaMoeConfig(warps=8, mma="async", mma_depth=2).label() == "cuda w8 wg2 m32 c8 d4 b2 pdl-all"
    with pytest.raises(ValueError, match="only the async build keeps MMAs in flight"):
        CudaMoeConfig(mma_depth=2)
    with pytest.raises(ValueError, match=r"mma_depth must be one of \(1, 2, 3\), got 4"):
        CudaMoeConfig(mma="async", mma_depth=4)


def test_the_shared_weight_ring_is_sized_a_warp_a_k_group_a_row_tile():
    ring = CudaMoeConfig(warps=16, chunk=8, depth=8, weights="shared")
    staged = 2 * 32 * (2 * 512 + 16)
    assert ring.shared_bytes == staged + 16 * 8 * (512 + 64)
    assert ring.label() == "cuda w16 m32 c8 d8 smem b2 pdl-all"
    assert ring.reason(4096, 6144, "gate_up") is None            # one CTA an SM, not two
    paired = CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=4, weights="shared")
    assert paired.shared_bytes == 2 * 32 * (2 * 256 + 16) + 8 * 4 * 2 * (512 + 64)
    wide = dict(warps=16, row_tiles=2, ntiles=8, chunk=8, depth=8)
    assert CudaMoeConfig(**wide).reason(4096, 8192, "x") is None
    assert "shared memory" in CudaMoeConfig(**wide, weights="shared").reason(4096, 8192, "x")


def test_three_staged_buffers_take_a_third_more_staging_and_build_with_one_barrier_a_chunk():
    two = CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=2, weights="shared", min_ctas=3)
    three = CudaMoeConfig(warps=8, row_tiles=2, chunk=4, depth=2, weights="shared", min_ctas=3,
                          buffers=3)
    staged = 32 * (2 * 256 + 16)
    assert three.shared_bytes - two.shared_bytes == staged
    assert 3 * three.shared_bytes < 228 * 1024                  # still three CTAs an SM
    assert three.label() == "cuda w8 r2 m32 c4x3 d2 smem b3 pdl-all"
    assert two.label() == "cuda w8 r2 m32 c4 d2 smem b3 pdl-all"
    assert "-DBUFFERS=3" in build(three, "nvfp4", gate_up=True)[1]
    assert "-DBUFFERS=2" in build(two, "mxfp4", gate_up=False)[1]
    with pytest.raises(ValueError, match="buffers must be one of"):
        CudaMoeConfig(buffers=4)
    source, _ = build(three, "nvfp4", gate_up=True)
    assert "#if BUFFERS == 2\n            __syncthreads();" in source


@pytest.mark.parametrize("ntiles", [2, 4, 8])
def test_the_generated_wgmma_code_has_one_step_a_width(ntiles):
    """One wgmma_step overload a width: m64nNk16 with N/2 accumulators, the four A registers
    after them, then the descriptor and the scale-d predicate; nothing past the build's n8 tiles."""
    source = wgmma_source(ntiles)
    assert source.count("void wgmma_step(Width<") == ntiles
    assert f"Width<{ntiles + 1}>" not in source and "int n8, float" not in source
    for n8 in range(1, ntiles + 1):
        regs = 4 * n8
        start = source.index(f"void wgmma_step(Width<{n8}>")
        step = source[start:source.index("\n}\n", start)]
        assert f"m64n{8 * n8}k16.f32.bf16.bf16 {{%0, " in step and f"%{regs - 1}}}, " in step
        assert f"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, 0;" in step
        assert f"setp.ne.b32 p, %{regs + 5}, 0;" in step and step.count('"+f"') == regs
        assert f'"+f"(d[{n8 - 1}][3])' in step


@pytest.mark.parametrize("ntiles", [2, 4, 8])
def test_the_width_dispatch_calls_the_k_loop_once_with_each_width_as_a_type(ntiles):
    """`with_width` has one case a width 1..ntiles, each calling the k loop with Width<n8>: the
    loop is compiled once a width (a width chosen inside it closed a wait group at every async
    step, call 100; in the sync build a compare, a branch and a NOP around every pair of MMAs)."""
    source = width_source(ntiles)
    assert source.index("struct Width") < source.index("void with_width(")
    dispatch = source[source.index("void with_width("):]
    assert dispatch.count("case ") == ntiles and "wgmma" not in source
    for n8 in range(1, ntiles + 1):
        assert f"case {n8}: f(Width<{n8}>{{}}); break;" in dispatch


def test_every_build_dispatches_on_the_width_and_only_the_async_build_carries_wgmma():
    from fp4lab.backends.cuda_w4a16 import COMMON_SOURCE

    sync_source, _ = build(CudaMoeConfig(), "nvfp4", gate_up=True)
    async_source, options = build(CudaMoeConfig(mma="async"), "nvfp4", gate_up=True)
    assert "-DMMA_ASYNC=1" in options
    for source in (sync_source, async_source):
        assert source.startswith(COMMON_SOURCE.read_text())
        assert source.endswith(KERNEL_SOURCE.read_text())
        assert width_source(4) in source
        assert source.index("void with_width(") < source.index("with_width(active_n8, k_loop)")
    assert "wgmma_step(" not in sync_source.replace(KERNEL_SOURCE.read_text(), "")
    steps = wgmma_source(4)
    assert async_source.index(steps) > async_source.index("to_bf16")          # after the shared code
    assert async_source.index(steps) < async_source.index("multiply_async(")  # before its caller


@pytest.mark.parametrize("model", ["glm-5", "deepseek-v3"])
def test_every_preset_runs_both_launches_of_the_models(model):
    preset = model_presets.get(model)
    for _, config in (entry for presets in MOE_PRESETS.values() for entry in presets):
        assert config.reason(2 * preset.moe_intermediate, preset.hidden, "gate_up") is None
        assert config.reason(preset.hidden, preset.moe_intermediate, "down") is None


def test_the_compute_stage_is_refused_where_ptxas_would_serialize_the_wgmma():
    """An async build with its weights in registers has no compute stage (its wgmma serialize
    there, NVRTC 13.0's C7512): prepare says so before building anything; every other build and
    stage has one."""
    registers = CudaMoeConfig(chunk=4, depth=2, mma="async")
    ring = CudaMoeConfig(warps=8, row_tiles=2, depth=4, weights="shared", mma="async")
    assert "serializes its wgmma" in registers.stage_reason("compute")
    assert all(registers.stage_reason(s) is None for s in ("full", "load", "decode", "mma"))
    assert ring.stage_reason("compute") is None and CudaMoeConfig(depth=2).stage_reason("compute") is None
    problem = base.make_layer_problem(skewed_ids(24, 8, 2, busy=0), 8, 512, 256, "mxfp4", "cpu")
    with pytest.raises(ValueError, match="serializes its wgmma"):
        moe.get("cuda-w4a16-moe").prepare(problem, config=registers, stage="compute")


@pytest.mark.parametrize("batch,rows,weights,ctas", [(64, 16, "registers", 2),
                                                     (512, 32, "shared", 3),
                                                     (1024, 32, "shared", 3),
                                                     (2048, 64, "shared", 2)])
def test_presets_by_mean_pairs_per_expert(batch, rows, weights, ctas):
    """Few pairs: 2 k-groups in flight in registers (4 spill at the 64-register cap); up to 32
    pairs an expert: two row tiles a warp (half the ldmatrix bytes) with the ring in shared memory,
    three CTAs an SM (more warps to hide the math's latency); more: 64-pair items (each expert's
    weights read and decoded once for 64 pairs), two CTAs an SM. Each preset's CTAs fit an SM's
    registers (the cap ptxas builds to) and its 228 KB of shared memory (1 KB a CTA reserved)."""
    for fmt in ("nvfp4", "mxfp4"):
        config = choose_moe_config(batch * 8, 256, fmt)
        assert (config.rows, config.weights, config.min_ctas) == (rows, weights, ctas)
        assert config.row_tiles == (1 if weights == "registers" else 2)
        assert config.overlap == "all" and config.depth == 2
        assert config.register_cap == {(16, 2): 64, (8, 2): 128, (8, 3): 80}[config.warps, ctas]
        assert ctas * (config.shared_bytes + 1024) <= 228 * 1024
    with pytest.raises(ValueError, match="presets for \\['mxfp4', 'nvfp4'\\], not 'int4'"):
        choose_moe_config(512 * 8, 256, "int4")


def test_interleave_puts_gate_rows_over_up_rows_in_each_row_tile():
    inter = 32
    rows = torch.arange(2 * inter)[:, None]                          # [2I, 1]: each row its index
    tiled = interleave_gate_up(rows).reshape(-1, 16)                  # [2I/16 tiles, 16]
    for r, tile in enumerate(tiled.tolist()):
        assert tile == [*range(8 * r, 8 * r + 8), *range(inter + 8 * r, inter + 8 * r + 8)]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_laid_out_experts_decode_to_their_weights(fmt):
    """Each expert's laid-out codes and scales, decoded with the kernel's integer operations and
    times its factor, are its dequantized weights (gate_up's rows interleaved)."""
    w13 = base.quantized_expert_weights(3, 2 * 64, 128, fmt, "cpu", seed=3)
    w2 = base.quantized_expert_weights(3, 128, 64, fmt, "cpu", seed=4)
    for q, interleave in ((w13, True), (w2, False)):
        ops = expert_operands(q, "cpu", interleave)
        assert ops.codes.shape[:3] == (3, q.shape[1] // 16, q.shape[2] // 64)
        for e in range(3):
            expected = dequantize(base._expert(q, e)).float()
            if interleave:
                expected = interleave_gate_up(expected)
            decoded = emulate(ops.codes[e], ops.scales[e], fmt) * (ops.factors[e] / WEIGHT_BIAS)
            torch.testing.assert_close(decoded, expected, rtol=2 ** -20, atol=0)


def test_a_layout_is_reused_only_for_the_very_same_weights():
    w = base.quantized_expert_weights(2, 32, 64, "nvfp4", "cpu")
    first = expert_operands(w, "cpu", interleave=False)
    assert expert_operands(w, "cpu", interleave=False) is first
    assert expert_operands(w, "cpu", interleave=True) is not first
    copy = base.QuantizedTensor(packed=w.packed.clone(), scales=w.scales, fmt=w.fmt, shape=w.shape,
                                global_scale=w.global_scale)
    assert expert_operands(copy, "cpu", interleave=False) is not first


def test_the_kernel_decodes_with_the_shared_code_and_waits_before_reading_routes():
    source = KERNEL_SOURCE.read_text()
    assert "decode_scaled(words[r][q], group_scales[r], q," in source
    gate_up_head = source[source.index("#if GATE_UP\n    wait_for_previous_kernel();"):]
    assert gate_up_head.index("wait_for_previous_kernel();") < gate_up_head.index("work_expert[")
    body = source[source.index("fp4_moe_gemm("):]
    down_wait = body.index("    wait_for_previous_kernel();                               // act")
    assert "copy_async(" not in body[:down_wait] and "stage(0)" not in body[:down_wait]


# --- on a GPU: the kernel itself, gated ----------------------------------------------------------

# the async builds (wgmma): one warpgroup of 16-pair items; two warpgroups of 32-pair items, one
# and two row tiles a warp; 64-pair items (n8 counts 1 to 8 over the skewed loads); one, two and
# three wgmma steps in flight
ASYNC_BUILDS = [CudaMoeConfig(warps=4, ntiles=2, chunk=4, depth=2, min_ctas=None, overlap="off",
                              mma="async"),
                CudaMoeConfig(warps=8, ntiles=4, chunk=4, depth=4, min_ctas=2, overlap="all",
                              mma="async", mma_depth=2),
                CudaMoeConfig(warps=8, row_tiles=2, ntiles=4, chunk=4, depth=2, min_ctas=2,
                              overlap="all", mma="async"),
                CudaMoeConfig(warps=4, ntiles=8, chunk=2, depth=1, min_ctas=None, overlap="tail",
                              mma="async", mma_depth=3)]
# the weights by cp.async into each warp's ring in shared memory: chunks of more k-groups than in
# flight (the ring's waits at a chunk's first and later steps), two row tiles a warp, the async
# build with one and two wgmma steps in flight, one k-group in flight
RING_BUILDS = [CudaMoeConfig(warps=4, ntiles=4, chunk=4, depth=2, min_ctas=2, overlap="all",
                             weights="shared"),
               CudaMoeConfig(warps=4, row_tiles=2, ntiles=2, chunk=2, depth=1, min_ctas=None,
                             overlap="off", weights="shared"),
               CudaMoeConfig(warps=8, ntiles=4, chunk=4, depth=2, min_ctas=2, overlap="all",
                             mma="async", mma_depth=2, weights="shared"),
               CudaMoeConfig(warps=4, ntiles=8, chunk=4, depth=4, min_ctas=None, overlap="tail",
                             mma="async", weights="shared")]
# three staged buffers (one barrier a chunk) over 4-8 chunks, so that every buffer is refilled:
# weights in the ring, in registers with two row tiles a warp, and the async build
THREE_BUFFER_BUILDS = [CudaMoeConfig(warps=4, ntiles=4, chunk=2, depth=2, min_ctas=2, overlap="all",
                                     weights="shared", buffers=3),
                       CudaMoeConfig(warps=4, row_tiles=2, ntiles=4, chunk=1, depth=1,
                                     min_ctas=None, overlap="off", buffers=3),
                       CudaMoeConfig(warps=8, ntiles=4, chunk=2, depth=2, min_ctas=2, overlap="all",
                                     mma="async", buffers=3)]
SMALL_BUILDS = [CudaMoeConfig(warps=4, ntiles=2, chunk=4, depth=2, min_ctas=None, overlap="off"),
                CudaMoeConfig(warps=4, ntiles=4, chunk=4, depth=4, min_ctas=2, overlap="tail"),
                CudaMoeConfig(warps=2, ntiles=8, chunk=2, depth=1, min_ctas=None, overlap="all"),
                CudaMoeConfig(warps=8, ntiles=4, chunk=4, depth=4, min_ctas=2, overlap="all"),
                CudaMoeConfig(warps=4, row_tiles=2, ntiles=4, chunk=4, depth=2, min_ctas=2,
                              overlap="all")]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("config", SMALL_BUILDS + ASYNC_BUILDS + RING_BUILDS + THREE_BUFFER_BUILDS,
                         ids=lambda c: c.label())
def test_fused_moe_passes_the_gate(fmt, config):
    """A busy expert over several work items (40 pairs against items of 16-64), idle experts,
    experts of one pair; the gate twice on the same call (the tables are rebuilt each call)."""
    ids = skewed_ids(40, 8, 3, busy=3, seed=4)
    problem = base.make_layer_problem(ids, 8, 512, 256, fmt, "cuda", seed=4)
    call = moe.get("cuda-w4a16-moe").prepare(problem, config=config)
    for _ in range(2):
        gate = base.check_call(call, problem)
        assert gate.ok, gate.message


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("model", ["glm-5", "deepseek-v3"])
@pytest.mark.parametrize("batch", [64, 256])
def test_the_presets_pass_the_gate_at_the_models_shapes(fmt, model, batch):
    """The models' hidden and intermediate sizes with 16 experts (their weights' bytes are the
    presets' question, not the kernel's), a uniform batch: 32 pairs an expert at 64 tokens, 128
    (the 64-pair preset, the busiest experts in several items) at 256."""
    from fp4lab.moe import routing

    preset = model_presets.get(model)
    ids = routing.sample_expert_ids("uniform", 16, preset.top_k, batch, 1)[0]
    problem = base.make_layer_problem(ids, 16, preset.hidden, preset.moe_intermediate, fmt, "cuda")
    call = moe.get("cuda-w4a16-moe").prepare(problem)
    gate = base.check_call(call, problem)
    assert gate.ok, gate.message


@pytest.mark.cuda
@pytest.mark.parametrize("config", [SMALL_BUILDS[1], ASYNC_BUILDS[1], RING_BUILDS[2]],
                         ids=lambda c: c.label())
def test_the_call_replays_in_a_cuda_graph(config):
    problem = base.make_layer_problem(skewed_ids(24, 8, 2, busy=0), 8, 512, 256, "nvfp4", "cuda")
    call = moe.get("cuda-w4a16-moe").prepare(problem, config=config)
    eager = call.call().clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call.call()
        with torch.cuda.graph(graph, stream=stream):
            call.call()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        call.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(call.out, eager)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [SMALL_BUILDS[1], ASYNC_BUILDS[1], RING_BUILDS[2]],
                         ids=lambda c: c.label())
@pytest.mark.parametrize("stage", ["load", "decode", "mma", "compute"])
def test_the_anatomy_stages_run_beside_a_gated_build(stage, config):
    """A stage build runs both launches over every work item (no fault, no hang) and shares the
    laid-out weights with the full build, whose gate still passes after it."""
    problem = base.make_layer_problem(skewed_ids(24, 8, 2, busy=0), 8, 512, 256, "mxfp4", "cuda")
    method = moe.get("cuda-w4a16-moe")
    if config.stage_reason(stage):                  # the async build in registers has no compute stage
        with pytest.raises(ValueError, match="serializes its wgmma"):
            method.prepare(problem, config=config, stage=stage)
        return
    staged = method.prepare(problem, config=config, stage=stage)
    assert f"anatomy stage {stage}" in staged.note
    staged.call()
    torch.cuda.synchronize()
    gate = base.check_call(method.prepare(problem, config=config), problem)
    assert gate.ok, gate.message
