"""Chapter 05's numbers: what the run measured of each collective, and which way to spread an MoE
decode step over the GPUs it measured (TP, TP x PP or EP), from its own GEMMs and comm rows.

The comm rows come from the run when it holds a `comm` table, else from the reference run; the
GEMM times from the same run as the comm rows where it has GEMM rows (so one device's numbers
are never mixed with another's). The model of a step is fp4lab.analysis.comm's; the GEMM time
function is the fastest GEMM backend's measured curve (fp4lab.analysis.decode), the one the
diagnosis reads. A CPU run's comm rows are a tiny gloo check: its layouts use the scaled-down
model of the same sizes, and say nothing about a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fp4lab.analysis import comm as comm_analysis
from fp4lab.analysis import decode, gemm as gemm_analysis
from fp4lab.analysis import moe as moe_analysis
from fp4lab.analysis.run import RunView, view
from fp4lab.comm import ops
from fp4lab.moe import presets
from fp4lab.results import RunDir


@dataclass
class LayoutStudy:
    source: RunView | None            # the run whose comm rows are read (None: no comm anywhere)
    frame: pd.DataFrame               # its comm rows, every status
    gpus: int                         # the largest group it measured
    model: presets.ModelPreset | None
    backend: str | None               # the GEMM backend whose times the layouts use
    layouts: pd.DataFrame             # comm.layout_sweep rows ([] when gpus == 1 or no GEMMs)
    fastest: dict                     # comm.fastest_layout at the decode batch
    decode_batch: int
    why_not: str = ""                 # why no layout is compared, in one sentence
    from_reference: bool = False      # the run measured no collective: the rows are the reference run's

    @property
    def ok(self) -> pd.DataFrame:
        return self.frame[self.frame["status"] == "ok"] if len(self.frame) else self.frame


def comm_source(run: RunDir, reference: RunView | None) -> RunView | None:
    if run.has_table("comm"):
        return view(run)
    if reference is not None and reference.run.has_table("comm"):
        return reference
    return None


def model_of(frame: pd.DataFrame, preset: str) -> presets.ModelPreset:
    """The model the comm rows were sized for: the preset itself, or (rows sized by hand, as the
    smoke plan's are) its scaled-down stand-in of the rows' hidden size, experts and top-k."""
    named = frame["preset"].dropna().unique() if "preset" in frame else []
    if len(named) and named[0]:
        return presets.get(str(named[0]))
    all_to_all = frame[frame["op"].isin(ops.ALL_TO_ALL_OPS)]
    hidden = int(frame["hidden"].iloc[0])
    experts = int(all_to_all["experts"].iloc[0]) if len(all_to_all) else 8
    top_k = int(all_to_all["top_k"].iloc[0]) if len(all_to_all) else 2
    return presets.scaled_down(presets.get(preset), experts=experts, hidden=hidden,
                               moe_intermediate=max(hidden // 2, 1), top_k=top_k)


def study(run: RunDir, reference: RunView | None, preset: str, batches, decode_batch: int,
          routing: str = "uniform", steps: int = 8, seed: int = 0) -> LayoutStudy:
    source = comm_source(run, reference)
    if source is None:
        return LayoutStudy(None, pd.DataFrame(), 0, None, None, pd.DataFrame(), {}, decode_batch,
                           "neither this run nor the reference run measured any collective")
    frame = source.run.read_table("comm")
    ok = frame[frame["status"] == "ok"]
    gpus = int(ok["world_size"].max()) if len(ok) else 0
    model = model_of(frame, preset) if len(frame) else None
    base = LayoutStudy(source, frame, gpus, model, None, pd.DataFrame(), {}, decode_batch,
                       from_reference=source is reference)
    if gpus < 2:
        base.why_not = (f"{source.device} measured every collective on one GPU (world size 1, a local "
                        "copy), so there is no layout to choose: a machine with 2 or more GPUs measures "
                        "every group size and this chapter then ranks TP, TP x PP and EP")
        return base
    if not source.run.has_table("gemm"):
        base.why_not = f"run {source.run_id} measured comm but no GEMMs to time the experts with"
        return base
    gemm = gemm_analysis.gemm_results(source.run)
    load = moe_analysis.tokens_per_expert(model, decode_batch, routing, steps, seed)
    backend = decode.layer_backend(gemm, model, load)
    if backend is None:
        base.why_not = f"run {source.run_id} has no correct GEMM points to time the experts with"
        return base
    step_model = comm_analysis.StepModel(
        preset=model, gemm_us=decode.gemm_time_function(gemm, backend),
        comm=comm_analysis.CommTable(frame), routing=routing, steps=steps, seed=seed,
        ceilings=gemm.measured or gemm.spec)
    batches = sorted({int(b) for b in batches} | {int(decode_batch)})
    table = comm_analysis.layout_sweep(step_model, gpus, batches)
    fastest = comm_analysis.fastest_layout(table[table["batch"] == decode_batch])
    base.backend, base.layouts, base.fastest = backend, table, fastest
    return base


def at_decode(study_: LayoutStudy, tokens: int) -> pd.DataFrame:
    """Each op, group size, dtype and routing at the measured token count nearest `tokens`
    (per rank for the all-to-alls), the one chapter 05's table shows."""
    ok = study_.ok
    if not len(ok):
        return ok
    nearest = int(ok.iloc[(ok["tokens"] - tokens).abs().argmin()]["tokens"])
    rows = ok[ok["tokens"] == nearest].copy()
    # nccl-tests' bus factor is 0 on one rank: no bus is crossed, so no bandwidth to state
    rows.loc[rows["world_size"] == 1, "busbw_gbps"] = float("nan")
    columns = ["op", "world_size", "tokens", "dtype", "routing", "bytes", "median_us", "busbw_gbps",
               "imbalance", "backend"]
    return rows[columns].sort_values(["world_size", "op", "dtype", "routing"], na_position="first") \
        .reset_index(drop=True)


def smallest_time(study_: LayoutStudy) -> dict | None:
    """The fastest measured collective (the latency floor a step pays per call)."""
    ok = study_.ok
    if not len(ok):
        return None
    row = ok.loc[ok["median_us"].idxmin()]
    calls = row.get("calls_per_sample")
    # the same call in chapter 05's table, which is read at the decode batch, not the fewest tokens
    table = at_decode(study_, study_.decode_batch)
    same = table[(table["op"] == row["op"]) & (table["world_size"] == row["world_size"])
                 & (table["dtype"] == row["dtype"])]
    return {"op": row["op"], "dtype": row["dtype"], "world_size": int(row["world_size"]),
            "tokens": int(row["tokens"]),
            # what it is the cheapest of: not the fewest tokens (the times are flat there)
            "calls_measured": len(ok), "tokens_span": (int(ok["tokens"].min()), int(ok["tokens"].max())),
            "us": float(row["median_us"]), "backend": row["backend"],
            # back-to-back calls a timed sample held: they share one sample's launch and events
            "calls_per_sample": int(calls) if pd.notna(calls) else None,
            "table_tokens": int(same["tokens"].iloc[0]) if len(same) else None,
            "table_us": float(same["median_us"].iloc[0]) if len(same) else None}
