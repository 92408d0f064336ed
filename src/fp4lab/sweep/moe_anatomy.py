"""Where fp4lab's fused FP4 MoE spends its time: the anatomy builds of a fused method
(schema.MOE_ANATOMY_METHODS) at one routed layer: both launches with the weights, block scales and
staged activations loaded only ("load"), also decoded ("decode"), whole ("full"), and decoding and
multiplying without the weights' read ("compute"), timed with the sweep's timer one after another in
one worker. The full build passes the gate first; the other builds write no output, so they are
timed only where the full build at the same point passed.

Worker side: `measure_job` (one worker per dissected method). The parent side is part of the MoE
sweep (fp4lab.sweep.moe.run_sweep).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fp4lab import schema
from fp4lab.sweep.config import MoeSweep
from fp4lab.sweep.plan import MoeAnatomyPoint, MoePoint


def point_row(run_id: str, config: MoeSweep, point: MoeAnatomyPoint, status: str, error: str | None,
              facts: dict[str, Any]) -> dict[str, Any]:
    model = config.model()
    return schema.blank_row("moe_anatomy", run_id=run_id, preset=model.key, scaled=model.scaled,
                            **point.identity(), routing=config.routing, top_k=model.top_k,
                            status=status, error=error, **facts)


def layer_point(point: MoeAnatomyPoint) -> MoePoint:
    """The moe table's layer point the build dissects (the same routed problem)."""
    return MoePoint(point.method, "layer", point.fmt, point.batch, point.ep, None)


def measure_point(point: MoeAnatomyPoint, config: MoeSweep, method, cache, gates: dict, timer,
                  facts, job) -> dict[str, Any]:
    """One build timed; `gates` holds each (fmt, batch)'s full-build gate, checked once."""
    from fp4lab import bench
    from fp4lab.backends.moe import check_call
    from fp4lab.sweep.gemm import timing_columns
    from fp4lab.sweep.moe import build_problem, timer_for

    device = job["device"]
    row = point_row(job["run_id"], config, point, "ok", None, facts)
    problem, extra = build_problem(config, config.model(), layer_point(point), cache, device)
    row["experts"] = extra["experts"]
    where = (point.fmt, point.batch)
    full = None
    if where not in gates or point.stage == "full":
        full = method.prepare(problem, point.fmt)
        gates[where] = check_call(full, problem)
    gate = gates[where]
    row["rel_err"] = gate.rel_err
    if not gate.ok:
        prefix = "" if point.stage == "full" else "the full build at this point failed the gate: "
        row.update(status=gate.status, error=prefix + gate.message)
        return row
    call = full if point.stage == "full" else method.prepare(problem, point.fmt, stage=point.stage)
    row.update(what=call.note or None, weight_bytes=float(call.weight_bytes))
    point_timer, cold_note = timer_for(timer, call.weight_bytes, device)
    if not call.graph:
        point_timer = dataclasses.replace(point_timer, use_graph=False)
    row.update(timing_columns(bench.time_call(call.make_call, call.args, call.out, point_timer, device)))
    row["timer_note"] = "; ".join(filter(None, [row["timer_note"], cold_note])) or None
    return row


def measure_job(job: dict[str, Any], send) -> None:
    """Worker: one fused method's anatomy points (see fp4lab.sweep.runner for the protocol)."""
    from fp4lab.sweep.gemm import start_worker
    from fp4lab.sweep.moe import ProblemCache, measure_each
    from fp4lab.sweep.registry import moe_method

    config = MoeSweep.from_dict(job["config"])
    method = moe_method(job["group"].removesuffix("-anatomy"))
    started = start_worker(method, job["device"], job["config"]["timer"], send)
    if started is None:
        return
    timer, facts = started
    cache, gates = ProblemCache(config, job["device"]), {}
    measure_each(job, send, MoeAnatomyPoint,
                 lambda point: measure_point(point, config, method, cache, gates, timer, facts, job),
                 lambda point, status, error: point_row(job["run_id"], config, point, status, error, facts))
