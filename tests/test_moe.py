"""MoE scatter: presets, routing models, trace replay, EP aggregation, bad input, grouped GEMMs."""

import json
import random

import numpy as np
import pandas as pd
import pytest
import torch

from fp4lab.backends import moe as moe_methods
from fp4lab.backends.moe.base import make_expert_problem
from fp4lab.cli import main as cli_main
from fp4lab.moe import layer_model, presets, routing, stats


def run_cli(argv, capsys):
    code = cli_main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# --- presets -------------------------------------------------------------------------------------

def test_glm5_shapes_and_aliases():
    glm5 = presets.get("glm5")
    assert presets.get("GLM-5") is glm5
    assert glm5.gemm_shapes() == {"gate_up": (4096, 6144), "down": (6144, 2048)}
    assert glm5.moe_layers == 75
    assert len(presets.PRESETS) == 8 and all(p.source for p in presets.PRESETS.values())


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="glm-5.*mixtral-8x7b"):
        presets.get("llama")


# --- routing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["uniform", "zipf:1.2"])
def test_routes_distinct_experts_and_closed_form_mean(spec):
    ids = routing.sample_expert_ids(spec, experts=64, top_k=6, batch=40, steps=20, seed=3)
    assert ids.shape == (20, 40, 6)
    assert (np.sort(ids, -1)[..., 1:] != np.sort(ids, -1)[..., :-1]).all()
    loads = routing.tokens_per_expert(ids, 64)
    assert (loads.sum(axis=1) == 40 * 6).all()
    assert stats.expert_load_stats(loads)["mean_tokens_per_expert"] == pytest.approx(40 * 6 / 64)


def test_seeded_and_zipf_is_skewed():
    a = routing.expert_loads("uniform", 32, 4, 64, 10, seed=1)
    assert (a == routing.expert_loads("uniform", 32, 4, 64, 10, seed=1)).all()
    skewed = stats.expert_load_stats(routing.expert_loads("zipf:1.5", 32, 4, 64, 50, seed=1))
    flat = stats.expert_load_stats(routing.expert_loads("uniform", 32, 4, 64, 50, seed=1))
    assert skewed["cv"] > 2 * flat["cv"]


def plain_python_busiest(experts, top_k, batch, steps, seed):
    """An independent sampler: random.sample per token, counted in a dict."""
    rng = random.Random(seed)
    maxima = []
    for _ in range(steps):
        counts = dict.fromkeys(range(experts), 0)
        for _ in range(batch):
            for e in rng.sample(range(experts), top_k):
                counts[e] += 1
        maxima.append(max(counts.values()))
    return sum(maxima) / steps


def test_busiest_expert_matches_independent_simulation():
    vectorized = stats.expert_load_stats(routing.expert_loads("uniform", 256, 8, 512, 60, seed=0))
    reference = plain_python_busiest(256, 8, 512, 60, seed=11)
    assert vectorized["mean_tokens_per_expert"] == 16
    assert vectorized["mean_max_tokens_per_expert"] == pytest.approx(reference, abs=1.0)
    assert 26 <= vectorized["mean_max_tokens_per_expert"] <= 30


def test_trace_replay(tmp_path):
    ids = np.array([[[0, 1], [1, 2], [3, 0]], [[2, 3], [2, 1], [0, 1]]])   # [S=2, T=3, k=2]
    path = tmp_path / "trace.npy"
    np.save(path, ids)
    loads = routing.expert_loads(f"trace:{path}", experts=4, top_k=2, batch=3, steps=2)
    assert loads.tolist() == [[2, 2, 1, 1], [1, 2, 2, 1]]


@pytest.mark.parametrize("array, message", [
    (np.zeros((3, 2), dtype=int), "3 dimensions|got 2 dimensions"),
    (np.array([[[0, 9]]]), r"ids must lie in \[0, 4\)"),
    (np.array([[[1, 1]]]), "same expert twice"),
    (np.array([[[0, 1, 2]]]), "top_k=3 per token, expected top_k=2"),
    (np.array([[[0.0, 1.0]]]), "integer expert ids"),
])
def test_malformed_trace_is_refused(tmp_path, array, message):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(ValueError, match=message):
        routing.expert_loads(f"trace:{path}", experts=4, top_k=2, batch=array.shape[1] if array.ndim == 3 else 1, steps=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(experts=4, top_k=8, batch=8), "top_k=8 exceeds experts=4"),
    (dict(experts=4, top_k=2, batch=0), "batch=0"),
    (dict(experts=4, top_k=2, batch=-3), "batch=-3"),
])
def test_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        routing.expert_loads("uniform", steps=2, **kwargs)


@pytest.mark.parametrize("spec", ["zipf", "zipf:-1", "gauss", "trace:"])
def test_bad_routing_spec(spec):
    with pytest.raises(ValueError, match="routing"):
        routing.parse_routing(spec)


# --- EP aggregation ------------------------------------------------------------------------------

def test_ep_ranks_sum_contiguous_experts():
    loads = np.array([[1, 2, 3, 4, 5, 6, 7, 8]])                            # [S=1, E=8]
    assert stats.rank_loads(loads, 4).tolist() == [[3, 7, 11, 15]]
    summary = stats.ep_stats(loads, 2)
    assert summary["mean_tokens_per_rank"] == 18 and summary["mean_max_tokens_per_rank"] == 26
    assert stats.busiest_rank_experts(loads[0], 2).tolist() == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="ep=3"):
        stats.rank_loads(loads, 3)


# --- CLI -----------------------------------------------------------------------------------------

def test_cli_prints_json(capsys):
    code, out, _ = run_cli(["moe-stats", "--experts", "256", "--top-k", "8", "--batch", "512",
                            "--steps", "40", "--ep", "1", "8"], capsys)
    result = json.loads(out)
    assert code == 0 and result["mean_tokens_per_expert"] == 16
    assert 25 <= result["mean_max_tokens_per_expert"] <= 31
    for key in ("p99_tokens_per_expert", "cv", "mean_idle_experts"):
        assert key in result
    assert result["ep"]["8"]["mean_tokens_per_rank"] == 512


def test_cli_bad_input_is_one_line_exit_2(capsys):
    code, out, err = run_cli(["moe-stats", "--experts", "4", "--top-k", "8", "--batch", "16"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "top_k=8 exceeds experts=4" in err


# --- grouped GEMMs on CPU (scaled preset) --------------------------------------------------------

def test_loop_grouped_padded_agree():
    problem = make_expert_problem(np.array([3, 0, 5, 1]), n=32, k=64, device="cpu", seed=0)
    outputs = {}
    for method in ("loop-bf16", "grouped-bf16", "padded-bf16"):
        prepared = moe_methods.get(method).prepare(problem)
        gate = moe_methods.check_call(prepared, problem)
        assert gate.ok, (method, gate.message)
        outputs[method] = prepared.to_rows(prepared.call()).float()
    assert torch.allclose(outputs["loop-bf16"], outputs["padded-bf16"], atol=2e-2)
    assert torch.allclose(outputs["loop-bf16"], outputs["grouped-bf16"], atol=2e-2)


def test_wrong_method_fails_the_gate():
    problem = make_expert_problem(np.array([2, 2]), n=16, k=32, device="cpu", seed=0)
    prepared = moe_methods.get("loop-bf16").prepare(problem)
    original = prepared.call
    prepared.call = lambda: original().mul_(2.0)                             # a factor-2 bug
    assert moe_methods.check_call(prepared, problem).status == "wrong_result"


@pytest.mark.cuda
def test_grouped_bf16_on_gpu():
    problem = make_expert_problem(np.array([5, 0, 17, 3]), n=256, k=512, device="cuda", seed=0)
    for method in ("loop-bf16", "grouped-bf16", "padded-bf16"):
        prepared = moe_methods.get(method).prepare(problem)
        assert moe_methods.check_call(prepared, problem).ok


# --- layer model ---------------------------------------------------------------------------------

def test_layer_model_arithmetic():
    # t(m) = 10 us * m^0.5 measured at m = 1, 4, 16; N = K = 100
    curve = layer_model.DenseCurve(100, 100, np.array([1.0, 4.0, 16.0]), np.array([10.0, 20.0, 40.0]))
    assert curve.time_us([2.0, 64.0]) == pytest.approx([10 * 2 ** 0.5, 80.0])
    assert layer_model.predict_loop_us(curve, [4, 0, 16]) == pytest.approx(60.0)
    best_bw = max(2.0 * (100 * 100 + m * 200) / t for m, t in ((1, 10), (4, 20), (16, 40)))
    stream = (2.0 * (2 * 100 * 100 + 20 * 200)) / best_bw
    assert layer_model.predict_grouped_us(curve, [4, 0, 16]) == pytest.approx(
        max(stream, 2 * 20 * 100 * 100 / (2 * 16 * 100 * 100 / 40)) + curve.launch_us)
    measured = pd.DataFrame([{"method": "loop-bf16", "status": "ok", "gemm": "g", "batch": 1, "ep": 1,
                              "loads": [4, 0, 16], "median_us": 50.0}])
    compared = layer_model.compare_with_measured(measured, {"g": curve})
    assert compared["error_pct"].iloc[0] == pytest.approx(20.0)


def test_padded_model_streams_at_the_device_bandwidth_when_the_run_measured_one():
    curve = layer_model.DenseCurve(100, 100, np.array([1.0, 4.0, 16.0]), np.array([10.0, 20.0, 40.0]))
    loads = [4, 0, 16]  # padded: 3 experts x 16 tokens
    padded_bytes = 3 * 2.0 * (100 * 100 + 16 * 200)
    flops_us = 2 * 48 * 100 * 100 / (2 * 16 * 100 * 100 / 40)
    # without a device ceiling: the best bandwidth one expert's GEMM reached
    assert layer_model.predict_padded_us(curve, loads) == pytest.approx(
        max(padded_bytes / curve.best_bandwidth(), flops_us) + curve.launch_us)
    # with the run's measured copy bandwidth (TB/s -> bytes/us), as dense_curves builds it
    rows = pd.DataFrame([{"method": "dense-bf16", "status": "ok", "n": n, "k": 100, "m": m, "median_us": t}
                         for n in (100, 200) for m, t in ((1, 10.0), (4, 20.0), (16, 40.0))])
    # gate_up (2I, H) = (200, 100), down (H, I) = (100, 100)
    model = presets.ModelPreset(key="toy", name="toy", hidden=100, moe_intermediate=100, experts=3, top_k=1,
                                shared_experts=0, layers=1, dense_layers=0, source="test")
    fast = layer_model.dense_curves(rows, model, device_bandwidth_tbps=1.0)["down"]
    assert fast.device_bandwidth == 1e6
    assert layer_model.predict_padded_us(fast, loads) == pytest.approx(
        max(padded_bytes / 1e6, flops_us) + fast.launch_us)
    timed = layer_model.dense_curves(rows, model, device_bandwidth_tbps=1.0, launch_us=2.4)["down"]
    assert layer_model.predict_padded_us(timed, loads) == pytest.approx(
        max(padded_bytes / 1e6, flops_us) + 2.4)              # the run's measured launch floor


def test_concurrency_for_utilization():
    table = pd.DataFrame({"batch": [64, 128, 256], "ep": [1, 1, 1], "grouped_utilization": [0.1, 0.3, 0.6]})
    found = layer_model.concurrency_for_utilization(table, 0.25)
    assert found["batch_needed"].iloc[0] == 128
    assert layer_model.concurrency_for_utilization(table, 0.9)["batch_needed"].iloc[0] is None
    with pytest.raises(ValueError, match="target utilization"):
        layer_model.concurrency_for_utilization(table, 1.5)
