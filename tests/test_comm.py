"""The comm layer in one process: byte and bandwidth definitions, routing splits, the plan, rows
built from per-rank results, heartbeats and their diagnosis, the data checks, the CLI's flags."""

import argparse
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from fp4lab import cli
from fp4lab.comm import collectives, ops, rows, splits
from fp4lab.comm import cli as comm_cli
from fp4lab.comm.faults import Fault
from fp4lab.comm.plan import CommPlan, CommPoint
from fp4lab.comm.watchdog import Heartbeat, describe_ranks, process_alive, read_heartbeats, \
    write_heartbeat


# -- nccl-tests' definitions ----------------------------------------------------------------------

def test_bus_factors_are_nccl_tests():
    assert ops.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert ops.bus_factor("all_to_all_dispatch", 8) == ops.bus_factor("all_to_all_combine", 8) \
        == pytest.approx(7 / 8)
    assert ops.bus_factor("send_recv", 8) == 1.0
    assert ops.bus_factor("all_reduce", 1) == 0.0  # one rank moves nothing over a bus


def test_bandwidths_are_gb_per_s_of_1e9_bytes():
    assert ops.algbw_gbps(10**9, 10**6) == pytest.approx(1.0)    # 1 GB in 1 s
    assert ops.busbw_gbps("all_reduce", 10**9, 10**6, 4) == pytest.approx(1.5)
    assert ops.activation_bytes(16, 6144) == 16 * 6144 * 2


@pytest.mark.parametrize("call, match", [
    (lambda: ops.bus_factor("all_gather", 2), "op must be one of"),
    (lambda: ops.bus_factor("all_reduce", 0), "ranks must be"),
    (lambda: ops.algbw_gbps(10, 0.0), "time_us must be > 0"),
])
def test_bad_arguments_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- routing splits -------------------------------------------------------------------------------

def test_every_rank_sends_its_tokens_k_rows():
    matrix = splits.dispatch_splits("zipf:0.7", 256, 8, 128, 8, seed=1)      # [n, n]
    assert matrix.shape == (8, 8)
    assert (matrix.sum(axis=1) == 128 * 8).all()
    np.testing.assert_array_equal(splits.combine_splits(matrix), matrix.T)
    assert splits.busiest_rows(matrix) == splits.busiest_rows(splits.combine_splits(matrix))


def test_skewed_routing_splits_more_unevenly_than_uniform():
    uniform = splits.imbalance(splits.dispatch_splits("uniform", 256, 8, 128, 32))
    skewed = splits.imbalance(splits.dispatch_splits("zipf:0.7", 256, 8, 128, 32))
    assert 1.0 <= uniform < 1.2          # random but even in expectation
    assert skewed > 2.0                  # the plan's skewed model: ~2.6 here (TRT-LLM: 2.56)


def test_splits_are_the_same_on_every_rank_for_a_seed():
    first = splits.dispatch_splits("uniform", 16, 2, 8, 4, seed=3)
    np.testing.assert_array_equal(first, splits.dispatch_splits("uniform", 16, 2, 8, 4, seed=3))


def test_experts_sit_in_contiguous_balanced_blocks():
    owner = splits.expert_owner(10, 4)
    assert owner.tolist() == sorted(owner.tolist())
    assert sorted(np.bincount(owner).tolist()) == [2, 2, 3, 3]
    with pytest.raises(ValueError, match="ranks=9"):
        splits.expert_owner(8, 9)


def test_one_rank_keeps_every_row():
    assert splits.dispatch_splits("uniform", 8, 2, 5, 1).tolist() == [[10]]


# -- the plan -------------------------------------------------------------------------------------

def test_group_sizes_are_powers_of_two_and_the_world():
    plan = CommPlan.smoke()
    assert plan.group_sizes(8) == (2, 4, 8)
    assert plan.group_sizes(6) == (2, 4, 6)
    assert plan.group_sizes(1) == (1,)
    assert CommPlan.smoke().with_overrides(world_sizes=(3,)).group_sizes(4) == (3,)
    with pytest.raises(ValueError, match="exceed the run's 2 ranks"):
        CommPlan.smoke().with_overrides(world_sizes=(4,)).group_sizes(2)


def test_points_cover_every_op_dtype_routing_and_size():
    plan = CommPlan.smoke()
    points = plan.points(2)
    assert {p.op for p in points} == set(ops.OPS)
    assert [p.index for p in points] == list(range(len(points)))
    per_a2a = len(plan.dtypes) * len(plan.routings) * len(plan.tokens)
    assert len(points) == 2 * len(plan.tokens) + 2 * per_a2a
    assert all(p.dtype == "bf16" and p.routing is None for p in points
               if p.op in ("all_reduce", "send_recv"))


def test_no_all_to_all_with_more_ranks_than_experts():
    plan = CommPlan.smoke().with_overrides(experts=2, top_k=2, world_sizes=(4,))
    assert {p.op for p in plan.points(4)} == {"all_reduce", "send_recv"}


def test_calls_per_sample_amortise_small_messages_only():
    plan = CommPlan.full()
    assert plan.calls_per_sample(1024) == plan.max_calls_per_sample
    assert plan.calls_per_sample(plan.sample_bytes * 4) == 1


@pytest.mark.parametrize("field, value, match", [
    ("ops", ("all_gather",), "ops: all_gather"), ("tokens", (0,), "tokens must be"),
    ("dtypes", ("fp4",), "dtypes: fp4"), ("routings", ("zipf:-1",), "routings:"),
    ("top_k", 99, "top_k=99 exceeds experts"), ("repeats", 0, "repeats must be"),
    ("point_timeout_s", 0, "point_timeout_s must be > 0"),
])
def test_bad_plans_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        CommPlan.smoke().with_overrides(**{field: value})


def test_plan_round_trips_through_its_dict():
    plan = CommPlan.from_preset("deepseek-v3", tokens=(1, 8))
    assert (plan.hidden, plan.experts, plan.top_k, plan.preset) == (7168, 256, 8, "deepseek-v3")
    assert CommPlan.from_dict(plan.as_dict()) == plan


# -- rows from per-rank results -------------------------------------------------------------------

def _result(samples, status="ok", error="", nbytes=4096):
    return {"status": status, "error": error, "samples": samples, "graph": True, "note": "",
            "nbytes": nbytes, "calls": 2, "imbalance": 1.5}


def test_a_row_takes_the_slowest_rank_of_each_iteration():
    point = CommPoint(0, "all_to_all_dispatch", 2, 16, "fp8", "uniform")
    results = [_result([1.0, 5.0, 1.0, 1.0, 1.0]), _result([4.0, 1.0, 1.0, 4.0, 4.0]), None]
    row = rows.point_row("r", point, CommPlan.smoke(), results, "nccl", "cuda")
    assert row["median_us"] == 4.0                       # maxima 4, 5, 1, 4, 4
    assert row["rank_median_us"] == [1.0, 4.0]
    assert row["algbw_gbps"] == pytest.approx(4096 / 4.0 / 1e3)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 0.5)
    assert row["graph"] is True and row["status"] == "ok" and row["imbalance"] == 1.5
    assert set(row) == set(rows.COMM_COLUMNS)


def test_a_row_takes_the_worst_status_and_names_its_rank():
    point = CommPoint(0, "all_reduce", 2, 1, "bf16")
    results = [_result([], "wrong_result", "3 sums differ"), _result([], "oom", "CUDA OOM")]
    row = rows.point_row("r", point, CommPlan.smoke(), results, "nccl", "cuda")
    assert row["status"] == "oom" and row["error"] == "rank 1: CUDA OOM"
    assert row["median_us"] is None


# -- heartbeats -----------------------------------------------------------------------------------

def _beat(rank, step, pid=None, stopped="", host=None):
    return Heartbeat(rank, pid or os.getpid(), host or socket.gethostname(), step, 3,
                     "all_reduce n=2 bf16 T=1", "measure", time.time() - 2.0, stopped)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_rank_that_died_is_named():
    message = describe_ranks({0: _beat(0, 9), 1: _beat(1, 7, pid=_dead_pid())}, 2)
    assert message.startswith("rank 1 (pid ") and "exited during point 3" in message


def test_a_rank_behind_the_others_is_stuck():
    message = describe_ranks({0: _beat(0, 9), 1: _beat(1, 7), 2: _beat(2, 9)}, 3)
    assert message.startswith("rank 1 is stuck in point 3") and "rank 0" not in message


def test_ranks_that_stopped_themselves_are_named_only_without_a_culprit():
    dead = _dead_pid()
    beats = {0: _beat(0, 9, pid=dead, stopped="point 3 timed out"), 1: _beat(1, 9, pid=dead)}
    assert describe_ranks(beats, 2).startswith("rank 1 (pid")
    beats[1] = _beat(1, 9, pid=dead, stopped="stopped by SIGTERM")
    assert describe_ranks(beats, 2) == ("rank 0 stopped: point 3 timed out; "
                                        "rank 1 stopped: stopped by SIGTERM")


def test_a_rank_that_lagged_is_named_even_once_it_stopped():
    dead = _dead_pid()
    beats = {0: _beat(0, 9, stopped="stopped by SIGTERM"),
             1: _beat(1, 7, pid=dead, stopped="stopped by SIGTERM")}
    assert describe_ranks(beats, 2).startswith("rank 1 was stuck in point 3")


def test_missing_and_remote_heartbeats_are_said(tmp_path):
    write_heartbeat(tmp_path, _beat(0, 4))
    write_heartbeat(tmp_path, _beat(1, 4, host="elsewhere"))
    beats = read_heartbeats(tmp_path, 3)
    assert sorted(beats) == [0, 1] and process_alive(beats[1]) is None
    assert describe_ranks(beats, 3) == "no heartbeat here from rank(s) 2"


def test_faults_parse_or_say_the_format():
    assert Fault.parse("1:3:hang") == Fault(1, 3, "hang")
    for text in ("1:3", "a:3:exit", "1:3:crash", "-1:3:exit"):
        with pytest.raises(ValueError, match="RANK:POINT:exit"):
            Fault.parse(text)


# -- the data checks, on a one-rank gloo group ----------------------------------------------------

@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all_dispatch", "all_to_all_combine"])
def test_each_op_checks_then_runs(one_rank_group, op):
    plan = CommPlan.smoke()
    point = CommPoint(0, op, 1, 4, "fp8" if "all_to_all" in op else "bf16",
                      "zipf:0.7" if "all_to_all" in op else None)
    prepared = collectives.prepare(point, plan, one_rank_group, [0], 0, torch.device("cpu"))
    assert prepared.check() == ""
    prepared.make_call(prepared.args, None)()
    row_bytes = plan.hidden * (1 if point.dtype == "fp8" else 2)
    expected = 4 * plan.top_k * row_bytes if "all_to_all" in op else 4 * plan.hidden * 2
    assert prepared.nbytes == expected


def test_gloo_cannot_ring_one_rank_and_says_so(one_rank_group):
    point = CommPoint(0, "send_recv", 1, 4, "bf16")
    with pytest.raises(collectives.Unavailable, match="gloo cannot send a message to its own"):
        collectives.prepare(point, CommPlan.smoke(), one_rank_group, [0], 0, torch.device("cpu"))


def test_an_all_to_all_that_delivers_nothing_is_caught(one_rank_group, monkeypatch):
    point = CommPoint(0, "all_to_all_dispatch", 1, 4, "bf16", "uniform")
    prepared = collectives.prepare(point, CommPlan.smoke(), one_rank_group, [0], 0,
                                   torch.device("cpu"))
    monkeypatch.setattr(dist, "all_to_all_single", lambda *args, **kwargs: None)
    assert prepared.check() == "8 of 8 received rows hold another rank's data"


def test_an_all_reduce_that_does_not_sum_is_caught(one_rank_group, monkeypatch):
    point = CommPoint(0, "all_reduce", 1, 2, "bf16")
    prepared = collectives.prepare(point, CommPlan.smoke(), one_rank_group, [0], 0,
                                   torch.device("cpu"))
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, group=None: tensor.mul_(3))
    assert prepared.check() == "128 of 128 sums differ from 1"


# -- the CLI's flags ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, match", [
    (["--ops", "all_gather"], "--ops: unknown all_gather"),
    (["--tokens", "0,4"], "--tokens: values must be integers >= 1"),
    (["--tokens", "1,x"], "--tokens: '1,x' is not a comma list"),
    (["--profile", "huge"], "--profile must be one of"),
    (["--fault", "1:x:exit"], "--fault:"),
    (["--routing", "zipf:x"], "routings: routing 'zipf:x'"),
    (["--world-sizes", "4", "--nproc-per-node", "2"], "--world-sizes: world_sizes: \\[4\\]"),
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--device", "gpu"], "--device must be one of auto, cpu, cuda"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, match, capsys, tmp_path):
    assert cli.main(["comm", "--device", "cpu", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fp4lab: error:")
    assert __import__("re").search(match, err), err
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_ranks_get_the_plan_the_launcher_parsed():
    parser = argparse.ArgumentParser()
    comm_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["comm", "--device", "cpu", "--ops", "all_to_all", "--tokens", "2,8",
                              "--routing", "uniform", "--eager", "--repeats", "3"])
    again = parser.parse_args(["comm", *comm_cli.worker_args(args, "run-1")])
    assert comm_cli.plan_from_args(again) == comm_cli.plan_from_args(args)
    plan = comm_cli.plan_from_args(args)
    assert plan.ops == ("all_to_all_dispatch", "all_to_all_combine") and not plan.use_graph
    assert again.run_id == "run-1"


def test_the_runs_folder_defaults_to_the_one_every_command_writes(monkeypatch, tmp_path):
    """Without --out the launcher and its ranks write under results.RUNS_ROOT (FP4LAB_RUNS_DIR),
    never under a "runs" relative to wherever the command was started."""
    from fp4lab import results

    monkeypatch.setattr(results, "RUNS_ROOT", tmp_path / "runs-root")
    parser = argparse.ArgumentParser()
    comm_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["comm", "--device", "cpu"])
    assert args.out == str(tmp_path / "runs-root")
    ranks = comm_cli.worker_args(args, "run-1")
    assert ranks[ranks.index("--out") + 1] == str(tmp_path / "runs-root")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_asking_for_cuda_without_a_gpu_is_one_line(capsys, tmp_path):
    assert cli.main(["comm", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "fp4lab: error: --device cuda: torch sees no CUDA GPU here"
