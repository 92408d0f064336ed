"""fp4lab.analysis.projection: a decode MoE layer's floors on other GPUs, and `project`."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fp4lab import cli, gpus_cli, where
from fp4lab.analysis import projection
from fp4lab.hardware import SPECS
from fp4lab.moe import presets

GLM5 = presets.get("glm-5")


def floors_by_gpu(rows):
    return {row["gpu"]: row for row in rows}


def test_glm5_at_512_reads_every_experts_fp4_weights_at_each_sheet_bandwidth():
    rows = floors_by_gpu(projection.project(GLM5, 512, ["b200", "rtx-pro-6000", "h200"]))
    # 512 tokens x 8 of 256 experts: all 256 active; one expert is (4096x6144 + 6144x2048) values
    # at 0.5 B + one e4m3 scale per 16, plus two float32 global scales
    expert = (4096 * 6144 + 6144 * 2048) * (0.5 + 1 / 16) + 2 * 4
    for gpu, row in rows.items():
        assert row["active_experts"] == pytest.approx(256, abs=0.01)
        assert row["weight_mb"] * 1e6 == pytest.approx(256 * expert, rel=1e-4)
        assert row["weight_floor_us"] == pytest.approx(256 * expert / (SPECS[gpu].memory_bw_tbps * 1e6),
                                                       rel=1e-4)
        assert row["bound"] == "weight" and row["floor_us"] == row["weight_floor_us"]
        assert row["label"] == "projection from spec sheets, not a measurement"
    assert rows["h200"]["weight_floor_us"] == pytest.approx(1132.5, abs=0.5)


def test_fp4_math_where_fp4_tensor_cores_exist_bf16_weight_only_math_elsewhere():
    rows = floors_by_gpu(projection.project(GLM5, 512, ["b200", "rtx-pro-6000", "h100"]))
    flops = 2 * 512 * 8 * (4096 * 6144 + 6144 * 2048)
    assert rows["b200"]["math_dtype"] == "fp4"
    assert rows["b200"]["math_floor_us"] == pytest.approx(flops / 9000e6)
    assert rows["rtx-pro-6000"]["math_floor_us"] == pytest.approx(flops / 2000e6)
    assert rows["h100"]["math_dtype"] == "bf16"
    assert rows["h100"]["math_floor_us"] == pytest.approx(flops / 989e6)


def test_the_launch_floor_uses_a_labelled_default_unless_the_run_measured_one():
    default = projection.project(GLM5, 1, ["b200"])[0]
    assert default["launch_floor_us"] == projection.KERNELS_PER_LAYER * projection.DEFAULT_LAUNCH_US
    assert default["launch_source"].startswith("default:")
    measured = projection.Measured(gpu="h200", layer_us=2230.0, method="humming", launch_us=1.3,
                                   source="runs/x")
    row = projection.project(GLM5, 1, ["b200"], measured=measured)[0]
    assert row["launch_floor_us"] == pytest.approx(projection.KERNELS_PER_LAYER * 1.3)
    assert row["launch_source"] == "measured on h200 (runs/x)"


def test_a_small_batch_reads_only_the_experts_it_routes_to():
    one = projection.project(GLM5, 1, ["b200"])[0]
    assert one["active_experts"] == 8
    assert one["weight_mb"] == pytest.approx(projection.project(GLM5, 512, ["b200"])[0]["weight_mb"] / 32,
                                             rel=1e-3)


def test_the_measured_gpus_ratio_is_shown_beside_every_row():
    measured = projection.Measured(gpu="h200", layer_us=2230.0, method="humming-nvfp4")
    rows = floors_by_gpu(projection.project(GLM5, 512, ["b200", "h200"], measured=measured))
    ratio = rows["h200"]["floor_us"] / 2230.0
    assert rows["h200"]["measured_us"] == 2230.0 and rows["b200"]["measured_us"] is None
    for row in rows.values():
        assert row["floor_over_measured"] == pytest.approx(ratio)
        assert row["at_measured_ratio_us"] == pytest.approx(row["floor_us"] / ratio)
        assert row["measured_method"] == "humming-nvfp4"
    assert rows["h200"]["at_measured_ratio_us"] == pytest.approx(2230.0)


@pytest.mark.parametrize("bad, message", [
    (dict(batch=0), "batch=0"), (dict(gpus=["a100"]), "gpus"), (dict(kernels=0), "kernels=0"),
])
def test_bad_arguments_name_the_parameter(bad, message):
    arguments = {"batch": 16, "gpus": ["b200"], **bad}
    kernels = arguments.pop("kernels", projection.KERNELS_PER_LAYER)
    with pytest.raises(ValueError, match=message):
        projection.project(GLM5, arguments["batch"], arguments["gpus"], kernels=kernels)
    with pytest.raises(ValueError, match="layer_us"):
        projection.Measured(gpu="h200", layer_us=-1.0, method="x")


def test_project_json_gives_the_floors_per_gpu_and_which_backend_runs_where(capsys):
    assert cli.main(["project", "--preset", "glm-5", "--batch", "512",
                     "--gpu", "b200,rtx-pro-6000,h200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == projection.LABEL
    assert [row["gpu"] for row in out["floors"]] == ["b200", "rtx-pro-6000", "h200"]
    assert all(row["floor_us"] > 0 for row in out["floors"])
    runs = {(row["device"], row["backend"]): row["runs"] for row in out["runs_where"]}
    assert runs[("h200", "flashinfer-cutlass")] is False and runs[("b200", "flashinfer-trtllm")] is True
    assert runs[("rtx-pro-6000", "flashinfer-trtllm")] is False
    assert runs[("h200", "triton-w4a16")] is True
    assert any(row["kind"] == "moe-layer" for row in out["runs_where"])


def test_where_rows_cover_every_backend_and_moe_method_per_gpu():
    from fp4lab import backends
    from fp4lab.backends import moe

    rows = where.where_rows([SPECS["b200"], SPECS["h100"]])
    assert len(rows) == 2 * (len(backends.REGISTRY) + len(moe.REGISTRY))


def make_run(tmp_path, rows, spec="h200", launch_us=2.39):
    folder = tmp_path / "run"
    folder.mkdir()
    run = {"provenance": {"device": {"spec": spec}},
           "sweep": {"ceilings": {"measured": {"launch_us": launch_us}}}}
    (folder / "run.json").write_text(json.dumps(run))
    pd.DataFrame(rows).to_parquet(folder / "moe.parquet")
    return folder


def moe_row(method, gemm, us, dtype="fp4", batch=512, status="ok"):
    return {"preset": "glm-5", "batch": batch, "ep": 1, "gemm": gemm, "method": method,
            "operand_dtype": dtype, "status": status, "median_us": us}


def test_the_run_gives_the_diagnosis_fastest_fp4_layer_and_its_launch_floor(capsys):
    """`project --run` checks the projection against the number chapter 04 states."""
    from fp4lab.analysis import decode
    from fp4lab.results import REFERENCE_ROOT, find_run_dirs

    folder = find_run_dirs(REFERENCE_ROOT)[-1]
    measured = gpus_cli.measured_from_run(str(folder), 512, "glm-5")
    d = decode.diagnose(folder, decode.DiagnosisConfig(decode_batch=512).check())
    assert measured.gpu == "h200" and measured.method == d.fp4["best"]["path"]
    assert measured.layer_us == d.fp4["best"]["layer_us"] and measured.launch_us == d.gemm.launch_us
    assert cli.main(["project", "--preset", "glm5", "--batch", "512", "--gpu", "b200",
                     "--run", str(folder), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["floors"][0]
    assert row["measured_on"] == "h200" and 0 < row["floor_over_measured"] < 1


def test_a_run_without_fp4_layers_at_the_batch_is_a_usage_error(tmp_path, capsys):
    folder = make_run(tmp_path, [moe_row("grouped-fp8", "gate_up", 100.0, dtype="fp8")])
    assert cli.main(["project", "--preset", "glm-5", "--batch", "512", "--gpu", "b200",
                     "--run", str(folder)]) == 2
    assert "no correct FP4 MoE layer" in capsys.readouterr().err
    assert cli.main(["project", "--preset", "glm-5", "--batch", "512", "--gpu", "b200",
                     "--run", str(tmp_path / "missing")]) == 2
    assert "no readable run.json" in capsys.readouterr().err


