"""Chapter 01's figures and tables on a small synthetic gemm table (no sweep needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fp4lab.plots import gemm as gemm_plots  # noqa: E402
from fp4lab.results import GEMM_COLUMNS  # noqa: E402

CEILINGS = {"measured": {"bandwidth_tbps": 4.0, "peak_tflops": {"bf16": 700.0}, "launch_us": 1.3,
                         "source": "measured"},
            "spec": {"bandwidth_tbps": 4.8, "peak_tflops": {"bf16": 989.0}, "launch_us": 2.0,
                     "source": "spec"}}


def row(backend, m, status="ok", tflops=None, n=64, k=128, **extra):
    values = dict.fromkeys(GEMM_COLUMNS)
    values.update(run_id="r", backend=backend, fmt="nvfp4", m=m, n=n, k=k, status=status, **extra)
    if tflops is not None:
        values.update(tflops=tflops, tbps=tflops / m, median_us=2 * m * n * k / tflops / 1e6,
                      pct_peak_spec=100 * tflops / 989, pct_peak_measured=100 * tflops / 700,
                      bound="memory" if m < 64 else "compute")
    return values


@pytest.fixture
def frame():
    rows = [row("fast", m, tflops=2.0 * m) for m in (1, 16, 256)]
    rows += [row("fast", m, tflops=2.2 * m, n=128) for m in (1, 16, 256)]
    rows += [row("slow", m, tflops=0.5 * m) for m in (1, 16, 256)]
    rows += [row("broken", m, "wrong_result", rel_err=1.0, error="scale x2") for m in (1, 16, 256)]
    rows += [row("absent", m, "unavailable", error="needs sm_100") for m in (1, 16, 256)]
    return pd.DataFrame(rows)


def test_availability_counts_and_reasons(frame):
    counts = gemm_plots.availability_counts(frame)
    assert counts.loc["fast", "ok"] == 6 and counts.loc["absent", "unavailable"] == 3
    reasons = gemm_plots.availability_reasons(frame).set_index("backend")
    assert reasons.loc["absent", "reason"] == "needs sm_100"
    assert reasons.loc["broken", "status"] == "wrong_result"


def test_seed_table_uses_the_fastest_backend_and_spans_shapes(frame):
    table = gemm_plots.seed_table(frame)
    assert table.attrs["backend"] == "fast"
    assert list(table["M"]) == [1, 16, 256]
    assert table.loc[table["M"] == 16, "TFLOPS"].item() == "32-35.2"
    assert table.loc[table["M"] == 256, "regime"].item() == "compute"
    with pytest.raises(ValueError, match="backend"):
        gemm_plots.seed_table(frame, backend="broken")


def test_headline_numbers(frame):
    numbers = gemm_plots.headline(frame)
    assert numbers["backend"] == "fast" and numbers["small_m"] == 1
    assert numbers["small_tflops"] == pytest.approx(2.2)
    assert numbers["best_m"] == 256
    # 2.2 * M >= 350 (half of 700) first at M=256
    assert numbers["half_measured_m"] == 256
    assert numbers["unavailable"] == ["absent"]
    assert numbers["failing"] == {("broken", "wrong_result"): 3}


def test_roofs_are_min_of_bandwidth_and_peak():
    import numpy as np

    lines = gemm_plots.roofs(CEILINGS, np.array([1.0, 1000.0]))
    assert lines["measured bf16"].tolist() == [4.0, 700.0]
    assert lines["spec bf16"].tolist() == [4.8, 989.0]


def test_figures_draw(frame):
    import matplotlib.pyplot as plt

    info = {"run_id": "r", "provenance": {"device": {"name": "Test GPU"}}, "sweep": {}}
    figures = [gemm_plots.availability_matrix(frame, info),
               gemm_plots.tflops_vs_m(frame, info, reference=frame, reference_label="H200"),
               gemm_plots.pct_peak_vs_m(frame, info),
               gemm_plots.roofline_chart(frame, CEILINGS, info)]
    assert len(figures[1].axes) == 2                       # one panel per weight shape
    for figure in figures:
        plt.close(figure)
    with pytest.raises(ValueError, match="against"):
        gemm_plots.pct_peak_vs_m(frame, against="median")


def test_published_seed_table_carries_its_source():
    assert "RTX PRO 6000" in gemm_plots.SEED_SM120_SOURCE
    assert list(gemm_plots.SEED_SM120_TABLE["M"])[0] == "1"


def test_fp4_weights_at_decode_compares_the_fp4_reader_with_bf16_and_its_floor():
    rows = [{"backend": b, "fmt": "nvfp4", "m": m, "n": 6144, "k": 2048, "status": "ok", "median_us": t}
            for b, m, t in (("torch-bf16", 1, 9.0), ("triton-w4a16", 1, 12.0), ("emulated", 1, 300.0),
                            ("torch-fp8", 1, 5.0), ("torch-bf16", 64, 10.0), ("triton-w4a16", 64, 20.0))]
    table = gemm_plots.fp4_weights_at_decode(pd.DataFrame(rows), bandwidth_tbps=4.0)
    # torch-fp8 is faster but reads fp8 weights: only FP4 readers compete, at the smallest M
    assert table[["m", "fp4_backend", "fp4_us", "torch-bf16_us"]].values.tolist() == [[1, "triton-w4a16", 12.0, 9.0]]
    assert table["speedup"].iloc[0] == pytest.approx(0.75)
    fp4_bytes = 6144 * 1024 + 6144 * 128 + 4 + 2048 * 2 + 6144 * 2  # codes, e4m3 scales, global, a, out
    assert table["fp4_floor_us"].iloc[0] == pytest.approx(fp4_bytes / 4e6)
    sentence = gemm_plots.fp4_decode_finding(table)
    assert "slower than torch-bf16's 9 us (0.75x)" in sentence and "6144x2048 nvfp4" in sentence
    assert gemm_plots.fp4_decode_finding(gemm_plots.fp4_weights_at_decode(pd.DataFrame(rows[:1]), 4.0)) is None
