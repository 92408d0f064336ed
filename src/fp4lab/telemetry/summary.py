"""Chapter 02's data: a run's telemetry and per-point power columns, and findings in sentences.

Every sentence is computed from the tables; none is written in advance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4lab.results import RunDir, reference_run

POINT_COLUMNS = ["backend", "fmt", "m", "n", "k", "tflops", "avg_power_w", "energy_per_call_j",
                 "tflops_per_w", "sm_clock_mhz", "throttle_reasons", "window_start_s", "window_end_s"]
SMALL_M = 64            # decode-sized batches: the seed's "235 W of a 600 W TDP" regime
BUSY_UTIL_PCT = 50      # a sample counts as "under load" above this GPU utilisation
BENIGN_REASONS = {"none", "gpu_idle"}  # clocks-event reasons that are not throttling


@dataclass
class RunPower:
    """What one run folder holds about power: its timeline, its measured points, its limit."""
    run_id: str
    path: str
    gpu: str | None
    telemetry: Any            # pd.DataFrame, TELEMETRY_COLUMNS (empty when none)
    points: Any               # pd.DataFrame, POINT_COLUMNS of the ok gemm rows with a power reading
    power_limit_w: float | None
    meta: dict[str, Any] = field(default_factory=dict)   # run.json["telemetry"]

    @property
    def has_telemetry(self) -> bool:
        return len(self.telemetry) > 0

    def caption(self) -> str:
        if not self.has_telemetry and not len(self.points):
            return f"run {self.run_id} on {self.gpu or 'unknown device'}: no GPU telemetry"
        rate = self.meta.get("rate_hz")
        source = self.meta.get("source", "sampled during the sweep")
        return (f"run {self.run_id} on {self.gpu or 'unknown GPU'}; NVML"
                f"{f' at {rate:g} Hz' if rate else ''}, {source}; limit "
                f"{f'{self.power_limit_w:.0f} W' if self.power_limit_w else 'unknown'}")


def read_run_power(run_dir: str | os.PathLike) -> RunPower:
    """The power side of a run folder (ValueError when the path is not a run folder)."""
    import pandas as pd

    from fp4lab.telemetry.load import empty_telemetry

    run = RunDir.open(run_dir)
    info = run.run_json()
    meta = info.get("telemetry", {})
    telemetry = run.read_table("telemetry") if run.has_table("telemetry") else empty_telemetry()
    points = pd.DataFrame(columns=POINT_COLUMNS)
    if run.has_table("gemm"):
        gemm = run.read_table("gemm")
        if "avg_power_w" in gemm:
            ok = gemm[(gemm["status"] == "ok") & gemm["avg_power_w"].notna()]
            points = ok[[c for c in POINT_COLUMNS if c in ok]].reset_index(drop=True)
    device = info.get("provenance", {}).get("device", {})
    limit = meta.get("power_limit_w")
    if limit is None and "power_limit_w" in telemetry and telemetry["power_limit_w"].notna().any():
        limit = float(telemetry["power_limit_w"].dropna().iloc[0])
    if limit is None:
        limit = device.get("power_limit_w")
    return RunPower(run.run_id, str(run.path), device.get("name") or device.get("kind"), telemetry,
                    points, limit, meta)


def resolve_reference_dir(reference_dir: str = "") -> str:
    """The reference run to show beside this one (results.reference_run), "" when there is none."""
    run = reference_run(reference_dir, table=None if reference_dir else "gemm")
    return str(run) if run else ""


def _pct(part: float, whole: float | None) -> str:
    return f" ({100 * part / whole:.0f}% of its {whole:.0f} W limit)" if whole else ""


def timeline_findings(power: RunPower) -> list[str]:
    frame = power.telemetry
    if not power.has_telemetry:
        return [f"Run {power.run_id} holds no GPU telemetry"
                + (f": {power.meta['reason']}" if power.meta.get("reason") else ".")]
    span = frame["t"].max() - frame["t"].min()
    instant, average = frame["power_instant_w"], frame["power_avg_w"]
    if instant.notna().any():
        lag = (f", while the ~1 s averaged reading peaked at {average.max():.0f} W"
               if average.notna().any() else "")
        found = [f"Over {span:.1f} s sampled ({len(frame)} samples), instant power ranged "
                 f"{instant.min():.0f}-{instant.max():.0f} W{_pct(instant.max(), power.power_limit_w)}{lag}."]
    elif average.notna().any():
        found = [f"Over {span:.1f} s sampled the driver offered only the ~1 s averaged power: "
                 f"{average.min():.0f}-{average.max():.0f} W{_pct(average.max(), power.power_limit_w)}."]
    else:
        found = [f"Over {span:.1f} s sampled the driver refused every power reading."]
    busy = frame[frame["gpu_util_pct"] > BUSY_UTIL_PCT]
    if len(busy) and busy["sm_clock_mhz"].notna().any():
        found.append(f"Under load (GPU utilisation > {BUSY_UTIL_PCT}%, {len(busy)} samples) the SM clock "
                     f"had a median of {busy['sm_clock_mhz'].median():.0f} MHz "
                     f"(range {busy['sm_clock_mhz'].min():.0f}-{busy['sm_clock_mhz'].max():.0f} MHz) "
                     f"at {busy['temperature_c'].max():.0f} °C at most.")
    found.append(throttle_sentence(frame["throttle_reasons"]))
    return found


def reason_counts(reasons) -> dict[str, int]:
    """How many samples showed each clocks-event reason."""
    counts: dict[str, int] = {}
    for joined in reasons.dropna():
        for name in str(joined).split(";"):
            counts[name] = counts.get(name, 0) + 1
    return counts


def throttle_sentence(reasons) -> str:
    total = int(reasons.notna().sum())
    if total == 0:
        return "The driver reported no clocks-event (throttle) reasons."
    throttling = {k: v for k, v in reason_counts(reasons).items() if k not in BENIGN_REASONS}
    if not throttling:
        return f"No throttling reason appeared in {total} readings (only idle or none)."
    listed = ", ".join(f"{name} in {100 * n / total:.0f}%" for name, n in
                       sorted(throttling.items(), key=lambda item: -item[1]))
    return f"Clocks were held back by: {listed} of {total} readings."


def point_findings(power: RunPower) -> list[str]:
    points = power.points
    if not len(points):
        return [f"Run {power.run_id} has no sweep points with a power reading."]
    found = []
    small = points[points["m"] <= SMALL_M]
    if len(small):
        watts = small["avg_power_w"].median()
        found.append(f"At M <= {SMALL_M} the GPU draws {watts:.0f} W (median of {len(small)} point{'s' if len(small) > 1 else ''})"
                     f"{_pct(watts, power.power_limit_w)}.")
    largest = points[points["m"] == points["m"].max()]
    watts = largest["avg_power_w"].median()
    found.append(f"At M = {int(largest['m'].iloc[0])} it draws {watts:.0f} W{_pct(watts, power.power_limit_w)}.")
    if points["tflops_per_w"].notna().any():
        best = points.loc[points["tflops_per_w"].idxmax()]
        found.append(f"The most efficient point is {best['backend']} at M = {int(best['m'])}, "
                     f"{int(best['n'])}x{int(best['k'])}: {best['tflops_per_w']:.3g} TFLOPS/W; the least "
                     f"efficient reaches {points['tflops_per_w'].min():.3g} TFLOPS/W.")
    return found


def power_findings(power: RunPower) -> list[str]:
    return timeline_findings(power) + point_findings(power)


# -- chapter 02 plumbing ---------------------------------------------------------------------
DEVICES = ("auto", "cpu", "cuda")
PROFILES = ("smoke", "full")
MAX_DURATION_S = 600.0


def check_chapter_parameters(sample_rate_hz: float, duration_s: float, device: str, profile: str,
                             run_dir: str, reference_dir: str) -> None:
    """Chapter 02's parameters; a ValueError names the bad one."""
    from fp4lab.telemetry.sampler import MAX_RATE_HZ

    if not isinstance(sample_rate_hz, (int, float)) or not 0 < sample_rate_hz <= MAX_RATE_HZ:
        raise ValueError(f"sample_rate_hz {sample_rate_hz!r}: use a rate in (0, {MAX_RATE_HZ:g}]")
    if not isinstance(duration_s, (int, float)) or not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration_s {duration_s!r}: use (0, {MAX_DURATION_S:g}] seconds")
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: use one of {', '.join(DEVICES)}")
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r}: use one of {', '.join(PROFILES)}")
    if run_dir and not Path(run_dir).is_dir():
        raise ValueError(f"run_dir {run_dir!r} does not exist")
    reference_run(reference_dir, table=None)  # a bad reference_dir raises, naming it


def _uses_cuda(device: str) -> bool:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda': torch sees no CUDA GPU on this machine")
    return device != "cpu" and torch.cuda.is_available()


def obtain_run_power(run_dir: str, sample_rate_hz: float, duration_s: float,
                     device: str = "auto") -> tuple[RunPower | None, str]:
    """This run's power data; when it has no telemetry and a GPU is here, sample a steady load
    into the run folder first. Returns (RunPower or None, a sentence on where the data came from)."""
    from fp4lab.telemetry.load import sample_steady_load
    from fp4lab.telemetry.sampler import Sampler

    if not run_dir:
        return None, "No run folder was given (run_dir is empty): only the reference run is shown."
    power = read_run_power(run_dir)
    if power.has_telemetry:
        return power, f"Run {power.run_id}: telemetry sampled during the sweep ({len(power.telemetry)} samples)."
    if not _uses_cuda(device):
        reason = Sampler(sample_rate_hz).reason or "device is 'cpu'"
        power.meta.setdefault("reason", reason)
        return power, (f"**No GPU telemetry exists on this machine** ({reason}); this run has none, "
                       "so the figures below come from the reference run, if there is one.")
    frame, meta = sample_steady_load(duration_s, sample_rate_hz)
    if not len(frame):
        return power, f"**No GPU telemetry could be sampled here**: {meta.get('reason')}."
    run = RunDir.open(run_dir)
    run.append_rows("telemetry", frame.to_dict("records"))
    run.update_run_json("telemetry", meta)
    return read_run_power(run_dir), (f"Run {power.run_id} had no telemetry, so this chapter sampled "
                                     f"{duration_s:g} s of a steady bf16 GEMM load "
                                     f"({meta['load_tflops']:.0f} TFLOP/s) at {sample_rate_hz:g} Hz.")


def read_reference_power(reference_dir: str = "") -> tuple[RunPower | None, str]:
    """The reference run beside this one (given, else the newest committed), and a sentence."""
    resolved = resolve_reference_dir(reference_dir)
    if not resolved:
        return None, "No committed reference run was found under results/reference."
    power = read_run_power(resolved)
    return power, f"Reference run {power.run_id} ({power.caption()})."
