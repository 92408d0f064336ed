"""What chapter 03 (MoE expert scatter) needs beyond the library: parameter checks and tables."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp4lab.moe import grouped, presets, routing, stats


@dataclass(frozen=True)
class ChapterParams:
    sweep: grouped.SweepConfig
    model: presets.ModelPreset          # the real preset (routing statistics use it)
    measured_model: presets.ModelPreset # what is timed: the real one on a GPU, a scaled one on CPU
    target_utilization: float
    measure: bool


def validate(preset: str, batch_sizes, routing_spec: str, ep_degrees, steps: int, seed: int,
             measure: bool, target_utilization: float, device: str, timer_repeats: int) -> ChapterParams:
    """Check every knob (ValueError naming the bad one); on CPU the measurement uses a scaled preset."""
    from fp4lab import hardware

    if not 0 < float(target_utilization) <= 1:
        raise ValueError(f"target_utilization={target_utilization!r}: must be in (0, 1]")
    if not isinstance(measure, bool):
        raise ValueError(f"measure={measure!r}: must be True or False")
    info = hardware.detect(device)
    config = grouped.SweepConfig(preset=preset, batch_sizes=tuple(batch_sizes), routing=routing_spec,
                                 ep_degrees=tuple(ep_degrees), steps=steps, seed=seed, device=device,
                                 scaled=info.kind != "cuda", timer_repeats=timer_repeats,
                                 timer_warmup_s=1.0 if info.kind == "cuda" else 0.0).validate()
    return ChapterParams(config, presets.get(preset), config.model(), float(target_utilization),
                         measure)


def load_stats_table(model: presets.ModelPreset, batch_sizes, routing_spec: str, ep_degrees,
                     steps: int, seed: int) -> tuple[pd.DataFrame, dict[int, np.ndarray]]:
    """One row per (batch, ep) of routing statistics, and the loads [S, E] per batch."""
    rows, loads_by_batch = [], {}
    for batch in batch_sizes:
        loads = routing.expert_loads(routing_spec, model.experts, model.top_k, batch, steps, seed)
        loads_by_batch[batch] = loads
        expert = stats.expert_load_stats(loads)
        for ep in ep_degrees:
            rows.append({"batch": batch, **expert, **stats.ep_stats(loads, ep)})
    return pd.DataFrame(rows), loads_by_batch


def open_run(run_dir: str):
    """The run folder the report passes (created if new), or a temporary one when run alone."""
    from pathlib import Path

    from fp4lab.results import RunDir

    if not run_dir:
        return RunDir.create(tempfile.mkdtemp(prefix="fp4lab-moe-"), run_id="moe")
    path = Path(run_dir)
    return RunDir.open(path) if (path / "run.json").exists() else RunDir.create(path.parent, run_id=path.name)


def shown_rows(run, params: ChapterParams) -> tuple[pd.DataFrame, presets.ModelPreset]:
    """The moe rows the chapter shows, and their model: the run's own rows of the real preset or
    of its CPU stand-in, whichever the run holds (a run is shown as it was measured, whatever
    machine renders it); measured now only when it holds neither and `measure` is on."""
    frame = run.read_table("moe") if run.has_table("moe") else pd.DataFrame({"preset": []})
    for model in (params.model, params.measured_model):
        if (frame["preset"] == model.key).any():
            return frame[frame["preset"] == model.key], model
    if not params.measure:
        return frame.iloc[0:0], params.measured_model
    grouped.run_sweep(params.sweep, run)
    frame = run.read_table("moe")
    return frame[frame["preset"] == params.measured_model.key], params.measured_model


def run_peak_bf16_tflops(run) -> float | None:
    """The dense bf16 peak of the GPU the run measured (its spec sheet), None for a CPU run."""
    from fp4lab import hardware

    name = run.run_json().get("provenance", {}).get("device", {}).get("name")
    spec = hardware.match_spec(name)
    return spec.peak_tflops.get("bf16") if spec is not None else None


def reference_moe_rows(reference_dir: str, preset: str) -> pd.DataFrame:
    """The reference run's moe rows for this preset (empty when there is none)."""
    from fp4lab.results import RunDir, reference_run

    run = reference_run(reference_dir, table=None if reference_dir else "moe")
    if run is None or not RunDir(run).has_table("moe"):
        return pd.DataFrame()
    frame = RunDir(run).read_table("moe")
    return frame[frame["preset"] == presets.get(preset).key] if len(frame) else frame
