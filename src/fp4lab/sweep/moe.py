"""The MoE sweep: every MoE method at the routed loads of each decode batch, one row per point.

GEMM methods time one expert GEMM (gate_up or down) over all experts of the busiest EP rank of a
typical routing step; layer methods time the whole routed MLP on FP4 weights of that rank (at EP
1 the whole layer; see `rank_routes` for EP > 1); the dense
curve is one expert's bf16 GEMM at M = 1 .. 512 (the layer model's input). Every method runs in
its own worker (fp4lab.sweep.runner): crash isolation, per-point timeouts and resume as in the GEMM
sweep; a rerun of the same run id measures only the points it lacks.

Weights of a GLM-5 layer (19 GB bf16, 5.4 GB NVFP4) dwarf the 60 MB L2, so they are naturally
cold; small problems (scaled CPU presets, the dense curve) rotate copies instead.

Shape legend: `S` routing steps, `T` tokens, `k` top-k, `E` experts, `P` EP degree, `N`, `K` one
expert GEMM, `H` hidden, `I` moe_intermediate.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from fp4lab import schema
from fp4lab.results import RunDir, provenance, utc_now
from fp4lab.sweep import moe_anatomy, runner
from fp4lab.sweep.config import MoeSweep
from fp4lab.sweep.gemm import device_facts, energy_columns, start_worker, timing_columns
from fp4lab.sweep.plan import DENSE_METHOD, MoeAnatomyPoint, MoePoint, moe_anatomy_points, moe_points
from fp4lab.sweep.registry import moe_method, moe_method_names

FAILED = ("error", "oom", "timeout")
TABLES = ("moe", "moe_anatomy")     # the tables the MoE sweep writes
NATURALLY_COLD_L2_MULTIPLE = 4      # weights this many L2s large are cold without copies


def step_routing(config: MoeSweep, model, batch: int, ep: int) -> tuple[np.ndarray, int, np.ndarray]:
    """The typical routing step at batch B: (loads [E/P] of its busiest EP rank, that rank,
    expert ids [T, k] of the step)."""
    from fp4lab.moe import routing, stats

    ids = routing.sample_expert_ids(config.routing, model.experts, model.top_k, batch,
                                    config.steps, config.seed)                       # [S, T, k]
    loads = routing.tokens_per_expert(ids, model.experts)                            # [S, E]
    step = stats.representative_step(loads)
    per_rank = loads[step].reshape(ep, -1)                                           # [P, E/P]
    rank = int(per_rank.sum(axis=1).argmax())
    return per_rank[rank], rank, ids[step]


def rank_routes(config: MoeSweep, model, batch: int, ep: int) -> tuple[np.ndarray, int, int]:
    """(expert ids [R, k'] in the busiest rank's own numbering, that rank, its experts E/P) of the
    typical routing step at batch B, for a layer method.

    At EP 1 these are the step's ids [T, k]. At EP P > 1 the rank receives, from all P ranks,
    each (token, expert) pair routed to one of its E/P experts: as an expert-parallel dispatch
    delivers them (one row per pair), so every pair is a row with k' = 1 and the rank's layer
    reads each routed token once per local expert, exactly its experts' GEMM work."""
    loads, rank, ids = step_routing(config, model, batch, ep)                         # [E/P], [T, k]
    per_rank = model.experts // ep
    if ep == 1:
        return ids, rank, per_rank
    local = ids[(ids // per_rank) == rank] - rank * per_rank                          # [R]
    assert len(local) == loads.sum(), "the rank's pairs must be its loads"
    return local.reshape(-1, 1), rank, per_rank


def method_kinds() -> dict[str, tuple[str, str]]:
    kinds = {name: (moe_method(name).kind, moe_method(name).weight_dtype) for name in moe_method_names()}
    kinds[DENSE_METHOD] = ("dense", "bf16")
    return kinds


def point_row(run_id: str, config: MoeSweep, point: MoePoint, status: str, error: str | None,
              facts: dict[str, Any]) -> dict[str, Any]:
    """A moe row of `point` with the model's facts and the method's dtypes."""
    model = config.model()
    method = moe_method("loop-bf16" if point.method == DENSE_METHOD else point.method)
    kind = "dense" if point.method == DENSE_METHOD else method.kind
    if point.gemm == "layer":
        n, k = model.hidden, model.moe_intermediate
    else:
        n, k = model.gemm_shapes()[point.gemm]
    return schema.blank_row(
        "moe", run_id=run_id, preset=model.key, scaled=model.scaled, method=point.method, kind=kind,
        library=method.library, gemm_backend=method.gemm_backend, gemm=point.gemm, fmt=point.fmt, **_dtypes(method, point),
        batch=point.batch, m=point.m, routing=config.routing, ep=point.ep, top_k=model.top_k,
        total_experts=model.experts, n=n, k=k, status=status, error=error, **facts)


def _dtypes(method, point: MoePoint) -> dict[str, str]:
    described = method.describe()
    return {key: described[key] for key in ("weight_dtype", "act_dtype", "math_dtype")}


# -- worker side ----------------------------------------------------------------------------------

class ProblemCache:
    """The weights a worker reuses across its points: bf16 [E, N, K] per GEMM, FP4 (w13, w2) per
    format and expert count (E at EP 1, E/P on a rank); one entry at a time, so a GLM-5 layer's
    weights are held once."""

    def __init__(self, config: MoeSweep, device: str):
        self.config, self.device, self.key, self.value = config, device, None, None

    def get(self, key: tuple, build):
        if key != self.key:
            self.key, self.value = None, None        # free the previous weights first
            self.value, self.key = build(), key
        return self.value


def build_problem(config: MoeSweep, model, point: MoePoint, cache: ProblemCache, device: str):
    """(problem, extra row facts) for one point."""
    from fp4lab.backends.moe import base

    if point.gemm == "layer":
        ids, rank, per_rank = rank_routes(config, model, point.batch, point.ep)         # [R, k']
        weights = cache.get(("layer", point.fmt, per_rank), lambda: (
            base.quantized_expert_weights(per_rank, 2 * model.moe_intermediate, model.hidden,
                                          point.fmt, device, config.seed),
            base.quantized_expert_weights(per_rank, model.hidden, model.moe_intermediate,
                                          point.fmt, device, config.seed + 1)))
        problem = base.make_layer_problem(ids, per_rank, model.hidden, model.moe_intermediate,
                                          point.fmt, device, config.seed, weights=weights)
        return problem, {"ep_rank": rank, "experts": per_rank}
    n, k = model.gemm_shapes()[point.gemm]
    if point.method == DENSE_METHOD:
        w = cache.get(("dense", point.gemm), lambda: base.expert_bf16_weights(1, n, k, device, config.seed))
        return base.make_expert_problem(np.array([point.m]), n, k, device, config.seed, w=w), \
            {"ep_rank": 0, "experts": 1}
    loads, rank, _ = step_routing(config, model, point.batch, point.ep)
    weights = cache.get(("gemm", point.gemm), lambda: base.expert_bf16_weights(
        model.experts, n, k, device, config.seed))
    per_rank = model.experts // point.ep
    problem = base.make_expert_problem(loads, n, k, device, config.seed,
                                       w=weights[rank * per_rank:(rank + 1) * per_rank])
    return problem, {"ep_rank": rank, "experts": per_rank}


def problem_facts(problem, call, point: MoePoint, model) -> dict[str, Any]:
    """Tokens, loads, FLOPs and bytes of one point (useful FLOPs only: padding not credited)."""
    loads = np.asarray(problem.loads)
    active = loads[loads > 0]
    if point.gemm == "layer":
        tokens = int(problem.x.shape[0])              # at EP > 1 the rank's routed pairs (k' = 1)
        per_token = 2 * problem.top_k * (2 * model.moe_intermediate * model.hidden
                                         + model.hidden * model.moe_intermediate)
        flops, moved = float(tokens * per_token), call.weight_bytes + tokens * model.hidden * 2 * 2
    else:
        tokens = int(loads.sum())
        n, k = problem.w.shape[1:]
        flops, moved = 2.0 * tokens * n * k, call.weight_bytes + tokens * (k + n) * 2
    return {"tokens": tokens, "max_tokens": int(loads.max()), "mean_tokens": float(loads.mean()),
            "active_experts": int(len(active)), "loads": loads.tolist(),
            "weight_bytes": float(call.weight_bytes), "flops": flops, "bytes_moved": float(moved),
            "note": call.note or None}


def timer_for(timer, weight_bytes: float, device: str):
    """The sweep's timer, without copies when the weights alone overflow the L2 many times."""
    import torch

    if device.startswith("cuda"):
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        if weight_bytes > NATURALLY_COLD_L2_MULTIPLE * l2:
            return dataclasses.replace(timer, cold_l2=False), "weights larger than 4x L2: cold without copies"
    return timer, None


def measure_point(point: MoePoint, config: MoeSweep, cache: ProblemCache, timer, facts, job) -> dict:
    from fp4lab import bench
    from fp4lab.backends.moe import check_call

    model, device = config.model(), job["device"]
    row = point_row(job["run_id"], config, point, "ok", None, facts)
    method = moe_method("loop-bf16" if point.method == DENSE_METHOD else point.method)
    problem, extra = build_problem(config, model, point, cache, device)
    call = method.prepare(problem, point.fmt)
    row.update(extra, **problem_facts(problem, call, point, model))
    gate = check_call(call, problem)
    row["rel_err"] = gate.rel_err
    if not gate.ok:
        row.update(status=gate.status, error=gate.message)
        return row
    point_timer, cold_note = timer_for(timer, call.weight_bytes, device)
    if not call.graph:
        point_timer = dataclasses.replace(point_timer, use_graph=False)
    timing = bench.time_call(call.make_call, call.args, call.out, point_timer, device)
    row.update(timing_columns(timing))
    row["timer_note"] = "; ".join(filter(None, [row["timer_note"], cold_note])) or None
    if point.batch in config.energy_batches and config.energy_window_s > 0 and facts["gpu_index"] is not None:
        # the timer's samples are a burst at the boost clock; a layer kernel streaming HBM near its
        # rate can reach the board's power cap within its first 0.1-0.2 s of back-to-back calls
        row.update(energy_columns(window_call(call, device), config.energy_window_s, facts["gpu_index"]))
    return row


def window_call(call, device: str):
    """What the energy window replays: the call as the timer times it, a CUDA graph where the
    method's call can be captured (so that a call's time there is the GPU's, not the launches' from
    Python: humming's eager layer took 2.87 ms a call in its window against the timer's 2.35, of
    which the SM clock's fall under the power cap explains 8-11%: calls 109-110, 114), else the
    call itself."""
    import torch

    from fp4lab import bench

    if not (call.graph and device.startswith("cuda")):
        return call.call
    graph, _ = bench.capture_graph(call.call, torch.device(device))
    return call.call if graph is None else graph.replay


def measure_each(job: dict[str, Any], send, point_type, measure, failed_row) -> None:
    """A worker's points in turn: `measure(point)` is its row; a failure of one point is its row
    too (`failed_row(point, status, error)`: unavailable, oom or error), and the next goes on."""
    import torch

    from fp4lab.backends.moe import MethodUnavailable
    from fp4lab.sweep.worker import first_line

    for identity in job["points"]:
        point = point_type(**identity)
        send("start", point=identity)
        try:
            row = measure(point)
        except MethodUnavailable as exc:
            row = failed_row(point, "unavailable", str(exc))
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            row = failed_row(point, "oom", first_line(exc))
        except Exception as exc:  # noqa: BLE001 - any failure of one point becomes its row
            row = failed_row(point, "error", first_line(exc))
        send("row", point=identity, row=row)


def measure_job(job: dict[str, Any], send) -> None:
    """Worker: measure one MoE method's points (see fp4lab.sweep.runner for the protocol)."""
    config = MoeSweep.from_dict(job["config"])
    method = moe_method("loop-bf16" if job["group"] == DENSE_METHOD else job["group"])
    started = start_worker(method, job["device"], job["config"]["timer"], send)
    if started is None:
        return
    timer, facts = started
    cache = ProblemCache(config, job["device"])
    measure_each(job, send, MoePoint, lambda point: measure_point(point, config, cache, timer, facts, job),
                 lambda point, status, error: point_row(job["run_id"], config, point, status, error, facts))


# -- parent side ----------------------------------------------------------------------------------

def format_point_line(row: dict[str, Any]) -> str:
    """One fixed-width line per measured point (an error's control characters shown, not sent);
    an anatomy build's stage stands where a moe row's gemm does."""
    from fp4lab.text import printable, sig

    where = f"B={row['batch']}" if row.get("batch") is not None else f"m={row.get('m')}"
    part = row["gemm"] if "gemm" in row else row["stage"]
    head = (f"{row['preset']:<14.14} {row['method']:<20.20} {part:<7} {str(row.get('fmt') or ''):<5} "
            f"{where:<7} ep={row['ep']:<2} {row['status']:<12}")
    if row["status"] != "ok":
        return printable(head + " " + " ".join(str(row.get("error") or "").split())[:90])
    return printable(head + f" {sig(row['median_us'], 4):>9} us  rel_err {sig(row.get('rel_err'), 2)}")


def _static_reason(point: MoePoint | MoeAnatomyPoint, device: str) -> str | None:
    if point.method == DENSE_METHOD:
        return None
    method = moe_method(point.method)
    available, reason = method.availability(device, import_check=False)
    if not available:
        return reason
    if point.fmt and method.formats and point.fmt not in method.formats:
        return f"{method.name} does not take {point.fmt} weights (takes {', '.join(method.formats)})"
    return None


def sweep_record(stored: dict[str, Any], config: MoeSweep, model) -> dict[str, Any]:
    """run.json's "moe" section as this sweep starts: a resume (the same model and config) keeps
    its start; another sweep into the same run (DeepSeek-V3 beside GLM-5, or other batches or
    methods of the same model) keeps each earlier sweep's record, in the order they ran, under
    "earlier", so no sweep's conditions are lost."""
    record = {"config": config.as_dict(), "model": dataclasses.asdict(model), "status": "running"}
    previous = (stored.get("model") or {}).get("key")
    if previous is None or (previous == model.key and stored.get("config") == record["config"]):
        return {**record, "started": stored.get("started") or utc_now()}
    earlier = stored.get("earlier", []) + [{key: value for key, value in stored.items()
                                            if key != "earlier"}]
    return {**record, "started": utc_now(), "ended": None, "earlier": earlier}


def run_sweep(config: MoeSweep, run: RunDir, *, retry_failed: bool = False, progress: bool = True,
              command: str | None = None) -> int:
    """Measure every point of `config` the run does not hold yet; returns how many were measured.
    Holds the run folder's lock; rows land in `moe.jsonl` as they are measured."""
    from fp4lab import hardware
    from fp4lab.progress import Progress

    device = hardware.resolve_device(config.device)
    facts = device_facts(device)
    model = config.model()
    with run.lock(command), runner.signals_as_interrupt():
        todo = []
        for table, points in (("moe", moe_points(config, method_kinds())),
                              ("moe_anatomy", moe_anatomy_points(config))):
            run.refresh_export(table)
            if retry_failed:
                run.drop_rows(table, run.row_keys(table, FAILED))
            done = run.row_keys(table)
            todo += [p for p in points if p.key(facts["gpu_index"], model.key, config.routing) not in done]
        if "provenance" not in run.run_json():
            run.update_run_json(None, {"provenance": provenance(command, device)})
        run.update_run_json("moe", sweep_record(run.run_json().get("moe") or {}, config, model))
        bar = Progress(len(todo), f"moe {model.key}") if progress else None

        def record(row: dict[str, Any]) -> None:
            run.append_rows("moe_anatomy" if "stage" in row else "moe", [row])
            if bar:
                bar.update(format_point_line(row))

        def blank(point, status: str, error: str | None) -> dict[str, Any]:
            rows = moe_anatomy.point_row if isinstance(point, MoeAnatomyPoint) else point_row
            return rows(run.run_id, config, point, status, error, facts)

        groups: dict[str, list] = collections.defaultdict(list)
        for point in todo:
            reason = _static_reason(point, device)
            if reason:
                record(blank(point, "unavailable", reason))
            else:
                groups[point.group].append(point)
        status = "interrupted"
        rows_before = run.row_count(TABLES)
        try:
            if groups:
                runner.ensure_ceilings(run, device)
            job = {"run_id": run.run_id, "device": device, "config": config.as_dict()}
            for name, points in groups.items():
                kind = "moe_anatomy" if isinstance(points[0], MoeAnatomyPoint) else "moe"
                runner.measure_group(name, points, {**job, "kind": kind},
                                     runner.log_path(run, f"moe-{name}"), record, blank,
                                     config.point_timeout_s)
            status = "complete"
        finally:
            if bar:
                bar.close()
            run.update_run_json("moe", {"ended": utc_now(), "status": status})
            run.note_later_commit(TABLES, rows_before)
    return len(todo)
