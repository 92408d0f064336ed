"""Run history: which runs exist, and what changed between two of them, with a noise model.

Two runs are compared point by point on the GEMM sweep's correct rows, joined on
(backend, fmt, m, n, k). `time_ratio` = this run's median time / the other's: above 1 is slower now.

When is a slower point a regression? Timing noise is real, so a point is flagged only when it is
slower by more than the threshold AND by more than the spread of the two measurements: its p20
now is above its p80 then (the interquartile-ish ranges do not overlap). On a CPU (a smoke run
on a shared machine) single points move by several times between identical runs, so the judge
is per backend instead: a backend regresses when the geometric mean of its points' ratios, over
the other backends' when they got slower too (the median of theirs: the machine's own change of
speed, a busy or throttled CPU slowing every backend at once), exceeds CPU_BACKEND_THRESHOLD and
most of its points got slower by more than that machine factor. Runs on different GPUs are compared too, but labelled:
their ratios measure hardware, not software. A GPU point got faster by the mirror rule: by more than the
threshold and its p80 now below its p20 then.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp4lab import text
from fp4lab.analysis import decode
from fp4lab.results import REFERENCE_ROOT, RunDir, later_commits, list_runs

POINT_KEY = ["backend", "fmt", "m", "n", "k"]
DEFAULT_THRESHOLD = 0.10
# a CPU backend must be 2x slower overall to count: one worker process's speed swings up to ~1.9x
# between identical sweeps on a shared machine (emulated: 1.57x here, 1.95x on the 2-core CI box)
CPU_BACKEND_THRESHOLD = 2.0
CPU_MAJORITY = 0.75             # ... with at least this share of its points slower


def index_runs(runs_dir: str | os.PathLike, reference_root: str | os.PathLike = REFERENCE_ROOT) -> pd.DataFrame:
    """Every run folder, local and reference, oldest first, with `kind` saying which (a run of
    a chapter rendered inside the reference folder lists those runs once, as references)."""
    reference = list_runs(reference_root)
    local = list_runs(*([] if is_reference_root(runs_dir, reference_root) else [runs_dir]))
    local.insert(1, "kind", "local")
    reference.insert(1, "kind", "reference")
    frames = [f for f in (local, reference) if len(f)]
    if not frames:
        return local
    index = pd.concat(frames, ignore_index=True)
    # oldest first by creation time (a run named by hand, "smoke5", sorts by when it was made);
    # a run.json without a readable time goes first, then the name decides
    created = pd.to_datetime(index["created"], utc=True, errors="coerce", format="ISO8601")
    order = index.assign(_created=created).sort_values(["_created", "run_id"], na_position="first", kind="stable")
    return order.drop(columns="_created").reset_index(drop=True)


def is_reference_root(runs_dir: str | os.PathLike, reference_root: str | os.PathLike | None = None) -> bool:
    return Path(runs_dir).resolve() == Path(REFERENCE_ROOT if reference_root is None else reference_root).resolve()


def previous_run(run_dir: str | os.PathLike, runs_dir: str | os.PathLike,
                 reference_root: str | os.PathLike | None = None) -> Path | None:
    """The latest local run created before this one that has GEMM rows (none among the committed
    reference runs, nor a local copy of one: those are compared as references)."""
    reference_root = REFERENCE_ROOT if reference_root is None else reference_root
    if is_reference_root(runs_dir, reference_root):
        return None
    run_dir = Path(run_dir).resolve()
    mine = RunDir.open(run_dir).run_json().get("created") or ""
    references = set(list_runs(reference_root)["run_id"]) - {run_dir.name}
    earlier = []
    for path in list_runs(runs_dir)["path"]:
        path = Path(path).resolve()
        if path == run_dir or path.name in references or not RunDir(path).has_table("gemm"):
            continue
        created = RunDir(path).run_json().get("created") or ""
        if created < mine or (created == mine and path.name < run_dir.name):
            earlier.append((created, path.name, path))
    return max(earlier)[2] if earlier else None


def _ok_points(run: RunDir) -> pd.DataFrame:
    columns = POINT_KEY + ["median_us", "p20_us", "p80_us"]
    if not run.has_table("gemm"):
        return pd.DataFrame(columns=columns)
    gemm = run.read_table("gemm")
    ok = gemm[gemm["status"] == "ok"]
    if "weight_dtype" in ok:
        # a bf16, fp8 or int4 (tinygemm) backend runs once per swept format, on those weights
        # converted to its own dtype: the format is not what its kernel reads, so its two rows are
        # one point, with none (as chapter 01 names a format on fp4 weights only)
        ok = ok.assign(fmt=ok["fmt"].where(ok["weight_dtype"] == "fp4"))
    return ok.groupby(POINT_KEY, as_index=False, dropna=False)[["median_us", "p20_us", "p80_us"]].median()


def point_ratios(current: RunDir, other: RunDir) -> pd.DataFrame:
    """Points correct in both runs: now/before times and spreads, `time_ratio`, `beyond_spread`."""
    now, before = _ok_points(current), _ok_points(other)
    joined = now.merge(before, on=POINT_KEY, suffixes=("_now", "_before"))
    joined = joined.rename(columns={"median_us_now": "now_us", "median_us_before": "before_us"})
    joined["time_ratio"] = joined["now_us"] / joined["before_us"]
    # each run's p20-p80 spread (its median where a percentile is missing)
    p20_now, p80_now, p20_before, p80_before = (joined[f"{p}_us_{run}"].fillna(joined[f"{run}_us"])
                                                for run in ("now", "before") for p in ("p20", "p80"))
    joined["beyond_spread"] = p20_now > p80_before           # slower: the fast end now above the slow end then
    joined["faster_beyond_spread"] = p80_now < p20_before    # faster: the slow end now below the fast end then
    return joined.sort_values(POINT_KEY).reset_index(drop=True)


def point_regressions(ratios: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """GPU runs: points slower than the threshold and beyond the spread, worst first."""
    slower = ratios[(ratios["time_ratio"] > 1 + threshold) & ratios["beyond_spread"]]
    return slower.sort_values("time_ratio", ascending=False).reset_index(drop=True)


def point_improvements(ratios: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """GPU runs: points faster than the threshold and beyond the spread, most improved first."""
    faster = ratios[(ratios["time_ratio"] < 1 / (1 + threshold)) & ratios["faster_beyond_spread"]]
    return faster.sort_values("time_ratio").reset_index(drop=True)


def backend_regressions(ratios: pd.DataFrame) -> pd.DataFrame:
    """CPU runs: backends whose points got slower overall (geometric mean) and mostly, beyond what
    the other backends of the same runs did (a machine twice as busy the second time slows them
    all; one backend twice slower stands out against the rest)."""
    groups = dict(tuple(ratios.groupby("backend")))
    geomeans = {backend: float(np.exp(np.log(group["time_ratio"]).mean())) for backend, group in groups.items()}
    rows = []
    for backend, group in groups.items():
        others = [value for name, value in geomeans.items() if name != backend]
        # only a slower machine excuses a slower backend: others that got faster (the earlier run
        # was the busy one) must not make a steady backend look slow
        machine = max(1.0, float(np.median(others))) if others else 1.0
        beyond = geomeans[backend] / machine
        share = float((group["time_ratio"] > machine).mean())
        if beyond > CPU_BACKEND_THRESHOLD and share >= CPU_MAJORITY:
            rows.append({"backend": backend, "points": len(group), "geomean_ratio": geomeans[backend],
                         "machine_ratio": machine, "beyond_machine": beyond, "share_slower": share})
    return pd.DataFrame(rows, columns=["backend", "points", "geomean_ratio", "machine_ratio", "beyond_machine",
                                       "share_slower"])


def provenance_fields(run_json: dict[str, Any]) -> dict[str, Any]:
    """The flat facts a number depends on: GPU, driver, CUDA, library versions, fp4lab commit and
    the commits that added rows later, short as git prints them (None when none did)."""
    prov = run_json.get("provenance") or {}
    device = prov.get("device") or {}
    capability = device.get("compute_capability")
    fields = {"device": device.get("name"),
              "compute capability": ".".join(map(str, capability)) if isinstance(capability, list) else capability,
              "driver": device.get("driver"), "CUDA": prov.get("cuda"), "python": prov.get("python"),
              "fp4lab commit": prov.get("fp4lab_git_sha"),
              "rows added later at": ", ".join(map(text.short_sha, later_commits(run_json))) or None,
              "profile": (run_json.get("report") or {}).get("profile")}
    fields.update(prov.get("versions") or {})
    return fields


def version_changes(current: dict[str, Any], other: dict[str, Any]) -> pd.DataFrame:
    now, before = provenance_fields(current), provenance_fields(other)
    rows = [{"field": name, "before": before.get(name), "now": now.get(name)}
            for name in dict.fromkeys([*before, *now]) if before.get(name) != now.get(name)]
    return pd.DataFrame(rows, columns=["field", "before", "now"])


@dataclass
class Comparison:
    run_id: str
    other_id: str
    other_kind: str                 # "previous" | "reference"
    same_device: bool
    devices: tuple[Any, Any]        # (now, other)
    on_cpu: bool                    # judged per backend (CPU noise) instead of per point
    ratios: pd.DataFrame
    regressions: pd.DataFrame       # points (GPU) or backends (CPU)
    improvements: pd.DataFrame      # points faster beyond the noise (GPU; empty on a CPU)
    changes: pd.DataFrame
    threshold: float
    diagnosed: dict[str, Any] | None = None   # the diagnosed path then and now (`diagnosis_change`)

    @property
    def judged(self) -> str:
        if self.on_cpu:
            return (f"per backend (CPU timing noise): geometric-mean slowdown over {CPU_BACKEND_THRESHOLD:g}x "
                    f"beyond the other backends' (the machine's own change), with {CPU_MAJORITY:.0%} of its "
                    "points slower")
        return f"per point: over {self.threshold:.0%} slower and beyond the p20-p80 spread of both runs"


def diagnosed_path(run: RunDir, config: decode.DiagnosisConfig) -> dict[str, Any] | None:
    """The path chapter 04 diagnoses in `run` (fastest measured at the decode point) and its
    layer time; None for a smoke run or one without a verdict."""
    d = decode.diagnose(run, config)
    if d.smoke or d.chosen is None:
        return None
    fmt = d.chosen.get("fmt")
    # every path's time at the same point, so a change of path can be told from a faster path
    times = {(r.path, r.fmt if isinstance(r.fmt, str) else None): float(r.layer_us)
             for r in d.paths.itertuples(index=False)}
    return {"path": d.chosen["path"], "fmt": fmt if isinstance(fmt, str) else None,
            "layer_us": float(d.chosen["layer_us"]), "times": times}


def diagnosis_change(now: dict[str, Any] | None, other_dir, config: decode.DiagnosisConfig) -> dict[str, Any] | None:
    """The diagnosed path and its layer time in both runs (`now`: `diagnosed_path` of the run
    compared, found once for all its comparisons); None where either has no verdict."""
    then = diagnosed_path(RunDir.open(other_dir), config) if now is not None else None
    if now is None or then is None:
        return None
    # where the diagnosed path changed: the path diagnosed then, timed now (None if this run has
    # no row of it)
    then_path_now = now["times"].get((then["path"], then["fmt"]))
    return {"now": now, "then": then, "model": config.preset, "batch": config.decode_batch,
            "then_path_now_us": then_path_now}


def compare(run_dir, other_dir, other_kind: str = "previous", threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    current, other = RunDir.open(run_dir), RunDir.open(other_dir)
    ratios = point_ratios(current, other)
    now, then = provenance_fields(current.run_json()), provenance_fields(other.run_json())
    on_cpu = (current.run_json().get("provenance") or {}).get("device", {}).get("kind") != "cuda"
    regressed = backend_regressions(ratios) if on_cpu else point_regressions(ratios, threshold)
    improved = ratios.iloc[0:0] if on_cpu else point_improvements(ratios, threshold)
    return Comparison(current.run_id, other.run_id, other_kind, now["device"] == then["device"],
                      (now["device"], then["device"]), on_cpu, ratios, regressed, improved,
                      version_changes(current.run_json(), other.run_json()), threshold)


def median_ratio(comparison: Comparison) -> float:
    return float(comparison.ratios["time_ratio"].median()) if len(comparison.ratios) else math.nan
