"""History on synthetic runs: the index, ratios, regressions, version changes, GPU labels."""

from __future__ import annotations

import pytest

from fp4lab import history
from fp4lab.results import RunDir


def make_run(root, run_id, us_by_m, gpu="NVIDIA H200", torch_version="2.11.0", driver="580.1",
             wrong_ms=()):
    run = RunDir.create(root, run_id)
    rows = [{"backend": "triton-w4a16", "fmt": "nvfp4", "m": m, "n": 4096, "k": 6144,
             "status": "wrong_result" if m in wrong_ms else "ok", "median_us": us}
            for m, us in us_by_m.items()]
    run.append_rows("gemm", rows)
    run.update_run_json(None, {"provenance": {"device": {"name": gpu, "driver": driver},
                                              "versions": {"torch": torch_version}, "cuda": "13.0"}})
    return run


def test_ratios_regressions_and_version_changes(tmp_path):
    before = make_run(tmp_path / "runs", "20261129T000000Z-h200", {1: 10.0, 16: 10.0, 64: 20.0})
    now = make_run(tmp_path / "runs", "20261130T000000Z-h200", {1: 10.5, 16: 12.0, 64: 10.0, 256: 5.0},
                   torch_version="2.12.0", driver="580.2")
    c = history.compare(now.path, before.path, threshold=0.10)
    assert c.ratios["time_ratio"].round(3).tolist() == [1.05, 1.2, 0.5]  # M=256 is in one run only
    assert c.regressions[["m", "time_ratio"]].values.tolist() == [[16, pytest.approx(1.2)]]
    assert c.same_gpu and c.label.startswith("same device")
    changes = c.changes.set_index("field")
    assert changes.loc["torch"].tolist() == ["2.11.0", "2.12.0"]
    assert changes.loc["driver"].tolist() == ["580.1", "580.2"]
    text = " ".join(history.summary(c))
    assert "1 point is more than 10% slower" in text and "torch 2.11.0 -> 2.12.0" in text


def test_only_correct_points_are_compared(tmp_path):
    before = make_run(tmp_path, "a", {1: 10.0, 16: 10.0})
    now = make_run(tmp_path, "b", {1: 30.0, 16: 10.0}, wrong_ms=(1,))
    assert history.compare(now.path, before.path).ratios["m"].tolist() == [16]


def test_different_gpus_are_labeled(tmp_path):
    ref = make_run(tmp_path / "ref", "20261101T000000Z-h200", {1: 10.0})
    now = make_run(tmp_path / "runs", "20261130T000000Z-cpu", {1: 1000.0}, gpu=None)
    c = history.compare(now.path, ref.path, other_kind="reference")
    assert not c.same_gpu and "DIFFERENT devices" in c.label
    assert c.changes.set_index("field").loc["GPU"].tolist() == ["NVIDIA H200", None]


def test_index_and_previous_run(tmp_path):
    runs = tmp_path / "runs"
    first = make_run(runs, "20261128T000000Z-h200", {1: 1.0})
    RunDir.create(runs, "20261129T000000Z-h200")  # a run whose sweep failed: no gemm rows
    now = make_run(runs, "20261130T000000Z-h200", {1: 1.0})
    make_run(tmp_path / "ref", "20261101T000000Z-h200", {1: 1.0})
    index = history.index_runs(runs, tmp_path / "ref")
    assert index["kind"].tolist() == ["reference", "local", "local", "local"]
    assert history.previous_run(now.path) == first.path
    assert history.previous_run(first.path) is None


@pytest.mark.parametrize("bad", [0, -0.1, "10%", True])
def test_bad_threshold_is_named(bad):
    with pytest.raises(ValueError, match="regression_threshold"):
        history.validate_threshold(bad)


def test_reference_run_is_one_rule_for_every_chapter(tmp_path):
    from fp4lab.results import reference_run

    assert reference_run("", "gemm", tmp_path) is None
    old = RunDir.create(tmp_path, "20261101T000000Z-h200")
    old.append_rows("gemm", [{"backend": "torch-bf16", "m": 1}])
    RunDir.create(tmp_path, "20261201T000000Z-h200-moe").append_rows("moe", [{"preset": "glm-5"}])
    assert reference_run("", "gemm", tmp_path) == old.path           # newest with the table asked for
    assert reference_run("", "moe", tmp_path).name.endswith("-moe")
    assert reference_run("none", "gemm", tmp_path) is None            # "none" shows no reference
    assert reference_run(str(old.path), "gemm", tmp_path) == old.path
    with pytest.raises(ValueError, match="not a run folder"):
        reference_run(str(tmp_path / "missing"), "gemm", tmp_path)
    with pytest.raises(ValueError, match="has no moe table"):
        reference_run(str(old.path), "moe", tmp_path)
