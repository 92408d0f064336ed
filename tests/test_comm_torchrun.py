"""The comm run as it really runs: two gloo ranks under torchrun on the CPU, a few seconds each.

The smoke run (the function the smoke profile calls) must give rows for all four ops with sane
numbers; a rank that exits, a rank that hangs, and a run past the launcher's time limit must each
end in seconds with a clear message and the rows measured before kept.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from fp4lab.analysis import comm as analysis
from fp4lab.comm import launch, ops
from fp4lab.comm.faults import FAULT_EXIT_CODE
from fp4lab.comm.nccl_env import MULTICAST_OFF
from fp4lab.comm.plan import CommPlan
from fp4lab.moe import presets
from fp4lab.results import RunDir

FAULT_ARGS = ["--device", "cpu", "--profile", "smoke", "--quiet", "--ops", "all_reduce",
              "--tokens", "1,2,4,8,16,32"]


def _run_json(path):
    return json.loads((path / "run.json").read_text())


def test_smoke_run_measures_every_op_with_sane_numbers(tmp_path):
    run_dir = tmp_path / "runs" / "smoke-comm"
    RunDir.create(run_dir.parent, run_id=run_dir.name).update_run_json("report", {"profile": "smoke"})
    started = time.monotonic()
    result = launch.smoke_into(run_dir)   # into the report's run folder, beside its other tables
    assert result.ok, result.output[-3000:]
    assert time.monotonic() - started < 60
    table = RunDir.open(run_dir).read_table("comm")
    plan = CommPlan.smoke()
    assert len(table) == result.rows == len(plan.points(2))
    assert set(table["op"]) == set(ops.OPS)
    assert (table["status"] == "ok").all(), table[table["status"] != "ok"][["op", "error"]]
    assert (table["backend"] == "gloo").all() and not table["graph"].any()
    assert (table["world_size"] == 2).all() and (table["n"] == plan.repeats).all()
    assert ((0 < table["p20_us"]) & (table["p20_us"] <= table["median_us"])
            & (table["median_us"] <= table["p80_us"])).all()
    assert (table["median_us"] < 1e6).all()        # under a second per op on two CPU processes
    factor = table.apply(lambda r: ops.bus_factor(r["op"], r["world_size"]), axis=1)
    pd.testing.assert_series_equal(table["busbw_gbps"], table["algbw_gbps"] * factor,
                                   check_names=False)
    dense = table[table["op"].isin(["all_reduce", "send_recv"])]
    assert (dense["bytes"] == dense["tokens"] * plan.hidden * 2).all()
    a2a = table[table["op"].str.startswith("all_to_all")]
    even = a2a["tokens"] * plan.top_k * plan.hidden * a2a["dtype"].map(ops.ELEMENT_BYTES)
    assert (a2a["bytes"] >= even).all() and (a2a["imbalance"] >= 1).all()
    assert _run_json(run_dir)["report"] == {"profile": "smoke"}     # the folder's other sections stay
    comm = _run_json(run_dir)["comm"]
    assert comm["status"] == "complete" and comm["world_size"] == 2 and comm["backend"] == "gloo"
    assert comm["environment"] == MULTICAST_OFF
    assert comm["topology"]["matrix"] is None and comm["topology"]["note"]
    assert [r["rank"] for r in comm["ranks"]] == [0, 1]
    # the analysis reads the run as it is: every two-GPU layout gets a time from its rows
    stand_in = presets.scaled_down(presets.get("glm-5"), experts=plan.experts, hidden=plan.hidden,
                                   top_k=plan.top_k)
    model = analysis.StepModel(stand_in, lambda n, k, m: 1.0, analysis.CommTable(table))
    layouts = analysis.compare_layouts(model, 2, 4)
    assert set(layouts["layout"]) == {"TP2", "TP1xPP2", "EP2"}
    assert layouts["step_us"].notna().all() and (layouts["missing"] == "").all()


def test_a_rank_that_exits_ends_the_run_with_the_rows_kept(tmp_path):
    run_path = tmp_path / "exit"
    started = time.monotonic()
    result = launch.launch(2, FAULT_ARGS + ["--out", str(tmp_path), "--run-id", "exit",
                                            "--fault", "1:3:exit"], run_path, timeout_s=60,
                           capture=True)
    assert time.monotonic() - started < 30
    assert not result.ok and result.returncode != 0
    assert "rank 1 (pid" in result.message and "exited during point 3" in result.message
    assert f"exitcode  : {FAULT_EXIT_CODE}" in result.output      # torchrun's own report
    table = RunDir.open(run_path).read_table("comm")
    assert table["status"].tolist()[:3] == ["ok"] * 3 and table["tokens"].tolist()[:3] == [1, 2, 4]
    assert len(table) <= 4 and (table["status"].iloc[3:] == "error").all()
    comm = _run_json(run_path)["comm"]
    assert comm["status"] == "failed" and comm["failure"] == result.message


def test_a_rank_that_hangs_is_named_by_the_watchdog(tmp_path):
    """Bare torchrun, no launcher: rank 0's watchdog records the failure itself."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "--max-restarts", "0", "-m", "fp4lab", "comm",
               *FAULT_ARGS, "--point-timeout", "2", "--fault", "1:2:hang",
               "--out", str(tmp_path), "--run-id", "hang"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env=launch.launch_environment())
    assert time.monotonic() - started < 30
    assert done.returncode != 0
    comm = _run_json(tmp_path / "hang")["comm"]
    assert comm["status"] == "failed"
    assert comm["failure"].startswith("point 2 (all_reduce n=2 bf16 T=4) did not finish within 2 s")
    assert "rank 1 is stuck in point 2" in comm["failure"]
    assert "rank 0: point 2" in done.stderr                         # said where it happened
    table = RunDir.open(tmp_path / "hang").read_table("comm")
    assert table["status"].tolist() == ["ok", "ok", "timeout"]


def test_the_launcher_time_limit_stops_a_stuck_run(tmp_path):
    run_path = tmp_path / "limit"
    started = time.monotonic()
    result = launch.launch(2, FAULT_ARGS + ["--out", str(tmp_path), "--run-id", "limit",
                                            "--point-timeout", "120", "--fault", "1:1:hang"],
                           run_path, timeout_s=20, capture=True)
    assert time.monotonic() - started < 50
    assert not result.ok
    assert "stopped by SIGTERM" in result.message and "stuck in point 1" in result.message
    assert RunDir.open(run_path).read_table("comm")["status"].tolist()[0] == "ok"


def test_interrupting_the_launcher_stops_its_ranks(tmp_path):
    """Ctrl-C on `python -m fp4lab comm`: the ranks (in torchrun's own session) stop with it."""
    command = [sys.executable, "-m", "fp4lab", "comm", "--nproc-per-node", "2", *FAULT_ARGS,
               "--point-timeout", "120", "--fault", "1:1:hang", "--out", str(tmp_path),
               "--run-id", "interrupted"]
    launcher = subprocess.Popen(command, env=launch.launch_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    heartbeat = tmp_path / "interrupted" / "logs" / "comm-rank1.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and '"point": 1' not in _text(heartbeat):
        time.sleep(0.2)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130 and "interrupted" in err
    beats = [json.loads(p.read_text()) for p in heartbeat.parent.glob("comm-rank*.json")]
    assert beats and all(not _alive(beat["pid"]) for beat in beats)
    comm = _run_json(tmp_path / "interrupted")["comm"]
    assert comm["status"] == "failed" and "stopped by SIGTERM" in comm["failure"]


def _text(path):
    try:
        return path.read_text()
    except OSError:
        return ""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
