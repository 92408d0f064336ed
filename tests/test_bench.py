"""The timer: statistics, cold-L2 copy logic, clones, clock steadiness, graph fallback, CUDA path."""

import contextlib
import dataclasses

import time

import pytest
import torch

from fp4lab import bench
from fp4lab.bench import (TimerConfig, Timing, args_nbytes, clock_is_steady, clone_args,
                          cold_l2_copies, format_timing_line, percentile, time_call)

MB = 2**20


def matmul_call(args, out):
    a, w = args
    return lambda: torch.mm(a, w.T, out=out)


def test_cpu_timing_statistics_are_ordered_and_counted():
    a, w = torch.randn(16, 32), torch.randn(24, 32)
    timing = time_call(matmul_call, (a, w), torch.empty(16, 24), TimerConfig.smoke(), "cpu")
    assert timing.n == TimerConfig.smoke().repeats == len(timing.samples_us)
    assert 0 < timing.p20_us <= timing.median_us <= timing.p80_us
    assert min(timing.samples_us) <= timing.p20_us and timing.p80_us <= max(timing.samples_us)
    assert timing.graph is False and timing.cold_l2 is False and "perf_counter" in timing.note


def test_cpu_timer_runs_the_call_it_was_given():
    calls = []
    config = TimerConfig(repeats=7, warmup_s=0)
    time_call(lambda args, out: lambda: calls.append(args), ("x",), None, config, "cpu")
    assert len(calls) == 1 + 7  # one untimed first call, then one per repeat


def test_percentile_matches_linear_interpolation():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 20) == pytest.approx(1.8)
    with pytest.raises(ValueError):
        percentile([], 50)


@dataclasses.dataclass
class Packed:  # stands in for formats.QuantizedTensor
    packed: torch.Tensor
    scales: torch.Tensor
    fmt: str


def test_clones_are_independent_copies_of_nested_args():
    args = (torch.ones(4), Packed(torch.zeros(2, dtype=torch.uint8), torch.ones(2), "nvfp4"),
            [torch.ones(3)], 7)
    copy = clone_args(args)
    assert isinstance(copy, tuple) and isinstance(copy[1], Packed) and copy[3] == 7
    assert copy[1].fmt == "nvfp4"
    originals, clones = bench.tensors_in(args), bench.tensors_in(copy)
    assert len(originals) == len(clones) == 4
    for original, clone in zip(originals, clones):
        assert torch.equal(original, clone)
        assert original.data_ptr() != clone.data_ptr()
    copy[0].add_(1)
    assert args[0].sum().item() == 4  # writing a clone leaves the original alone


def test_args_nbytes_counts_a_shared_tensor_once():
    t = torch.ones(256)  # 1 KiB
    assert args_nbytes((t, t, [t])) == 1024
    assert args_nbytes((t, torch.ones(256))) == 2048


def test_cold_l2_copy_count_covers_the_l2_multiple():
    count, note = cold_l2_copies(bytes_per_copy=7 * MB, l2_bytes=60 * MB, l2_multiple=4,
                                 budget_bytes=8 * 2**30, max_copies=1024)
    assert count == 35 and note == ""  # ceil(240 / 7)
    assert count * 7 >= 240 > (count - 1) * 7


def test_cold_l2_large_operands_need_one_copy():
    count, note = cold_l2_copies(500 * MB, 60 * MB, 4, 8 * 2**30, 1024)
    assert (count, note) == (1, "")


def test_cold_l2_copies_are_capped_by_the_memory_budget_and_say_so():
    count, note = cold_l2_copies(10 * MB, 60 * MB, 4, budget_bytes=50 * MB, max_copies=1024)
    assert count == 5
    assert "memory budget" in note and "0.8x L2" in note and "wanted 4x" in note


def test_cold_l2_copies_are_capped_by_max_copies_and_say_so():
    count, note = cold_l2_copies(1024, 60 * MB, 4, 8 * 2**30, max_copies=100)
    assert count == 100 and "max_copies" in note


def test_clock_steady_at_ratio_or_when_it_stops_rising():
    assert clock_is_steady([1900.0], max_clock=1980.0, min_ratio=0.95)
    assert not clock_is_steady([345.0, 900.0, 1500.0], max_clock=1980.0, min_ratio=0.95)
    assert clock_is_steady([1750.0, 1755.0, 1752.0], max_clock=1980.0, min_ratio=0.95)
    assert not clock_is_steady([], max_clock=1980.0, min_ratio=0.95)


def test_warm_up_is_a_no_op_on_cpu():
    assert bench.warm_up_clocks("cpu", TimerConfig.smoke()) is None


def test_a_burst_that_ended_under_the_warm_clock_does_not_count_as_a_warm_up(monkeypatch):
    """A burst at the power limit ends with the SM clock fallen: the next point warms up again
    (its burst starts at the boost clock), where one that held its clock lets the next skip it."""
    monkeypatch.setattr(bench, "_warm_until", {})
    config = TimerConfig.smoke()
    bench.mark_burst_end(0, config, 1965.0, 1980.0)
    deadline, clock = bench._warm_until[0]
    assert clock == 1965.0 and deadline > time.monotonic()
    bench.mark_burst_end(0, config, 1605.0, 1980.0)          # 81% of the maximum: fallen
    assert 0 not in bench._warm_until
    bench.mark_burst_end(1, config, None, None)              # no NVML: as before, warm for a while
    assert 1 in bench._warm_until


def test_a_burst_is_cut_to_fit_max_burst_ms_but_keeps_a_few_replays():
    """GLM-5 B = 512 (3.4 ms replays of two calls): 30 replays are ~100 ms, past the ~0.1 s at
    which the power limit lowers the clock; a 50 ms cap keeps 14 of them. A longer replay keeps
    MIN_BURST_REPEATS, a short one all `repeats`, and no cap changes nothing."""
    capped = TimerConfig(repeats=30, max_burst_ms=50.0)
    assert bench.burst_repeats(capped, 3.4) == 14
    assert bench.burst_repeats(capped, 40.0) == bench.MIN_BURST_REPEATS
    assert bench.burst_repeats(capped, 0.5) == 30
    assert bench.burst_repeats(TimerConfig(repeats=30), 3.4) == 30
    assert bench.burst_repeats(TimerConfig(repeats=3, max_burst_ms=1.0), 3.4) == 3


@pytest.mark.parametrize("overrides, name", [
    ({"repeats": 0}, "repeats"), ({"repeats": 2.5}, "repeats"), ({"l2_multiple": 0}, "l2_multiple"),
    ({"min_clock_ratio": 1.5}, "min_clock_ratio"), ({"warmup_s": -1}, "warmup_s"),
    ({"memory_budget_gb": 0}, "memory_budget_gb"), ({"max_burst_ms": 0}, "max_burst_ms"),
    ({"max_burst_ms": True}, "max_burst_ms"), ({"max_burst_ms": "50"}, "max_burst_ms"),
])
def test_bad_timer_config_names_the_field(overrides, name):
    with pytest.raises(ValueError, match=f"TimerConfig.{name}"):
        TimerConfig(**overrides)


def test_bad_device_is_a_clear_error():
    with pytest.raises(ValueError, match="device"):
        time_call(matmul_call, (torch.ones(1, 1), torch.ones(1, 1)), None, TimerConfig.smoke(),
                  "tpu")


def test_graph_capture_failure_falls_back_with_a_reason(monkeypatch):
    class FakeGraph:
        pass

    @contextlib.contextmanager
    def refusing_capture(graph):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", refusing_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    graph, note = bench.capture_graph(lambda: None, torch.device("cpu"))
    assert graph is None
    assert "graph capture failed" in note and "not permitted" in note and "eagerly" in note


def test_empty_kernel_floor_on_cpu_is_positive_and_small():
    assert 0 < bench.empty_kernel_launch_us("cpu") < 1e4


def test_timing_line_is_fixed_width():
    def timing(median):
        return Timing(median, median * 0.9, median * 1.1, 10, True, True, [median], 1980.0)

    short = format_timing_line("bf16 M=1 6144x2048", timing(9.2))
    long = format_timing_line("bf16 M=8192 8192x8192", timing(1234.5))
    assert len(short) == len(long)
    assert "graph cold" in short and "1980 MHz" in short


@pytest.mark.cuda
def test_cuda_cold_and_warm_timing_of_a_small_gemm():
    a = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 6144, device="cuda", dtype=torch.bfloat16)
    cold = time_call(matmul_call, (a, w), out, TimerConfig.smoke(), "cuda")
    warm = time_call(matmul_call, (a, w), out,
                     dataclasses.replace(TimerConfig.smoke(), cold_l2=False), "cuda")
    eager = time_call(matmul_call, (a, w), out,
                      dataclasses.replace(TimerConfig.smoke(), use_graph=False), "cuda")
    assert cold.graph and cold.cold_l2 and cold.copies > 1
    assert warm.copies == 1 and eager.graph is False
    for timing in (cold, warm, eager):
        assert 0 < timing.p20_us <= timing.median_us <= timing.p80_us
    assert warm.median_us <= cold.median_us * 1.1  # warm L2 is never much slower than cold
    # the clock is read on both sides of the burst, and the row keeps both readings beside their median
    from fp4lab.sweep.gemm import timing_columns
    columns = timing_columns(cold)
    readings = [columns["sm_clock_start_mhz"], columns["sm_clock_end_mhz"]]
    if None not in readings:
        assert columns["sm_clock_mhz"] == pytest.approx(sum(readings) / 2)


@pytest.mark.cuda
def test_cuda_burst_cut_by_max_burst_ms_keeps_few_replays_and_says_so():
    a = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, 6144, device="cuda", dtype=torch.bfloat16)
    config = dataclasses.replace(TimerConfig.smoke(), repeats=30, max_burst_ms=0.001)
    timing = time_call(matmul_call, (a, w), out, config, "cuda")
    assert timing.n == bench.MIN_BURST_REPEATS
    assert f"burst cut to {bench.MIN_BURST_REPEATS} replays (0.001 ms)" in timing.note


@pytest.mark.cuda
def test_cuda_uncapturable_call_is_timed_eagerly_and_says_why():
    x = torch.ones(16, device="cuda")

    def syncing_call(args, out):
        return lambda: args[0].sum().item()  # a host sync: illegal inside graph capture

    timing = time_call(syncing_call, (x,), None,
                       dataclasses.replace(TimerConfig.smoke(), cold_l2=False), "cuda")
    assert timing.graph is False and "graph capture failed" in timing.note
    assert timing.median_us > 0


@pytest.mark.cuda
def test_cuda_launch_floor_is_a_few_microseconds():
    assert 0.3 < bench.empty_kernel_launch_us("cuda") < 20
