"""`python -m fp4lab sweep`: bad arguments exit 2 with one line and no run folder; a CPU sweep."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from fp4lab import cli
from fp4lab.results import GEMM_COLUMNS

TINY = ["--device", "cpu", "--m", "1,2", "--shapes", "32x64", "--format", "nvfp4",
        "--repeats", "2", "--quiet"]


@pytest.mark.parametrize("args, argument", [
    (["--m", "0"], "m:"),
    (["--m", "1,-2"], "m:"),
    (["--m", "1,two"], "m:"),
    (["--shapes", "32x40"], "shapes:"),           # K=40: not a multiple of the nvfp4 block (16)
    (["--shapes", "32by64"], "shapes:"),
    (["--backends", "no-such-backend"], "backends:"),
    (["--repeats", "0"], "repeats:"),
    (["--format", "int4"], "format:"),
    (["--device", "tpu"], "--device"),
])
def test_bad_argument_exits_2_with_one_line(tmp_path, capsys, args, argument):
    out = tmp_path / "runs"
    argv = ["sweep", *TINY, "--out", str(out), *args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argument in err and "Traceback" not in err
    assert not out.exists()                                 # validated before creating anything


def test_unwritable_output_exits_2(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["sweep", *TINY, "--out", str(blocker / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out:" in err
    assert blocker.read_text() == "not a folder"


def test_bad_run_id_and_resume_target_exit_2(tmp_path, capsys):
    assert cli.main(["sweep", *TINY, "--out", str(tmp_path), "--run-id", "../escape"]) == 2
    assert cli.main(["sweep", "--resume", str(tmp_path / "nowhere")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "run id" in errors[0] and "run folder" in errors[1]
    assert list(tmp_path.iterdir()) == []


def test_cpu_sweep_through_the_cli(tmp_path):
    """The real CPU backends through `python -m fp4lab sweep`: schema, statuses, run folder last."""
    done = subprocess.run(
        [sys.executable, "-m", "fp4lab", "sweep", *TINY, "--backends", "torch-bf16,emulated,torch-fp4",
         "--out", str(tmp_path), "--run-id", "cpu-smoke"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run_path = tmp_path / "cpu-smoke"
    assert done.stdout.strip().splitlines()[-1] == str(run_path)
    frame = pd.read_parquet(run_path / "gemm.parquet")
    assert set(GEMM_COLUMNS) <= set(frame.columns)
    assert len(frame) == 3 * 2
    status = frame.groupby("backend")["status"].agg(set).to_dict()
    assert status == {"torch-bf16": {"ok"}, "emulated": {"ok"}, "torch-fp4": {"unavailable"}}
    measured = frame[frame["status"] == "ok"]
    assert (measured["median_us"] > 0).all() and (measured["rel_err"] < 2e-2).all()
    assert frame.loc[frame["status"] == "unavailable", "error"].str.len().gt(0).all()
    info = json.loads((run_path / "run.json").read_text())
    assert "sweep" in info["sweep"]["command"] and info["sweep"]["status"] == "complete"
    assert info["provenance"]["versions"]["torch"]


def test_eager_flag_times_launches_without_graphs(tmp_path, capsys):
    assert cli.main(["sweep", "--backends", "torch-bf16", "--format", "nvfp4", "--m", "1",
                     "--shapes", "64x64", "--device", "cpu", "--repeats", "2", "--eager", "--quiet",
                     "--out", str(tmp_path), "--run-id", "eager"]) == 0
    run_json = json.loads((tmp_path / "eager" / "run.json").read_text())
    assert run_json["sweep"]["config"]["timer"]["use_graph"] is False
    assert capsys.readouterr().out.strip().endswith("eager")
