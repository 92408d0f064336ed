"""What the H200 reference calls tripped on: the front page's diagnosis reads this run on a GPU
and the newest GPU run on a CPU (a GPU report once crashed there, after every chapter had run);
the commit recorded is the one named, not a stray .git's."""

from __future__ import annotations

from fp4lab import report
from fp4lab.results import REFERENCE_ROOT, RunDir, latest_gpu_run


def test_a_gpu_report_leads_with_its_own_run(tmp_path):
    run = RunDir.create(tmp_path, "gpu-run")
    assert report.leading_run(run, True, tmp_path) is run


def test_a_cpu_report_leads_with_the_newest_gpu_run(tmp_path):
    run = RunDir.create(tmp_path, "cpu-run")
    leading = report.leading_run(run, False, tmp_path)
    assert leading is not None and leading.path == latest_gpu_run(tmp_path, REFERENCE_ROOT)


def test_an_explicit_commit_wins_over_whatever_git_is_around(monkeypatch):
    """A tree copied to a device machine can sit inside another checkout's .git: the commit the
    caller names is the one recorded."""
    from fp4lab import results

    monkeypatch.setenv("FP4LAB_GIT_SHA", "ba8b458")
    assert results.git_sha() == "ba8b458"
    monkeypatch.delenv("FP4LAB_GIT_SHA")
    assert results.git_sha() != "ba8b458"
