"""The diagnosis carried to GPUs the run never saw: the decode layer's floors projected from the
spec sheets (checked against this run's fastest FP4 layer on its own GPU), whether FlashInfer's
CUTLASS FP4 MoE tiles fit each GPU's shared memory, and which backend runs where by its rules.
Chapter 04's "elsewhere" section and `fp4lab project --run` read these; nothing here measures."""

from __future__ import annotations

import pandas as pd

from fp4lab import tiles, where
from fp4lab.analysis import projection
from fp4lab.analysis.decode import Diagnosis
from fp4lab.hardware import SPECS
from fp4lab.moe import presets

GPUS = ("b200", "rtx-pro-6000", "h100", "h200")     # the GPUs the book's users run
SMEM_GPUS = ("b200", "rtx-pro-6000")                # the FP4 tensor-core parts FlashInfer tunes for


def measured(d: Diagnosis) -> projection.Measured | None:
    """The diagnosis's fastest FP4-weight layer (the number chapter 04 states) as what the
    projection is checked against; None when the run has no FP4 path or its GPU has no sheet."""
    best = (d.fp4 or {}).get("best")
    if best is None or d.view.device_key not in SPECS:
        return None
    return projection.Measured(gpu=d.view.device_key, layer_us=float(best["layer_us"]),
                               method=str(best["path"]),
                               launch_us=d.gemm.launch_us if d.gemm is not None else None,
                               source=d.view.run_id)


def projected(d: Diagnosis, gpus=GPUS) -> pd.DataFrame:
    """The layer's floors on each GPU at the diagnosis's batch and routing, in the format of the
    fastest FP4 path measured (nvfp4 when none), with the projection's error on the run's GPU."""
    fmt = (d.fp4 or {}).get("fmt") or "nvfp4"
    model = presets.get(d.config.preset)
    return projection.projection_table(model, d.config.decode_batch, gpus, fmt=fmt,
                                       routing_spec=d.config.routing, steps=d.config.steps,
                                       seed=d.config.seed, measured=measured(d))


def smem_fit(gpus=SMEM_GPUS) -> pd.DataFrame:
    """MoE tiles x GPU: the shared memory each tile needs at the stages it is built with, against
    the GPU's per-block limit (`tiles`); one row per tile, a column per GPU."""
    table = tiles.fit_table(gpus)
    moe = table[table["kind"] == "moe"]
    cell = moe.apply(lambda r: "—" if r["fits"] is None else
                     f"{'fits' if r['fits'] else 'does not fit'}: {r['smem_kb']:.0f} of {r['limit_kb']:.0f} KB"
                     + (f", {int(r['stages'])} stage{'s' if r['stages'] != 1 else ''}"
                        if pd.notna(r["stages"]) else ""), axis=1)
    wide = moe.assign(cell=cell).pivot_table(index="tile", columns="gpu", values="cell", aggfunc="first")
    seed = moe.groupby("tile")["seed"].any()
    wide = wide.fillna("not built for this GPU")
    wide.insert(0, "seed's tile", seed.reindex(wide.index).map({True: "yes", False: ""}))
    return wide.reset_index()


def where_matrix(gpus=GPUS) -> pd.DataFrame:
    """Backend or MoE method x GPU: "runs" or "no", and why not where it does not."""
    rows = pd.DataFrame(where.where_rows([SPECS[gpu] for gpu in gpus]))
    wide = rows.pivot_table(index=["kind", "backend"], columns="device", values="runs", aggfunc="first")
    wide = wide.reindex(columns=list(gpus)).map(lambda runs: "runs" if runs else "no")
    # the rule, without the part that names one GPU ("; this GPU is sm_90 ...")
    reasons = rows[~rows["runs"]].groupby(["kind", "backend"])["reason"].first().str.split(";").str[0]
    wide["why not"] = reasons.reindex(wide.index).fillna("")
    return wide.reset_index()
