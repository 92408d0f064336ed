"""The sweep runner: worker isolation, the gate before the timer, resume, interruption.

The fake backends (tests/test_sweep_fakes.py) reach the worker processes through
FP4LAB_EXTRA_BACKENDS; shapes are tiny so each sweep costs mostly worker start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from fp4lab import sweep
from fp4lab.results import GEMM_COLUMNS, RunDir

TESTS_DIR = Path(__file__).parent
M_VALUES = (1, 2, 4, 8)          # the crashing fakes die at M == 4
SHAPE = (32, 64)                  # (N, K): K a multiple of both block sizes


@contextlib.contextmanager
def fakes_registered():
    """Fake backends visible here and in workers; the registry is restored afterwards."""
    from fp4lab import backends

    saved = dict(backends.REGISTRY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FP4LAB_EXTRA_BACKENDS", "fakes.backends")
        mp.setenv("PYTHONPATH", os.pathsep.join(
            [str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        mp.syspath_prepend(str(TESTS_DIR))
        try:
            yield
        finally:
            backends.REGISTRY.clear()
            backends.REGISTRY.update(saved)


@pytest.fixture(autouse=True)
def fake_backends():
    with fakes_registered():
        yield


def tiny_config(*backends: str, m_values=M_VALUES) -> sweep.SweepConfig:
    return sweep.SweepConfig.smoke().with_overrides(
        backends=backends, fmts=("nvfp4",), m_values=m_values, shapes=(SHAPE,), device="cpu",
        repeats=2)


def rows_by(frame, backend):
    return frame[frame["backend"] == backend].set_index("m").sort_index()


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """One sweep over a good, a wrong, a crashing and an unavailable backend."""
    run_path = tmp_path_factory.mktemp("runs") / "mixed"
    with fakes_registered():
        config = tiny_config("fake-ok", "fake-wrong", "fake-crash", "fake-unavailable")
        frame = sweep.run_sweep(config, run_path, progress=False)
    return run_path, frame


def test_every_point_has_one_row_with_every_column(mixed_run):
    run_path, frame = mixed_run
    assert set(GEMM_COLUMNS) <= set(frame.columns)
    assert len(frame) == 4 * len(M_VALUES)
    assert not frame.duplicated(["backend", "fmt", "n", "k", "m"]).any()
    assert (frame["run_id"] == "mixed").all()


def test_good_backend_is_timed_and_classified(mixed_run):
    _, frame = mixed_run
    good = rows_by(frame, "fake-ok")
    assert (good["status"] == "ok").all()
    assert (good["median_us"] > 0).all() and (good["tflops"] > 0).all()
    assert (good["rel_err"] < 2e-2).all()
    # tflops is 2*M*N*K over the median time
    n, k = SHAPE
    expected = 2 * good.index * n * k / good["median_us"] / 1e6
    assert good["tflops"].to_numpy() == pytest.approx(expected.to_numpy())


def test_wrong_result_has_rel_err_and_no_timing(mixed_run):
    _, frame = mixed_run
    wrong = rows_by(frame, "fake-wrong")
    assert (wrong["status"] == "wrong_result").all()
    assert wrong["rel_err"].to_numpy() == pytest.approx(1.0, rel=2e-2)  # 2x the answer
    assert wrong["median_us"].isna().all() and wrong["tflops"].isna().all()


def test_crashing_worker_costs_one_point(mixed_run):
    run_path, frame = mixed_run
    crash = rows_by(frame, "fake-crash")
    assert crash.loc[sweep_crash_m(), "status"] == "error"
    message = crash.loc[sweep_crash_m(), "error"]
    assert "exited with code 1" in message and "dying at M=4" in message
    assert (crash.drop(index=sweep_crash_m())["status"] == "ok").all()  # a fresh worker went on
    assert (run_path / "logs" / "fake-crash.log").exists()


def sweep_crash_m() -> int:
    from fakes.backends import CRASH_AT_M

    return CRASH_AT_M


def test_unavailable_backend_needs_no_worker(mixed_run):
    run_path, frame = mixed_run
    missing = rows_by(frame, "fake-unavailable")
    assert (missing["status"] == "unavailable").all()
    assert missing["error"].str.contains("does not exist").all()
    assert not (run_path / "logs" / "fake-unavailable.log").exists()


def test_run_json_records_provenance_config_and_ceilings(mixed_run):
    run_path, _ = mixed_run
    info = json.loads((run_path / "run.json").read_text())
    # provenance describes the machine; the sweep section says which device was measured
    assert info["provenance"]["device"]["kind"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert info["sweep"]["status"] == "complete"
    assert info["sweep"]["config"]["m_values"] == list(M_VALUES)
    assert info["sweep"]["started"] <= info["sweep"]["ended"]
    assert "ceilings" in info["sweep"]


def test_interrupt_keeps_rows_and_resume_finishes(tmp_path):
    run_path = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(tiny_config("fake-interrupt"), run_path, progress=False)
    kept = RunDir.open(run_path).read_table("gemm")
    assert sorted(kept["m"]) == [1, 2]                     # measured before the interrupt
    assert RunDir.open(run_path).run_json()["sweep"]["status"] == "interrupted"

    # resuming measures only what is missing; M=4 interrupts again, nothing is duplicated
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(tiny_config("fake-interrupt"), run_path, progress=False)
    assert len(RunDir.open(run_path).read_rows("gemm")) == 2


def test_resume_skips_finished_points(tmp_path):
    run_path = tmp_path / "resumed"
    first = sweep.run_sweep(tiny_config("fake-ok", m_values=(1, 2)), run_path, progress=False)
    second = sweep.run_sweep(tiny_config("fake-ok", m_values=(1, 2, 8)), run_path, progress=False)
    assert len(first) == 2 and len(second) == 3
    assert second.set_index("m").loc[[1, 2], "median_us"].tolist() == \
        first.set_index("m").loc[[1, 2], "median_us"].tolist()
    assert len(RunDir.open(run_path).run_json()["sweep"]["resumed"]) == 1
    with pytest.raises(ValueError, match="run_dir"):
        sweep.run_sweep(tiny_config("fake-ok"), run_path, resume=False, progress=False)


@pytest.mark.parametrize("overrides, argument", [
    ({"m_values": (0,)}, "m:"),
    ({"m_values": (-4,)}, "m:"),
    ({"shapes": ((32, 40),)}, "shapes:"),            # K=40 is no multiple of 16
    ({"backends": ("no-such-backend",)}, "backends:"),
    ({"repeats": 0}, "repeats:"),
    ({"fmts": ("int4",)}, "format:"),
    ({"device": "tpu"}, "device:"),
])
def test_bad_config_names_the_argument(overrides, argument):
    config = sweep.SweepConfig.from_dict({**tiny_config("fake-ok").as_dict(), **overrides})
    with pytest.raises(ValueError, match=argument):
        sweep.validate_config(config)


def test_mxfp4_needs_k_multiple_of_32():
    config = tiny_config("fake-ok").with_overrides(fmts=("mxfp4",), shapes=((32, 48),))
    with pytest.raises(ValueError, match="mxfp4 block size"):
        sweep.validate_config(config)


def test_presets_are_valid_grids():
    full = sweep.SweepConfig.full()
    assert full.m_values[0] == 1 and full.m_values[-1] == 16384
    assert (6144, 2048) in full.shapes and (4096, 6144) in full.shapes
    assert full.energy_window_s == 0.5
    sweep.validate_config(sweep.SweepConfig.smoke())


def test_log_line_is_fixed_width():
    point = sweep.Point("torch-bf16", "nvfp4", 4096, 6144, 1)
    ok = {**sweep.blank_row("r", point, "ok"), "median_us": 12.5, "tflops": 4.0, "tbps": 2.1,
          "bound": "memory", "pct_peak_spec": 0.4, "rel_err": 1e-3}
    failed = sweep.blank_row("r", point, "unavailable", "no GPU")
    lines = [sweep.format_point_line(ok), sweep.format_point_line(failed), sweep.LOG_HEADER]
    assert len({len(line) for line in lines}) == 1


def test_measured_peak_is_raised_to_the_sweeps_best_point(tmp_path):
    """The end-of-sweep step: a point faster than the probe raises the peak; rows are recomputed."""
    run_path = tmp_path / "ceilings"
    sweep.run_sweep(tiny_config("fake-ok", m_values=(1, 8)), run_path, progress=False)
    run = RunDir.open(run_path)
    best = max(row["tflops"] for row in run.read_rows("gemm"))
    # pretend the bf16 probe was slower than the sweep's best bf16 point (as fp8 was on the H200)
    stored = run.run_json()["sweep"]["ceilings"]
    stored["measured"]["peak_tflops"]["bf16"] = best / 2
    run.update_run_json("sweep", {"ceilings": stored})

    raised = sweep.raise_measured_ceilings(run_path)
    assert set(raised) == {"bf16"} and "fake-ok nvfp4 M=" in raised["bf16"]
    measured = run.run_json()["sweep"]["ceilings"]["measured"]
    assert measured["peak_tflops"]["bf16"] == pytest.approx(best)
    assert measured["details"]["bf16_raised"] == raised["bf16"]
    for frame in (run.read_table("gemm"), pd.DataFrame(run.read_rows("gemm"))):  # parquet and log
        assert frame["pct_peak_measured"].max() == pytest.approx(100.0)
        assert frame["pct_peak_measured"].tolist() == pytest.approx((100 * frame["tflops"] / best).tolist())
    assert sweep.raise_measured_ceilings(run_path) == {}      # applying it again changes nothing


def test_run_sweep_ends_with_no_point_over_the_measured_peak(mixed_run):
    _, frame = mixed_run
    assert (frame["pct_peak_measured"].dropna() <= 100 + 1e-9).all()
