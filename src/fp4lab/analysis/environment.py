"""Chapter 00's numbers: the device a run measured (from its provenance), its spec sheet, the
library versions, and what FP4 means on it."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fp4lab import hardware, roofline
from fp4lab.analysis.run import RunView
from fp4lab.results import device_of

GPU_FIELDS = ("name", "compute_capability", "sm_count", "memory_gb", "l2_mb", "driver", "cuda",
              "max_sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "pci_bus_id", "spec")
CPU_FIELDS = ("name", "cpu_count", "torch_threads")
UNITS = {"memory_gb": "memory (GiB)", "l2_mb": "L2 (MB)", "max_sm_clock_mhz": "max SM clock (MHz)",
         "mem_clock_mhz": "max memory clock (MHz)", "power_limit_w": "power limit (W)",
         "sm_count": "SMs", "cpu_count": "CPU cores", "torch_threads": "torch threads",
         "compute_capability": "compute capability", "pci_bus_id": "PCI bus id",
         "spec": "spec sheet entry", "cuda": "CUDA (torch build)"}
# the spec sheet's figures (hardware.FIGURES) as its sources state them: memory in GB, not GiB
SHEET_FIGURES = {"compute_capability": "compute capability", "sm_count": "SMs", "memory_gb": "memory (GB)",
                 "memory_bw_tbps": "memory bandwidth (TB/s)", "power_w": "power (W)",
                 "smem_per_block_kb": "shared memory a block (KB)", "l2_mb": "L2 (MB)"}


def device_rows(run_view: RunView) -> list[tuple[str, Any]]:
    """(label, value) of what the run's detect() read."""
    device = {**device_of(run_view.info), "cuda": (run_view.info.get("provenance") or {}).get("cuda")}
    fields = GPU_FIELDS if device.get("kind") == "cuda" else CPU_FIELDS
    rows = []
    for name in fields:
        value = device.get(name)
        if isinstance(value, (list, tuple)):
            value = ".".join(map(str, value))
        rows.append((UNITS.get(name, name), value))
    return rows


def spec_for(run_view: RunView) -> hardware.GpuSpec | None:
    key = device_of(run_view.info).get("spec")
    return hardware.SPECS.get(key) if key else None


def sheet_table() -> pd.DataFrame:
    """The whole sheet, the columns the book shows."""
    rows = []
    for spec in hardware.SPECS.values():
        rows.append({"key": spec.key, "name": spec.name, "sm": spec.sm, **{
            f"{dtype}_tflops": spec.peak_tflops.get(dtype) for dtype in ("fp4", "fp8", "bf16")},
            "memory_bw_tbps": spec.memory_bw_tbps, "power_w": spec.power_w,
            "smem_per_block_kb": spec.smem_per_block_kb,
            "native_fp4": ", ".join(hardware.native_fp4_formats(spec.compute_capability)) or "none"})
    return pd.DataFrame(rows)


def spec_rows(spec: hardware.GpuSpec) -> pd.DataFrame:
    """One GPU's figures with the source of each."""
    rows = [{"figure": SHEET_FIGURES[name], "value": getattr(spec, name), "source": spec.sources[name]}
            for name in hardware.FIGURES]
    rows += [{"figure": f"{dtype} dense TFLOP/s", "value": spec.peak_tflops[dtype], "source": spec.sources[dtype]}
             for dtype in hardware.PEAK_KEYS]
    frame = pd.DataFrame(rows)
    frame["value"] = frame["value"].map(lambda v: f"{v[0]}.{v[1]}" if isinstance(v, tuple) else v)
    return frame


def native_fp4(run_view: RunView) -> list[str]:
    return list(device_of(run_view.info).get("native_fp4") or [])


def fp4_bytes_saving(fmt: str = "nvfp4", n: int = 8192, k: int = 8192) -> float:
    """How many times fewer bytes an [N, K] weight takes in FP4 (`fmt`, scales included) than in
    bf16: what weight-only FP4 saves a weight read (3.56x for NVFP4, 3.76x for MXFP4)."""
    return roofline.operand_bytes(n, k, "bf16", None) / roofline.operand_bytes(n, k, "fp4", fmt)
