"""Chapter 00's logic: the device in use, its sheet, library versions, FP4 support, provenance.

The notebook stays thin: it validates its parameters here, shows the tables and figure built
here, records the run's provenance, and prints findings computed from what detect() saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4lab import hardware, results

PROFILES = ("smoke", "full")
NOTEBOOK_COMMAND = "notebooks/00_environment.ipynb"


@dataclass(frozen=True)
class EnvironmentParams:
    run_dir: str
    reference_dir: str
    profile: str
    device: str


def check_parameters(run_dir: str = "", reference_dir: str = "", profile: str = "smoke",
                     device: str = "auto") -> EnvironmentParams:
    """The chapter's parameters, checked; a bad one raises a ValueError naming it."""
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r}: use one of {PROFILES}")
    for name, value in (("run_dir", run_dir), ("reference_dir", reference_dir)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a path string (\"\" for none), got {value!r}")
    results.reference_run(reference_dir, table=None)  # a bad reference_dir raises, naming it
    if run_dir and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ValueError(f"run_dir {run_dir!r} exists and is not a folder")
    return EnvironmentParams(run_dir, reference_dir, profile, hardware.resolve_device(device))


def device_table(info: hardware.DeviceInfo):
    """What detect() read, as field/value rows (missing readings shown as '-')."""
    import pandas as pd

    data = info.as_dict()
    fields = ["name", "kind", "label"] + (
        ["compute_capability", "sm_count", "memory_gb", "l2_mb", "driver", "cuda_version",
         "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "spec"]
        if info.kind == "cuda" else ["cpu_model", "cpu_count", "torch_threads"])
    rows = [{"field": name, "value": _shown(data[name])} for name in fields]
    return pd.DataFrame(rows)


def _shown(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ".".join(map(str, value))
    return str(value)


def own_spec_sheet(info: hardware.DeviceInfo):
    """The device's sheet row with sources, or a Markdown line saying why there is none."""
    from IPython.display import Markdown

    if info.spec is not None:
        return hardware.spec_sheet(info.spec.key)
    if info.kind == "cpu":
        return Markdown(f"This run is on a CPU ({info.name}): the sheet holds GPUs only, so the "
                        "whole GPU sheet below is shown for comparison.")
    return Markdown(f"**{info.name}** has no entry in fp4lab's spec sheet: later chapters "
                    "compare it with measured ceilings only.")


def versions_table(versions: dict[str, str | None]):
    import pandas as pd

    return pd.DataFrame([{"package": name, "version": version or "not installed"}
                         for name, version in versions.items()])


def fp4_support(info: hardware.DeviceInfo) -> str:
    """One paragraph: what FP4 means on this device."""
    if info.kind == "cpu":
        return (f"This run is on a CPU ({info.name}), not a GPU: FP4 GEMMs run only as the "
                "emulated reference (decode to float, then multiply); no timing here says "
                "anything about a GPU.")
    native = info.native_fp4
    cc = ".".join(map(str, info.compute_capability))
    if native:
        return (f"{info.name} (compute capability {cc}) has FP4 tensor cores: it runs "
                f"{' and '.join(native)} natively, so FP4 GEMMs can multiply FP4 operands directly.")
    return (f"{info.name} (compute capability {cc}) has no FP4 tensor cores. Here FP4 means "
            "weight-only kernels: weights are stored in FP4 (4x fewer bytes to read than bf16) and "
            "decoded to bf16 or fp8 in registers before the tensor cores multiply. Blackwell-only "
            "backends report that they cannot run, with the reason.")


def reference_device(reference_dir: str) -> dict[str, Any] | None:
    """The device recorded in a reference run's provenance, or None when there is none."""
    run = results.reference_run(reference_dir, table=None if reference_dir else "gemm")
    if run is None:
        return None
    device = results.RunDir(run).run_json().get("provenance", {}).get("device")
    return {"run": run.name, **device} if device else None


def record_provenance(run_dir: str) -> dict[str, Any] | None:
    """Writes this environment into run.json["provenance"] (creating the run folder if needed)."""
    if not run_dir:
        return None
    path = Path(run_dir)
    run = results.RunDir.open(path) if (path / "run.json").is_file() else \
        results.RunDir.create(path.parent, run_id=path.name)
    provenance = results.provenance(command=NOTEBOOK_COMMAND)
    run.update_run_json("provenance", provenance)
    return provenance


def findings(info: hardware.DeviceInfo, versions: dict[str, str | None],
             reference: dict[str, Any] | None, recorded_in: str = "") -> list[str]:
    """The chapter's conclusions, each computed from what was detected."""
    lines = []
    if info.kind == "cpu":
        lines.append(f"This run is on a CPU ({info.name}, {info.cpu_count} cores, "
                     f"{info.torch_threads} torch threads), not a GPU: later chapters show "
                     "the emulated path and the committed reference runs, not GPU measurements.")
    else:
        spec = info.spec
        sheet = (f"it matches the sheet entry {spec.name} ({spec.memory_bw_tbps} TB/s, "
                 f"{spec.peak_tflops['bf16']} dense bf16 TFLOP/s)" if spec else
                 "it is not in fp4lab's spec sheet, so % of peak uses measured ceilings only")
        lines.append(f"The GPU is {info.name} with {info.sm_count} SMs and "
                     f"{info.memory_gb} GiB; {sheet}.")
        if info.power_limit_w is not None and spec is not None and info.power_limit_w < spec.power_w:
            lines.append(f"Its power limit is set to {info.power_limit_w:.0f} W, below the "
                         f"{spec.power_w:.0f} W of the sheet: peaks may not be reachable.")
        if info.notes:
            lines.append("Some readings are missing: " + "; ".join(info.notes) + ".")
    native = info.native_fp4
    lines.append(f"Native FP4 formats on this device: {', '.join(native) if native else 'none'}.")
    installed = [name for name, version in versions.items() if version]
    missing = [name for name, version in versions.items() if not version]
    lines.append(f"Installed: {', '.join(f'{n} {versions[n]}' for n in installed)}."
                 + (f" Not installed: {', '.join(missing)} (their backends will say so)."
                    if missing else ""))
    if reference:
        lines.append(f"The reference run {reference['run']} shown beside this one was measured "
                     f"on {reference.get('name')}.")
    else:
        lines.append("No committed reference run was found to show beside this one.")
    if recorded_in:
        lines.append(f"This environment is recorded in {recorded_in}/run.json under 'provenance'.")
    return lines
