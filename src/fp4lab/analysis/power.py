"""What a run holds about power: its NVML timeline, the energy window of each sweep point, the
limit, and the numbers chapter 02 states (ranges, clocks under load, throttle reasons, TFLOPS/W).

"Decode-sized" points are those with M <= analysis.gemm.DECODE_M: the seed's "235 W of a 600 W TDP"
regime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.analysis.gemm import GemmResults, gemm_results
from fp4lab.analysis.run import RunView, view
from fp4lab.results import RunDir
from fp4lab.schema import TELEMETRY_SESSION_GAP_S

BUSY_UTIL_PCT = 50                       # a sample counts as "under load" above this utilisation
BENIGN_REASONS = {"none", "gpu_idle"}    # clocks-event reasons that are not throttling
POINT_COLUMNS = ["backend", "fmt", "m", "n", "k", "gpu_index", "tflops", "avg_power_w",
                 "energy_per_call_j", "tflops_per_w", "window_sm_clock_mhz", "throttle_reasons",
                 "window_start_s", "window_end_s"]


@dataclass
class RunPower:
    view: RunView
    telemetry: pd.DataFrame              # fp4lab.schema.TELEMETRY rows (empty when none)
    points: pd.DataFrame                 # POINT_COLUMNS of the ok gemm rows with a power reading
    power_limit_w: float | None
    meta: dict[str, Any] = field(default_factory=dict)   # run.json["telemetry"]
    gemm: GemmResults | None = None      # the run's GEMM results the points were taken from

    @property
    def has_telemetry(self) -> bool:
        return len(self.telemetry) > 0

    def caption(self, what: str = "") -> str:
        rate = self.meta.get("rate_hz")
        source = self.meta.get("source", "sampled during the sweep")
        limit = f"limit {self.power_limit_w:.0f} W" if self.power_limit_w else "limit unknown"
        sampled = f"NVML{f' at {rate:g} Hz' if rate else ''}, {source}; {limit}"
        return self.view.caption(what) + (f"; {sampled}" if self.has_telemetry or len(self.points) else
                                          "; no GPU telemetry")


def run_power(run_dir: str | RunDir) -> RunPower:
    """The power side of a run folder."""
    run_view = view(run_dir)
    run = run_view.run
    meta = run_view.info.get("telemetry") or {}
    telemetry = run.read_table("telemetry")
    points, gemm = pd.DataFrame(columns=POINT_COLUMNS), None
    if run.has_table("gemm"):
        gemm = gemm_results(run)
        frame = gemm.ok
        points = frame[frame["avg_power_w"].notna()][POINT_COLUMNS].reset_index(drop=True)
    limit = meta.get("power_limit_w")
    if limit is None and len(telemetry) and telemetry["power_limit_w"].notna().any():
        limit = float(telemetry["power_limit_w"].dropna().iloc[0])
    if limit is None:
        limit = run_view.power_limit_w
    return RunPower(run_view, telemetry, points, limit, meta, gemm)


def reason_counts(reasons: pd.Series) -> dict[str, int]:
    """How many samples showed each clocks-event reason."""
    counts: dict[str, int] = {}
    for joined in reasons.dropna():
        for name in str(joined).split(";"):
            counts[name] = counts.get(name, 0) + 1
    return counts


def throttling(reasons: pd.Series) -> dict[str, float]:
    """Share of readings (0-1) in which each throttling (non-benign) reason was active."""
    total = int(reasons.notna().sum())
    if not total:
        return {}
    return {name: count / total for name, count in sorted(reason_counts(reasons).items(), key=lambda kv: -kv[1])
            if name not in BENIGN_REASONS}


def sampled_seconds(telemetry: pd.DataFrame) -> float:
    """Seconds the sampler ran, the pauses between sessions left out (a run resumed a day later
    holds one sample either side of the pause, not a day of sampling); the most of any GPU."""
    seconds = 0.0
    for _, samples in telemetry.groupby("gpu", dropna=False):
        steps = np.diff(np.unique(samples["t"].to_numpy(dtype=float)))
        seconds = max(seconds, float(steps[steps <= TELEMETRY_SESSION_GAP_S].sum()))
    return seconds


def timeline_numbers(power: RunPower) -> dict[str, Any]:
    """Time sampled, instant and averaged power ranges, the clock under load, throttling, per GPU."""
    frame = power.telemetry
    if not power.has_telemetry:
        return {}
    busy = frame[frame["gpu_util_pct"] > BUSY_UTIL_PCT]
    return {
        "seconds": sampled_seconds(frame), "samples": len(frame),
        "gpus": sorted(int(g) for g in frame["gpu"].dropna().unique()),
        "instant_min_w": frame["power_instant_w"].min(), "instant_max_w": frame["power_instant_w"].max(),
        "average_min_w": frame["power_avg_w"].min(), "average_max_w": frame["power_avg_w"].max(),
        "busy_samples": len(busy),
        "busy_clock_median_mhz": busy["sm_clock_mhz"].median() if len(busy) else None,
        "busy_clock_min_mhz": busy["sm_clock_mhz"].min() if len(busy) else None,
        "busy_clock_max_mhz": busy["sm_clock_mhz"].max() if len(busy) else None,
        "max_temperature_c": frame["temperature_c"].max(),
        "readings": int(frame["throttle_reasons"].notna().sum()),
        "throttling": throttling(frame["throttle_reasons"]),
    }


def point_numbers(power: RunPower) -> dict[str, Any]:
    """Power at the largest M, and the most and least efficient points (power at decode is
    fp4lab.analysis.decode.Diagnosis.decode_power: one number for chapters 02 and 04)."""
    points = power.points
    if not len(points):
        return {}
    largest = points[points["m"] == points["m"].max()]
    found = {"largest_m": int(largest["m"].iloc[0]), "largest_w": largest["avg_power_w"].median(),
             "largest_points": int(largest["avg_power_w"].notna().sum())}
    efficient = points.dropna(subset=["tflops_per_w"])
    if len(efficient):
        best = efficient.loc[efficient["tflops_per_w"].idxmax()]
        least = efficient.loc[efficient["tflops_per_w"].idxmin()]
        found.update(best=best.to_dict(), least=least.to_dict(), least_tflops_per_w=least["tflops_per_w"])
    return found
