"""Chapter 00 (environment): its parameter checks, findings, and the notebook run by papermill."""

import json
from pathlib import Path

import pytest
import torch

from fp4lab import environment, hardware, results

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "00_environment.ipynb"


def test_bad_parameters_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="profile 'huge'"):
        environment.check_parameters(profile="huge")
    with pytest.raises(ValueError, match="reference_dir .* is not a run folder"):
        environment.check_parameters(reference_dir=str(tmp_path))
    with pytest.raises(ValueError, match="device 'tpu'"):
        environment.check_parameters(device="tpu")
    assert environment.check_parameters(device="cpu").device == "cpu"


def test_findings_follow_the_device():
    cpu = hardware.detect("cpu")
    text = " ".join(environment.findings(cpu, {"torch": "2.13", "sgl-kernel": None}, None))
    assert "on a CPU" in text and "Not installed: sgl-kernel" in text
    h200 = hardware.DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0),
                               sm_count=132, memory_gb=139.8, power_limit_w=500.0,
                               spec=hardware.SPECS["h200"])
    text = " ".join(environment.findings(h200, {"torch": "2.11"}, {"run": "r1", "name": "NVIDIA H200"}))
    assert "matches the sheet entry NVIDIA H200 SXM" in text
    assert "500 W, below the 700 W" in text and "reference run r1" in text
    assert "weight-only" in environment.fp4_support(h200)
    b200 = hardware.DeviceInfo(kind="cuda", name="NVIDIA B200", compute_capability=(10, 0))
    assert "nvfp4 and mxfp4 natively" in environment.fp4_support(b200)


def test_record_provenance_creates_the_run_folder(tmp_path):
    assert environment.record_provenance("") is None
    environment.record_provenance(str(tmp_path / "runs" / "r1"))
    stored = results.RunDir.open(tmp_path / "runs" / "r1").run_json()["provenance"]
    assert stored["device"]["kind"] in ("cpu", "cuda") and stored["command"] == environment.NOTEBOOK_COMMAND


def test_notebook_is_stored_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in code)
    assert nb["cells"][0]["cell_type"] == "markdown"
    assert "parameters" in code[0]["metadata"].get("tags", [])
    for name in ("run_dir", "reference_dir", "profile", "device"):
        assert f"{name} = " in "".join(code[0]["source"])


@pytest.mark.slow
def test_notebook_runs_on_cpu_and_records_provenance(tmp_path):
    papermill = pytest.importorskip("papermill")
    run_dir = tmp_path / "runs" / "env-test"
    out = tmp_path / "00_environment.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters={"run_dir": str(run_dir),
                               "device": "cpu"}, kernel_name="fp4lab", cwd=str(NOTEBOOK.parent),
                               progress_bar=False)
    outputs = [o for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert all(key in html for key in hardware.SPECS), "the spec table is missing"
    markdown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "Native FP4 formats on this device" in markdown
    assert any("image/png" in o.get("data", {}) for o in outputs)
    provenance = results.RunDir.open(run_dir).run_json()["provenance"]
    # provenance describes the machine, whatever device the chapter was asked to use
    machine = "cuda" if torch.cuda.is_available() else "cpu"
    assert provenance["device"]["kind"] == machine and provenance["versions"]["torch"]
