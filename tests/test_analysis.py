"""The analysis layer on synthetic run folders whose numbers are known: derived columns, the
measured peaks raised on read, the 4-bit tables, and the diagnosis (floors, verdict, power, paths,
levers, what it cannot conclude)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fakes.runs import (CPU, MEASURED, fused_anatomy_run, glm5_gemm_rows, gemm_row, make_run, moe_anatomy_row,
                        moe_row)

from fp4lab import roofline, text
from fp4lab.analysis import decode, gemm, moe
from fp4lab.errors import ParameterError

DECODE_MS = {1: 10.0, 8: 10.0, 16: 10.0, 32: 11.0, 64: 12.0}


def run_with(tmp_path, rows, moe_rows=(), **kwargs):
    run = make_run(tmp_path, **kwargs)
    run.append_rows("gemm", rows)
    if moe_rows:
        run.append_rows("moe", moe_rows)
    return run


# -- gemm -------------------------------------------------------------------------------------------

def test_derived_columns_by_hand(tmp_path):
    run = run_with(tmp_path, [gemm_row("torch-bf16", 1, 8192, 8192, 40.0)])
    row = gemm.gemm_results(run).ok.iloc[0]
    moved = roofline.gemm_bytes(1, 8192, 8192, "bf16", "nvfp4", "bf16")
    assert row["bytes"] == moved and row["tbps"] == pytest.approx(moved / 40e-6 / 1e12)
    assert row["tflops"] == pytest.approx(2 * 8192 * 8192 / 40e-6 / 1e12)
    assert row["pct_peak_measured"] == pytest.approx(100 * row["tflops"] / 800.0)
    assert row["pct_peak_spec"] == pytest.approx(100 * row["tflops"] / 989.0)
    assert row["bound"] == "memory" and row["memory_floor_us"] == pytest.approx(moved / 4e6)


def test_a_point_faster_than_the_probe_raises_the_measured_peak_on_read(tmp_path):
    # 2*4096^3 FLOPs in 150 us = 916 TFLOP/s, above the 800 TFLOP/s bf16 probe
    run = run_with(tmp_path, [gemm_row("torch-bf16", 4096, 4096, 4096, 150.0),
                              gemm_row("torch-bf16", 1, 4096, 4096, 10.0)])
    results = gemm.gemm_results(run)
    assert results.measured.peak_tflops["bf16"] == pytest.approx(2 * 4096 ** 3 / 150e-6 / 1e12)
    assert "bf16" in results.raised and "M=4096" in results.raised["bf16"]
    assert "by torch-bf16 M=4096" in results.raised["bf16"]          # a bf16 backend's row names no FP4 format
    assert results.ok["pct_peak_measured"].max() == pytest.approx(100.0)
    assert (run.path / "gemm.jsonl").read_text().count("\n") == 2      # nothing written back


def test_availability_counts_and_first_reasons(tmp_path):
    run = run_with(tmp_path, [gemm_row("torch-bf16", 1, 64, 64, 5.0),
                              gemm_row("torch-fp4", 1, 64, 64, None, status="unavailable", error="needs sm_100"),
                              gemm_row("torch-fp4", 2, 64, 64, None, status="unavailable", error="needs sm_100")])
    table = gemm.availability(gemm.gemm_results(run)).set_index("backend")
    assert table.loc["torch-fp4", "unavailable"] == 2 and table.loc["torch-bf16", "ok"] == 1
    assert table.loc["torch-fp4", "why not"] == "unavailable: needs sm_100"


def test_a_reason_shared_by_several_backends_is_stated_once_naming_them(tmp_path):
    rows = [gemm_row("torch-bf16", 1, 64, 64, 5.0)] + [
        gemm_row(name, 1, 64, 64, None, status="unavailable", error="needs sm_100")
        for name in ("torch-fp4", "sgl-cutlass")] + [
        gemm_row("gemlite-w4a16", 1, 64, 64, None, status="error", error="LibraryCompileError: x")]
    table = gemm.availability(gemm.gemm_results(run_with(tmp_path, rows)))
    assert gemm.why_not_groups(table) == [(["torch-fp4", "sgl-cutlass"], "unavailable: needs sm_100"),
                                          (["gemlite-w4a16"], "error: LibraryCompileError: x")]


def test_fastest_four_bit_method_against_bf16_and_the_floor(tmp_path):
    rows = [gemm_row("torch-bf16", 1, 8192, 8192, 34.0), gemm_row("triton-w4a16", 1, 8192, 8192, 17.0),
            gemm_row("emulated", 1, 8192, 8192, 900.0)]
    table = gemm.fastest_fp4(gemm.gemm_results(run_with(tmp_path, rows)))
    row = table.iloc[0]
    floor = roofline.gemm_bytes(1, 8192, 8192, "fp4", "nvfp4", "bf16") / 4e6
    assert row["backend"] == "triton-w4a16" and row["speedup_vs_bf16"] == pytest.approx(2.0)
    assert row["floor_us"] == pytest.approx(floor) and row["pct_of_floor"] == pytest.approx(100 * floor / 17)


def test_a_method_whose_launches_overlap_the_previous_call_is_named_with_how(tmp_path):
    rows = [gemm_row("torch-bf16", 1, 8192, 8192, 34.0),
            gemm_row("cuda-w4a16", 1, 8192, 8192, 13.0, config="cuda g16 d4 w16 k1 pdl-all", launch="pdl-all"),
            gemm_row("cuda-w4a16", 4, 8192, 8192, 14.0, config="cuda g16 d4 w4 k1", launch="plain"),
            gemm_row("triton-w4a16", 1, 8192, 8192, 20.0, config="16x64x128 w4 s1")]
    notes = gemm.launch_notes(gemm.gemm_results(run_with(tmp_path, rows)))
    assert len(notes) == 1 and notes[0].startswith("cuda-w4a16 launches with programmatic dependent launch")
    assert "several calls in a row" in notes[0] and "the kernel before it must allow" in notes[0]
    assert notes[0].endswith("(1 of its 2 points)")
    # a run measured before the column or with plain launches says nothing
    older = [gemm_row("torch-bf16", 1, 64, 64, 5.0), gemm_row("cuda-w4a16", 1, 64, 64, 3.0),
             gemm_row("cuda-w4a16", 4, 64, 64, 3.0, launch="plain")]
    assert gemm.launch_notes(gemm.gemm_results(run_with(tmp_path / "older", older))) == []


def test_methods_tied_for_the_most_cases_each_get_a_row_of_the_fastest_per_m(tmp_path):
    """The reference run's M = 16: cuda-w4a16 and triton-w4a16 won 3 of 6 cases each, and the table
    named only the one its row order put first."""
    rows = []
    for n, k, bf16_us, cuda_us, triton_us in [(8192, 8192, 34.0, 17.0, 20.0), (4096, 6144, 18.0, 12.0, 11.0),
                                              (6144, 2048, 9.0, 8.0, 10.0)]:
        rows += [gemm_row("torch-bf16", 16, n, k, bf16_us), gemm_row("triton-w4a16", 16, n, k, triton_us),
                 gemm_row("cuda-w4a16", 16, n, k, cuda_us)]
    rows += [gemm_row("torch-bf16", 1, 8192, 8192, 34.0), gemm_row("cuda-w4a16", 1, 8192, 8192, 17.0),
             gemm_row("triton-w4a16", 1, 8192, 8192, 20.0)]
    table = gemm.fastest_fp4_per_m(gemm.gemm_results(run_with(tmp_path, rows)))
    at16 = table[table["m"] == 16]
    assert list(at16["backend"]) == ["cuda-w4a16"] and list(at16["cases won"]) == ["2 of 3"]
    rows.append(gemm_row("triton-w4a16", 16, 6144, 2048, 9.0, fmt="mxfp4"))  # a 4th case, triton's
    rows.append(gemm_row("cuda-w4a16", 16, 6144, 2048, 9.5, fmt="mxfp4"))
    rows.append(gemm_row("torch-bf16", 16, 6144, 2048, 9.9, fmt="mxfp4"))
    table = gemm.fastest_fp4_per_m(gemm.gemm_results(run_with(tmp_path / "tie", rows)))
    at16 = table[table["m"] == 16]
    assert list(at16["backend"]) == ["cuda-w4a16", "triton-w4a16"] and set(at16["cases won"]) == {"2 of 4"}
    assert at16.iloc[1]["median speed-up vs bf16"] == pytest.approx(np.median([18.0 / 11.0, 9.9 / 9.0]))
    assert list(table[table["m"] == 1]["backend"]) == ["cuda-w4a16"]


def test_fp4labs_own_kernels_against_the_fastest_peer_with_the_aims_and_the_mma_floor(tmp_path):
    """Issue 13's yardstick: per point, fp4lab's fastest own kernel against the fastest of cuBLAS
    bf16, humming, tinygemm and gemlite (torch-fp8, faster still, is no peer: fp8 weights and
    MMAs); 1.5x is the aim up to M = 16, level up to 256, none above; where the bf16 MMAs at the
    measured peak outweigh the FP4 read, the findings say the bytes no longer set the time."""
    from fp4lab.chapters.ch01_gemm import peer_findings

    n = k = 8192
    rows = [gemm_row("torch-bf16", 1, n, k, 34.0), gemm_row("humming-w4a16", 1, n, k, 19.0),
            gemm_row("tinygemm-int4", 1, n, k, 20.0), gemm_row("torch-fp8", 1, n, k, 5.0),
            gemm_row("cuda-w4a16", 1, n, k, 10.0), gemm_row("triton-w4a16", 1, n, k, 20.0),
            gemm_row("torch-bf16", 16, n, k, 34.0), gemm_row("humming-w4a16", 16, n, k, 21.0),
            gemm_row("cuda-w4a16", 16, n, k, 16.0),
            gemm_row("torch-bf16", 256, n, k, 48.0), gemm_row("humming-w4a16", 256, n, k, 58.0),
            gemm_row("triton-w4a16", 256, n, k, 72.0),
            gemm_row("torch-bf16", 1024, n, k, 170.0), gemm_row("triton-w4a16", 1024, n, k, 430.0)]
    results = gemm.gemm_results(run_with(tmp_path, rows))
    table = gemm.own_against_peers(results).set_index("m")
    assert list(table["own"]) == ["cuda-w4a16", "cuda-w4a16", "triton-w4a16", "triton-w4a16"]
    assert list(table["peer"]) == ["humming-w4a16", "humming-w4a16", "torch-bf16", "torch-bf16"]
    assert table.loc[1, "speedup"] == pytest.approx(1.9) and table.loc[256, "speedup"] == pytest.approx(48 / 72)
    peak = results.measured.peak_tflops["bf16"]        # cuBLAS at M = 1024 raised the probe's 800 TFLOP/s
    assert peak == pytest.approx(2 * 1024 * n * k / 170e-6 / 1e12)
    mma_floor = 2 * 256 * n * k / (peak * 1e6)
    assert table.loc[256, "mma_floor_us"] == pytest.approx(mma_floor)
    assert table.loc[256, "peer_pct_mma"] == pytest.approx(100 * mma_floor / 48)
    assert table.loc[256, "read_floor_us"] == pytest.approx(
        roofline.gemm_bytes(256, n, k, "fp4", "nvfp4", "bf16") / 4e6)
    per_m = gemm.own_against_peers_per_m(table.reset_index()).set_index("m")
    assert list(per_m["aim"].fillna(0)) == [1.5, 1.5, 1.0, 0]
    assert list(per_m["at_aim"].iloc[:3]) == [1, 0, 0] and pd.isna(per_m.loc[1024, "at_aim"])
    assert list(per_m["mma_bound"]) == [False, False, True, True]
    said = [line.replace("\\", "") for line in peer_findings(per_m.reset_index())]
    assert said[0] == ("Up to M = 16 fp4lab's fastest kernel (`cuda-w4a16`) is 1.31-1.90x as fast as the fastest "
                       "peer: 1 of 2 points reach the 1.5x aim; short of it: 1 of 1 at M = 16 (1.31x).")
    assert "(`triton-w4a16`) runs at 0.667-0.667x its speed at M = 256: 0 of 1 points level." in said[1]
    assert said[2].startswith("From M = 256 a weight-only FP4 GEMM's bf16 MMAs")
    assert f"take {text.ratio(per_m.loc[256, 'mma_over_read'])} its FP4 weight read" in said[2]
    assert (f"`torch-bf16`, runs them at {text.pct(100 * mma_floor / 48)} of that peak, fp4lab's `triton-w4a16` "
            f"at {text.pct(100 * mma_floor / 72)}") in said[2]


# -- decode -----------------------------------------------------------------------------------------

def test_memory_bound_verdict_counts_the_weights_the_path_reads(tmp_path):
    run = run_with(tmp_path, glm5_gemm_rows("torch-bf16", DECODE_MS))
    d = decode.diagnose(run, decode.DiagnosisConfig(steps=8))
    path = d.chosen
    experts = d.load["active_experts"]
    bf16_bytes = experts * 2 * (4096 * 6144 + 6144 * 2048)
    assert path["path"] == "torch-bf16 loop" and path["memory_floor_us"] == pytest.approx(bf16_bytes / 4e6)
    assert path["layer_us"] == pytest.approx(experts * 2 * 10.0)            # 16 tokens/expert: 10 us each
    assert path["launch_floor_us"] == pytest.approx(2 * experts * 2.0)
    assert d.verdict["verdict"] == "memory-bound" and not d.verdict["kernel_limited"]
    assert d.verdict["explained"] == pytest.approx(path["memory_floor_us"] / path["layer_us"])


def test_a_path_far_above_its_memory_floor_is_called_kernel_limited_with_a_bound_lever(tmp_path):
    """The verdict's bold words said "memory-bound" while its sentence said "not HBM": far above
    the floor, the bold words name the kernel, and the copy-bandwidth kernel is a lever (a bound)."""
    from fp4lab.chapters import ch04_diagnosis as words

    slow = {m: 4 * us for m, us in DECODE_MS.items()}                   # 4x the times above
    d = decode.diagnose(run_with(tmp_path, glm5_gemm_rows("torch-bf16", slow)), decode.DiagnosisConfig(steps=8))
    assert d.verdict["floor"] == "memory" and d.verdict["explained"] < decode.KERNEL_GAP and d.verdict["kernel_limited"]
    sentence = words.verdict_sentence(d)
    assert "**kernel-limited above its memory floor**. Its fastest measured path" in sentence
    gigabytes = text.sig(d.chosen["weight_bytes"] / 1e9)              # the bytes the floor reads
    assert f"; its largest floor, reading its {gigabytes} GB of active " in sentence
    assert (f"TB/s, takes {text.us(d.verdict['floor_us'])} "
            f"({text.pct(100 * d.verdict['explained'])} of that).") in sentence
    assert "**memory-bound**" not in sentence and "hardware counters" in words.kernel_time_sentence(d)
    assert d.chosen_anatomy is None
    bound = d.levers[d.levers["basis"] == decode.BOUND].iloc[0]
    assert bound["gain"] == pytest.approx(1 / d.verdict["explained"]) and bound["from_path"]
    assert words.lever_lines(d, from_path=True)[0].startswith(text.md(f"{d.chosen['path']} at its weight-read floor: "))
    assert bound["kind"] == "bound"
    assert bound["with_us"] == pytest.approx(d.chosen["memory_floor_us"])


def test_launch_bound_when_every_gemm_costs_about_a_launch(tmp_path):
    tiny = {m: 2.1 for m in DECODE_MS}
    rows = [gemm_row("torch-bf16", m, n, k, us) for (n, k) in ((4096, 6144), (6144, 2048)) for m, us in tiny.items()]
    run = run_with(tmp_path, rows, measured={**MEASURED, "bandwidth_tbps": 400.0})
    d = decode.diagnose(run, decode.DiagnosisConfig(steps=8))
    assert d.verdict["verdict"] == "launch-bound" and d.verdict["explained"] == pytest.approx(2.0 / 2.1)


def test_power_bound_overrides_the_floors_and_is_judged_at_the_decode_point(tmp_path):
    rows = [gemm_row("torch-bf16", m, n, k, 10.0, avg_power_w=680.0 if m <= 32 else 200.0)
            for (n, k) in ((4096, 6144), (6144, 2048)) for m in DECODE_MS]
    rows += [gemm_row("torch-bf16", 4096, 6144, 2048, 300.0, avg_power_w=699.0)]
    d = decode.diagnose(run_with(tmp_path, rows), decode.DiagnosisConfig(steps=8))
    assert d.decode_power["m_values"] == [16] and d.decode_power["avg_power_w"] == 680.0
    assert d.verdict["verdict"] == "power-bound"
    assert decode.decode_m_values([1, 8, 16, 32, 64], 16.0, 28.0) == [16]
    assert decode.decode_m_values([1, 8, 64], 16.0, 28.0) == [8]


def test_the_fastest_path_is_diagnosed_and_a_measured_loop_supersedes_the_built_one(tmp_path):
    gemm_rows = glm5_gemm_rows("torch-bf16", DECODE_MS) + glm5_gemm_rows("torch-fp8", {m: 9.0 for m in DECODE_MS})
    moe_rows = [moe_row(method, g, 512, us, gemm_backend=backend)
                for method, us, backend in (("loop-bf16", 3000.0, "torch-bf16"), ("grouped-fp8", 1500.0, None))
                for g in ("gate_up", "down")]
    moe_rows = [r if r["method"] != "grouped-fp8" else {**r, "weight_dtype": "fp8", "math_dtype": "fp8",
                                                         "act_dtype": "fp8"} for r in moe_rows]
    d = decode.diagnose(run_with(tmp_path, gemm_rows, moe_rows), decode.DiagnosisConfig(steps=8))
    paths = list(d.paths["path"])
    assert paths[0] == "grouped-fp8" and d.chosen["layer_us"] == 3000.0
    assert "torch-bf16 loop" not in paths and "loop-bf16" in paths and "torch-fp8 loop" in paths
    lever = d.levers[d.levers["lever"].str.startswith("grouped-fp8 instead of")].iloc[0]
    assert lever["gain"] == pytest.approx(6000.0 / 3000.0)
    with pytest.raises(ParameterError, match="backend='magic'"):
        decode.diagnose(run_with(tmp_path / "b", gemm_rows, moe_rows), decode.DiagnosisConfig(backend="magic"))


def test_layer_times_are_the_one_number_both_moe_chapters_state(tmp_path):
    moe_rows = [moe_row("loop-bf16", g, b, us, gemm_backend="torch-bf16") for b, us in ((256, 2000.0), (512, 3000.0))
                for g in ("gate_up", "down")]
    moe_rows += [moe_row("grouped-bf16", g, 512, 1000.0) for g in ("gate_up", "down")]
    moe_rows += [moe_row("half-a-layer", "down", 512, 1.0)]
    run = run_with(tmp_path, glm5_gemm_rows("torch-bf16", DECODE_MS), moe_rows)
    table = moe.layer_times(moe.moe_results(run, "glm-5"), 600).set_index("method")
    assert table.loc["grouped-bf16", "layer_us"] == 2000.0 and table.loc["grouped-bf16", "speedup_vs_loop"] == 3.0
    assert "half-a-layer" not in table.index                    # a layer time needs both GEMMs
    d = decode.diagnose(run, decode.DiagnosisConfig(steps=8, decode_batch=600))
    diagnosed = d.paths.set_index("path")
    assert diagnosed.loc["grouped-bf16", "layer_us"] == table.loc["grouped-bf16", "layer_us"]


def test_a_floor_above_the_layer_marks_the_verdict_unreliable(tmp_path):
    rows = glm5_gemm_rows("torch-bf16", {m: 0.01 for m in DECODE_MS})
    d = decode.diagnose(run_with(tmp_path, rows), decode.DiagnosisConfig(steps=8))
    assert d.verdict["reliable"] is False


def test_missing_tables_are_named_and_a_smoke_run_issues_no_verdict(tmp_path):
    run = run_with(tmp_path, [gemm_row("torch-bf16", 1, 256, 512, 40.0)], device=CPU)
    d = decode.diagnose(run, decode.DiagnosisConfig(steps=8))
    assert d.smoke and d.verdict is None
    assert any("MoE sweep" in source for source in d.missing)


def test_nearest_measured_shape_is_used_and_said(tmp_path):
    rows = [gemm_row("torch-bf16", m, 4000, 6000, 10.0) for m in DECODE_MS] + \
           [gemm_row("torch-bf16", m, 6144, 2048, 5.0) for m in DECODE_MS]
    d = decode.diagnose(run_with(tmp_path, rows), decode.DiagnosisConfig(steps=8))
    assert "nearest measured shape 4000x6000 for gate_up" in d.chosen["note"]


@pytest.mark.parametrize("field, value, named", [
    ("decode_batch", 0, "decode_batch"), ("steps", -1, "steps"), ("preset", "llama", "llama"),
    ("routing", "gauss", "routing"), ("power_bound_fraction", 1.5, "power_bound_fraction"),
    ("decode_batch", True, "decode_batch"), ("steps", float("nan"), "steps")])
def test_bad_diagnosis_parameters_name_themselves(field, value, named):
    with pytest.raises(ParameterError, match=named):
        decode.DiagnosisConfig(**{field: value}).check()


def test_a_trace_routing_is_checked_with_the_config(tmp_path):
    """A missing or malformed trace is one ParameterError from check(), not a ValueError from
    deep inside the diagnosis; one recorded at another batch is fine (the models regroup it)."""
    from fp4lab.moe import presets

    model = presets.get("glm-5")
    fits = tmp_path / "fits.npy"
    np.save(fits, np.tile(np.arange(model.top_k), (8, 4, 1)))          # [steps, batch, top_k]
    (tmp_path / "garbage.npy").write_text("not an array\n")
    np.save(tmp_path / "wrong-k.npy", np.tile(np.arange(model.top_k + 1), (8, 4, 1)))
    for batch in (4, 5):
        config = decode.DiagnosisConfig(routing=f"trace:{fits}", decode_batch=batch, steps=8).check()
        assert config.routing == f"trace:{fits}"
    for name, problem in (("missing.npy", "no such file"), ("garbage.npy", "not a readable .npy"),
                          ("wrong-k.npy", f"expected top_k={model.top_k}")):
        with pytest.raises(ParameterError, match=f"routing: routing trace .*{name}: .*{problem}") as caught:
            decode.DiagnosisConfig(routing=f"trace:{tmp_path / name}", decode_batch=4, steps=8).check()
        assert "\n" not in str(caught.value)


def test_the_what_ifs_model_a_trace_at_every_batch_and_degree(tmp_path):
    """what_if_concurrency (B/4 .. 4B) and what_if_ep (P x B tokens) used to fail on a trace
    recorded at B: its tokens are regrouped, and at B itself the trace is replayed as recorded."""
    from fp4lab.moe import presets, routing

    model = presets.get("glm-5")
    rng = np.random.default_rng(3)
    ids = np.stack([np.stack([rng.choice(model.experts, model.top_k, replace=False) for _ in range(16)])
                    for _ in range(4)])                                  # [S=4, T=16, k]
    trace = tmp_path / "router.npy"
    np.save(trace, ids)
    spec = f"trace:{trace}"
    assert (routing.modelled_loads(spec, model.experts, model.top_k, 16, 4)
            == routing.expert_loads(spec, model.experts, model.top_k, 16, 4)).all()
    for batch in (4, 64):
        loads = routing.modelled_loads(spec, model.experts, model.top_k, batch, 4)       # [S, E]
        assert loads.shape == (4, model.experts) and (loads.sum(axis=1) == batch * model.top_k).all()
    results = gemm.gemm_results(run_with(tmp_path, glm5_gemm_rows("torch-bf16", DECODE_MS)))
    config = decode.DiagnosisConfig(preset="glm-5", routing=spec, decode_batch=16, steps=4,
                                    ep_degrees=(1, 2, 4)).check()
    batches = decode.what_if_concurrency(results, "torch-bf16", model, config)
    assert list(batches["batch"]) == [4, 8, 16, 32, 64]
    assert list(decode.what_if_ep(results, "torch-bf16", model, config)["ep"]) == [1, 2, 4]


def test_chapters_04_and_05_model_a_smoke_layer_with_the_same_gemm(tmp_path):
    """On a CPU smoke run the diagnosis's seed backend (chapter 04) and the layout study's
    (chapter 05, the scaled stand-in of the comm rows) are one choice: the fastest at the
    smallest M, here torch-fp8, not the bf16 baseline."""
    from fp4lab import schema
    from fp4lab.analysis import layouts

    run = make_run(tmp_path, "cpu-smoke", device=CPU)
    run.append_rows("gemm", [gemm_row(backend, m, 128, 256, us * m ** 0.5) for m in (1, 8, 64)
                             for backend, us in (("torch-bf16", 3.0), ("torch-fp8", 2.0))])
    run.append_rows("comm", [
        schema.blank_row("comm", run_id="cpu-smoke", op=op, world_size=2, tokens=tokens, hidden=64,
                         dtype="bf16", status="ok", median_us=10.0 + tokens,
                         **(dict(routing="uniform", top_k=2, experts=8) if op.startswith("all_to_all") else {}))
        for op in ("all_reduce", "send_recv", "all_to_all_dispatch", "all_to_all_combine")
        for tokens in (1, 8, 64)])
    study = layouts.study(run, None, "glm-5", [8, 32], 512)
    assert study.model.scaled and not study.why_not
    assert study.backend == decode.diagnose(run, decode.DiagnosisConfig(steps=8)).seed_backend == "torch-fp8"


def test_a_decode_only_kernel_does_not_time_the_layer_models(tmp_path):
    """cuda-w4a16 runs decode M only: read at its M = 16 for an expert parallelism rank's M = 128
    it would model a layer faster than anything measured there. The models take the fastest
    backend that ran every M; the decode kernel stays in chapter 01's tables."""
    rows = (glm5_gemm_rows("torch-bf16", DECODE_MS)
            + glm5_gemm_rows("cuda-w4a16", {1: 2.0, 8: 2.0, 16: 2.0}))
    results = gemm.gemm_results(run_with(tmp_path, rows))
    assert decode.every_m_backends(results.ok) == ["torch-bf16"]
    d = decode.diagnose(run_with(tmp_path / "d", rows), decode.DiagnosisConfig(steps=8))
    assert d.seed_backend == "torch-bf16" and set(d.seed["M"]) == set(DECODE_MS)


def test_expert_parallelism_aggregates_tokens_per_rank(tmp_path):
    d = decode.diagnose(run_with(tmp_path, glm5_gemm_rows("torch-bf16", DECODE_MS)), decode.DiagnosisConfig(steps=8))
    ep = d.ep.set_index("ep")
    assert ep.loc[8, "tokens_per_step"] == 8 * 512 and ep.loc[8, "active_experts"] == pytest.approx(32.0)
    assert ep.loc[8, "us_per_token"] < ep.loc[1, "us_per_token"] / 4
    assert np.isfinite(d.levers["gain"]).all()


def test_the_batch_lever_of_a_moe_sweep_path_is_its_own_measured_times():
    """The diagnosed path came from the MoE sweep, which measured it at every decode batch: the
    concurrency lever reads those times, not a GEMM-loop model of another backend."""
    from fp4lab.results import REFERENCE_ROOT, latest_gpu_run

    run = latest_gpu_run(REFERENCE_ROOT)
    d = decode.diagnose(run, decode.DiagnosisConfig.from_profile("full"))
    assert d.chosen["source"] == "MoE sweep" and d.concurrency_basis == decode.MEASURED_BATCHES
    now = d.concurrency[d.concurrency["batch"] == 512]
    assert float(now["layer_us"].iloc[0]) == pytest.approx(d.chosen["layer_us"])
    batch = d.levers[d.levers["lever"].str.startswith("batch ") & (d.levers["basis"] == decode.MEASURED_BATCHES)]
    assert len(batch) == 1 and d.chosen["path"] in batch["lever"].iloc[0]
    assert batch["now_us"].iloc[0] == pytest.approx(d.chosen["layer_us"] / 512)


def test_a_faster_method_at_another_batch_is_a_lever_with_its_memory_cost():
    """At B = 2048 the reference run's grouped fp8 (fp8 MMAs, twice the bf16 rate) beats every FP4
    weight-only kernel per token, which the path's own batch lever (cuda-w4a16-moe at 4096) hid:
    the lowest time per token of every method and batch is a lever, with what fp8 weights cost
    in memory."""
    from fp4lab.results import REFERENCE_ROOT, latest_gpu_run

    d = decode.diagnose(latest_gpu_run(REFERENCE_ROOT), decode.DiagnosisConfig.from_profile("full"))
    table = moe.layer_times_by_batch(d.moe, "uniform")
    per_token = table["layer_us"] / table["batch"]
    best = table.loc[per_token.idxmin()]
    assert best["method"] != d.chosen["path"]
    ratio = decode.expert_weight_bytes(d.moe.model, "fp8") / decode.expert_weight_bytes(
        d.moe.model, "fp4", d.chosen["fmt"])
    # the lever's own words carry its memory cost: the front page shows them without the basis
    # and how long each call then takes: the per-token gain lengthens the step
    call = text.us(float(best["layer_us"]))
    lever = d.levers[d.levers["lever"] == f"batch {int(best['batch'])} through {best['method']} "
                     f"(a call takes {call}; {ratio:.1f}x the weight memory)"]
    assert len(lever) == 1 and lever["from_path"].iloc[0] and lever["kind"].iloc[0] == "measured"
    assert lever["with_us"].iloc[0] == pytest.approx(per_token.min())
    assert lever["now_us"].iloc[0] == pytest.approx(d.chosen["layer_us"] / d.chosen["batch"])
    assert (best["method"], best["weight_dtype"], int(best["batch"])) == ("grouped-fp8", "fp8", 2048)
    assert lever["basis"].iloc[0].endswith(f"its fp8 weights take {ratio:.1f}x the FP4 weights' memory")


def test_the_timer_conditions_read_as_words():
    timer = {"repeats": 30, "cold_l2": True, "use_graph": True, "warmup_s": 0.5}
    assert gemm.timer_words(timer) == "30 repeats, cold L2 (copies rotated), CUDA-graph replay"
    assert gemm.timer_words({**timer, "cold_l2": False, "use_graph": False}) == \
        "30 repeats, L2 left warm, eager launches"
    assert gemm.timer_words(timer, on_gpu=False) == "30 repeats"


def test_the_ceilings_table_states_each_divisor_with_its_spec_and_how_it_was_measured(tmp_path):
    """The verdict divides by 4.24 TB/s and the launch floor; the book never said where they came
    from. Each ceiling: measured, spec, the probe's line, and a peak the run's best point raised."""
    measured = {**MEASURED, "details": {"bandwidth": "copy 1024 MiB ...", "launch": "one-element add ..."}}
    rows = [gemm_row("torch-bf16", 4096, 4096, 4096, 150.0)]
    table = gemm.ceilings_table(gemm.gemm_results(run_with(tmp_path, rows, measured=measured))).set_index("ceiling")
    assert table.loc["copy bandwidth (TB/s)", "measured"] == 4.0 and table.loc["copy bandwidth (TB/s)", "spec"] == 4.8
    assert table.loc["copy bandwidth (TB/s)", "how"] == "copy 1024 MiB ..."
    assert table.loc["launch floor (us)", "measured"] == 2.0
    assert "raised from the probe's 800.0" in table.loc["bf16 peak (TFLOP/s)", "how"]
    assert table.loc["fp8 peak (TFLOP/s)", "spec"] == 1979.0 and "fp4 peak (TFLOP/s)" not in table.index


def test_the_ep_lever_of_a_moe_sweep_path_is_its_own_busiest_rank_when_measured():
    """The reference run timed the diagnosed path's busiest rank at EP 8 and 8 x B tokens (call
    93): the expert-parallel lever reads those times (measured, on the path). Without them it is
    the GEMM-loop model of the seed backend, said so in its name."""
    import dataclasses

    from fp4lab.analysis import moe as moe_analysis
    from fp4lab.results import REFERENCE_ROOT, latest_gpu_run

    config = decode.DiagnosisConfig.from_profile("full")
    d = decode.diagnose(latest_gpu_run(REFERENCE_ROOT), config)
    assert d.ep_basis == decode.MEASURED_BATCHES
    ok = d.moe.ok
    mine = ok[(ok["method"] == d.chosen["path"]) & (ok["fmt"] == d.chosen["fmt"]) & (ok["batch"] == 4096)
              & (ok["ep"] == 8)]
    assert len(mine) == 1
    assert list(d.ep["ep"]) == [1, 8] and list(d.ep["tokens_per_step"]) == [512, 4096]
    assert d.ep["layer_us"].iloc[0] == pytest.approx(d.chosen["layer_us"])
    assert d.ep["layer_us"].iloc[1] == pytest.approx(float(mine["median_us"].iloc[0]))
    spread = moe_analysis.expert_parallel_times(d.moe, 512, config.routing)
    row = spread[(spread["method"] == d.chosen["path"]) & (spread["fmt"] == d.chosen["fmt"])].iloc[0]
    on_path = d.levers["lever"].str.startswith("expert parallelism") & ~d.levers["lever"].str.contains(" through ")
    lever = d.levers[on_path].iloc[0]
    assert d.chosen["path"] in lever["lever"] and lever["from_path"] and lever["kind"] == "measured"
    assert lever["gain"] == pytest.approx(row["gain"])               # chapter 03's table, one number
    # at 8 x the tokens an expert another kernel spreads fastest: its own lever, chapter 03's number
    fastest = moe_analysis.fastest_spread(d.moe, 512, config.routing)
    assert (fastest["spread"]["method"], fastest["spread"]["fmt"]) != (d.chosen["path"], d.chosen["fmt"])
    through = d.levers[d.levers["lever"].str.startswith("expert parallelism") & d.levers["lever"].str.contains(
        " through ")].iloc[0]
    assert fastest["spread"]["method"] in through["lever"] and through["kind"] == "measured"
    assert through["gain"] == pytest.approx(fastest["gain"]) and through["from_path"]
    # without the rank at 8 x B the lever falls back to the model, named as such
    frame = d.moe.frame
    without = dataclasses.replace(d.moe, frame=frame[~((frame["ep"] == 8) & (frame["batch"] == 4096))])
    assert decode.measured_ep(without, d.chosen, config).empty
    modelled = decode.levers(d.paths, d.chosen, d.fp4, d.concurrency,
                             decode.what_if_ep(d.gemm, d.seed_backend, d.moe.model, config), d.graphs, 512,
                             concurrency_basis=d.concurrency_basis, backend=d.seed_backend)
    lever = modelled[modelled["lever"].str.startswith("expert parallelism")].iloc[0]
    assert f"a {d.seed_backend} GEMM loop" in lever["lever"] and lever["kind"] == "modelled"


def test_the_bf16_lever_and_the_fp4_sentence_state_one_baseline():
    """The diagnosed FP4 path's gain over bf16 is stated against the fastest bf16 path, in the
    levers as in the FP4 sentence: one number, not 3.2x in one place and 2.1x in another."""
    from fp4lab.results import REFERENCE_ROOT, latest_gpu_run

    d = decode.diagnose(latest_gpu_run(REFERENCE_ROOT), decode.DiagnosisConfig.from_profile("full"))
    lever = d.levers[d.levers["lever"].str.contains("instead of the fastest bf16 path")].iloc[0]
    assert d.fp4["bf16"]["path"] in lever["lever"]
    assert lever["gain"] == pytest.approx(d.fp4["bf16"]["layer_us"] / d.chosen["layer_us"])


# -- the fused MoE's anatomy --------------------------------------------------------------------------

def test_the_fused_anatomy_reads_each_build_against_the_floor_and_the_build_before(tmp_path):
    run = fused_anatomy_run(tmp_path, {"full": 1800.0, "load": 1250.0, "decode": 1400.0})
    run.append_rows("moe_anatomy", [moe_anatomy_row("load", None, preset="deepseek-v3", status="error",
                                                    error="not this preset's")])
    row = moe.fused_anatomy(moe.moe_results(run, "glm-5")).iloc[0]
    assert (row["method"], row["fmt"], row["batch"]) == ("cuda-w4a16-moe", "nvfp4", 512)
    assert row["read_floor_us"] == pytest.approx(1000.0) and row["load_rate_pct"] == pytest.approx(80.0)
    assert row["decode_added_us"] == pytest.approx(150.0) and row["mma_added_us"] == pytest.approx(400.0)
    assert row["load_share"] == pytest.approx(100 * 1250 / 1800)
    assert row["layer_us"] == 1850.0 and row["layer_apart_pct"] == pytest.approx(100 * 50 / 1850)
    zipf = moe_row("cuda-w4a16-moe", "layer", 512, 9000.0, weight_dtype="fp4", kind="layer", fmt="nvfp4",
                   weight_bytes=4e9)
    run.append_rows("moe", [{**zipf, "routing": "zipf:1.2"}])
    assert moe.fused_anatomy(moe.moe_results(run, "glm-5")).iloc[0]["layer_us"] == 1850.0   # not zipf's


def test_the_fused_anatomy_sets_the_math_without_the_weights_against_the_loads(tmp_path):
    """The compute build (the call without its weights' read) against the loads alone: as long or
    longer (>= 90%) bounds the call whatever the overlap; shorter leaves the loads as the bound;
    without one, the columns say nothing (NaN, not bound)."""
    for compute, bound in ((1400.0, True), (1150.0, True), (900.0, False)):
        run = fused_anatomy_run(tmp_path / str(compute), {"full": 1800.0, "load": 1250.0,
                                                          "decode": 1400.0, "compute": compute})
        row = moe.fused_anatomy(moe.moe_results(run, "glm-5")).iloc[0]
        assert row["compute"] == compute and row["math_to_load"] == pytest.approx(compute / 1250.0)
        assert bool(row["math_bound"]) is bound
        assert row["overlapped_us"] == max(1250.0, compute)
        assert row["mma_added_us"] == pytest.approx(400.0)      # the stages before it unchanged
    row = moe.fused_anatomy(moe.moe_results(
        fused_anatomy_run(tmp_path / "old", {"full": 1800.0, "load": 1250.0, "decode": 1400.0}), "glm-5")).iloc[0]
    assert np.isnan(row["compute"]) and np.isnan(row["overlapped_us"]) and not row["math_bound"]


def test_one_list_of_fused_stages_from_the_kernel_to_the_figure():
    """The sweep dissects the fused kernel's own stages (the schema's), each one the analysis reads
    and the figure draws, with a legend name."""
    from fp4lab import schema
    from fp4lab.backends.moe.cuda_fused import MOE_STAGES
    from fp4lab.plots.moe import FUSED_STAGE_LABELS

    stages = schema.MOE_ANATOMY_METHODS["cuda-w4a16-moe"]
    assert set(stages) <= set(MOE_STAGES)
    assert set(stages) == set(moe.FUSED_STAGES) | {moe.MATH_STAGE} == set(FUSED_STAGE_LABELS)


def test_an_undissected_run_says_why_from_its_rows(tmp_path):
    run = fused_anatomy_run(tmp_path, {"full": None, "load": None}, status="unavailable", error="no CUDA GPU")
    results = moe.moe_results(run, "glm-5")
    assert moe.fused_anatomy(results).empty and moe.fused_anatomy_reason(results) == "no CUDA GPU"
    bare = moe.moe_results(run_with(tmp_path / "bare", glm5_gemm_rows("torch-bf16", DECODE_MS)), "glm-5")
    assert moe.fused_anatomy(bare).empty and moe.fused_anatomy_reason(bare) == "not measured"



def test_the_kernel_time_sentence_says_what_the_diagnosed_calls_own_builds_measured(tmp_path):
    """The front page's "what would fix it" read "a kernel that streamed these weights at the copy
    bandwidth" while chapter 03 showed the loads already at it: where the diagnosed call was
    dissected, the sentence states its builds (the same row chapter 03 reads) and what they say."""
    from fp4lab.chapters import ch04_diagnosis as words

    def diagnosed(root, builds):
        run = fused_anatomy_run(root, builds)
        run.append_rows("gemm", glm5_gemm_rows("torch-bf16", DECODE_MS))
        d = decode.diagnose(run, decode.DiagnosisConfig(steps=8))
        assert d.chosen["path"] == "cuda-w4a16-moe" and d.verdict["kernel_limited"]
        return d, words.kernel_time_sentence(d)

    builds = {"full": 1800.0, "load": 1250.0, "decode": 1400.0}
    d, sentence = diagnosed(tmp_path / "old", builds)
    assert d.chosen_anatomy["load"] == 1250.0 and d.chosen_anatomy["fmt"] == d.chosen["fmt"]
    # the parts add up to the whole the worker timed: 1.25 + 0.15 + 0.40 = 1.80 ms
    # and the time above the loads there (550 us), which the layer table's time above the floor is not
    assert (f"took 1.80 ms there ({text.us(d.chosen['layer_us'])} in the table of methods), of which its loads alone "
            "take 1.25 ms (the weights at 80% of the copy bandwidth: 250 us over the floor), and the decode adds +150 us and the MMAs +400 us "
            "that the loads do not hide") in sentence
    # without its math alone, the verdict can say only where the fix is
    assert "The fix is in the kernel, not HBM: at that floor the layer would run" in words.verdict_sentence(d)
    assert "did not time them without the weights' read" in sentence and "copy bandwidth would" not in sentence
    bound_lever = d.levers[d.levers["kind"] == "bound"].iloc[0]      # no math build: the plain bound
    assert bound_lever["lever"] == "cuda-w4a16-moe at its weight-read floor" and bound_lever["basis"] == decode.BOUND
    d, sentence = diagnosed(tmp_path / "bound", {**builds, "compute": 1400.0})
    assert "they alone take 1.40 ms, 1.12x the loads" in sentence
    assert "could not go below 1.40 ms in that worker" in sentence
    # the prescription is the verdict's, stated once
    assert "fewer instructions per weight" in words.verdict_sentence(d) and "fewer instructions" not in sentence
    # the verdict states the worker's ratio, not its times: the table's call took another process's
    assert "its decode and MMAs take 1.12x as long as its loads alone." in words.verdict_sentence(d)
    assert "1.40 ms" not in words.verdict_sentence(d)
    # the floor lever then says what reaching it needs, and why: overlap alone cannot
    bound_lever = d.levers[d.levers["kind"] == "bound"].iloc[0]
    assert bound_lever["lever"] == "cuda-w4a16-moe at its weight-read floor (needs fewer instructions per weight)"
    assert bound_lever["basis"] == (decode.BOUND + "; its math alone (no weight read) takes 1.12x as long as its loads alone "
                                    "(chapter 03's dissection)")
    d, sentence = diagnosed(tmp_path / "hidden", {**builds, "compute": 900.0})
    assert "hidden under the loads, the layer would take about the loads' 1.25 ms" in sentence
    assert "The fix is **its decode and MMAs hidden under its loads**" in words.verdict_sentence(d)
    assert d.levers[d.levers["kind"] == "bound"].iloc[0]["lever"] == "cuda-w4a16-moe at its weight-read floor"
    d, sentence = diagnosed(tmp_path / "bare", {})
    assert d.chosen_anatomy is None and "chapter 01, the anatomy of fp4lab's own kernels" in sentence


def test_a_dissected_path_without_its_own_math_build_cites_the_other_formats(tmp_path):
    """Call 122 re-measured NVFP4 only: the diagnosed MXFP4 call has no compute build, the NVFP4
    one at the same batch has. Chapters 04 and 03 say so instead of "this run did not time them"."""
    from fp4lab.chapters import ch03_moe
    from fp4lab.chapters import ch04_diagnosis as words

    run = fused_anatomy_run(tmp_path, {"full": 1800.0, "load": 1250.0, "decode": 1400.0, "compute": 1400.0})
    run.append_rows("moe", [moe_row("cuda-w4a16-moe", "layer", 512, 1700.0, weight_dtype="fp4", kind="layer",
                                    fmt="mxfp4", weight_bytes=4e9)])
    run.append_rows("moe_anatomy", [moe_anatomy_row(stage, us, fmt="mxfp4") for stage, us in
                                    (("full", 1750.0), ("load", 1200.0), ("decode", 1300.0))])
    run.append_rows("gemm", glm5_gemm_rows("torch-bf16", DECODE_MS))
    d = decode.diagnose(run, decode.DiagnosisConfig(steps=8))
    assert d.chosen["fmt"] == "mxfp4" and np.isnan(d.chosen_anatomy["compute"])
    other = d.chosen_anatomy["math_elsewhere"]
    assert other == {"fmt": "nvfp4", "compute": 1400.0, "load": 1250.0,
                     "math_to_load": pytest.approx(1400 / 1250), "math_bound": True}
    sentence = words.kernel_time_sentence(d)
    assert ("Timed without the weights' read (NVFP4 weights only), the decode and MMAs alone take 1.40 ms, 1.12x "
            "the NVFP4 loads alone (1.25 ms)") in sentence
    assert "could not go much below its math" in sentence and "did not time them" not in sentence
    assert "without the weight read (NVFP4) its decode and MMAs take 1.12x as long" in words.verdict_sentence(d)
    table = moe.fused_anatomy(moe.moe_results(run, "glm-5"))
    assert moe.math_in_other_format(table, table[table["fmt"] == "nvfp4"].iloc[0]) is None   # has its own
    lead = " ".join(ch03_moe.fused_anatomy_findings(table, 512))
    assert "At B=512 (mxfp4)" in lead and "without the weights' read only in nvfp4 (its line below): 1.40 ms" in lead


@pytest.mark.parametrize("value, shown", [(1.0519, "1.05x"), (1.12, "1.12x"), (0.95, "0.950x"), (0.64, "0.64x"),
                                          (1.5, "1.5x"), (float("nan"), "—")])
def test_a_ratio_read_against_one_keeps_its_margin(value, shown):
    """The dissected kernel's math took 1.05x its loads; two digits printed '1.1x', a 5% margin
    read as 10% beside an 8% spread between two workers (a reader's stumble)."""
    from fp4lab import text

    assert text.ratio_to_one(value) == shown
