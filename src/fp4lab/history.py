"""Run history: which runs exist, and what changed between two of them.

Two runs are compared point by point on the GEMM sweep's correct rows, joined on
(backend, fmt, m, n, k). `time_ratio` = this run's median time / the other run's: above 1 is
slower now. A point slower by more than the threshold (10% by default) is a regression. Library,
driver and GPU changes come from each run's run.json provenance, so a regression can be read next
to what changed. Runs on different GPUs are compared too, but labeled as such: their ratios
measure hardware, not a software change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fp4lab.results import REFERENCE_ROOT, RunDir, list_runs

POINT_KEY = ["backend", "fmt", "m", "n", "k"]
DEFAULT_THRESHOLD = 0.10


def validate_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 10:
        raise ValueError(f"regression_threshold={threshold!r}: a fraction such as 0.10 (10% slower)")
    return float(threshold)


def index_runs(runs_dir: str | os.PathLike = "runs",
               reference_root: str | os.PathLike = REFERENCE_ROOT) -> pd.DataFrame:
    """Every run folder, local and reference, oldest first, with `kind` saying which."""
    local, reference = list_runs(runs_dir), list_runs(reference_root)
    local.insert(1, "kind", "local")
    reference.insert(1, "kind", "reference")
    frames = [f for f in (local, reference) if len(f)]
    if not frames:
        return local
    return pd.concat(frames, ignore_index=True).sort_values("run_id").reset_index(drop=True)


def previous_run(run_dir: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> Path | None:
    """The latest local run before this one (by run id, which sorts by time) that has GEMM rows."""
    run_dir = Path(run_dir)
    runs_dir = Path(runs_dir) if runs_dir else run_dir.parent
    earlier = [Path(p) for p in list_runs(runs_dir)["path"]
               if Path(p).name < run_dir.name and RunDir(Path(p)).has_table("gemm")]
    return earlier[-1] if earlier else None


def reference_runs(reference_root: str | os.PathLike = REFERENCE_ROOT) -> list[Path]:
    return [Path(p) for p in list_runs(reference_root)["path"]]


# -- comparing two runs ------------------------------------------------------------------------
def _ok_points(run: RunDir) -> pd.DataFrame:
    if not run.has_table("gemm"):
        return pd.DataFrame(columns=POINT_KEY + ["median_us"])
    gemm = run.read_table("gemm")
    ok = gemm[gemm["status"] == "ok"]
    return ok.groupby(POINT_KEY, as_index=False)["median_us"].median()


def point_ratios(current: RunDir, other: RunDir) -> pd.DataFrame:
    """Points correct in both runs: `now_us`, `before_us`, `time_ratio` (now / before)."""
    now, before = _ok_points(current), _ok_points(other)
    joined = now.merge(before, on=POINT_KEY, suffixes=("_now", "_before"))
    joined = joined.rename(columns={"median_us_now": "now_us", "median_us_before": "before_us"})
    joined["time_ratio"] = joined["now_us"] / joined["before_us"]
    return joined.sort_values(POINT_KEY).reset_index(drop=True)


def regressions(ratios: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """Points slower now by more than `threshold` (0.10 = 10%), worst first."""
    slower = ratios[ratios["time_ratio"] > 1 + validate_threshold(threshold)]
    return slower.sort_values("time_ratio", ascending=False).reset_index(drop=True)


def provenance_fields(run_json: dict[str, Any]) -> dict[str, Any]:
    """The flat facts a number depends on: GPU, driver, CUDA, library versions, fp4lab commit."""
    prov = run_json.get("provenance", {})
    device = prov.get("device", {})
    fields = {"GPU": device.get("name"), "compute capability": _text(device.get("compute_capability")),
              "driver": device.get("driver"), "CUDA": prov.get("cuda"), "python": prov.get("python"),
              "fp4lab commit": prov.get("fp4lab_git_sha"), "profile": run_json.get("report", {}).get("profile")}
    fields.update({name: version for name, version in (prov.get("versions") or {}).items()})
    return fields


def _text(value: Any) -> Any:
    return ".".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def version_changes(current: dict[str, Any], other: dict[str, Any]) -> pd.DataFrame:
    """What differs between two runs' provenance: field, before, now."""
    now, before = provenance_fields(current), provenance_fields(other)
    rows = [{"field": name, "before": before.get(name), "now": now.get(name)}
            for name in dict.fromkeys([*before, *now])
            if before.get(name) != now.get(name)]
    return pd.DataFrame(rows, columns=["field", "before", "now"])


@dataclass
class Comparison:
    run_id: str
    other_id: str
    other_kind: str                 # "previous" | "reference"
    same_gpu: bool
    gpus: tuple[Any, Any]           # (now, other)
    ratios: pd.DataFrame
    regressions: pd.DataFrame
    changes: pd.DataFrame
    threshold: float

    @property
    def label(self) -> str:
        """How to read the ratios: a software change on one GPU, or two different GPUs."""
        if self.same_gpu:
            return f"same device ({self.gpus[0]}): ratios show software and conditions"
        return f"DIFFERENT devices ({self.gpus[0]} now, {self.gpus[1]} in {self.other_id}): ratios compare hardware"


def compare(run_dir: str | os.PathLike, other_dir: str | os.PathLike, other_kind: str = "previous",
            threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    current, other = RunDir.open(run_dir), RunDir.open(other_dir)
    ratios = point_ratios(current, other)
    gpu_now = provenance_fields(current.run_json())["GPU"]
    gpu_other = provenance_fields(other.run_json())["GPU"]
    return Comparison(current.run_id, other.run_id, other_kind, gpu_now == gpu_other, (gpu_now, gpu_other),
                      ratios, regressions(ratios, threshold), version_changes(current.run_json(), other.run_json()),
                      threshold)


def plural(count: int, noun: str) -> str:
    """`1 run`, `2 runs`: a count with its noun agreeing."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def index_sentence(index: pd.DataFrame, compared: int) -> str:
    """How many runs are on record (local and reference) and how many this run was compared with."""
    kinds = index["kind"].value_counts() if len(index) else pd.Series(dtype=int)
    return (f"{plural(len(index), 'run')} on record ({int(kinds.get('local', 0))} local, "
            f"{int(kinds.get('reference', 0))} reference); this run was compared with {compared}.")


def summary(c: Comparison) -> list[str]:
    """Sentences about one comparison, every number from the data."""
    lines = [f"Against {c.other_kind} run {c.other_id}: {c.label}."]
    if not len(c.ratios):
        lines.append("No point was measured correctly in both runs, so no ratio can be computed.")
        return lines
    median = c.ratios["time_ratio"].median()
    lines.append(f"{len(c.ratios)} points measured correctly in both runs; the median point takes "
                 f"{median:.2f}x the time it took then ({'slower' if median > 1 else 'faster or equal'} now).")
    if len(c.regressions):
        worst = c.regressions.iloc[0]
        lines.append(f"{plural(len(c.regressions), 'point')} {'is' if len(c.regressions) == 1 else 'are'} "
                     f"more than {c.threshold:.0%} slower; the worst is "
                     f"{worst.backend} {worst.fmt} M={worst.m} {worst.n}x{worst.k} at {worst.time_ratio:.2f}x.")
    else:
        lines.append(f"No point is more than {c.threshold:.0%} slower.")
    if len(c.changes):
        lines.append("What changed: " + "; ".join(f"{r.field} {r.before} -> {r.now}" for r in c.changes.itertuples()) + ".")
    return lines
