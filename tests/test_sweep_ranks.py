"""The per-GPU sweep (fp4lab.sweep.ranks): `gpus: all` runs the grid through torchrun, one rank per
GPU, into one run folder. On the CPU the ranks run with the stored device "cpu" (one rank: two
would measure the same device twice); the spread across GPUs is read from rows of two GPUs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp4lab import schema
from fp4lab.analysis import gemm as analysis
from fp4lab.chapters import ch01_gemm
from fp4lab.errors import ParameterError
from fp4lab.results import RunDir
from fp4lab.sweep import GemmSweep, ranks
from fp4lab.sweep import gemm as gemm_sweep

FAST = {"repeats": 3, "warmup_s": 0.0, "cold_l2": False, "use_graph": False}


def config(**overrides) -> GemmSweep:
    return GemmSweep.from_profile("smoke", "cpu", backends=["fake-ok"], fmts=["nvfp4"], m_values=[1, 4],
                                  shapes=[[32, 64]], anatomy_m=[], timer=FAST, **overrides)


def test_gpus_all_sweeps_through_torchrun_ranks(tmp_path, fake_backends_env, monkeypatch):
    monkeypatch.setattr(ranks, "ranks_for", lambda gpus, device: 1 if gpus == "all" else None)
    run = RunDir.create(tmp_path, run_id="ranks")
    assert gemm_sweep.run_sweep(config(gpus="all"), run, progress=False) == 2
    info = run.run_json()
    assert info["sweep"]["status"] == "complete" and info["sweep"]["ranks"] == 1
    assert info["sweep_gpus"]["0"]["status"] == "complete" and info["sweep_gpus"]["0"]["points"] == 2
    assert info["sweep"]["ceilings"]["measured"]                  # measured once, by the parent
    assert sorted(run.read_table("gemm")["status"]) == ["ok", "ok"]
    # a rerun measures nothing twice, through the ranks too
    assert gemm_sweep.run_sweep(config(gpus="all"), run, progress=False) == 0
    assert len(run.read_rows("gemm")) == 2
    record = run.run_json()["sweep_gpus"]["0"]
    assert (record["points"], record["rows"]) == (0, 2)         # the rerun measured none; two are there


def test_a_failing_rank_stops_the_sweep_with_its_reason_and_rows_kept(tmp_path, fake_backends_env,
                                                                      monkeypatch):
    monkeypatch.setattr(ranks, "ranks_for", lambda gpus, device: 1)
    run = RunDir.create(tmp_path, run_id="broken")
    (run.path / "anatomy.jsonl").mkdir()        # the rank cannot read its table: it fails
    with pytest.raises(ranks.RanksFailed, match=r"GPU 0: failed \(RunFolderError: .*not a regular file"):
        gemm_sweep.run_sweep(config(gpus="all"), run, progress=False)
    sweep = run.run_json()["sweep"]
    assert sweep["status"] == "failed" and "resume measures the rest" in sweep["failure"]


def test_a_bad_gpus_flag_is_one_line(tmp_path, fake_backends_env):
    """The flag is checked before any run folder is written."""
    done = subprocess.run([sys.executable, "-m", "fp4lab", "sweep", "--device", "cpu", "--gpus", "some",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and "gpus='some'" in done.stderr and "Traceback" not in done.stderr


def test_gpus_is_checked_and_defaults_to_one(fake_backends_env):
    assert config().gpus == "one" and GemmSweep.from_profile("full", "cpu").gpus == "all"
    with pytest.raises(ParameterError, match="gpus=2"):
        config(gpus=2)


def test_ranks_are_only_for_every_gpu_of_a_cuda_box():
    assert ranks.ranks_for("one", "cuda") is None
    assert ranks.ranks_for("all", "cpu") is None and ranks.ranks_for("all", "cuda:1") is None


# -- two GPUs' rows, read -----------------------------------------------------------------------------

def two_gpu_run(tmp_path) -> RunDir:
    run = RunDir.create(tmp_path, run_id="box")
    rows = []
    for gpu, slower in ((0, 1.0), (1, 1.3)):
        for m in (1, 16, 1024):
            rows.append(schema.blank_row(
                "gemm", run_id="box", backend="torch-bf16", fmt="nvfp4", n=4096, k=4096, m=m, status="ok",
                weight_dtype="bf16", act_dtype="bf16", math_dtype="bf16", median_us=10.0 * m * slower,
                gpu_index=gpu, pci_bus_id=f"00000000:0{gpu}:00.0", device="cuda",
                avg_power_w=200.0 / slower, window_sm_clock_mhz=1980.0 / slower))
    run.append_rows("gemm", rows)
    return run


def test_the_book_reads_the_lead_gpu_and_the_spread_names_the_slow_one(tmp_path):
    results = analysis.gemm_results(two_gpu_run(tmp_path))
    assert set(results.frame["gpu_index"]) == {0} and len(results.every_gpu) == 6
    spread = analysis.gpu_spread(results).set_index("gpu_index")
    assert list(spread["points"]) == [2, 2]                      # M=1 and 16: decode-sized
    assert spread.loc[1, "median_vs_box"] > 1 > spread.loc[0, "median_vs_box"]
    assert spread.loc[1, "median_vs_box"] / spread.loc[0, "median_vs_box"] == pytest.approx(1.3)
    assert spread.loc[1, "median_power_w"] == pytest.approx(200 / 1.3)
    line = ch01_gemm.spread_findings(analysis.gpu_spread(results))[0]
    assert line.startswith("GPU 1 is the slowest")
