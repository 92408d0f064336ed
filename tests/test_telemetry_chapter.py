"""Chapter 02's data, findings and figures, on run folders sampled through the fake NVML."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pytest

from fakes.nvml import FakeNvml
from fp4lab import telemetry
from fp4lab.results import RunDir
from fp4lab.telemetry import summary
from fp4lab.telemetry.energy import EnergyWindowConfig

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "02_power_clocks.ipynb"


def fake_sweep_run(runs_dir: Path, monkeypatch, power_w=(120.0, 450.0)) -> Path:
    """A run folder as the sweep writes it, measured with the real sampler on a fake NVML."""
    fake = FakeNvml(power_w=power_w[0], clock_event_bits=0x4, energy_start_mj=10**9)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    run = RunDir.create(runs_dir, run_id="fake-h200")
    run.update_run_json(None, {"provenance": {"device": {"name": "Fake H200", "kind": "cuda"}}})
    config = EnergyWindowConfig(idle_seconds=0.1, batch_seconds=0.002)
    rows = []
    with telemetry.Sampler(rate_hz=50) as sampler:
        for m, watts in zip((1, 4096), power_w):
            fake.power_w = watts
            window = telemetry.measure_energy_window(lambda: time.sleep(0.0002), 0.1, idle_power_w=80.0,
                                                     synchronize=lambda: None, config=config)
            flops = 2 * m * 6144 * 2048
            rows.append({"run_id": run.run_id, "backend": "torch-bf16", "fmt": "bf16", "m": m, "n": 6144,
                         "k": 2048, "status": "ok", "tflops": 1.0,
                         "tflops_per_w": telemetry.tflops_per_watt(flops, window["energy_per_call_j"]),
                         **{k: window[k] for k in ("avg_power_w", "energy_per_call_j", "sm_clock_mhz",
                                                   "throttle_reasons", "window_start_s", "window_end_s")}})
    run.append_rows("gemm", rows)
    run.append_rows("telemetry", sampler.frame.to_dict("records"))
    run.update_run_json("telemetry", sampler.metadata())
    monkeypatch.delitem(sys.modules, "pynvml")
    return run.path


def test_findings_are_computed_from_the_run(tmp_path, monkeypatch):
    power = summary.read_run_power(fake_sweep_run(tmp_path, monkeypatch))
    assert power.has_telemetry and power.power_limit_w == 700.0 and power.gpu == "Fake H200"
    text = " ".join(summary.power_findings(power))
    small = power.points.loc[power.points["m"] == 1, "avg_power_w"].iloc[0]
    assert small == pytest.approx(120.0, rel=0.15)
    assert f"At M <= 64 the GPU draws {small:.0f} W (median of 1 point) ({100 * small / 700:.0f}% of its 700 W limit)" in text
    assert "sw_power_cap in 100%" in text
    assert "At M = 4096" in text and "TFLOPS/W" in text


def test_figures_draw_from_a_run(tmp_path, monkeypatch):
    from fp4lab.plots import power as power_plots

    power = summary.read_run_power(fake_sweep_run(tmp_path, monkeypatch))
    for draw in (power_plots.power_timeline, power_plots.clock_timeline, power_plots.power_per_point,
                 power_plots.throttle_reasons_chart):
        fig = draw(power)
        assert fig.axes and any(ax.lines or ax.patches for ax in fig.axes)
    timeline = power_plots.power_timeline(power).axes[0]
    assert any(line.get_label().startswith("enforced limit 700") for line in timeline.lines)


def test_chapter_parameters_are_checked(tmp_path):
    good = dict(sample_rate_hz=20.0, duration_s=5.0, device="auto", profile="smoke", run_dir="",
                reference_dir="")
    summary.check_chapter_parameters(**good)
    for bad, message in [({"sample_rate_hz": -1}, "sample_rate_hz"), ({"duration_s": 0}, "duration_s"),
                         ({"device": "tpu"}, "device 'tpu'"), ({"profile": "huge"}, "profile"),
                         ({"run_dir": str(tmp_path / "missing")}, "run_dir"),
                         ({"reference_dir": str(tmp_path)}, "reference_dir")]:
        with pytest.raises(ValueError, match=message):
            summary.check_chapter_parameters(**{**good, **bad})


def test_cpu_run_says_there_is_no_gpu_telemetry(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = RunDir.create(tmp_path, run_id="cpu")
    power, note = summary.obtain_run_power(str(run.path), 20.0, 1.0, "auto")
    assert "No GPU telemetry exists on this machine" in note
    assert "no NVML" in summary.power_findings(power)[0]


@pytest.mark.slow
def test_notebook_runs_on_cpu_and_shows_the_reference(tmp_path, monkeypatch):
    reference = fake_sweep_run(tmp_path / "reference", monkeypatch)
    run = RunDir.create(tmp_path / "runs", run_id="cpu-run")
    out = tmp_path / "out.ipynb"
    subprocess.run([sys.executable, "-m", "papermill", "-k", "fp4lab", str(NOTEBOOK), str(out),
                    "-p", "run_dir", str(run.path), "-p", "reference_dir", str(reference),
                    "-p", "device", "cpu"], check=True, capture_output=True, timeout=300)
    cells = json.loads(out.read_text())["cells"]
    text = json.dumps([c.get("outputs", []) for c in cells])
    assert "No GPU telemetry exists on this machine" in text
    assert "Reference run fake-h200" in text and "At M <= 64 the GPU draws" in text
    assert text.count("image/png") == 4  # timeline, clock, per point, throttle reasons of the reference
