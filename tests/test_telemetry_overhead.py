"""benchmarks/telemetry_overhead.py: its rate-lowering logic, on CPU with a fake NVML and tiny GEMMs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from fakes.nvml import FakeNvml

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "telemetry_overhead.py"


def load_script(monkeypatch):
    spec = importlib.util.spec_from_file_location("telemetry_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "telemetry_overhead", module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def tiny(module, **overrides):
    return module.OverheadConfig(ms=(1, 4), shapes=((16, 32),), rounds=2, repeats=3, device="cpu",
                                 **overrides)


def test_overhead_rows_and_verdict(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    module = load_script(monkeypatch)
    monkeypatch.setattr(module, "SAMPLER_SETTLE_S", 0.0)
    lines = []
    result = module.measure_overhead(tiny(module, rates_hz=(20.0, 5.0)), echo=lines.append)
    assert result["sampler_available"]
    first = result["rates"][0]
    assert [(p["m"], p["n"], p["k"]) for p in first["points"]] == [(1, 16, 32), (4, 16, 32)]
    assert all(len(p["changes_pct"]) == 2 and p["median_us_without"] > 0 for p in first["points"])
    verdict = result["highest_rate_under_threshold_hz"]
    tried = [r["rate_hz"] for r in result["rates"]]
    # it stops at the first rate under 1%, or tries every rate and reports none
    assert (verdict == tried[-1] and abs(result["rates"][-1]["median_change_pct"]) < 1.0) or \
        (verdict is None and tried == [20.0, 5.0])
    assert lines[0].startswith("   20 Hz  M     1  N    16  K    32")


def test_without_nvml_it_says_why_and_measures_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(no_library=True))
    module = load_script(monkeypatch)
    lines = []
    result = module.measure_overhead(tiny(module), echo=lines.append)
    assert not result["sampler_available"] and result["rates"] == []
    assert "not measurable" in lines[0]


def test_cli_writes_json_and_rejects_bad_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(no_library=True))
    module = load_script(monkeypatch)
    out = tmp_path / "overhead.json"
    assert module.main(["--out", str(out), "--device", "cpu"]) == 0
    assert '"sampler_available": false' in out.read_text()
    assert module.main(["--out", str(out), "--device", "cpu", "--rounds", "1"]) == 2
    assert "--rounds" in capsys.readouterr().err
