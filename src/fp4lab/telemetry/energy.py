"""Energy of one sweep point: the NVML energy counter's difference over a loop of repeated calls.

How the window is chosen, and why (issue 4, item 2):

* The counter (nvmlDeviceGetTotalEnergyConsumption, mJ) only moves when the driver updates it,
  about every 100 ms. A plain "read, run, read" would be off by up to one update period at each
  end. So the window is aligned to counter updates: run the call in batches, poll the counter
  after each batch, and start the window at the first update seen while the load runs; keep going
  until at least `min_seconds` have passed AND the counter has updated again; end there.
  The energy is the exact difference between two updates; the calls counted are those completed
  between the two observations, so the only slack is one batch (~5 ms) at each end.
* Batches of ~5 ms, each followed by a synchronize: the GPU stays busy (the gap to launch the next
  batch is tens of microseconds) and an update is seen within ~5 ms of happening. Without the
  synchronize, CUDA-graph replays would queue up ahead of the CPU and the count would be wrong.
* 0.5 s by default: five counter updates, so one update's jitter is ~±2% of the window, and long
  enough for the ~1 s averaged power to climb most of the way (the instant figure is what counts).
* `idle_power_w`: the baseline of a GPU doing nothing (same counter method, nothing launched),
  measured once per process and GPU unless the caller passes one. energy_per_call_j is the whole
  board's energy per call, idle included; subtract idle_power_w * seconds / calls for the part
  the kernel adds.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from fp4lab.nvml import GpuReader, counter_delta_mj, load_nvml

WINDOW_KEYS = ("avg_power_w", "energy_j", "energy_per_call_j", "calls", "seconds", "sm_clock_mhz",
               "throttle_reasons", "window_start_s", "window_end_s", "idle_power_w")


@dataclass
class EnergyWindowConfig:
    batch_seconds: float = 0.005      # run this long between counter polls (see module doc)
    counter_timeout_s: float = 2.0    # ~20 update periods with no update: the counter is stuck
    clock_read_interval_s: float = 0.05  # SM clock / throttle reads inside the window
    idle_seconds: float = 1.0         # length of the idle-baseline window
    poll_sleep_s: float = 0.001       # idle polling step while waiting for an update


DEFAULT_CONFIG = EnergyWindowConfig()
CALIBRATION_CALLS = 3  # synchronized single calls that size the batches
_IDLE_POWER_W: dict[int, float] = {}  # per GPU index: measured once per process


def empty_window(note: str) -> dict[str, Any]:
    """The window's keys with None values (no NVML, or a counter that never moved) and why."""
    return {**{key: None for key in WINDOW_KEYS}, "note": note}


def _cuda_synchronize() -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def _idle_power(reader: GpuReader, seconds: float, config: EnergyWindowConfig) -> float | None:
    start_mj = reader.energy_mj()
    if start_mj is None:
        return None
    def idle() -> None:
        time.sleep(config.poll_sleep_s)

    first = reader.wait_for_energy_tick(start_mj, config.counter_timeout_s, idle)
    if first is None:
        return None
    time.sleep(seconds)
    last = reader.wait_for_energy_tick(reader.energy_mj(), config.counter_timeout_s, idle)
    if last is None:
        return None
    return counter_delta_mj(first[1], last[1]) / 1000.0 / (last[0] - first[0])


def measure_idle_power(device_index: int = 0, seconds: float | None = None,
                       synchronize: Callable[[], None] | None = None,
                       config: EnergyWindowConfig = DEFAULT_CONFIG) -> float | None:
    """Watts the GPU draws with nothing launched (counter-aligned window); None without NVML."""
    seconds = config.idle_seconds if seconds is None else seconds
    if not seconds > 0:
        raise ValueError(f"seconds {seconds!r}: the idle window must be positive")
    (synchronize or _cuda_synchronize())()
    nvml, _ = load_nvml()
    if nvml is None:
        return None
    try:
        return _idle_power(GpuReader(nvml, device_index), seconds, config)
    finally:
        nvml.nvmlShutdown()


def _check_window_args(call, min_seconds) -> None:
    if not callable(call):
        raise ValueError(f"call must be a zero-argument callable, got {type(call).__name__}")
    if not isinstance(min_seconds, (int, float)) or not min_seconds > 0:
        raise ValueError(f"min_seconds {min_seconds!r}: the window must last a positive number of seconds")


class _LoadLoop:
    """Runs `call` in synchronized batches, counting calls and reading clocks as it goes."""

    def __init__(self, call, synchronize, reader: GpuReader, config: EnergyWindowConfig):
        self.call, self.synchronize, self.reader, self.config = call, synchronize, reader, config
        per_call_s = min(self._timed_call() for _ in range(CALIBRATION_CALLS))  # min: skip lazy init
        self.batch = max(1, math.ceil(config.batch_seconds / max(per_call_s, 1e-7)))
        self.calls = CALIBRATION_CALLS
        self.clocks: list[float] = []
        self.reasons: set[str] = set()
        self._last_clock_read = 0.0

    def _timed_call(self) -> float:
        started = time.perf_counter()
        self.call()
        self.synchronize()
        return time.perf_counter() - started

    def run_batch(self) -> None:
        for _ in range(self.batch):
            self.call()
        self.synchronize()
        self.calls += self.batch

    def read_clocks(self) -> None:
        if time.perf_counter() - self._last_clock_read < self.config.clock_read_interval_s:
            return
        self._last_clock_read = time.perf_counter()
        clock = self.reader.sm_clock_mhz()
        if clock is not None:
            self.clocks.append(float(clock))
        reasons = self.reader.throttle_reasons()
        if reasons is not None:
            self.reasons.update(reasons.split(";"))


def _window(loop: _LoadLoop, min_seconds: float, config: EnergyWindowConfig) -> dict[str, Any] | None:
    reader = loop.reader
    start = reader.wait_for_energy_tick(reader.energy_mj(), config.counter_timeout_s, loop.run_batch)
    if start is None:
        return None
    start_calls = loop.calls
    # Run the load for min_seconds, then until the counter moves off its value at that moment.
    deadline = time.perf_counter() + min_seconds
    while time.perf_counter() < deadline:
        loop.run_batch()
        loop.read_clocks()

    def batch_and_clocks() -> None:
        loop.run_batch()
        loop.read_clocks()

    end = reader.wait_for_energy_tick(reader.energy_mj(), config.counter_timeout_s, batch_and_clocks)
    if end is None:
        return None
    calls = loop.calls - start_calls
    energy_j = counter_delta_mj(start[1], end[1]) / 1000.0
    seconds = end[0] - start[0]
    return {
        "avg_power_w": energy_j / seconds,
        "energy_j": energy_j,
        "energy_per_call_j": energy_j / calls,
        "calls": calls,
        "seconds": seconds,
        "sm_clock_mhz": statistics.median(loop.clocks) if loop.clocks else None,
        "throttle_reasons": ";".join(sorted(loop.reasons)) if loop.reasons else None,
        "window_start_s": start[0],
        "window_end_s": end[0],
    }


def measure_energy_window(call: Callable[[], Any], min_seconds: float = 0.5, device_index: int = 0, *,
                          idle_power_w: float | None = None,
                          synchronize: Callable[[], None] | None = None,
                          config: EnergyWindowConfig = DEFAULT_CONFIG) -> dict[str, Any]:
    """Run `call` repeatedly over a counter-aligned window of >= min_seconds (see module doc).

    Returns WINDOW_KEYS (+ "note"); the values are None where NVML is absent or the counter
    does not move, and the note says why.
    """
    _check_window_args(call, min_seconds)
    synchronize = synchronize or _cuda_synchronize()
    nvml, reason = load_nvml()
    if nvml is None:
        return empty_window(reason)
    try:
        reader = GpuReader(nvml, device_index)
        if reader.energy_mj() is None:
            return empty_window(f"the driver refuses the energy counter: {reader.refused['energy_mj']}")
        if idle_power_w is None:
            synchronize()
            if device_index not in _IDLE_POWER_W:
                measured = _idle_power(reader, config.idle_seconds, config)
                if measured is not None:
                    _IDLE_POWER_W[device_index] = measured
            idle_power_w = _IDLE_POWER_W.get(device_index)
        window = _window(_LoadLoop(call, synchronize, reader, config), min_seconds, config)
        if window is None:
            return empty_window(f"the energy counter did not update within "
                                f"{config.counter_timeout_s:g} s")
        return {**window, "idle_power_w": idle_power_w,
                "note": f"counter-aligned window of {window['seconds']:.2f} s, {window['calls']} calls"}
    finally:
        nvml.nvmlShutdown()


def tflops_per_watt(flops_per_call: float, energy_per_call_j: float | None) -> float | None:
    """TFLOP per joule = TFLOP/s per watt; None when the energy is unknown."""
    if energy_per_call_j is None or not energy_per_call_j > 0:
        return None
    return flops_per_call / energy_per_call_j / 1e12
