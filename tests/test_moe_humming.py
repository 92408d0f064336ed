"""humming's MoE layer methods on the CPU: the layouts' index arithmetic against plain loops, and
whole layers through the fake humming (tests/fakes/humming.py) gated against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe import base, humming as moe_humming
from fp4lab.moe import routing
from fakes import humming as fake_humming

LAYER_METHODS = ("humming-moe-grouped", "humming-moe-indexed", "humming-w4a4-moe")


@pytest.fixture
def fake_hum(monkeypatch):
    return fake_humming.install(monkeypatch)


def topk_ids(tokens: int, experts: int, top_k: int, seed: int = 3) -> torch.Tensor:
    return torch.as_tensor(routing.sample_expert_ids("uniform", experts, top_k, tokens, 1,
                                                     seed=seed)[0], dtype=torch.int32)  # [T, k]


def small_layer(fmt: str, tokens: int = 12, experts: int = 8, top_k: int = 2):
    ids = topk_ids(tokens, experts, top_k).numpy()
    return base.make_layer_problem(ids, experts, hidden=64, intermediate=32, fmt=fmt, device="cpu")


# --- index arithmetic, against the plain per-expert computation ---------------------------------

def plain_grouped(ids: torch.Tensor, experts: int):
    flat = ids.reshape(-1).tolist()
    order = [r for e in range(experts) for r in range(len(flat)) if flat[r] == e]
    offsets = [0]
    for e in range(experts):
        offsets.append(offsets[-1] + flat.count(e))
    return order, offsets


def plain_indexed(ids: torch.Tensor, experts: int, block: int):
    flat = ids.reshape(-1).tolist()
    sorted_ids, expert_ids = [], []
    for e in range(experts):
        mine = [r for r in range(len(flat)) if flat[r] == e]
        pad = -len(mine) % block
        sorted_ids += mine + [len(flat)] * pad
        expert_ids += [e] * ((len(mine) + pad) // block)
    return sorted_ids, expert_ids


@pytest.mark.parametrize("tokens,experts,top_k", [(12, 8, 2), (200, 16, 4), (3, 32, 8)])
def test_grouped_layout_matches_a_plain_computation(tokens, experts, top_k):
    ids = topk_ids(tokens, experts, top_k)
    order, layout = moe_humming.grouped_routes(ids, experts)
    expected_order, expected_offsets = plain_grouped(ids, experts)
    assert order.tolist() == expected_order
    assert layout.dtype == torch.int64 and layout.tolist() == expected_offsets
    assert layout[-1] == tokens * top_k


@pytest.mark.parametrize("block", [8, 16, 48])
@pytest.mark.parametrize("tokens,experts,top_k", [(12, 8, 2), (200, 16, 4), (3, 32, 8)])
def test_indexed_layout_matches_a_plain_computation(tokens, experts, top_k, block):
    ids = topk_ids(tokens, experts, top_k)
    routes = moe_humming.indexed_routes(ids, experts, block)
    expected_sorted, expected_experts = plain_indexed(ids, experts, block)
    assert routes.sorted_ids.dtype == routes.expert_ids.dtype == torch.int32
    assert routes.sorted_ids.tolist() == expected_sorted
    assert routes.expert_ids.tolist() == expected_experts
    assert routes.num_tokens_padded.dtype == torch.int32
    assert routes.num_tokens_padded.tolist() == [len(expected_sorted)]
    assert len(expected_sorted) % block == 0


def test_indexed_block_follows_the_launchers_intervals():
    intervals = [[0, 32, {"block_shape": [8, 64, 64]}], [32, 256, {"block_shape": [16, 64, 64]}],
                 [256, 1 << 30, {"block_shape": [48, 64, 64]}]]
    assert moe_humming.indexed_block(intervals, 32) == 8      # (lo, hi]: 32 is in the first
    assert moe_humming.indexed_block(intervals, 33) == 16
    assert moe_humming.indexed_block(intervals, 4096) == 48
    with pytest.raises(ValueError, match="do not cover 0 routed rows"):
        moe_humming.indexed_block(intervals, 0)


# --- whole layers through the fake --------------------------------------------------------------

def test_registered_as_layer_methods():
    layers = moe_methods.names("layer")
    for name in LAYER_METHODS:
        assert name in layers
        method = moe_methods.get(name)
        assert method.library == "humming" and method.weight_dtype == "fp4"
    assert moe_methods.get("humming-moe-grouped").math_dtype == "bf16"
    assert moe_methods.get("humming-w4a4-moe").math_dtype == "fp4"
    assert moe_methods.get("humming-w4a4-moe").formats == ("nvfp4",)


def test_w4a4_moe_needs_blackwell(monkeypatch, fake_hum):
    from fp4lab.backends import base as backend_base

    backend_base.import_reason.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert moe_methods.get("humming-moe-grouped").availability("cuda")[0]
    available, reason = moe_methods.get("humming-w4a4-moe").availability("cuda")
    assert not available and "FP4 runs only as weight-only kernels here" in reason
    backend_base.import_reason.cache_clear()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", ["humming-moe-grouped", "humming-moe-indexed"])
def test_layers_pass_the_float64_layer_gate(fake_hum, name, fmt):
    problem = small_layer(fmt)
    call = moe_methods.get(name).prepare(problem)
    assert call.graph and call.tolerance_key == fmt
    assert call.weight_bytes == base.layer_weight_bytes(problem)
    assert "torch between them" in call.note and "first call" in call.note
    gate = moe_methods.check_call(call, problem)
    assert gate.ok and gate.rel_err < 5e-3, gate.message
    assert [layer.kwargs["num_experts"] for layer in fake_hum.layers] == [8, 8]
    assert fake_hum.layers[0].kwargs["shape_n"] == 64 and fake_hum.layers[1].kwargs["shape_k"] == 32


def test_grouped_layer_hands_humming_offsets_and_expert_order(fake_hum):
    problem = small_layer("nvfp4")
    moe_methods.get("humming-moe-grouped").prepare(problem)
    gate_up, down = fake_hum.calls[-2:]
    order, offsets = plain_grouped(problem.topk_ids, problem.experts)
    for call in (gate_up, down):
        assert call["compute_config"] == {"gemm_type": "grouped_contiguous"}
        assert call["expert_layout"].tolist() == offsets
    tokens = [r // problem.top_k for r in order]
    assert torch.equal(gate_up["inputs"], problem.x[tokens])       # rows gathered by expert
    assert down["inputs"].shape == (len(order), problem.intermediate)


def test_indexed_layer_aligns_each_gemm_to_its_own_block(fake_hum):
    problem = small_layer("nvfp4")        # 24 routes: the fake's blocks are 32 (gate_up), 8 (down)
    moe_methods.get("humming-moe-indexed").prepare(problem)
    gate_up, down = fake_hum.calls[-2:]
    assert gate_up["top_k"] == problem.top_k and down["top_k"] == 1
    assert gate_up["inputs"] is problem.x or torch.equal(gate_up["inputs"], problem.x)
    for call, block in ((gate_up, 32), (down, 8)):
        expected_sorted, expected_experts = plain_indexed(problem.topk_ids, problem.experts, block)
        assert call["sorted_ids"].tolist() == expected_sorted
        assert call["expert_ids"].tolist() == expected_experts
        assert call["tuning_config"] == fake_hum.block_intervals(call["config"])
    assert all(tune["gemm_type"] == "indexed" for tune in fake_hum.tune_calls)


def test_w4a4_moe_passes_its_gate_with_calibrated_static_scales(fake_hum):
    problem = small_layer("nvfp4")
    call = moe_methods.get("humming-w4a4-moe").prepare(problem)
    gate_up, down = fake_hum.layers
    assert gate_up.kwargs["input_config"] == {"quant_method": "modelopt", "quant_algo": "nvfp4"}
    assert gate_up.loaded["input_scale"].shape == (problem.experts,)
    x_scale = problem.x.float().abs().max().item() / (448 * 6)
    assert gate_up.loaded["input_scale"][0].item() == pytest.approx(x_scale, rel=1e-6)
    assert down.loaded["input_scale"][0].item() != pytest.approx(x_scale, rel=1e-2)
    assert call.reference_transform is not None
    # the input GEMM is exact (the dense W4A4 test); the intermediate's FP4 codes may differ a
    # step where bf16 and float64 straddle a rounding boundary (the documented caveat)
    gate = moe_methods.check_call(call, problem)
    assert gate.rel_err < 5e-2, gate.message


def test_layer_call_reads_the_weight_copies_it_is_given(fake_hum):
    problem = small_layer("mxfp4")
    call = moe_methods.get("humming-moe-grouped").prepare(problem)
    x, weights, w13, w2 = call.args
    zero_w2 = tuple(t.clone() for t in w2)
    zero_w2[0].zero_()                                             # the copy's packed codes
    out = torch.empty_like(call.out)
    assert not call.make_call((x, weights, w13, zero_w2), out)().any()


def test_the_layer_gate_catches_a_kernel_that_drops_the_global_scale(fake_hum):
    fake_hum.ignore_global_scale = True
    problem = small_layer("nvfp4")
    call = moe_methods.get("humming-moe-indexed").prepare(problem)
    gate = moe_methods.check_call(call, problem)
    assert gate.status == "wrong_result"


def test_wrong_format_names_the_parameter(fake_hum):
    with pytest.raises(ValueError, match="takes formats \\['nvfp4'\\], not fmt='mxfp4'"):
        moe_methods.get("humming-w4a4-moe").prepare(small_layer("mxfp4"))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["humming-moe-grouped", "humming-moe-indexed"])
def test_real_humming_layer_on_the_gpu_passes_the_gate(name):
    method = moe_methods.get(name)
    available, reason = method.availability("cuda")
    if not available:
        pytest.skip(reason)
    ids = topk_ids(64, 16, 4).numpy()
    problem = base.make_layer_problem(ids, 16, hidden=512, intermediate=256, fmt="nvfp4",
                                      device="cuda")
    gate = moe_methods.check_call(method.prepare(problem), problem)
    assert gate.ok, gate.message
