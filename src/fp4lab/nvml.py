"""NVML access for fp4lab: the one reader per GPU, found by PCI bus id, that remembers which
fields the driver refuses. Device detection, the timer's clock reads, the sampler and the energy
windows all read through `GpuReader`.

GPUs are named by their torch CUDA index everywhere in fp4lab; the reader finds NVML's handle of
that device by PCI bus id, so `CUDA_VISIBLE_DEVICES` reordering (torch's cuda:0 is NVML's GPU 3)
cannot make it read another GPU. Where the bus id is unknown (no torch GPU, as with the test fakes)
it falls back to NVML's index.

Everything goes through `pynvml` (package nvidia-ml-py), imported lazily so that tests can put a
fake module in `sys.modules["pynvml"]` and CPU machines never load the NVIDIA library.

A field the driver refuses (NVMLError, e.g. NOT_SUPPORTED) is recorded once in `refused` with the
driver's message and read as missing (None) from then on: never as zero, and never asked again,
because a refused query costs as much as a good one and the answer will not change mid-run.
"""

from __future__ import annotations

import time
from typing import Any, Callable

# nvmlClocksEventReason* bits (older name: nvmlClocksThrottleReason*), as nvml.h defines them.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
NO_CLOCK_EVENT = "none"

# nvmlDeviceGetTotalEnergyConsumption is an unsigned 64-bit count of millijoules.
ENERGY_COUNTER_MODULUS = 2**64

# The performance policies whose violation time NVML reports (nvmlPerfPolicyType_t values).
VIOLATION_POLICIES = {"violation_power_s": 0, "violation_thermal_s": 1}

# union member of c_nvmlValue_t for each nvmlValueType_t
_FIELD_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                       6: "usVal"}

# The columns one sample of one GPU holds (before the sampler turns the energy counter into joules).
SAMPLE_FIELDS = ("power_instant_w", "power_avg_w", "energy_mj", "sm_clock_mhz", "mem_clock_mhz",
                 "temperature_c", "gpu_util_pct", "mem_util_pct", "throttle_reasons",
                 *VIOLATION_POLICIES)


def decode_clock_event_reasons(bits: int) -> list[str]:
    """Names of the set clocks-event bits; unknown bits keep their hex value so nothing is lost."""
    if bits < 0:
        raise ValueError(f"clocks-event reason bits must be non-negative, got {bits}")
    if bits == 0:
        return [NO_CLOCK_EVENT]
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if bits & bit]
    unknown = bits & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def counter_delta_mj(previous: int, current: int) -> int:
    """mJ consumed between two reads of the energy counter, across a wrap of the 64-bit counter."""
    return (current - previous) % ENERGY_COUNTER_MODULUS


def load_nvml() -> tuple[Any | None, str]:
    """(pynvml with NVML initialised, "") or (None, why not). Pair every success with nvmlShutdown."""
    try:
        import pynvml
    except ImportError:
        return None, "no NVML: the nvidia-ml-py package (module pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        return None, (f"no NVML/GPU telemetry on this machine: nvmlInit failed ({exc}); "
                      "it needs an NVIDIA GPU and driver")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        pynvml.nvmlShutdown()
        return None, f"no NVML/GPU telemetry: nvmlDeviceGetCount failed ({exc})"
    if count == 0:
        pynvml.nvmlShutdown()
        return None, "no NVML/GPU telemetry: NVML sees no GPU on this machine"
    return pynvml, ""


def check_device_index(nvml, device_index: int) -> None:
    count = nvml.nvmlDeviceGetCount()
    if not isinstance(device_index, int) or isinstance(device_index, bool) or not 0 <= device_index < count:
        raise ValueError(f"device_index {device_index!r}: NVML sees {count} GPU(s), "
                         f"use 0..{count - 1}")


def pci_bus_id(device_index: int) -> str | None:
    """NVML's bus id string of torch's CUDA device `device_index`, or None when torch has no GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(device_index)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (ImportError, AttributeError, RuntimeError, AssertionError):
        return None


def nvml_handle(nvml, device_index: int):
    """NVML's handle of torch's CUDA device `device_index`: by PCI bus id, else by index."""
    bus_id = pci_bus_id(device_index)
    if bus_id:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception:  # noqa: BLE001 - older NVML or another id format: the index below
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


class GpuReader:
    """Reads one GPU's fields; a field refused once stays missing (see module doc).

    `device_index` is torch's CUDA index of the GPU (see module doc for the bus-id lookup).
    """

    def __init__(self, nvml, device_index: int):
        check_device_index(nvml, device_index)
        self.nvml = nvml
        self.device_index = device_index
        self.handle = nvml_handle(nvml, device_index)
        self.bus_id = pci_bus_id(device_index)
        self.refused: dict[str, str] = {}
        # The enforced limit is a setting, not a measurement: read once per reader.
        limit_mw = self._read("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle))
        self.power_limit_w = None if limit_mw is None else limit_mw / 1000.0

    def _read(self, name: str, query: Callable[[], Any]) -> Any:
        if name in self.refused:
            return None
        try:
            return query()
        except self.nvml.NVMLError as exc:
            self.refused[name] = str(exc)
            return None

    def _field_value(self, name: str, field_id: int) -> float | None:
        """One nvmlDeviceGetFieldValues entry; its own per-field return code counts as a refusal."""
        values = self._read(name, lambda: self.nvml.nvmlDeviceGetFieldValues(self.handle, [field_id]))
        if values is None:
            return None
        entry = values[0]
        if entry.nvmlReturn != 0:
            self.refused[name] = str(self.nvml.NVMLError(entry.nvmlReturn))
            return None
        return float(getattr(entry.value, _FIELD_VALUE_MEMBER.get(entry.valueType, "uiVal")))

    def energy_mj(self) -> int | None:
        return self._read("energy_mj", lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def sm_clock_mhz(self) -> float | None:
        return self._read("sm_clock_mhz",
                          lambda: self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))

    def max_clock_mhz(self, which: str = "sm") -> float | None:
        clock = {"sm": self.nvml.NVML_CLOCK_SM, "mem": self.nvml.NVML_CLOCK_MEM}[which]
        return self._read(f"max_{which}_clock_mhz",
                          lambda: self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, clock))

    def driver_version(self) -> str | None:
        driver = self._read("driver", self.nvml.nvmlSystemGetDriverVersion)
        return driver.decode() if isinstance(driver, bytes) else driver

    def clock_event_bits(self) -> int | None:
        nvml = self.nvml
        # The "ClocksEvent" name replaced "ClocksThrottle" in newer bindings; the bits are the same.
        query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return self._read("throttle_reasons", lambda: query(self.handle))

    def throttle_reasons(self) -> str | None:
        bits = self.clock_event_bits()
        return None if bits is None else ";".join(decode_clock_event_reasons(bits))

    def sample(self) -> dict[str, Any]:
        """One reading of every field (None where refused), in SAMPLE_FIELDS order."""
        nvml, handle = self.nvml, self.handle
        power_mw = self._read("power_avg_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        instant_mw = self._field_value("power_instant_w", nvml.NVML_FI_DEV_POWER_INSTANT)
        mem_clock = self._read("mem_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
        utilization = self._read("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        row = {
            "power_instant_w": None if instant_mw is None else instant_mw / 1000.0,
            "power_avg_w": None if power_mw is None else power_mw / 1000.0,
            "energy_mj": self.energy_mj(),
            "sm_clock_mhz": self.sm_clock_mhz(),
            "mem_clock_mhz": mem_clock,
            "temperature_c": self._read("temperature_c", lambda: nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU)),
            "gpu_util_pct": None if utilization is None else utilization.gpu,
            "mem_util_pct": None if utilization is None else utilization.memory,
            "throttle_reasons": self.throttle_reasons(),
        }
        for column, policy in VIOLATION_POLICIES.items():
            violation = self._read(column, lambda: nvml.nvmlDeviceGetViolationStatus(handle, policy))
            row[column] = None if violation is None else violation.violationTime / 1e9  # ns -> s
        return row

    def wait_for_energy_tick(self, since_mj: int, timeout_s: float,
                             between_polls: Callable[[], None]) -> tuple[float, int] | None:
        """Poll until the energy counter moves off `since_mj`; (epoch time, new value) or None."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            between_polls()
            value = self.energy_mj()
            if value is None:
                return None
            if value != since_mj:
                return time.time(), value
        return None
