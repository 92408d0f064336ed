"""The background sampler: NVML readings of every chosen GPU at a fixed rate, as a tidy table.

    with Sampler(rate_hz=20) as sampler:
        run_the_sweep()
    frame = sampler.frame            # one row per sample per GPU (TELEMETRY_COLUMNS)

A thread (not a process) does the sampling: NVML calls release the GIL while the driver answers,
a thread shares the clock of the process it measures, and it starts in microseconds. On a machine
without NVML the sampler is a null sampler: `available` is False, `reason` says why, start/stop
still work and the table is empty.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from fp4lab.nvml import GpuReader, counter_delta_mj, load_nvml

POWER_LABELS = {
    "power_instant_w": "instantaneous board power (NVML field NVML_FI_DEV_POWER_INSTANT)",
    "power_avg_w": "nvmlDeviceGetPowerUsage: a ~1 s trailing average on Hopper, it lags bursts",
    "energy_j": "nvmlDeviceGetTotalEnergyConsumption, relative to the first sample (updates ~every 100 ms)",
}

TELEMETRY_COLUMNS = [
    "t", "gpu", "power_instant_w", "power_avg_w", "energy_j", "sm_clock_mhz", "mem_clock_mhz",
    "temperature_c", "gpu_util_pct", "mem_util_pct", "throttle_reasons",
    "violation_power_s", "violation_thermal_s", "power_limit_w",
]

MAX_RATE_HZ = 1000.0
STOP_TIMEOUT_S = 5.0


def _device_list(device_index: int | Sequence[int] | None, count: int) -> list[int]:
    if device_index is None:
        return list(range(count))
    indices = [device_index] if isinstance(device_index, int) else list(device_index)
    for index in indices:
        if not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"device_index {index!r}: NVML sees {count} GPU(s), use 0..{count - 1}")
    return indices


def energy_to_joules(frame):
    """Raw counter (mJ) per GPU -> cumulative joules since that GPU's first sample, wrap-safe."""
    import pandas as pd

    frame = frame.copy()
    frame["energy_j"] = pd.Series([None] * len(frame), index=frame.index, dtype="float64")
    for _, rows in frame.groupby("gpu"):
        previous, total = None, 0
        for index, value in rows["energy_mj"].items():
            if pd.isna(value):
                continue
            value = int(value)
            total += 0 if previous is None else counter_delta_mj(previous, value)
            previous = value
            frame.at[index, "energy_j"] = total / 1000.0
    return frame.drop(columns=["energy_mj"])


class Sampler:
    """Samples NVML telemetry of `device_index` (an int, a list, or None for all GPUs)."""

    def __init__(self, rate_hz: float = 20.0, device_index: int | Sequence[int] | None = 0):
        if not isinstance(rate_hz, (int, float)) or not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate_hz {rate_hz!r}: use a rate in (0, {MAX_RATE_HZ:g}] samples/s")
        self.rate_hz = float(rate_hz)
        self.frame = None
        self.power_limit_w: float | None = None
        self.refused: dict[int, dict[str, str]] = {}
        self._running = False
        self._thread: threading.Thread | None = None  # None for the null sampler
        self._stop_event = threading.Event()
        self._rows: list[dict[str, Any]] = []
        self._error: BaseException | None = None
        self._nvml = None
        nvml, self.reason = load_nvml()
        self.available = nvml is not None
        self.device_indices: list[int] = []
        if nvml is not None:
            try:
                self.device_indices = _device_list(device_index, nvml.nvmlDeviceGetCount())
            finally:
                nvml.nvmlShutdown()  # the probe only; start() opens its own NVML session

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> "Sampler":
        if self.running:
            raise RuntimeError("Sampler.start(): already running; call stop() first")
        self._rows, self._error, self.frame = [], None, None
        self._stop_event.clear()
        self._running = True
        if not self.available:
            return self  # null sampler: nothing to sample
        nvml, reason = load_nvml()
        if nvml is None:  # the driver went away between probe and start
            self.available, self.reason = False, reason
            return self
        self._nvml = nvml
        readers = [GpuReader(nvml, index) for index in self.device_indices]
        self.power_limit_w = readers[0].power_limit_w
        self._readers = readers
        self._thread = threading.Thread(target=self._sample_loop, name="fp4lab-telemetry",
                                        daemon=True)
        self._thread.start()
        return self

    def _sample_loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_tick = time.perf_counter()
        try:
            while not self._stop_event.is_set():
                now = time.time()
                for reader in self._readers:
                    self._rows.append({"t": now, "gpu": reader.device_index,
                                       **reader.sample(), "power_limit_w": reader.power_limit_w})
                next_tick += period
                delay = next_tick - time.perf_counter()
                if delay < 0:  # fell behind (slow driver): skip ticks rather than burst to catch up
                    next_tick, delay = time.perf_counter(), 0.0
                self._stop_event.wait(delay)
        except BaseException as exc:  # re-raised by stop() in the caller's thread
            self._error = exc

    def stop(self):
        """Stop sampling; the table of samples (also kept as `self.frame`)."""
        import pandas as pd

        if not self.running:
            raise RuntimeError("Sampler.stop(): not running; call start() first")
        self._stop_event.set()
        self._running = False
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                raise RuntimeError(f"telemetry thread did not stop within {STOP_TIMEOUT_S:g} s "
                                   "(an NVML call is hanging)")
        if self._nvml is not None:
            self.refused = {reader.device_index: dict(reader.refused) for reader in self._readers}
            self._nvml.nvmlShutdown()
            self._nvml = None
        if self._error is not None:
            raise RuntimeError(f"telemetry sampling failed: {self._error!r}") from self._error
        if self._rows:
            frame = energy_to_joules(pd.DataFrame(self._rows))[TELEMETRY_COLUMNS]
        else:
            frame = pd.DataFrame({column: pd.Series(dtype="float64") for column in TELEMETRY_COLUMNS})
        frame.attrs.update(self.metadata())
        self.frame = frame
        return frame

    def metadata(self) -> dict[str, Any]:
        """What run.json["telemetry"] records about this sampler."""
        return {"available": self.available, "reason": self.reason, "rate_hz": self.rate_hz,
                "gpus": self.device_indices, "power_limit_w": self.power_limit_w,
                "refused_fields": {str(gpu): fields for gpu, fields in self.refused.items()},
                "labels": POWER_LABELS}

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        if self.running:
            self.stop()
