"""benchmarks/h200_fp4_libraries.py end to end on the CPU, with the fake humming and gemlite:
every planned point becomes one JSON line (measured, failed with its cause, or skipped), and the
summary table comes last."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from fp4lab.backends.gemlite import GemliteW4A16
from fp4lab.backends.humming import HummingW4A16
from fp4lab.backends.moe.humming import HummingMoeLayer
from fakes import gemlite as fake_gemlite, humming as fake_humming

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "h200_fp4_libraries.py"
TINY = ["--device", "cpu", "--shapes", "64x128", "--m", "1,4", "--batches", "8,4",
        "--models", "glm-5,deepseek-v3", "--scaled"]


@pytest.fixture
def script(monkeypatch):
    fake_humming.install(monkeypatch)
    fake_gemlite.install(monkeypatch).fail_nvfp4 = True
    # the fakes run on the CPU: let the GPU-only adapters say they can
    for runnable in (HummingW4A16, GemliteW4A16, HummingMoeLayer):
        monkeypatch.setattr(runnable, "availability",
                            lambda self, device, import_check=True: (True, "fake library"))
    spec = importlib.util.spec_from_file_location("h200_fp4_libraries", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)   # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "fp4_libraries.jsonl").read_text().splitlines()]


def test_every_part_on_the_cpu(script, tmp_path, capsys):
    assert script.main([*TINY, "--out", str(tmp_path)]) == 0
    rows = rows_of(tmp_path)
    planned = script.plan(script.PARTS, [(64, 128)], [1, 4], [8, 4], ["glm-5", "deepseek-v3"])
    assert len(rows) == len(planned) == 4 * 2 + (3 * 2 + 1) + 2 * 2
    by = {(r.get("backend") or r.get("method"), r["fmt"], r.get("m", r.get("batch"))): r for r in rows}
    for key in [("humming-w4a16", "nvfp4", 1), ("humming-w4a16", "mxfp4", 4),
                ("torch-bf16", "nvfp4", 1), ("gemlite-w4a16", "mxfp4", 4),
                ("humming-moe-grouped", "nvfp4", 8), ("humming-moe-indexed", "nvfp4", 4),
                ("humming-moe-grouped", "mxfp4", 8)]:
        assert by[key]["status"] == "ok", by[key]
        assert by[key]["rel_err"] < 2e-2 and by[key]["median_us"] > 0
    if hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        assert by[("tinygemm-int4", "nvfp4", 1)]["status"] == "ok"
    assert by[("humming-w4a16", "nvfp4", 1)]["compile_s"] >= 0
    dsv3 = [r for r in rows if r.get("model") == "deepseek-v3"]
    assert [(r["batch"], r["status"]) for r in dsv3] == [(512, "ok")]
    failed, skipped = by[("gemlite-w4a16", "nvfp4", 1)], by[("gemlite-w4a16", "nvfp4", 4)]
    assert failed["status"] == "error" and "PassManager::run failed" in failed["message"]
    assert skipped["status"] == "skipped" and skipped["message"].startswith("not tried: gemlite-w4a16")
    assert by[("humming-moe-grouped", "nvfp4", 8)]["floor_us"] > 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["cases"] == len(rows) and run["copy_tbps"] > 0
    printed = capsys.readouterr().out
    summary = (tmp_path / "summary.txt").read_text()
    assert printed.rstrip().endswith(summary.rstrip())
    assert "humming nvfp4" in summary and "MoE layer" in summary
    assert "failed: gemlite-w4a16 nvfp4: LibraryCompileError" in summary


def test_a_spent_budget_skips_with_a_reason(script, tmp_path):
    assert script.main([*TINY, "--out", str(tmp_path), "--parts", "dense", "--budget-s", "0.5"]) == 0
    rows = rows_of(tmp_path)
    assert rows and all(r["status"] == "skipped" for r in rows)
    assert rows[0]["message"] == "time budget (0 s) spent"
    assert "skipped 8" in (tmp_path / "summary.txt").read_text()


def test_bad_arguments_name_the_flag(script, tmp_path):
    with pytest.raises(SystemExit, match="--shapes must be NxK"):
        script.main([*TINY, "--out", str(tmp_path), "--shapes", "64by128"])
    with pytest.raises(SystemExit):
        script.main([*TINY, "--out", str(tmp_path), "--parts", "dense,nope"])
