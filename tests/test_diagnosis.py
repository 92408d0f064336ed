"""Diagnosis on synthetic run folders: verdicts, gate failures, what-ifs, missing tables."""

from __future__ import annotations

import numpy as np
import pytest

from fp4lab import diagnosis
from fp4lab.diagnosis import DiagnosisConfig
from fp4lab.results import RunDir

GLM5_SHAPES = [(4096, 6144), (6144, 2048)]  # gate_up, down as (N, K)
CEILINGS = {"measured": {"bandwidth_tbps": 4.0, "peak_tflops": {"bf16": 700.0}, "launch_us": 2.0,
                         "source": "measured"}}


def gemm_row(backend, m, n, k, median_us, status="ok", graph=True, **extra):
    flops = 2 * m * n * k
    return {"run_id": "r", "backend": backend, "fmt": "nvfp4", "m": m, "n": n, "k": k, "status": status,
            "error": None if status == "ok" else "relative error 1.0 > tolerance",
            "rel_err": 0.01 if status == "ok" else 1.0, "median_us": median_us,
            "tflops": flops / median_us / 1e6, "tbps": None, "bound": "memory" if m < 128 else "compute",
            "pct_peak_spec": flops / median_us / 1e6 / 700 * 100, "pct_peak_measured": None,
            "graph": graph, "avg_power_w": extra.get("avg_power_w")}


def make_run(tmp_path, per_m_us, backend="triton-w4a16", ceilings=CEILINGS, power=None, extra_rows=()):
    run = RunDir.create(tmp_path, "20261130T000000Z-test")
    rows = [gemm_row(backend, m, n, k, per_m_us(m), avg_power_w=power)
            for n, k in GLM5_SHAPES for m in (1, 16, 64, 256, 1024)]
    run.append_rows("gemm", rows + list(extra_rows))
    run.update_run_json("sweep", {"ceilings": ceilings})
    run.update_run_json("provenance", {"device": {"power_limit_w": 700.0}})
    return run


def test_launch_bound_when_every_gemm_costs_about_a_launch(tmp_path):
    # a launch costs 10 us here; each GEMM takes 12.5 us; the weight read is ~5 us per expert
    slow_launch = {"measured": {**CEILINGS["measured"], "launch_us": 10.0}}
    run = make_run(tmp_path, lambda m: 12.5, ceilings=slow_launch)
    tables = diagnosis.load_run(run.path)
    config = DiagnosisConfig(steps=4)
    point = diagnosis.layer_breakdown(tables, config, "triton-w4a16")
    assert point["exact_shapes"]
    assert 14 < point["mean_m"] < 18  # 512 * 8 / 256 = 16 tokens per expert
    result = diagnosis.verdict(point, diagnosis.power_state(tables, config, "triton-w4a16"), config)
    assert result["verdict"] == "launch-bound"
    assert result["explained"] == pytest.approx(10.0 / 12.5, rel=0.01)


def test_memory_floor_counts_the_bytes_of_the_backends_weights(tmp_path):
    # torch-bf16 reads bf16 weights: its GEMMs take 1.2x the bf16 weight read at 4 TB/s, at every M
    run = make_run(tmp_path, lambda m: 100.0)
    rows = [gemm_row("torch-bf16", m, n, k, n * k * 2 / 4e12 * 1e6 * 1.2)
            for n, k in GLM5_SHAPES for m in (1, 16, 64, 256)]
    run.append_rows("gemm", rows)
    tables = diagnosis.load_run(run.path)
    point = diagnosis.layer_breakdown(tables, DiagnosisConfig(steps=4), "torch-bf16")
    assert point["weight_dtype"] == "bf16"
    result = diagnosis.verdict(point, None, DiagnosisConfig())
    assert result["verdict"] == "memory-bound"
    assert result["explained"] == pytest.approx(1 / 1.2, rel=0.01)
    # the FP4 what-if reads the same weights as nvfp4: 4 bits + one e4m3 scale per 16 values
    assert point["fp4_read_floor_us"] / point["memory_floor_us"] == pytest.approx((0.5 + 1 / 16) / 2, rel=1e-3)
    fp4 = diagnosis.layer_breakdown(tables, DiagnosisConfig(steps=4), "triton-w4a16")
    assert fp4["weight_dtype"] == "fp4" and fp4["memory_floor_us"] == pytest.approx(point["fp4_read_floor_us"])


def test_power_bound_overrides_floors(tmp_path):
    run = make_run(tmp_path, lambda m: 3.0 + m / 10, power=680.0)
    tables = diagnosis.load_run(run.path)
    config = DiagnosisConfig(steps=4)
    point = diagnosis.layer_breakdown(tables, config, "triton-w4a16")
    power = diagnosis.power_state(tables, config, "triton-w4a16")
    assert power["fraction"] == pytest.approx(680 / 700)
    assert diagnosis.verdict(point, power, config)["verdict"] == "power-bound"


def test_power_is_judged_at_the_decode_point_not_at_large_m(tmp_path):
    # the GPU sits at its limit only for the large GEMMs; decode (16..28 tokens per expert) runs at M=16
    run = RunDir.create(tmp_path, "power")
    watts = {1: 300.0, 16: 380.0, 64: 400.0, 256: 690.0, 1024: 720.0}
    run.append_rows("gemm", [gemm_row("triton-w4a16", m, n, k, 3.0 + m / 10, avg_power_w=watts[m])
                             for n, k in GLM5_SHAPES for m in watts])
    run.update_run_json("sweep", {"ceilings": CEILINGS})
    run.update_run_json("provenance", {"device": {"power_limit_w": 700.0}})
    config = DiagnosisConfig(steps=4)
    d = diagnosis.diagnose(run.path, config)
    assert d.power["m_values"] == [16] and d.power["points"] == 2
    assert d.power["avg_power_w"] == pytest.approx(380.0)
    assert d.verdict["verdict"] != "power-bound"
    assert any("380 W" in line and "54% of the 700 W limit" in line for line in diagnosis.findings(d))


def test_decode_m_values_bracket_the_expert_load():
    measured = [1, 2, 4, 8, 16, 32, 64]
    assert diagnosis.decode_m_values(measured, 16.0, 28.0) == [16]
    assert diagnosis.decode_m_values(measured, 6.0, 40.0) == [8, 16, 32]
    assert diagnosis.decode_m_values(measured, 5.0, 7.0) == [4]   # none inside: the nearest the mean


def test_gate_failures_are_listed_with_their_error(tmp_path):
    bad = [gemm_row("flashinfer-cutlass", m, 4096, 6144, 5.0, status="wrong_result") for m in (1, 16)]
    run = make_run(tmp_path, lambda m: 3.0, extra_rows=bad)
    failures = diagnosis.gate_failures(diagnosis.load_run(run.path).gemm)
    assert failures.to_dict("records") == [{
        "backend": "flashinfer-cutlass", "fmt": "nvfp4", "points_failed": 2, "points_total": 2,
        "worst_rel_err": 1.0, "example_error": "relative error 1.0 > tolerance"}]


def test_auto_backend_is_the_fastest_at_decode_not_the_most_measured(tmp_path):
    # torch-fp8 has more points and more TFLOPS at large M, but torch-bf16 is faster at M=16
    fast_at_decode = [gemm_row("torch-bf16", m, n, k, 2.0) for n, k in GLM5_SHAPES for m in (1, 16, 64)]
    run = make_run(tmp_path, lambda m: 4.0 + m / 1000, backend="torch-fp8", extra_rows=fast_at_decode)
    tables = diagnosis.load_run(run.path)
    at_decode = diagnosis.what_if_backends(tables, DiagnosisConfig(steps=4))
    backend, reason = diagnosis.choose_backend(at_decode)
    assert backend == "torch-bf16"
    assert "fastest" in reason and "next is torch-fp8" in reason
    assert diagnosis.choose_backend(at_decode, "torch-fp8")[0] == "torch-fp8"
    with pytest.raises(ValueError, match="backend='nope'"):
        diagnosis.choose_backend(at_decode, "nope")


def test_seed_table(tmp_path):
    run = make_run(tmp_path, lambda m: 3.0 + m / 10)
    gemm = diagnosis.load_run(run.path).gemm
    table = diagnosis.seed_table(gemm, "triton-w4a16")
    assert list(table["m"]) == [1, 16, 64, 256, 1024]
    assert (table["tflops_max"].diff().dropna() > 0).all()  # bigger M, more TFLOPS
    assert list(table["regime"]) == ["memory"] * 3 + ["compute"] * 2


def test_what_ifs_from_measured_rows(tmp_path):
    eager = [gemm_row("triton-w4a16", 16, 4096, 6144, 9.0, graph=False)]
    run = make_run(tmp_path, lambda m: 3.0 + m / 10, extra_rows=eager)
    tables = diagnosis.load_run(run.path)
    config = DiagnosisConfig(steps=4)
    concurrency = diagnosis.what_if_concurrency(tables, config, "triton-w4a16", factors=(0.5, 1, 2))
    assert list(concurrency["batch"]) == [256, 512, 1024]
    assert concurrency["us_per_token"].is_monotonic_decreasing  # more concurrency amortizes weights
    ep = diagnosis.what_if_ep(tables, config, "triton-w4a16")
    assert list(ep["ep"]) == [1, 2, 4, 8]
    assert ep["layer_us_busiest_rank"].is_monotonic_decreasing
    graphs = diagnosis.what_if_graphs(tables.gemm)
    assert graphs["speedup"].tolist() == pytest.approx([9.0 / (3.0 + 1.6)])


def test_missing_tables_are_named_and_nothing_is_guessed(tmp_path):
    run = RunDir.create(tmp_path, "empty")
    tables = diagnosis.load_run(run.path)
    assert tables.missing == list(diagnosis.TABLE_SOURCES.values())
    assert diagnosis.layer_breakdown(tables, DiagnosisConfig(steps=4), "x") is None
    assert diagnosis.choose_backend(diagnosis.what_if_backends(tables, DiagnosisConfig(steps=4)))[0] is None
    assert diagnosis.gate_failures(tables.gemm).empty
    assert diagnosis.what_if_grouped(tables.moe, "glm-5", 512).empty


def test_nearest_shape_is_labelled(tmp_path):
    run = RunDir.create(tmp_path, "small")
    run.append_rows("gemm", [gemm_row("torch-bf16", m, 64, 128, 1.0 + m) for m in (1, 8)])
    run.update_run_json("sweep", {"ceilings": CEILINGS})
    at = diagnosis.gemm_time_at(diagnosis.load_run(run.path).gemm, "torch-bf16", 4096, 6144, 4.0)
    assert at["median_us"] == pytest.approx(5.0)
    assert "not the preset's 4096x6144" in at["shape_note"]


@pytest.mark.parametrize("field, value, message", [
    ("preset", "no-such-model", "unknown model preset"),
    ("decode_batch", 0, "decode_batch=0"),
    ("routing", "zipf:x", "zipf needs a number"),
])
def test_bad_parameters_name_themselves(field, value, message):
    with pytest.raises(ValueError, match=message):
        diagnosis.validate(DiagnosisConfig(**{field: value}))


def test_grouped_methods_compared_with_the_loop(tmp_path):
    run = RunDir.create(tmp_path, "moe")
    rows = [{"preset": "glm-5", "batch": b, "gemm": g, "method": meth, "status": "ok", "median_us": us,
             "tflops": 1.0, "max_tokens": 28, "mean_tokens": 16}
            for b in (64, 512) for g in ("gate_up", "down")
            for meth, us in (("loop", 1000.0), ("grouped", 400.0))]
    run.append_rows("moe", rows)
    # expert-parallel ranks' rows are not part of the one-GPU layer
    ranks = [{"preset": "glm-5", "batch": 512, "gemm": "gate_up", "method": "grouped", "status": "ok",
              "median_us": 5000.0, "ep": 2, "ep_rank": r} for r in (0, 1)]
    run.append_rows("moe", ranks)
    grouped = diagnosis.what_if_grouped(diagnosis.load_run(run.path).moe, "glm-5", 500)
    assert grouped.set_index("method")["vs_loop"].to_dict() == {"grouped": 0.4, "loop": 1.0}
    assert set(grouped["batch"]) == {512}
    assert np.isclose(grouped["layer_us"].min(), 800.0)


def test_a_layer_faster_than_its_floor_flags_the_ceilings():
    breakdown = {"loop_us": 100.0, "launch_floor_us": 10.0, "memory_floor_us": 20.0,
                 "compute_floor_us": 500.0, "ceilings_source": "spec"}
    result = diagnosis.verdict(breakdown, None, DiagnosisConfig())
    assert result["verdict"] == "compute-bound" and np.isnan(result["explained"])
    assert "spec ceilings do not describe this device" in result["reason"]


@pytest.mark.parametrize("fast, slow, words", [
    (100.0, 104.0, "about as fast as"), (100.0, 200.0, "2.0x as fast as"), (100.0, 84.0, "0.84x as fast as"),
    (10.0, 134.0, "13x as fast as"), (1.0, 512.0, "510x as fast as")])
def test_speed_comparisons_read_as_words(fast, slow, words):
    assert diagnosis.compare_speed(fast, slow) == words


def test_counts_agree_with_their_nouns():
    import pandas as pd

    from fp4lab import history

    one = pd.DataFrame({"kind": ["reference"]})
    assert history.index_sentence(one, 1).startswith("1 run on record (0 local, 1 reference)")
    assert history.index_sentence(pd.concat([one, one]), 2).startswith("2 runs on record")


def test_findings_put_the_fp4_read_floor_beside_the_fp4_backend(tmp_path):
    # torch-bf16 is fastest at decode; triton-w4a16 (FP4 weights) is measured slower beside it
    bf16 = [gemm_row("torch-bf16", m, n, k, 2.0) for n, k in GLM5_SHAPES for m in (1, 16, 64)]
    run = make_run(tmp_path, lambda m: 3.0, extra_rows=bf16)
    run.update_run_json("provenance", {"device": {"kind": "cuda", "name": "NVIDIA H200", "native_fp4": [],
                                                  "power_limit_w": 700.0}})
    d = diagnosis.diagnose(run.path, DiagnosisConfig(steps=4))
    assert d.backend == "torch-bf16" and d.breakdown["weight_dtype"] == "bf16"
    sentence = diagnosis.fp4_sentence(d)
    assert f"would take {d.breakdown['fp4_read_floor_us']:.0f} us" in sentence
    assert "triton-w4a16" in sentence and "0.67x as fast as torch-bf16" in sentence
    assert "NVIDIA H200 has no FP4 tensor cores" in sentence


def test_an_unregistered_backend_has_no_weight_read_floor(tmp_path):
    run = make_run(tmp_path, lambda m: 3.0, backend="retired-backend")
    d = diagnosis.diagnose(run.path, DiagnosisConfig(steps=4))
    assert np.isnan(d.breakdown["memory_floor_us"]) and d.verdict["verdict"] != "memory-bound"
    assert any("not a registered backend" in line for line in diagnosis.cannot_conclude(d))
