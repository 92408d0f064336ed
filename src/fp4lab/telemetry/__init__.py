"""Power, clocks and energy over NVML: a background sampler and counter-aligned energy windows.

    from fp4lab import telemetry
    with telemetry.Sampler(rate_hz=20) as sampler:      # null sampler (available False) on CPU
        window = telemetry.measure_energy_window(graph.replay, min_seconds=0.5)
    run.append_rows("telemetry", sampler.frame.to_dict("records"))

Modules: sampler (the thread), energy (windows and the idle baseline), load (a steady GEMM load
to watch). NVML itself is read through fp4lab.nvml's one reader.
"""

from fp4lab.telemetry.energy import (EnergyWindowConfig, measure_energy_window, measure_idle_power,
                                     tflops_per_watt, WINDOW_KEYS)
from fp4lab.nvml import CLOCK_EVENT_REASONS, counter_delta_mj, decode_clock_event_reasons
from fp4lab.telemetry.sampler import POWER_LABELS, TELEMETRY_COLUMNS, Sampler

__all__ = ["CLOCK_EVENT_REASONS", "EnergyWindowConfig", "POWER_LABELS", "Sampler", "TELEMETRY_COLUMNS",
           "WINDOW_KEYS", "counter_delta_mj", "decode_clock_event_reasons", "measure_energy_window",
           "measure_idle_power", "tflops_per_watt"]
