"""Where fp4lab's FP4 decode GEMMs spend their time: the stage variants of `triton-w4a16` (loads
only, decode without math, math on pre-decoded bf16, the full kernel, the decode done twice) and of
`cuda-w4a16` (loads only, decode without MMA, the MMAs without the split-K reduction, the full
kernel), timed at the same points with the same timer, each passing its own check first (exact
integer sums of what "load" and "decode" read or decoded, the GEMM gate for the others).

Worker side: `measure_job` (one worker per dissected kernel; crash isolation as for any group).
The parent side is part of the GEMM sweep (fp4lab.sweep.gemm.run_sweep).
"""

from __future__ import annotations

import importlib
from typing import Any

from fp4lab import schema
from fp4lab.sweep.plan import AnatomyPoint

# where each dissected kernel (schema.ANATOMY_KERNELS) builds its variants: `anatomy_variants`
KERNEL_MODULES = {"triton-w4a16": "fp4lab.backends.triton_w4a16", "cuda-w4a16": "fp4lab.backends.cuda_w4a16"}


def point_row(run_id: str, point: AnatomyPoint, status: str, error: str | None,
              facts: dict[str, Any]) -> dict[str, Any]:
    return schema.blank_row("anatomy", run_id=run_id, **point.identity(),
                            status=status, error=error, **facts)


def measure_job(job: dict[str, Any], send) -> None:
    """Worker: one kernel's anatomy points, the variants of one point built together (one config)."""
    from fp4lab import bench
    from fp4lab.sweep.gemm import make_activations, make_weights, start_worker, timing_columns
    from fp4lab.sweep.registry import backend
    from fp4lab.sweep.worker import first_line

    name = job["points"][0]["backend"]
    started = start_worker(backend(name), job["device"], job["timer"], send)
    if started is None:
        return
    timer, facts = started
    kernel = importlib.import_module(KERNEL_MODULES[name])
    built: dict[tuple, dict] = {}
    for identity in job["points"]:
        point = AnatomyPoint(**identity)
        send("start", point=identity)
        try:
            where = (point.fmt, point.n, point.k, point.m)
            if where not in built:
                built.clear()                       # one point's variants in memory at a time
                a = make_activations(point.m, point.k, job["seed"], job["device"])
                w = make_weights(point.fmt, point.n, point.k, job["seed"], job["device"])
                built[where] = {v.stage: v for v in kernel.anatomy_variants(
                    a, w, job["device"], stages=schema.ANATOMY_KERNELS[name])}
            variant = built[where][point.stage]
            row = point_row(job["run_id"], point, "ok", None, facts)
            row.update(what=variant.what, config=variant.prepared.info.get("config"),
                       weight_bytes=float(variant.weight_bytes))
            gate = variant.check()
            row["rel_err"] = gate.rel_err
            if not gate.ok:
                row.update(status="wrong_result", error=gate.message)
            else:
                prepared = variant.prepared
                row.update(timing_columns(bench.time_call(prepared.make_call, prepared.args, prepared.out,
                                                          timer, job["device"])))
        except Exception as exc:  # noqa: BLE001 - a failure of one point becomes its row
            row = point_row(job["run_id"], point, "error", first_line(exc), facts)
        send("row", point=identity, row=row)
