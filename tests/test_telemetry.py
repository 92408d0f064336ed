"""Telemetry logic against a fake NVML (tests/fake_nvml.py): no GPU needed."""

from __future__ import annotations

import sys
import threading
import time

import pandas as pd
import pytest

from fakes.nvml import FakeNvml
from fp4lab import telemetry
from fp4lab.telemetry import energy as energy_module
from fp4lab.telemetry.energy import EnergyWindowConfig

FAST = EnergyWindowConfig(idle_seconds=0.1, counter_timeout_s=1.0)


def no_sync() -> None:
    """The fake GPU runs synchronously: nothing to wait for."""


def short_call() -> None:
    time.sleep(0.0005)


@pytest.fixture
def install(monkeypatch):
    def _install(**knobs) -> FakeNvml:
        fake = FakeNvml(**knobs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        monkeypatch.setattr(energy_module, "_IDLE_POWER_W", {})
        return fake
    return _install


def sample_for(seconds: float, **sampler_args) -> tuple[telemetry.Sampler, pd.DataFrame]:
    with telemetry.Sampler(**sampler_args) as sampler:
        time.sleep(seconds)
    return sampler, sampler.frame


# -- fields the driver refuses ----------------------------------------------------------------
def test_refused_fields_are_missing_not_zero_and_not_retried(install):
    fake = install(unsupported={"nvmlDeviceGetPowerUsage", "field:186", "nvmlDeviceGetViolationStatus"})
    sampler, frame = sample_for(0.2, rate_hz=50)
    assert len(frame) >= 3
    for column in ("power_avg_w", "power_instant_w", "violation_power_s", "violation_thermal_s"):
        assert frame[column].isna().all(), column
    assert (frame["sm_clock_mhz"] == 1980).all() and (frame["temperature_c"] == 41).all()
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # refused once, never asked again
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # power and thermal, once each
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # the per-field return code counts too
    assert sampler.refused[0]["power_avg_w"] == "Not Supported"
    assert "power_instant_w" in sampler.metadata()["refused_fields"]["0"]


def test_supported_fields_are_read_in_watts_and_seconds(install):
    install(power_w=250.0)
    _, frame = sample_for(0.15, rate_hz=50)
    row = frame.iloc[-1]
    assert row["power_avg_w"] == pytest.approx(250.0)
    assert row["power_instant_w"] == pytest.approx(375.0)  # the fake's instant field reads 1.5x
    assert row["violation_power_s"] == pytest.approx(2.5)
    assert row["gpu_util_pct"] == 97 and row["mem_util_pct"] == 35 and row["mem_clock_mhz"] == 3201
    assert list(frame.columns) == telemetry.TELEMETRY_COLUMNS


# -- the energy counter -------------------------------------------------------------------------
def test_counter_delta_is_wrap_safe():
    assert telemetry.counter_delta_mj(100, 350) == 250
    assert telemetry.counter_delta_mj(2**64 - 100, 50) == 150


def test_sampler_energy_is_relative_monotonic_and_survives_a_wrap(install):
    install(power_w=300.0, energy_start_mj=2**64 - 20_000)  # wraps after ~67 ms at 300 W
    _, frame = sample_for(0.4, rate_hz=50)
    energy = frame["energy_j"]
    assert energy.iloc[0] == 0.0
    assert energy.is_monotonic_increasing
    span = frame["t"].iloc[-1] - frame["t"].iloc[0]
    assert energy.iloc[-1] == pytest.approx(300.0 * span, abs=300.0 * 0.1 + 1)  # within one update
    assert energy.iloc[-1] < 300.0 * 1.0  # a wrap mishandled would read ~1.8e16 J


def test_energy_window_matches_the_drawn_power_across_a_wrap(install):
    install(power_w=300.0, energy_start_mj=2**64 - 10_000)
    window = telemetry.measure_energy_window(short_call, 0.25, idle_power_w=80.0, synchronize=no_sync,
                                             config=FAST)
    assert window["seconds"] >= 0.25
    assert window["avg_power_w"] == pytest.approx(300.0, rel=0.1)
    assert window["idle_power_w"] == 80.0


def test_too_short_window_waits_for_a_counter_update(install):
    install(power_w=300.0, energy_update_s=0.1)
    window = telemetry.measure_energy_window(short_call, 0.001, idle_power_w=80.0, synchronize=no_sync,
                                             config=FAST)
    assert window["energy_j"] > 0  # two distinct counter updates bound the window
    assert window["seconds"] >= 0.09
    assert window["energy_j"] == pytest.approx(30.0 * round(window["seconds"] / 0.1), rel=1e-6)


def test_energy_window_arithmetic(install):
    install(power_w=400.0, clock_event_bits=0x4 | 0x40)
    window = telemetry.measure_energy_window(short_call, 0.2, synchronize=no_sync, config=FAST)
    assert set(telemetry.WINDOW_KEYS) <= set(window)
    assert window["energy_per_call_j"] * window["calls"] == pytest.approx(window["energy_j"])
    assert window["avg_power_w"] * window["seconds"] == pytest.approx(window["energy_j"])
    assert window["window_end_s"] - window["window_start_s"] == pytest.approx(window["seconds"])
    assert window["calls"] > 10
    assert window["sm_clock_mhz"] == 1980
    assert window["throttle_reasons"] == "hw_thermal_slowdown;sw_power_cap"
    assert window["idle_power_w"] == pytest.approx(400.0, rel=0.15)  # the fake draws 400 W always


def test_stuck_counter_gives_none_and_says_why(install):
    install(energy_update_s=1e6)
    window = telemetry.measure_energy_window(short_call, 0.05, idle_power_w=80.0, synchronize=no_sync,
                                             config=EnergyWindowConfig(counter_timeout_s=0.1))
    assert window["energy_j"] is None and window["avg_power_w"] is None
    assert "did not update" in window["note"]


def test_refused_energy_counter_gives_none_and_says_why(install):
    install(unsupported={"nvmlDeviceGetTotalEnergyConsumption"})
    window = telemetry.measure_energy_window(short_call, 0.05, synchronize=no_sync, config=FAST)
    assert window["energy_per_call_j"] is None
    assert "refuses the energy counter" in window["note"]


def test_energy_window_rejects_bad_arguments(install):
    install()
    with pytest.raises(ValueError, match="min_seconds"):
        telemetry.measure_energy_window(short_call, 0)
    with pytest.raises(ValueError, match="callable"):
        telemetry.measure_energy_window("graph.replay", 0.5)
    with pytest.raises(ValueError, match="device_index 3"):
        telemetry.measure_energy_window(short_call, 0.1, device_index=3, synchronize=no_sync)


def test_idle_power(install):
    install(power_w=82.0)
    assert telemetry.measure_idle_power(0, seconds=0.1, synchronize=no_sync) == pytest.approx(82.0, rel=0.15)


def test_tflops_per_watt():
    assert telemetry.tflops_per_watt(2e12, 0.5) == pytest.approx(4.0)
    assert telemetry.tflops_per_watt(2e12, None) is None


# -- throttle reasons and the power limit ---------------------------------------------------------
def test_clock_event_bits_decode_to_names():
    assert telemetry.decode_clock_event_reasons(0) == ["none"]
    assert telemetry.decode_clock_event_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert telemetry.decode_clock_event_reasons(0x1 | 0x10000) == ["gpu_idle", "unknown_0x10000"]
    with pytest.raises(ValueError, match="non-negative"):
        telemetry.decode_clock_event_reasons(-1)


def test_sampler_decodes_reasons_and_reads_the_limit_once(install):
    fake = install(clock_event_bits=0x1 | 0x4, power_limit_w=700.0)
    sampler, frame = sample_for(0.2, rate_hz=50)
    assert (frame["throttle_reasons"] == "gpu_idle;sw_power_cap").all()
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 1
    assert sampler.power_limit_w == 700.0 and (frame["power_limit_w"] == 700.0).all()


def test_older_bindings_with_only_the_throttle_name(install):
    fake = install(clock_event_bits=0x8)
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = fake.nvmlDeviceGetCurrentClocksEventReasons
    fake.nvmlDeviceGetCurrentClocksEventReasons = None
    _, frame = sample_for(0.05, rate_hz=50)
    assert frame["throttle_reasons"].iloc[0] == "hw_slowdown"


# -- null sampler ---------------------------------------------------------------------------------
def test_null_sampler_without_nvml_library(install):
    install(no_library=True)
    sampler, frame = sample_for(0.01)
    assert not sampler.available
    assert "no NVML/GPU" in sampler.reason and "Library Not Found" in sampler.reason
    assert frame.empty and list(frame.columns) == telemetry.TELEMETRY_COLUMNS


def test_null_sampler_on_this_cpu_machine():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    sampler, frame = sample_for(0.01)
    assert not sampler.available and "no NVML" in sampler.reason
    assert frame.empty


# -- thread hygiene -------------------------------------------------------------------------------
def telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fp4lab-telemetry"]


def test_start_stop_leaves_no_thread_and_no_nvml_session(install):
    fake = install()
    sampler = telemetry.Sampler(rate_hz=100)
    assert fake.init_count == 0  # the availability probe closed its session
    sampler.start()
    assert sampler.running and len(telemetry_threads()) == 1
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start()
    time.sleep(0.05)
    first = sampler.stop()
    assert not sampler.running and telemetry_threads() == [] and fake.init_count == 0
    with pytest.raises(RuntimeError, match="not running"):
        sampler.stop()
    sampler.start()  # a sampler can be reused; the new table starts afresh
    time.sleep(0.05)
    second = sampler.stop()
    assert second["t"].min() > first["t"].max()


def test_rate_is_kept_and_the_loop_does_not_burst(install):
    install()
    _, frame = sample_for(0.5, rate_hz=20)
    assert 7 <= len(frame) <= 12
    assert frame["t"].diff().dropna().min() > 0.02


def test_slow_driver_lowers_the_rate_instead_of_piling_up(install):
    install(call_delay_s=0.005)  # ~12 queries per sample: ~60 ms per sample
    _, frame = sample_for(0.3, rate_hz=200)
    assert len(frame) <= 8


def test_failure_inside_the_thread_surfaces_in_stop(install):
    fake = install()

    def broken(handle):
        raise KeyError("driver returned garbage")

    fake.nvmlDeviceGetTemperature = broken
    sampler = telemetry.Sampler(rate_hz=50).start()
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="telemetry sampling failed"):
        sampler.stop()
    assert telemetry_threads() == [] and fake.init_count == 0


def test_all_gpus_give_one_row_per_sample_per_gpu(install):
    install(gpus=2)
    _, frame = sample_for(0.1, rate_hz=50, device_index=None)
    counts = frame.groupby("gpu").size()
    assert list(counts.index) == [0, 1] and counts[0] == counts[1]
    assert (frame.groupby("gpu")["energy_j"].first() == 0).all()


@pytest.mark.parametrize("args, message", [
    ({"rate_hz": 0}, "rate_hz 0"), ({"rate_hz": "fast"}, "rate_hz 'fast'"),
    ({"device_index": 2}, "device_index 2"), ({"device_index": [0, 5]}, "device_index 5"),
])
def test_bad_sampler_arguments_are_named(install, args, message):
    install(gpus=2)
    with pytest.raises(ValueError, match=message):
        telemetry.Sampler(**args)
