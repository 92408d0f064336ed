"""A fake `pynvml` that behaves like the real one where fp4lab's telemetry depends on it.

Like the real module: nvmlInit/nvmlShutdown are reference counted, errors are NVMLError with a
`.value` code and the driver's message, nvmlDeviceGetFieldValues reports failures per field in
`nvmlReturn`, power is in mW, the energy counter is an unsigned 64-bit mJ count that the "driver"
only updates every `energy_update_s` (100 ms) and that wraps at 2**64.
Install with `monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...))`.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12

_MESSAGES = {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
             NVML_ERROR_NOT_SUPPORTED: "Not Supported",
             NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


class FakeNvml:
    """One module-like object per test; every knob is a constructor argument."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_VALUE_TYPE_UNSIGNED_INT = 1

    def __init__(self, *, gpus=1, power_w=300.0, energy_start_mj=0, energy_update_s=0.1,
                 unsupported=(), clock_event_bits=0x4, power_limit_w=700.0, no_library=False,
                 sm_clock_mhz=1980, call_delay_s=0.0):
        self.gpus = gpus
        self.power_w = power_w                    # constant draw the energy counter integrates
        self.energy_start_mj = energy_start_mj
        self.energy_update_s = energy_update_s
        self.unsupported = set(unsupported)       # names of functions (or "field:<id>") that refuse
        self.clock_event_bits = clock_event_bits
        self.power_limit_w = power_limit_w
        self.no_library = no_library
        self.sm_clock_mhz = sm_clock_mhz
        self.call_delay_s = call_delay_s          # how long each device query takes
        self.init_count = 0
        self.calls: dict[str, int] = {}
        self._epoch = time.monotonic()
        self._lock = threading.Lock()

    # -- bookkeeping ----------------------------------------------------------------------
    def _enter(self, name):
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name in self.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if self.call_delay_s:
            time.sleep(self.call_delay_s)

    def _handle(self, handle):
        if not (isinstance(handle, tuple) and handle[0] == "gpu" and 0 <= handle[1] < self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    # -- library --------------------------------------------------------------------------
    def nvmlInit(self):
        if self.no_library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.init_count += 1

    def nvmlShutdown(self):
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.init_count -= 1

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", index)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        """Bus ids "00000000:<index + 0x18>:00.0" map to NVML indices in reverse order, so a test
        can tell a lookup by bus id from one by index (as CUDA_VISIBLE_DEVICES reordering does)."""
        self._enter("nvmlDeviceGetHandleByPciBusId")
        try:
            index = self.gpus - 1 - (int(bus_id.split(":")[1], 16) - 0x18)
        except (IndexError, ValueError):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT) from None
        if not 0 <= index < self.gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", index)

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return "580.159.04"

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type):
        self._enter("nvmlDeviceGetMaxClockInfo")
        self._handle(handle)
        return 1980 if clock_type == self.NVML_CLOCK_SM else 3201

    # -- readings -------------------------------------------------------------------------
    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        self._enter("nvmlDeviceGetEnforcedPowerLimit")
        self._handle(handle)
        return int(self.power_limit_w * 1000)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._enter("nvmlDeviceGetPowerUsage")
        self._handle(handle)
        return int(self.power_w * 1000)

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        self._enter("nvmlDeviceGetFieldValues")
        self._handle(handle)
        values = []
        for field_id in field_ids:
            refused = f"field:{field_id}" in self.unsupported
            values.append(SimpleNamespace(
                fieldId=field_id, scopeId=0, timestamp=0, latencyUsec=0,
                valueType=self.NVML_VALUE_TYPE_UNSIGNED_INT,
                nvmlReturn=NVML_ERROR_NOT_SUPPORTED if refused else NVML_SUCCESS,
                value=SimpleNamespace(uiVal=0 if refused else int(self.power_w * 1000 * 1.5))))
        return values

    def energy_now_mj(self):
        """What the counter reads now: the energy up to the last 100 ms update, mod 2**64."""
        elapsed = time.monotonic() - self._epoch
        updated_at = (elapsed // self.energy_update_s) * self.energy_update_s
        return (self.energy_start_mj + int(round(updated_at * self.power_w * 1000))) % 2**64

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self._enter("nvmlDeviceGetTotalEnergyConsumption")
        self._handle(handle)
        return self.energy_now_mj()

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        name = {self.NVML_CLOCK_SM: "clock:sm", self.NVML_CLOCK_MEM: "clock:mem"}[clock_type]
        self._enter("nvmlDeviceGetClockInfo")
        if name in self.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._handle(handle)
        return self.sm_clock_mhz if clock_type == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._enter("nvmlDeviceGetTemperature")
        self._handle(handle)
        return 41

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._enter("nvmlDeviceGetUtilizationRates")
        self._handle(handle)
        return SimpleNamespace(gpu=97, memory=35)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        self._handle(handle)
        return self.clock_event_bits

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        self._enter("nvmlDeviceGetViolationStatus")
        self._handle(handle)
        return SimpleNamespace(referenceTime=0, violationTime=int(2.5e9) if policy == 0 else 0)
