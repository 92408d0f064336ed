"""Chapter 01 end to end: papermill runs the notebook in the smoke profile on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "01_fp4_gemm_sweep.ipynb"


def test_notebook_is_stored_without_outputs():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in code)
    assert cells[0]["cell_type"] == "markdown"
    parameters = [cell for cell in code if "parameters" in cell["metadata"].get("tags", [])]
    assert len(parameters) == 1
    for name in ("run_dir", "reference_dir", "profile", "device", "backends", "fmts", "m_values"):
        assert f"{name} = " in "".join(parameters[0]["source"])


@pytest.mark.slow
def test_notebook_runs_in_the_smoke_profile(tmp_path):
    papermill = pytest.importorskip("papermill")
    run_dir = tmp_path / "run"
    out = tmp_path / "01.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK), str(out), kernel_name="fp4lab", progress_bar=False,
        parameters={"run_dir": str(run_dir), "profile": "smoke", "device": "cpu",
                    "backends": ["torch-bf16", "emulated", "torch-fp4"], "fmts": ["nvfp4"],
                    "m_values": [1, 16], "shapes": [[64, 128]]})
    executed = json.loads(out.read_text())
    text = json.dumps(executed["cells"][-1]["outputs"])
    assert "backends ran correctly" in text and "TFLOP/s" in text
    assert (run_dir / "gemm.parquet").exists()


def test_bad_parameter_is_a_clear_error():
    from fp4lab import sweep

    with pytest.raises(ValueError, match="m:"):
        sweep.config_from_params(profile="smoke", device="cpu", m_values=[0])
