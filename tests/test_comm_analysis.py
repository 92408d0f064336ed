"""analysis.comm: comm curves from rows, the TP / TP x PP / EP step model, the verdict, and the
published figures with their sources."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp4lab import roofline
from fp4lab.analysis import comm as ac
from fp4lab.moe import presets, routing, stats

GLM5 = presets.get("glm-5")
REPO = Path(__file__).resolve().parents[1]


def comm_rows(us_of_size, world_sizes=(2, 4, 8), tokens=(1, 8, 64, 512), hidden=6144,
              routings=("uniform",)):
    """Synthetic ok rows for every op: median_us = us_of_size(message size)."""
    rows = []
    for op in ("all_reduce", "send_recv", "all_to_all_dispatch", "all_to_all_combine"):
        for n in world_sizes:
            for t in tokens:
                for spec in (routings if op.startswith("all_to_all") else (None,)):
                    top_k = 8 if spec else None
                    size = ac.message_size(op, t, hidden, "bf16", top_k)
                    rows.append(dict(op=op, world_size=n, tokens=t, hidden=hidden, top_k=top_k,
                                     dtype="bf16", routing=spec, status="ok",
                                     median_us=us_of_size(size)))
    return pd.DataFrame(rows)


def weight_read_us(n, k, m):
    """A memory-bound expert GEMM: its NVFP4 weights at 1 byte per microsecond per 1e6."""
    return n * k * 0.5625 / 1e6


def model(frame, gemm_us=weight_read_us, **kw):
    return ac.StepModel(GLM5, gemm_us, ac.CommTable(frame), **kw)


# -- comm curves ----------------------------------------------------------------------------------

def test_curve_interpolates_in_log_log_with_a_latency_floor_and_a_bandwidth_tail():
    curve = ac.CommCurve(np.array([100.0, 10_000.0]), np.array([10.0, 1000.0]))
    assert curve.time_us(100) == 10.0 and curve.time_us(10_000) == 1000.0
    assert curve.time_us(1000) == pytest.approx(100.0)   # straight line in log-log
    assert curve.time_us(1) == 10.0                      # below the smallest message: its latency
    assert curve.time_us(20_000) == pytest.approx(2000.0)


def test_table_reads_the_right_rows_and_says_what_it_lacks():
    frame = comm_rows(lambda size: size / 1e3, routings=("uniform", "zipf:0.7"))
    frame.loc[frame["routing"] == "zipf:0.7", "median_us"] *= 3
    table = ac.CommTable(frame)
    size = ac.message_size("all_to_all_dispatch", 8, 6144, "bf16", 8)
    uniform = table.time_us("all_to_all_dispatch", 8, size, "bf16", "uniform")
    assert table.time_us("all_to_all_dispatch", 8, size, "bf16", "zipf:0.7") == pytest.approx(3 * uniform)
    assert table.time_us("all_reduce", 1, 1e6) == 0.0            # one rank: nothing to send
    assert table.time_us("all_reduce", 16, 1e6) is None          # not measured
    assert table.time_us("all_to_all_dispatch", 8, size, "fp8", "uniform") is None


def test_failed_rows_are_not_read():
    frame = comm_rows(lambda size: 5.0)
    frame.loc[frame["op"] == "all_reduce", "status"] = "error"
    assert ac.CommTable(frame).time_us("all_reduce", 2, 100) is None


# -- layouts --------------------------------------------------------------------------------------

def test_layouts_of_eight_gpus():
    assert [l.label for l in ac.layouts_for(8)] == ["TP8", "TP4xPP2", "TP2xPP4", "TP1xPP8", "EP8"]
    assert [l.label for l in ac.layouts_for(1)] == ["TP1"]
    with pytest.raises(ValueError, match="EP is modelled alone"):
        ac.Layout(tp=2, ep=4)


def test_memory_bound_tp4_pp2_is_twice_as_slow_as_tp8():
    """The seed's observation: each PP stage reads its weights once per microbatch."""
    m = model(comm_rows(lambda size: 1e-6))
    table = ac.compare_layouts(m, 8, 1).set_index("layout")
    assert table.loc["TP4xPP2", "step_gemm_us"] == pytest.approx(2 * table.loc["TP8", "step_gemm_us"])
    assert table.loc["TP8", "vs_best"] == 1.0
    assert table.loc["TP4xPP2", "vs_best"] == pytest.approx(2.0, rel=1e-3)


def test_pp_step_is_layers_times_microbatch_layer_plus_one_send_per_stage():
    m = model(comm_rows(lambda size: 7.0))
    row = ac.layout_step(m, ac.Layout(tp=4, pp=2), 64)
    layer = ac.tp_layer_gemm(m, 32, 4).us + 7.0                  # microbatch of B/2, all-reduce
    assert row["step_us"] == pytest.approx(GLM5.moe_layers * layer + 2 * 7.0)
    assert row["stage_comm_us"] == pytest.approx(14.0)


def test_the_busiest_ep_rank_sets_the_layer_time():
    tokens = lambda n, k, m: float(m)                             # cost = tokens, per GEMM
    m = model(comm_rows(lambda size: 1e-6), gemm_us=tokens, routing="zipf:0.7", steps=4, seed=2)
    loads = routing.expert_loads("zipf:0.7", GLM5.experts, GLM5.top_k, 256, 4, 2)   # [S, E]
    busiest = stats.rank_loads(loads, 8).max(axis=1).mean()
    expected = 2 * busiest + 2 * GLM5.shared_experts * math.ceil(256 / 8)
    assert ac.ep_layer_gemm(m, 256, 8).us == pytest.approx(expected)


def test_a_layout_without_its_comm_has_no_time_and_says_why():
    frame = comm_rows(lambda size: 1.0, world_sizes=(2, 4))
    table = ac.compare_layouts(model(frame), 8, 16).set_index("layout")
    assert pd.isna(table.loc["TP8", "step_us"])
    assert table.loc["TP8", "missing"] == "all_reduce at 8 ranks"
    assert "all_to_all_dispatch at 8 ranks (bf16, uniform)" in table.loc["EP8", "missing"]
    assert table.loc["TP4xPP2", "missing"] == "send_recv at 8 ranks"
    verdict = ac.fastest_layout(table.reset_index())
    assert verdict["layout"] is None and "all_reduce at 8 ranks" in verdict["sentence"]


def test_verdict_names_the_fastest_its_margin_and_its_bound():
    spec = roofline.Ceilings(bandwidth_tbps=1.79, peak_tflops={"bf16": 500.0}, launch_us=None,
                             source="spec")
    m = model(comm_rows(lambda size: 20 + size / 40e3), gemm_us=ac.floor_gemm_time(spec),
              ceilings=spec)
    table = ac.compare_layouts(m, 8, 64)
    verdict = ac.fastest_layout(table)
    first, second = table.iloc[0], table.iloc[1]
    assert verdict["layout"] == first["layout"] and verdict["runner_up"] == second["layout"]
    assert verdict["margin"] == pytest.approx(second["step_us"] / first["step_us"])
    assert verdict["bound"] == "memory"                       # B=64 reads weights, little math
    assert verdict["sentence"].startswith(f"{first['layout']} is fastest at B=64")


def test_slow_links_make_the_step_communication_bound():
    m = model(comm_rows(lambda size: 5_000.0))
    row = ac.layout_step(m, ac.Layout(tp=8), 1)
    assert row["comm_share"] > 0.5 and row["bound"] == "communication"


def test_without_ceilings_the_gemm_part_is_not_called_memory_or_compute():
    row = ac.layout_step(model(comm_rows(lambda size: 1e-6)), ac.Layout(tp=2), 4)
    assert row["bound"] == "gemm"


def test_bad_batch_names_the_parameter():
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        ac.layout_step(model(comm_rows(lambda size: 1.0)), ac.Layout(tp=2), 0)


# -- published figures ----------------------------------------------------------------------------

def test_published_figures_carry_sources_that_resolve_in_the_repository():
    table = ac.published_comm_figures()
    assert set(table["op"]) == {"all_to_all_dispatch", "all_to_all_combine"}
    assert (table["us"] > 0).all() and table["source"].str.contains("docs/REFERENCES.md").all()
    references = (REPO / "docs" / "REFERENCES.md").read_text()
    for name in ("DeepEP low-latency", "pplx-kernels README", "DeepEP PR#173",
                 "benchmarks/MoE_benchmarks.md"):
        assert name in references, name
    pplx = table[table["source"].str.startswith("pplx") & (table["tokens"] == 128)]
    assert pplx.set_index("op")["us"].to_dict() == {"all_to_all_dispatch": 83.6,
                                                    "all_to_all_combine": 102.3}


def test_published_figures_sit_beside_the_run_at_the_same_point():
    frame = comm_rows(lambda size: 50.0, tokens=(1, 128), hidden=7168)
    frame.loc[frame["op"] == "all_to_all_dispatch", "dtype"] = "fp8"
    beside = ac.published_beside_measured(frame)
    pplx = beside[beside["source"].str.startswith("pplx")]
    assert (pplx["measured_us"] == 50.0).all()
    assert beside[beside["system"] == "B200"]["measured_us"].isna().all()   # hidden not published


def test_the_published_table_fits_a_page_and_shows_this_run_only_where_it_measured():
    from fp4lab.chapters.ch05_comm import published_table

    none_here = published_table(ac.published_beside_measured(comm_rows(lambda size: 50.0, tokens=(4,), hidden=64)))
    assert "this run measured none of these points" in none_here and ">this run</th>" not in none_here
    assert "(docs/REFERENCES.md)" not in none_here and "after the PR (before: 172 / 319 us)" in none_here
    frame = comm_rows(lambda size: 50.0, tokens=(1, 128), hidden=7168)
    here = published_table(ac.published_beside_measured(frame))
    assert ">this run</th>" in here and "measured none" not in here
