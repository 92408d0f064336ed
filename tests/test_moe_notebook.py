"""Chapter 03 runs end to end through papermill on the CPU (scaled preset), and refuses bad knobs."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_moe_expert_scatter.ipynb"
SMALL = "{batch_sizes: [8, 32], ep_degrees: [1, 2], steps: 10, timer_repeats: 2}"


def papermill(out, run_dir, yaml):
    return subprocess.run([sys.executable, "-m", "papermill", "-k", "fp4lab", str(NOTEBOOK), str(out),
                           "-p", "run_dir", str(run_dir), "-y", yaml], capture_output=True, text=True)


@pytest.mark.slow
def test_notebook_runs_and_states_findings(tmp_path):
    result = papermill(tmp_path / "out.ipynb", tmp_path / "runs" / "r1", SMALL)
    assert result.returncode == 0, result.stderr[-2000:]
    findings = nbformat.read(tmp_path / "out.ipynb", 4).cells[-1].outputs[0]["data"]["text/markdown"]
    assert "mean GLM-5 expert gets 1.0 tokens" in findings
    assert (tmp_path / "runs" / "r1" / "moe.parquet").exists()


@pytest.mark.slow
def test_notebook_rejects_bad_parameters(tmp_path):
    result = papermill(tmp_path / "out.ipynb", tmp_path / "r", "{batch_sizes: [0], steps: 5}")
    assert result.returncode != 0 and "batch_sizes=(0,)" in result.stderr + result.stdout


def test_notebook_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, 4)
    assert all(c.get("outputs", []) == [] and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code")
    assert "parameters" in nb.cells[1].metadata.get("tags", [])
